//! Converting an `/ingest` request's body into its profiles, by the body's
//! kind: inline when the body is small and plain, else on the blocking pool.

use bytes::Bytes;
use proflow_model::lost::LostSamples;
use proflow_model::model::Envelope;

use super::{ContentEncoding, blocking, converted_within_limits, parts_inline, read_multipart};
use crate::pprof_push::budget::DecompressBudget;
use crate::pprof_push::error::{IngestError, Refused};
use crate::pprof_push::folded::TextLimits;
use crate::pprof_push::ingest::{self, BodyKind, IngestParams};
use crate::pprof_push::jfr;

/// An `/ingest` request's body, read and granted, with what converting it
/// needs.
pub(super) struct IngestBody {
    pub encoding: ContentEncoding,
    pub body: Bytes,
    pub content_type: Option<String>,
    pub params: IngestParams,
    /// Whether it may be decoded on the async worker ([`super::decode_inline`]).
    pub inline: bool,
}

/// The profiles of a body, the budget they were made within, and what the
/// conversion of a text, speedscope or JFR body could not carry (pprof
/// bodies are passed on as they came).
pub(super) type Converted = (Vec<Envelope>, DecompressBudget, LostSamples);

/// Converts a body of `kind` into its profiles within `budget`.
pub(super) async fn convert_body(
    kind: BodyKind,
    request: IngestBody,
    text: &TextLimits,
    mut budget: DecompressBudget,
) -> Result<Converted, Refused> {
    match kind {
        BodyKind::Multipart => multipart_batch(request, budget).await,
        BodyKind::Jfr { multipart } => jfr_recording_batch(request, multipart, budget).await,
        BodyKind::Pprof => {
            let IngestBody {
                encoding,
                body,
                params,
                inline,
                ..
            } = request;
            blocking(inline, move || {
                let body = encoding.decode(body, &mut budget)?;
                let batch = ingest::pprof_batch(&params, body, None, &mut budget)?;
                Ok((batch, budget, LostSamples::default()))
            })
            .await
        }
        BodyKind::Speedscope | BodyKind::Text(_) => {
            let IngestBody {
                encoding,
                body,
                params,
                inline,
                ..
            } = request;
            let limits = *text;
            blocking(inline, move || {
                let body = encoding.decode(body, &mut budget)?;
                let mut lost = LostSamples::default();
                let batch = match kind {
                    BodyKind::Text(format) => {
                        ingest::text_batch(&params, format, body, limits, &mut budget, &mut lost)?
                    }
                    _ => ingest::speedscope_batch(&params, body, limits, &mut budget, &mut lost)?,
                };
                let batch = converted_within_limits(&mut budget, batch)?;
                Ok((batch, budget, lost))
            })
            .await
        }
    }
}

/// The profiles of a multipart form's `profile` part (pprof), read with its
/// `sample_type_config` part.
async fn multipart_batch(
    request: IngestBody,
    budget: DecompressBudget,
) -> Result<Converted, Refused> {
    let IngestBody {
        encoding,
        body,
        content_type,
        params,
        inline,
    } = request;
    let (form, mut budget) =
        read_multipart(encoding, body, content_type.as_deref(), budget).await?;
    let profile = form.profile.ok_or_else(|| {
        IngestError::bad_request(
            "the multipart body has no `profile` part; send the pprof bytes in a part named profile",
        )
    })?;
    let inline = parts_inline(inline, &[Some(&profile)]);
    blocking(inline, move || {
        let batch = ingest::pprof_batch(
            &params,
            profile,
            form.sample_type_config.as_deref(),
            &mut budget,
        )?;
        Ok((batch, budget, LostSamples::default()))
    })
    .await
}

/// The profiles of a JFR recording: the raw body, or a multipart form's
/// `jfr` part with its `labels` part.
async fn jfr_recording_batch(
    request: IngestBody,
    multipart: bool,
    budget: DecompressBudget,
) -> Result<Converted, Refused> {
    let IngestBody {
        encoding,
        body,
        content_type,
        params,
        inline,
    } = request;
    let (recording, labels, mut budget) = if multipart {
        let (form, budget) =
            read_multipart(encoding, body, content_type.as_deref(), budget).await?;
        let recording = form.jfr.ok_or_else(|| {
            IngestError::bad_request(
                "the multipart body has no `jfr` part; send the recording in a part named jfr (and the agent's labels in a part named labels)",
            )
        })?;
        (recording, form.labels, budget)
    } else {
        (body, None, budget)
    };
    let inline = parts_inline(inline, &[Some(&recording), labels.as_ref()]);
    blocking(inline, move || {
        // A raw recording may come with a Content-Encoding; the
        // parts of a form were decoded with the body.
        let recording = if multipart {
            recording
        } else {
            encoding.decode(recording, &mut budget)?
        };
        let mut lost = LostSamples::default();
        let batch = jfr::jfr_batch(&params, recording, labels, &mut budget, &mut lost)?;
        let batch = converted_within_limits(&mut budget, batch)?;
        Ok((batch, budget, lost))
    })
    .await
}
