//! Grafana Pyroscope's push API messages (`push.v1`, with `types.v1.LabelPair`),
//! written from their field numbers (shared/formats.md):
//! `PushRequest{series=1}`, `RawProfileSeries{labels=1, samples=2}`,
//! `RawSample{raw_profile=1, ID=2}`, `LabelPair{name=1, value=2}`, and the
//! empty `PushResponse`. They travel over Connect unary at
//! `POST /push.v1.PusherService/Push`, as binary protobuf or proto3 JSON.
//!
//! They live here, not in a component crate, because more than one component
//! speaks them (the `pprof_push` receiver today, a Pyroscope exporter later) and
//! components never depend on each other. Decoding untrusted bytes is the
//! receiver's business: it bounds the counts on the wire ([`crate::wire`])
//! before these structs are allocated.

use bytes::Bytes;
use prost::Message;

/// `push.v1.PushRequest`: series of profiles.
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
    /// A client-chosen id (pyroscope-rs sends a UUID); `ID` in JSON.
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

impl LabelPair {
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        LabelPair {
            name: name.into(),
            value: value.into(),
        }
    }
}

impl RawProfileSeries {
    /// A series with `labels` (name, value) and one sample per profile, with no ids.
    pub fn new<'a>(
        labels: impl IntoIterator<Item = (&'a str, &'a str)>,
        profiles: impl IntoIterator<Item = Bytes>,
    ) -> Self {
        RawProfileSeries {
            labels: labels
                .into_iter()
                .map(|(name, value)| LabelPair::new(name, value))
                .collect(),
            samples: profiles
                .into_iter()
                .map(|raw_profile| RawSample {
                    raw_profile,
                    id: String::new(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_layout_matches_the_field_numbers() {
        let request = PushRequest {
            series: vec![RawProfileSeries {
                labels: vec![LabelPair::new("a", "b")],
                samples: vec![RawSample {
                    raw_profile: Bytes::from_static(b"P"),
                    id: "i".into(),
                }],
            }],
        };
        // series(1) { labels(1) { name(1) "a", value(2) "b" },
        //             samples(2) { raw_profile(1) "P", ID(2) "i" } }
        let want = [
            0x0a, 0x10, // series, 16 bytes
            0x0a, 0x06, 0x0a, 0x01, b'a', 0x12, 0x01, b'b', // labels
            0x12, 0x06, 0x0a, 0x01, b'P', 0x12, 0x01, b'i', // samples
        ];
        assert_eq!(request.encode_to_vec(), want);
        assert_eq!(PushRequest::decode(&want[..]).unwrap(), request);
        assert!(PushResponse {}.encode_to_vec().is_empty());
    }

    #[test]
    fn series_constructor() {
        let s = RawProfileSeries::new([("service_name", "x")], [Bytes::from_static(b"p")]);
        assert_eq!(s.labels, vec![LabelPair::new("service_name", "x")]);
        assert_eq!(s.samples.len(), 1);
        assert_eq!(s.samples[0].raw_profile, Bytes::from_static(b"p"));
        assert!(s.samples[0].id.is_empty());
    }
}
