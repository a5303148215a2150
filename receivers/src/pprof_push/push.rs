//! `POST /push.v1.PusherService/Push`: Pyroscope's Connect unary push API.
//!
//! The messages are [`proflow_model::push_v1`]'s. Connect carries them as
//! binary protobuf (`application/proto`) or proto3 JSON
//! (`application/json`: camelCase names, original names also accepted, bytes
//! in base64, `null` meaning the default), optionally gzip-compressed
//! (`Content-Encoding: gzip`, as pyroscope-rs sends).

use std::cell::Cell;
use std::fmt;

use base64::Engine;
use bytes::Bytes;
use proflow_model::model::{Envelope, NAME_LABEL, Payload, SERVICE_NAME_LABEL, TENANT_LABEL};
use proflow_model::pprof::Metadata;
use proflow_model::push_v1::{LabelPair, PushRequest, PushResponse, RawProfileSeries, RawSample};
use proflow_model::wire;
use prost::Message;
use serde::Deserialize;
use serde::de::{self, SeqAccess, Visitor};

use super::budget::DecompressBudget;
use super::error::{IngestError, Refused};
use super::ingest::with_plain;
use super::labels::{LabelsBuilder, MAX_LABELS_PER_SERIES, UNKNOWN_SERVICE};
use super::profile_limits;
use super::profile_type::profile_name_from_sample_types;

/// How the message is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Codec {
    Proto,
    Json,
}

impl Codec {
    /// The codec of a Connect unary request's `Content-Type`.
    pub fn from_content_type(content_type: Option<&str>) -> Result<Codec, IngestError> {
        let media = content_type
            .and_then(|ct| ct.split(';').next())
            .map(|m| m.trim().to_ascii_lowercase())
            .unwrap_or_default();
        match media.as_str() {
            "application/proto" | "application/protobuf" | "application/x-protobuf" => {
                Ok(Codec::Proto)
            }
            "application/json" => Ok(Codec::Json),
            m if m.starts_with("application/grpc") => Err(IngestError::UnsupportedMediaType(
                format!(
                    "{m} is not served here: this endpoint speaks Connect unary; send Content-Type: application/proto or application/json"
                ),
            )),
            "" => Err(IngestError::UnsupportedMediaType(
                "the request has no Content-Type: send application/proto (binary protobuf) or application/json".to_owned(),
            )),
            m => Err(IngestError::UnsupportedMediaType(format!(
                "unsupported Content-Type {m}: send application/proto (binary protobuf) or application/json"
            ))),
        }
    }

    /// The `Content-Type` of responses in this codec.
    pub fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => "application/proto",
            Codec::Json => "application/json",
        }
    }

    /// The encoded empty PushResponse.
    pub fn empty_response(self) -> Bytes {
        match self {
            Codec::Proto => Bytes::from(PushResponse {}.encode_to_vec()),
            Codec::Json => Bytes::from_static(b"{}"),
        }
    }
}

// ------------------------------------------------------------- limits

/// Most series one PushRequest may hold (pyroscope-rs sends one or a few).
pub(crate) const MAX_SERIES_PER_REQUEST: usize = 1_000;
/// Most samples (profiles) one series may hold.
pub(crate) const MAX_SAMPLES_PER_SERIES: usize = 1_000;
/// Most samples (profiles) one PushRequest may hold in all its series.
pub(crate) const MAX_SAMPLES_PER_REQUEST: usize = 10_000;

// These caps exist because decoding amplifies: an empty RawSample is 2 bytes
// on the wire and ~56 once decoded, so a 64 MiB body could otherwise make
// ~2 GB of structs. They are checked before anything is allocated per item:
// by a walk over the protobuf wire format, and while JSON is deserialized.

fn too_many_series() -> IngestError {
    IngestError::bad_request(format!(
        "the PushRequest has more than {MAX_SERIES_PER_REQUEST} series (the limit per request); send the series in several requests"
    ))
}

