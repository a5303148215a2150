//! `POST /push.v1.PusherService/Push`: Pyroscope's Connect unary push API.
//!
//! The messages are written here from their field numbers (shared/formats.md):
//! PushRequest{series=1}, RawProfileSeries{labels=1, samples=2},
//! RawSample{raw_profile=1, ID=2}, LabelPair{name=1, value=2}. Connect carries
//! them as binary protobuf (`application/proto`) or proto3 JSON
//! (`application/json`: camelCase names, original names also accepted, bytes
//! in base64, `null` meaning the default), optionally gzip-compressed
//! (`Content-Encoding: gzip`, as pyroscope-rs sends).

use base64::Engine;
use bytes::Bytes;
use proflow_pipeline::model::{
    Batch, Envelope, NAME_LABEL, Payload, SERVICE_NAME_LABEL, ValueType,
};
use proflow_pipeline::pprof::{self, Metadata};
use prost::Message;
use serde::Deserialize;

use super::error::{IngestError, Refused};
use super::labels::{LabelsBuilder, UNKNOWN_SERVICE};
use super::profile_type::profile_name_from_sample_types;

/// `push.v1.PushRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct PushRequest {
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// `push.v1.PushResponse`: empty.
#[derive(Clone, PartialEq, Message)]
pub struct PushResponse {}

/// `push.v1.RawProfileSeries`: one label set and its profiles.
#[derive(Clone, PartialEq, Message)]
pub struct RawProfileSeries {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// `push.v1.RawSample`: one pprof profile, plain or gzipped.
#[derive(Clone, PartialEq, Message)]
pub struct RawSample {
    /// Decoded from a `Bytes` buffer this shares the request's memory.
    #[prost(bytes = "bytes", tag = "1")]
    pub raw_profile: Bytes,
    /// A client-chosen id (pyroscope-rs sends a UUID).
    #[prost(string, tag = "2")]
    pub id: String,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, Message)]
pub struct LabelPair {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

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

// ------------------------------------------------------------- JSON form

/// proto3 JSON: `null` stands for the default value of any field.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

#[derive(Deserialize)]
struct JsonPushRequest {
    #[serde(default, deserialize_with = "null_default")]
    series: Vec<JsonSeries>,
}

#[derive(Deserialize)]
struct JsonSeries {
    #[serde(default, deserialize_with = "null_default")]
    labels: Vec<JsonLabelPair>,
    #[serde(default, deserialize_with = "null_default")]
    samples: Vec<JsonSample>,
}

#[derive(Deserialize)]
struct JsonLabelPair {
    #[serde(default, deserialize_with = "null_default")]
    name: String,
    #[serde(default, deserialize_with = "null_default")]
    value: String,
}

#[derive(Deserialize)]
struct JsonSample {
    #[serde(
        rename = "rawProfile",
        alias = "raw_profile",
        default,
        deserialize_with = "null_default"
    )]
    raw_profile: String,
    #[serde(rename = "ID", default, deserialize_with = "null_default")]
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

