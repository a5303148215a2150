//! A tenant's profile `limits` (`max_profile_size_bytes`,
//! `max_profile_stacktrace_samples`, `max_profile_stacktrace_depth`,
//! `max_profile_stacktrace_sample_labels`) applied to the profiles of one
//! request, in the request's blocking task: a profile past a limit refuses
//! the request (400, Pyroscope's reason and words); a stack deeper than the
//! depth limit is cut to its root-most frames, as Pyroscope cuts it, and
//! the frames cut are counted as lost parts.
//!
//! A pprof profile that came as bytes is judged by the scan the receiver
//! already made of it ([`limit_scanned`]); it is decoded only when a stack
//! must be cut. A profile the receiver made from another format is judged
//! by its decoded form when it holds one, else by a scan of its bytes (a
//! JFR recording's) ([`limit_converted`]).

use std::sync::Arc;

use proflow_model::model::{Envelope, Payload};
use proflow_model::pprof::{self, Metadata, Profile};
use proflow_net::server::{ProfileShape, ProfileSource};

use super::budget::DecompressBudget;
use super::error::IngestError;

/// The shape the limits look at, from a profile's scan.
pub(crate) fn shape_of_scan(meta: &Metadata) -> ProfileShape {
    ProfileShape {
        size: meta.plain_size,
        samples: meta.sample_count,
        deepest_stack: meta.deepest_stack,
        most_sample_labels: meta.most_sample_labels,
    }
}

/// The shape the limits look at, from a decoded profile.
fn shape_of_profile(profile: &Profile) -> ProfileShape {
    let mut shape = ProfileShape {
        size: prost::Message::encoded_len(profile),
        samples: profile.sample.len(),
        ..ProfileShape::default()
    };
    for s in &profile.sample {
        shape.deepest_stack = shape.deepest_stack.max(s.location_id.len());
        shape.most_sample_labels = shape.most_sample_labels.max(s.label.len());
    }
    shape
}

/// Checks one pprof profile the request brought as bytes (`shape`, from its
/// scan, whose decoded form takes `decoded_size`) with its series labels
/// (`envelope.labels`); returns it with its deep stacks cut, if any were.
pub(crate) fn limit_scanned(
    budget: &mut DecompressBudget,
    shape: ProfileShape,
    decoded_size: usize,
    envelope: Envelope,
) -> Result<Envelope, IngestError> {
    let (limits, source) = budget.profile_limits();
    if !limits.any() {
        return Ok(envelope);
    }
    let labels = envelope
        .labels
        .iter()
        .map(|l| (l.name.as_str(), l.value.as_str()));
    let Some(depth) = limits
        .check(&shape, source, labels)
        .map_err(IngestError::Limit)?
    else {
        return Ok(envelope);
    };
    // Decoded from the plain bytes the scan kept for this (see the budget).
    budget.reserve(decoded_size)?;
    let profile = envelope
        .payload
        .decoded()
        .map_err(|e| IngestError::Internal(format!("a profile read once did not decode: {e}")))?;
    cut(budget, envelope, profile, depth)
}

/// Checks every profile the receiver made from another format (folded
/// text, a tree, speedscope, JFR); returns them with deep stacks cut.
pub(crate) fn limit_converted(
    budget: &mut DecompressBudget,
    batch: Vec<Envelope>,
) -> Result<Vec<Envelope>, IngestError> {
    if !budget.profile_limits().0.any() {
        return Ok(batch);
    }
    let mut out = Vec::with_capacity(batch.len());
    for envelope in batch {
        let Some(profile) = envelope.payload.profile() else {
            // Bytes made here (from JFR): read as a pushed profile is.
            let plain = envelope
                .payload
                .plain()
                .map_err(|e| IngestError::Internal(format!("a profile made here: {e}")))?;
            let meta = pprof::scan_metadata(&plain, envelope.payload.decode_limit())
                .map_err(|e| IngestError::Internal(format!("a profile made here: {e}")))?;
            out.push(limit_scanned(
                budget,
                shape_of_scan(&meta),
                meta.decoded_size,
                envelope,
            )?);
            continue;
        };
        let shape = shape_of_profile(&profile);
        let (limits, _) = budget.profile_limits();
        let labels = envelope
            .labels
            .iter()
            .map(|l| (l.name.as_str(), l.value.as_str()));
        let depth = limits
            .check(&shape, ProfileSource::Converted, labels)
            .map_err(IngestError::Limit)?;
        out.push(match depth {
            None => envelope,
            Some(depth) => {
                // The cut copy is held beside the original until this returns.
                budget.reserve(envelope.payload.size_bytes())?;
                cut(budget, envelope, profile, depth)?
            }
        });
    }
    Ok(out)
}

/// `envelope` with `profile`'s stacks cut to `depth`, the frames cut counted.
fn cut(
    budget: &mut DecompressBudget,
    mut envelope: Envelope,
    profile: Arc<Profile>,
    depth: usize,
) -> Result<Envelope, IngestError> {
    // The payload's hold on the profile goes first: when nothing else
    // holds it, it is cut in place rather than copied.
    envelope.payload = Payload::from_bytes(bytes::Bytes::new(), 0);
    let mut profile = Arc::unwrap_or_clone(profile);
    budget.add_truncated_frames(pprof::truncate_stacks(&mut profile, depth));
    envelope.payload = Payload::from_profile(profile);
    Ok(envelope)
}