fn too_many_samples_in_series(series: usize) -> IngestError {
    IngestError::bad_request(format!(
        "series {series} has more than {MAX_SAMPLES_PER_SERIES} samples (the limit per series); send its profiles in several requests"
    ))
}

fn too_many_samples() -> IngestError {
    IngestError::bad_request(format!(
        "the PushRequest has more than {MAX_SAMPLES_PER_REQUEST} samples in all its series (the limit per request); send the profiles in several requests"
    ))
}

fn too_many_labels(series: usize) -> IngestError {
    IngestError::bad_request(format!(
        "series {series} has more than {MAX_LABELS_PER_SERIES} labels (the limit per series); send fewer labels"
    ))
}

/// Counts series, labels and samples of a binary PushRequest from the wire
/// format alone (nothing is allocated) and refuses it past the limits.
/// Malformed framing is refused too, with the same message prost would give
/// cause to.
fn check_proto_counts(body: &[u8]) -> Result<(), IngestError> {
    proto_counts(body).map(drop)
}

/// The series, labels and samples of a protobuf request, counted on the
/// wire and refused past the limits.
fn proto_counts(body: &[u8]) -> Result<(usize, usize, usize), IngestError> {
    let mut series = 0usize;
    let mut total_labels = 0usize;
    let mut total_samples = 0usize;
    walk_wire(body, |tag, series_bytes| {
        if tag != 1 {
            return Ok(());
        }
        if series == MAX_SERIES_PER_REQUEST {
            return Err(too_many_series());
        }
        let (mut labels, mut samples) = (0usize, 0usize);
        walk_wire(series_bytes, |tag, _| {
            match tag {
                1 => {
                    labels += 1;
                    if labels > MAX_LABELS_PER_SERIES {
                        return Err(too_many_labels(series));
                    }
                }
                2 => {
                    samples += 1;
                    if samples > MAX_SAMPLES_PER_SERIES {
                        return Err(too_many_samples_in_series(series));
                    }
                    total_samples += 1;
                    if total_samples > MAX_SAMPLES_PER_REQUEST {
                        return Err(too_many_samples());
                    }
                }
                _ => {}
            }
            Ok(())
        })?;
        total_labels += labels;
        series += 1;
        Ok(())
    })?;
    Ok((series, total_labels, total_samples))
}

fn malformed_proto(detail: impl fmt::Display) -> IngestError {
    IngestError::bad_request(format!(
        "malformed PushRequest protobuf ({detail}); send a push.v1.PushRequest in binary protobuf, or use Content-Type: application/json for JSON"
    ))
}

/// Calls `f` with the field number and contents of every length-delimited
/// field of one message; other fields are skipped. The wire walk refuses bad
/// framing, groups included (long deprecated and absent from this API).
fn walk_wire<'a>(
    buf: &'a [u8],
    mut f: impl FnMut(u32, &'a [u8]) -> Result<(), IngestError>,
) -> Result<(), IngestError> {
    for field in wire::fields(buf) {
        if let (tag, wire::Value::Bytes(bytes)) = field.map_err(malformed_proto)? {
            f(tag, bytes)?;
        }
    }
    Ok(())
}

// ------------------------------------------------------------- JSON form

thread_local! {
    /// Samples the JSON request being deserialized on this thread may still
    /// hold. Serde's derive cannot pass state into a field's deserializer, and
    /// a request is deserialized start to end on one thread, so the running
    /// total lives here ([`decode_json`] resets it) and the total cap holds
    /// while arrays are read, not only after 1,000 × 1,000 samples are built.
    static JSON_SAMPLES_LEFT: Cell<usize> = const { Cell::new(MAX_SAMPLES_PER_REQUEST) };
}

