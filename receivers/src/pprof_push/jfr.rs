//! `/ingest?format=jfr`: Java Flight Recorder uploads, as the Pyroscope
//! Java agent sends them (a multipart form with a gzipped `jfr` part and,
//! when the app set dynamic labels, a gzipped `labels` part) or as a raw
//! body. Each recording becomes one profile per kind of event (CPU, wall,
//! allocations, locks, ...), labelled as Pyroscope labels them: the `name`
//! tags, `service_name`, `__name__`, `__delta__="false"`, `pyroscope_spy`
//! and `jfr_event` (the agent's profiling event: `itimer`, `cpu`, `wall`).
//!
//! Everything the conversion holds is granted from the request's memory
//! grant before it is allocated; the parts are inflated within
//! `max_decompressed_size`.

use bytes::Bytes;
use proflow_model::jfr::{self, JfrError, Meter, labels::LabelsSnapshot};
use proflow_model::lost::LostSamples;
use proflow_model::model::{Envelope, Payload, ValueType};
use prost::Message;

use super::budget::DecompressBudget;
use super::error::{IngestError, Refused};
use super::ingest::IngestParams;
use super::labels::ingest_folded_labels;

/// The label naming the agent's profiling event, as Pyroscope sets it.
const JFR_EVENT_LABEL: &str = "jfr_event";

/// Bytes of memory the decoded labels may take per byte of their protobuf.
/// The agent's context of one label is ten bytes on the wire and a map
/// entry of about a hundred once decoded; the worst, an empty context under
/// a one-byte key, is four bytes on the wire for some 60 bytes of entry,
/// twice that with the map's spare room.
const LABELS_BYTES_PER_WIRE_BYTE: usize = 32;

/// A JFR upload as envelopes: `recording` (plain or gzip) and the agent's
/// `labels` (a `LabelsSnapshot`, plain or gzip), if sent. The samples no
/// profile carries are added to `lost`.
pub(crate) fn jfr_batch(
    params: &IngestParams,
    recording: Bytes,
    labels: Option<Bytes>,
    budget: &mut DecompressBudget,
    lost: &mut LostSamples,
) -> Result<Vec<Envelope>, Refused> {
    let refuse = |error: IngestError| Refused { error, profiles: 1 };
    if recording.is_empty() {
        return Ok(Vec::new());
    }
    let recording = budget
        .decompress(|| "the jfr part".to_owned(), recording)
        .map_err(refuse)?;
    let snapshot = match labels.filter(|l| !l.is_empty()) {
        None => None,
        Some(labels) => {
            let plain = budget
                .decompress(|| "the labels part".to_owned(), labels)
                .map_err(refuse)?;
            budget
                .reserve(plain.len().saturating_mul(LABELS_BYTES_PER_WIRE_BYTE))
                .map_err(refuse)?;
            Some(LabelsSnapshot::decode(plain).map_err(|e| {
                refuse(IngestError::bad_request(format!(
                    "the labels part is not the agent's LabelsSnapshot protobuf ({e}); send the labels the Pyroscope Java agent makes, or none"
                )))
            })?)
        }
    };
    let mut over = None;
    let converted = {
        let mut meter = Meter::new(|n| match budget.charge(n) {
            Ok(()) => true,
            Err(e) => {
                over = Some(e);
                false
            }
        });
        jfr::convert::to_pprof(
            &recording,
            snapshot.as_ref(),
            params.sample_rate,
            params.start_nanos,
            params.end_nanos,
            &mut meter,
        )
    };
    let recording = converted.map_err(|e| {
        refuse(match (e, over) {
            (JfrError::OverBudget { .. }, Some(over)) => IngestError::from_memory(over),
            (e, _) => IngestError::bad_request(format!(
                "the jfr part is not a JFR recording that can be read ({e}); send the recording the Pyroscope Java agent or the JDK's Flight Recorder wrote"
            )),
        })
    })?;
    lost.merge(&recording.lost);
    let mut out = Vec::with_capacity(recording.profiles.len());
    for converted in recording.profiles {
        let mut labels = ingest_folded_labels(
            &params.name.app,
            &params.name.tags,
            &params.spy_name,
            converted.name,
        )
        .map_err(|e| refuse(IngestError::bad_request(format!("name: {e}"))))?;
        if let Some(event) = recording.event.as_deref().filter(|e| !e.is_empty()) {
            labels.set(JFR_EVENT_LABEL, event);
        }
        out.push(Envelope {
            labels,
            start_unix_nanos: params.start_nanos,
            end_unix_nanos: params.end_nanos,
            sample_types: converted
                .sample_types
                .iter()
                .map(|(t, u)| ValueType::new(*t, *u))
                .collect(),
            period_type: converted.period_type.map(|(t, u)| ValueType::new(t, u)),
            // As Pyroscope's: a period type, no period.
            period: 0,
            payload: Payload::from_bytes(Bytes::from(converted.pprof), budget.setting()),
        });
    }
    Ok(out)
}