/// Decodes a PushRequest (already decompressed) in the given codec.
pub(crate) fn decode_request(codec: Codec, body: Bytes) -> Result<PushRequest, IngestError> {
    match codec {
        Codec::Proto => PushRequest::decode(body).map_err(|e| {
            IngestError::bad_request(format!(
                "malformed PushRequest protobuf ({e}); send a push.v1.PushRequest in binary protobuf, or use Content-Type: application/json for JSON"
            ))
        }),
        Codec::Json => decode_json(&body),
    }
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

/// An envelope's value types from a scan.
pub(crate) fn value_types(meta: &Metadata) -> (Vec<ValueType>, Option<ValueType>) {
    (
        meta.sample_types
            .iter()
            .map(|(t, u)| ValueType::new(t.as_str(), u.as_str()))
            .collect(),
        meta.period_type
            .as_ref()
            .map(|(t, u)| ValueType::new(t.as_str(), u.as_str())),
    )
}

/// Turns every profile of a request into an envelope; any invalid profile or
/// label refuses the whole request, so a retry never duplicates profiles.
pub(crate) fn to_batch(
    request: PushRequest,
    max_decompressed: usize,
    now_nanos: i64,
) -> Result<Batch, Refused> {
    let total: usize = request.series.iter().map(|s| s.samples.len()).sum();
    let profiles = total as u64;
    let refuse = |error: IngestError| Refused { error, profiles };
    if total == 0 {
        return Err(refuse(IngestError::bad_request(
            "no profiles received: the PushRequest has no series with samples",
        )));
    }
    let mut batch = Vec::with_capacity(total);
    for (si, series) in request.series.into_iter().enumerate() {
        let mut builder = LabelsBuilder::new();
        for label in &series.labels {
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
            let what = format!("series {si} profile {pi}");
            let meta = pprof::scan_metadata(&sample.raw_profile, max_decompressed)
                .map_err(|e| refuse(IngestError::from_decode(&what, e)))?;
            if meta.sample_types.is_empty() {
                return Err(refuse(IngestError::bad_request(format!(
                    "{what}: the profile has no sample types; send a pprof profile with at least one sample type"
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
                        "{what}: the profile type cannot be told from its unnamed sample types; send a __name__ label such as process_cpu"
                    )))
                })?;
                labels.set(NAME_LABEL, name);
            }
            let (start, end) = profile_times(&meta, now_nanos);
            let (sample_types, period_type) = value_types(&meta);
            batch.push(Envelope {
                labels,
                start_unix_nanos: start,
                end_unix_nanos: end,
                sample_types,
                period_type,
                period: meta.period,
                payload: Payload::from_bytes(sample.raw_profile, max_decompressed),
            });
        }
    }
    Ok(batch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_pipeline::pprof::ProfileBuilder;

    fn cpu_profile(time_nanos: i64) -> Bytes {
        let mut b = ProfileBuilder::new();
        b.sample_type("samples", "count")
            .sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(time_nanos, 10_000_000_000);
        b.sample_root_first(["main", "hot"], vec![1, 10_000_000]);
        pprof::encode(&b.build())
    }

    fn request(labels: &[(&str, &str)], profiles: Vec<Bytes>) -> PushRequest {
        PushRequest {
            series: vec![RawProfileSeries {
                labels: labels
                    .iter()
                    .map(|(n, v)| LabelPair {
                        name: n.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                samples: profiles
                    .into_iter()
                    .map(|raw_profile| RawSample {
                        raw_profile,
                        id: "id".into(),
                    })
                    .collect(),
            }],
        }
    }

    const T: i64 = 1_700_000_000_000_000_000;

    #[test]
    fn proto_roundtrip_shares_the_profile_bytes() {
        let req = request(&[("service_name", "a")], vec![cpu_profile(T)]);
        let wire = Bytes::from(req.encode_to_vec());
        let back = decode_request(Codec::Proto, wire.clone()).unwrap();
        assert_eq!(back, req);
        let raw = &back.series[0].samples[0].raw_profile;
        let wire_range = wire.as_ptr() as usize..wire.as_ptr() as usize + wire.len();
        assert!(
            wire_range.contains(&(raw.as_ptr() as usize)),
            "zero-copy slice"
        );
    }

    #[test]
    fn json_form_with_both_field_spellings_and_nulls() {
        let raw = cpu_profile(T);
        let b64 = base64::engine::general_purpose::STANDARD.encode(&raw);
        let json = format!(
            r#"{{"series":[{{"labels":[{{"name":"__name__","value":"process_cpu"}},{{"name":"service_name","value":"svc"}}],
                "samples":[{{"rawProfile":"{b64}","ID":"x"}},{{"raw_profile":"{b64}"}}]}},
                {{"labels":null,"samples":null}}],"unknownField":1}}"#
        );
        let req = decode_request(Codec::Json, Bytes::from(json)).unwrap();
        assert_eq!(req.series.len(), 2);
        assert_eq!(req.series[0].samples[0].raw_profile, raw);
        assert_eq!(req.series[0].samples[0].id, "x");
        assert_eq!(req.series[0].samples[1].raw_profile, raw);
        // URL-safe and unpadded base64 are proto3 JSON too.
        assert_eq!(decode_base64("-_8").unwrap(), vec![0xfb, 0xff]);
        assert_eq!(decode_base64("+/8=").unwrap(), vec![0xfb, 0xff]);
        assert!(decode_base64("!!").is_err());
    }

    #[test]
    fn content_types() {
        assert_eq!(
            Codec::from_content_type(Some("application/proto")),
            Ok(Codec::Proto)
        );
        assert_eq!(
            Codec::from_content_type(Some("Application/JSON; charset=utf-8")),
            Ok(Codec::Json)
        );
        for bad in [None, Some("text/plain"), Some("application/grpc+proto")] {
            let err = Codec::from_content_type(bad).unwrap_err();
            assert_eq!(err.status(), axum::http::StatusCode::UNSUPPORTED_MEDIA_TYPE);
        }
        assert!(Codec::Proto.empty_response().is_empty());
    }

    #[test]
    fn envelopes_keep_labels_times_and_bytes() {
        let raw = pprof::gzip(&cpu_profile(T));
        let req = request(
            &[
                ("__name__", "process_cpu"),
                ("service_name", "svc"),
                ("otel.scope.name", "rust"),
            ],
            vec![raw.clone(), raw.clone()],
        );
        let batch = to_batch(req, 1 << 20, 7).unwrap();
        assert_eq!(batch.len(), 2);
        let e = &batch[0];
        assert_eq!(
            e.labels.to_selector_string(),
            r#"{__name__="process_cpu", otel_scope_name="rust", service_name="svc"}"#
        );
        assert_eq!(
            (e.start_unix_nanos, e.end_unix_nanos),
            (T, T + 10_000_000_000)
        );
        assert_eq!(e.sample_types[1], ValueType::new("cpu", "nanoseconds"));
        assert_eq!(e.period_type, Some(ValueType::new("cpu", "nanoseconds")));
        assert_eq!(e.period, 10_000_000);
        assert_eq!(e.payload.encoded().bytes, raw);
        assert!(e.payload.encoded().gzipped);
        assert!(!e.payload.is_decoded());
    }

    #[test]
    fn missing_labels_are_inferred() {
        let batch = to_batch(request(&[], vec![cpu_profile(0)]), 1 << 20, 7).unwrap();
        let e = &batch[0];
        assert_eq!(e.labels.get("service_name"), Some("unknown_service"));
        assert_eq!(e.labels.get("__name__"), Some("process_cpu"));
        assert_eq!(
            e.start_unix_nanos, 7,
            "no time in the profile: receive time"
        );
        // Old pyroscope-rs: microseconds in time_nanos.
        let batch = to_batch(
            request(&[], vec![cpu_profile(1_700_000_000_000_000)]),
            1 << 20,
            7,
        )
        .unwrap();
        assert_eq!(batch[0].start_unix_nanos, 7);
    }

    #[test]
    fn bad_requests() {
        let err = to_batch(PushRequest { series: vec![] }, 1 << 20, 0).unwrap_err();
        assert!(err.error.to_string().contains("no profiles"));
        let err = to_batch(
            request(&[("bad-name", "x")], vec![cpu_profile(T)]),
            1 << 20,
            0,
        )
        .unwrap_err();
        assert!(err.error.to_string().contains("bad-name"), "{}", err.error);
        assert_eq!(err.profiles, 1);
        let err = to_batch(
            request(&[], vec![Bytes::from_static(b"\xff\xff")]),
            1 << 20,
            0,
        )
        .unwrap_err();
        assert!(
            err.error.to_string().contains("series 0 profile 0"),
            "{}",
            err.error
        );
        let err = to_batch(request(&[], vec![Bytes::new()]), 1 << 20, 0).unwrap_err();
        assert!(
            err.error.to_string().contains("no sample types"),
            "{}",
            err.error
        );
        let bomb = pprof::gzip(&vec![0u8; 1 << 16]);
        let err = to_batch(request(&[], vec![bomb]), 1 << 10, 0).unwrap_err();
        assert_eq!(
            err.error.status(),
            axum::http::StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(matches!(
            decode_request(Codec::Proto, Bytes::from_static(b"\x0a\xff\xff\xff\x0f")),
            Err(IngestError::BadRequest(_))
        ));
        assert!(matches!(
            decode_request(
                Codec::Json,
                Bytes::from_static(b"{\"series\":[{\"samples\":[{\"rawProfile\":\"%%%\"}]}]}")
            ),
            Err(IngestError::BadRequest(_))
        ));
    }

    proptest::proptest! {
        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            for codec in [Codec::Proto, Codec::Json] {
                if let Ok(req) = decode_request(codec, Bytes::from(body.clone())) {
                    let _ = to_batch(req, 4096, 0);
                }
            }
        }

        #[test]
        fn never_panics_on_random_profiles(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
            let wire = request(&[("service_name", "s")], vec![Bytes::from(raw)]).encode_to_vec();
            if let Ok(req) = decode_request(Codec::Proto, Bytes::from(wire)) {
                let _ = to_batch(req, 4096, 0);
            }
        }
    }
}