/// Deserializes a proto3 JSON array (`null` is empty) of at most `max`
/// elements, failing with `too_many()` as soon as one more arrives, so memory
/// follows the cap and not what the body claims. `count_samples` also charges
/// every element to [`JSON_SAMPLES_LEFT`].
fn bounded_seq<'de, D, T>(
    d: D,
    max: usize,
    count_samples: bool,
    too_many: fn() -> String,
) -> Result<Vec<T>, D::Error>
where
    D: de::Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct Bounded<T> {
        max: usize,
        count_samples: bool,
        too_many: fn() -> String,
        marker: std::marker::PhantomData<T>,
    }

    impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "an array of at most {} elements, or null", self.max)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_none<E: de::Error>(self) -> Result<Vec<T>, E> {
            Ok(Vec::new())
        }

        fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<T>, D::Error> {
            d.deserialize_seq(self)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
            // No size hint is trusted: the Vec grows with what was really read.
            let mut out = Vec::new();
            while let Some(item) = seq.next_element::<T>()? {
                if out.len() == self.max {
                    return Err(de::Error::custom((self.too_many)()));
                }
                if self.count_samples {
                    let left = JSON_SAMPLES_LEFT.get();
                    if left == 0 {
                        return Err(de::Error::custom(too_many_samples()));
                    }
                    JSON_SAMPLES_LEFT.set(left - 1);
                }
                out.push(item);
            }
            Ok(out)
        }
    }

    d.deserialize_option(Bounded {
        max,
        count_samples,
        too_many,
        marker: std::marker::PhantomData,
    })
}

fn json_series<'de, D: de::Deserializer<'de>>(d: D) -> Result<Vec<JsonSeries>, D::Error> {
    bounded_seq(d, MAX_SERIES_PER_REQUEST, false, || {
        too_many_series().to_string()
    })
}

fn json_labels<'de, D: de::Deserializer<'de>>(d: D) -> Result<Vec<JsonLabelPair>, D::Error> {
    bounded_seq(d, MAX_LABELS_PER_SERIES, false, || {
        format!(
            "a series has more than {MAX_LABELS_PER_SERIES} labels (the limit per series); send fewer labels"
        )
    })
}

fn json_samples<'de, D: de::Deserializer<'de>>(d: D) -> Result<Vec<JsonSample>, D::Error> {
    bounded_seq(d, MAX_SAMPLES_PER_SERIES, true, || {
        format!(
            "a series has more than {MAX_SAMPLES_PER_SERIES} samples (the limit per series); send its profiles in several requests"
        )
    })
}

#[derive(Deserialize)]
struct JsonPushRequest {
    #[serde(default, deserialize_with = "json_series")]
    series: Vec<JsonSeries>,
}

#[derive(Deserialize)]
struct JsonSeries {
    #[serde(default, deserialize_with = "json_labels")]
    labels: Vec<JsonLabelPair>,
    #[serde(default, deserialize_with = "json_samples")]
    samples: Vec<JsonSample>,
}

#[derive(Deserialize)]
struct JsonLabelPair {
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    name: String,
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    value: String,
}

#[derive(Deserialize)]
struct JsonSample {
    #[serde(
        rename = "rawProfile",
        alias = "raw_profile",
        default,
        deserialize_with = "proflow_config::null_as_default"
    )]
    raw_profile: String,
    #[serde(
        rename = "ID",
        default,
        deserialize_with = "proflow_config::null_as_default"
    )]
    id: String,
}

/// proto3 JSON bytes: standard or URL-safe base64, padded or not.
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    use base64::engine::general_purpose::{STANDARD_PAD_INDIFFERENT, URL_SAFE_PAD_INDIFFERENT};
    if text.contains(['-', '_']) {
        URL_SAFE_PAD_INDIFFERENT.decode(text)
    } else {
        STANDARD_PAD_INDIFFERENT.decode(text)
    }
}

fn decode_json(body: &[u8]) -> Result<PushRequest, IngestError> {
    JSON_SAMPLES_LEFT.set(MAX_SAMPLES_PER_REQUEST);
    let parsed: JsonPushRequest = serde_json::from_slice(body).map_err(|e| {
        IngestError::bad_request(format!(
            "malformed JSON PushRequest ({e}); send {{\"series\":[{{\"labels\":[{{\"name\":..,\"value\":..}}],\"samples\":[{{\"rawProfile\":\"<base64>\"}}]}}]}}"
        ))
    })?;
    let mut series = Vec::with_capacity(parsed.series.len());
    for (si, s) in parsed.series.into_iter().enumerate() {
        let mut samples = Vec::with_capacity(s.samples.len());
        for (pi, sample) in s.samples.into_iter().enumerate() {
            let raw = decode_base64(&sample.raw_profile).map_err(|e| {
                IngestError::bad_request(format!(
                    "series {si} sample {pi}: rawProfile is not valid base64 ({e}); encode the pprof bytes in base64"
                ))
            })?;
            samples.push(RawSample {
                raw_profile: Bytes::from(raw),
                id: sample.id,
            });
        }
        let labels = s
            .labels
            .into_iter()
            .map(|l| LabelPair {
                name: l.name,
                value: l.value,
            })
            .collect();
        series.push(RawProfileSeries { labels, samples });
    }
    Ok(PushRequest { series })
}

/// Decodes a PushRequest (already decompressed) in the given codec, refusing
/// it before decoding allocates when it holds more series, labels or samples
/// than the limits above allow.
/// An upper bound of what decoding a request body of `codec` allocates
/// beside the body, known before decoding: protobuf copies its labels and
/// ids (raw profiles stay slices of the body) into structs its counts bound;
/// JSON builds a struct of each object and copies every string, and
/// base64 decodes each raw profile into a buffer of its own.
pub(crate) fn decode_cost(codec: Codec, body: &[u8]) -> usize {
    use std::mem::size_of;
    match codec {
        // A request refused by its counts is refused before it decodes.
        Codec::Proto => proto_counts(body).map_or(0, |(series, labels, samples)| {
            body.len()
                + 2 * (series * size_of::<RawProfileSeries>()
                    + labels * size_of::<LabelPair>()
                    + samples * size_of::<RawSample>())
        }),
        Codec::Json => {
            let largest = [
                size_of::<JsonSeries>(),
                size_of::<JsonLabelPair>(),
                size_of::<JsonSample>(),
                size_of::<RawProfileSeries>(),
                size_of::<RawSample>(),
                size_of::<LabelPair>(),
            ]
            .into_iter()
            .max()
            .unwrap_or(0);
            let shape = proflow_model::json_shape::JsonShape::scan(body);
            shape
                .built_bytes(2 * largest, 32)
                .saturating_add(2 * body.len())
                .saturating_add(proflow_model::json_shape::BASE)
        }
    }
}

pub(crate) fn decode_request(codec: Codec, body: Bytes) -> Result<PushRequest, IngestError> {
    let request = match codec {
        Codec::Proto => {
            check_proto_counts(&body)?;
            PushRequest::decode(body).map_err(malformed_proto)?
        }
        Codec::Json => decode_json(&body)?,
    };
    check_counts(&request)?;
    Ok(request)
}

/// The limits on a decoded request: already enforced while decoding, checked
/// again for requests built any other way (and as a net under the JSON path).
fn check_counts(request: &PushRequest) -> Result<(), IngestError> {
    if request.series.len() > MAX_SERIES_PER_REQUEST {
        return Err(too_many_series());
    }
    let mut total = 0usize;
    for (si, series) in request.series.iter().enumerate() {
        if series.labels.len() > MAX_LABELS_PER_SERIES {
            return Err(too_many_labels(si));
        }
        if series.samples.len() > MAX_SAMPLES_PER_SERIES {
            return Err(too_many_samples_in_series(si));
        }
        total += series.samples.len();
    }
    if total > MAX_SAMPLES_PER_REQUEST {
        return Err(too_many_samples());
    }
    Ok(())
}

// ------------------------------------------------------------- envelopes

/// Profiles older than this (1971-01-01) carry no real time: old pyroscope-rs
/// wrote microseconds into `time_nanos`, others leave it 0. Pyroscope uses the
/// receive time for them and so do we.
const MIN_PLAUSIBLE_TIME_NANOS: i64 = 365 * 24 * 3600 * 1_000_000_000;

/// Start and end of a profile from its own times, or `now` when it has none.
pub(crate) fn profile_times(meta: &Metadata, now_nanos: i64) -> (i64, i64) {
    let start = if meta.time_nanos < MIN_PLAUSIBLE_TIME_NANOS {
        now_nanos
    } else {
        meta.time_nanos
    };
    (start, start.saturating_add(meta.duration_nanos.max(0)))
}

/// Turns every profile of a request into an envelope (a profile of no sample
/// into none); any invalid profile or label refuses the whole request, so a
/// retry never duplicates profiles.
/// Gzipped profiles are inflated within what is left of the request's
/// decompression `budget`.
pub(crate) fn to_batch(
    request: PushRequest,
    budget: &mut DecompressBudget,
    now_nanos: i64,
) -> Result<Vec<Envelope>, Refused> {
    let total: usize = request.series.iter().map(|s| s.samples.len()).sum();
    let profiles = total as u64;
    let refuse = |error: IngestError| Refused { error, profiles };
    check_counts(&request).map_err(refuse)?;
    if total == 0 {
        return Err(refuse(IngestError::bad_request(
            "no profiles received: the PushRequest has no series with samples",
        )));
    }
    // `total` is at most MAX_SAMPLES_PER_REQUEST here.
    let mut batch = Vec::with_capacity(total);
    for (si, series) in request.series.into_iter().enumerate() {
        let mut builder = LabelsBuilder::new();
        for label in &series.labels {
            // A sender names its tenant with X-Scope-OrgID; the tenant
            // label is the operator's (set by relabelling).
            if label.name == TENANT_LABEL {
                continue;
            }
            builder
                .add(&label.name, &label.value)
                .map_err(|e| refuse(IngestError::bad_request(format!("series {si}: {e}"))))?;
        }
        // Pyroscope's fallback for series without a service.
        if builder.get(SERVICE_NAME_LABEL).is_none() {
            builder.set(SERVICE_NAME_LABEL, UNKNOWN_SERVICE);
        }
        let labels = builder.build();
        for (pi, sample) in series.samples.into_iter().enumerate() {
            // Formatted only when a refusal needs it.
            let what = || format!("series {si} profile {pi}");
            let raw = sample.raw_profile;
            let (mut meta, plain) = budget.scan(what, &raw).map_err(refuse)?;
            if meta.sample_types.is_empty() {
                return Err(refuse(IngestError::bad_request(format!(
                    "{}: the profile has no sample types; send a pprof profile with at least one sample type",
                    what()
                ))));
            }
            let mut labels = labels.clone();
            // pyroscope-rs sends __name__; Pyroscope refuses series without
            // one, we infer it from the sample types as /ingest does.
            if labels.get(NAME_LABEL).is_none() {
                let name = profile_name_from_sample_types(
                    meta.sample_types.iter().map(|(t, _)| t.as_str()),
                    None,
                )
                .ok_or_else(|| {
                    refuse(IngestError::bad_request(format!(
                        "{}: the profile type cannot be told from its unnamed sample types; send a __name__ label such as process_cpu",
                        what()
                    )))
                })?;
                labels.set(NAME_LABEL, name);
            }
            if meta.sample_count == 0 {
                // A valid profile with nothing to store, as at /ingest:
                // the caller counts a request left with none as empty.
                continue;
            }
            let (start, end) = profile_times(&meta, now_nanos);
            let period = meta.period;
            let shape = profile_limits::shape_of_scan(&meta);
            let (sample_types, period_type) = meta.take_value_types();
            let envelope = Envelope {
                labels,
                start_unix_nanos: start,
                end_unix_nanos: end,
                sample_types,
                period_type,
                period,
                payload: with_plain(Payload::from_bytes(raw, budget.setting()), plain),
            };
            batch.push(
                profile_limits::limit_scanned(budget, shape, meta.decoded_size, envelope)
                    .map_err(refuse)?,
            );
        }
    }
    Ok(batch)
}

#[cfg(test)]
mod tests;
