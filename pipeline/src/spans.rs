//! Spans: the traces side input of processors that correlate profiles with
//! traces (`trace_link`'s span index). proflow does not export traces; a
//! receiver in a `traces` pipeline decodes what it needs of each span and
//! hands the spans to the [`SpanConsumer`]s of that pipeline's processors.
//!
//! The OTLP messages here are written from the trace protocol's field
//! numbers and decode only what correlation needs: the ids, the name, the
//! times and the resource's `service.name`. Everything else of a span
//! (attributes, events, links, status) is skipped on the wire, never
//! allocated. OTLP JSON is read into the same [`Span`]s.

use std::sync::Arc;

use prost::Message;
use serde::Deserialize;

/// The resource attribute naming the service.
pub const SERVICE_NAME_KEY: &str = "service.name";
/// Longest span name kept (longer ones are cut at a character boundary).
pub const MAX_NAME_LEN: usize = 256;

/// What correlation needs of one span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// All zero for a root span.
    pub parent_span_id: [u8; 8],
    pub name: String,
    /// The resource's `service.name` (shared by the spans of one resource).
    pub service: Arc<str>,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
}

/// Takes spans a receiver accepted. Called on the receiver's task: it must
/// not block for long (an index insert under a short lock is the intent).
pub trait SpanConsumer: Send + Sync {
    fn consume_spans(&self, spans: &[Span]);
}

/// The spans of one request, and what was refused of it.
#[derive(Debug, Default)]
pub struct Decoded {
    pub spans: Vec<Span>,
    /// Spans refused (an id of the wrong length or all zero).
    pub rejected: usize,
    /// Why, for the response's `partial_success` (the first reason).
    pub error_message: String,
}

/// A request that cannot be read at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct DecodeError(pub String);

// ------------------------------------------------------------ the messages

/// `ExportTraceServiceRequest`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceRequest {
    #[prost(message, repeated, tag = "1")]
    pub resource_spans: Vec<ResourceSpans>,
}

/// `ResourceSpans` (schema_url, 3, is skipped).
#[derive(Clone, PartialEq, Message)]
pub struct ResourceSpans {
    #[prost(message, optional, tag = "1")]
    pub resource: Option<crate::otlp::Resource>,
    #[prost(message, repeated, tag = "2")]
    pub scope_spans: Vec<ScopeSpans>,
}

/// `ScopeSpans` (the scope, 1, and schema_url, 3, are skipped).
#[derive(Clone, PartialEq, Message)]
pub struct ScopeSpans {
    #[prost(message, repeated, tag = "2")]
    pub spans: Vec<WireSpan>,
}

/// `Span`, the fields correlation reads (the rest are skipped).
#[derive(Clone, PartialEq, Message)]
pub struct WireSpan {
    #[prost(bytes = "vec", tag = "1")]
    pub trace_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "2")]
    pub span_id: Vec<u8>,
    #[prost(bytes = "vec", tag = "4")]
    pub parent_span_id: Vec<u8>,
    #[prost(string, tag = "5")]
    pub name: String,
    #[prost(fixed64, tag = "7")]
    pub start_time_unix_nano: u64,
    #[prost(fixed64, tag = "8")]
    pub end_time_unix_nano: u64,
}

/// `ExportTraceServiceResponse`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportTraceServiceResponse {
    #[prost(message, optional, tag = "1")]
    pub partial_success: Option<ExportTracePartialSuccess>,
}

/// `ExportTracePartialSuccess`.
#[derive(Clone, PartialEq, Message)]
pub struct ExportTracePartialSuccess {
    #[prost(int64, tag = "1")]
    pub rejected_spans: i64,
    #[prost(string, tag = "2")]
    pub error_message: String,
}

impl Decoded {
    /// The response for this request (partial success when spans were refused).
    pub fn response(&self) -> ExportTraceServiceResponse {
        ExportTraceServiceResponse {
            partial_success: (self.rejected > 0).then(|| ExportTracePartialSuccess {
                rejected_spans: i64::try_from(self.rejected).unwrap_or(i64::MAX),
                error_message: self.error_message.clone(),
            }),
        }
    }

    fn reject(&mut self, why: &str) {
        self.rejected += 1;
        if self.error_message.is_empty() {
            self.error_message = why.to_owned();
        }
    }

    fn push(&mut self, service: &Arc<str>, s: WireSpan) {
        let WireSpan {
            trace_id,
            span_id,
            parent_span_id: parent,
            mut name,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
        } = s;
        let (Ok(trace_id), Ok(span_id)) = (
            <[u8; 16]>::try_from(trace_id.as_slice()),
            <[u8; 8]>::try_from(span_id.as_slice()),
        ) else {
            return self.reject("a span's trace_id must be 16 bytes and its span_id 8");
        };
        if trace_id == [0; 16] || span_id == [0; 8] {
            return self.reject("a span's trace_id and span_id must not be all zero");
        }
        let parent_span_id = <[u8; 8]>::try_from(parent.as_slice()).unwrap_or([0; 8]);
        if name.len() > MAX_NAME_LEN {
            let mut cut = MAX_NAME_LEN;
            while !name.is_char_boundary(cut) {
                cut -= 1;
            }
            name.truncate(cut);
        }
        self.spans.push(Span {
            trace_id,
            span_id,
            parent_span_id,
            name,
            service: service.clone(),
            start_unix_nanos: start,
            end_unix_nanos: end,
        });
    }
}

fn service_of(resource: Option<&crate::otlp::Resource>) -> Arc<str> {
    use crate::otlp::common::any_value::Value;
    resource
        .into_iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == SERVICE_NAME_KEY)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            Value::StringValue(s) => Some(Arc::from(s.as_str())),
            _ => None,
        })
        .unwrap_or_else(|| Arc::from("unknown_service"))
}

/// Reads a protobuf `ExportTraceServiceRequest`.
pub fn decode(body: &[u8]) -> Result<Decoded, DecodeError> {
    let request = ExportTraceServiceRequest::decode(body).map_err(|e| {
        DecodeError(format!(
            "the body is not an OTLP ExportTraceServiceRequest: {e}"
        ))
    })?;
    let mut out = Decoded::default();
    for rs in request.resource_spans {
        let service = service_of(rs.resource.as_ref());
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(&service, s);
            }
        }
    }
    Ok(out)
}

// ------------------------------------------------------------------- JSON

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonRequest {
    #[serde(default, alias = "resource_spans")]
    resource_spans: Vec<JsonResourceSpans>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonResourceSpans {
    #[serde(default)]
    resource: Option<JsonResource>,
    #[serde(default, alias = "scope_spans")]
    scope_spans: Vec<JsonScopeSpans>,
}

#[derive(Deserialize)]
struct JsonResource {
    #[serde(default)]
    attributes: Vec<JsonKeyValue>,
}

#[derive(Deserialize)]
struct JsonKeyValue {
    key: String,
    #[serde(default)]
    value: Option<JsonAnyValue>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonAnyValue {
    #[serde(default, alias = "string_value")]
    string_value: Option<String>,
}

#[derive(Deserialize)]
struct JsonScopeSpans {
    #[serde(default)]
    spans: Vec<JsonSpan>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct JsonSpan {
    #[serde(default, alias = "trace_id")]
    trace_id: String,
    #[serde(default, alias = "span_id")]
    span_id: String,
    #[serde(default, alias = "parent_span_id")]
    parent_span_id: String,
    #[serde(default)]
    name: String,
    #[serde(default, alias = "start_time_unix_nano")]
    start_time_unix_nano: Option<JsonU64>,
    #[serde(default, alias = "end_time_unix_nano")]
    end_time_unix_nano: Option<JsonU64>,
}

/// OTLP JSON writes 64-bit integers as strings; numbers are accepted too.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonU64 {
    Number(u64),
    Text(String),
}

impl JsonU64 {
    fn get(&self) -> Option<u64> {
        match self {
            JsonU64::Number(n) => Some(*n),
            JsonU64::Text(s) => s.parse().ok(),
        }
    }
}

/// Lower- or upper-case hex to bytes; `None` when it is not hex.
pub fn from_hex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Reads an OTLP JSON `ExportTraceServiceRequest` (ids in hex, as OTLP JSON writes them).
pub fn decode_json(body: &[u8]) -> Result<Decoded, DecodeError> {
    let request: JsonRequest = serde_json::from_slice(body).map_err(|e| {
        DecodeError(format!(
            "the body is not an OTLP JSON ExportTraceServiceRequest: {e}"
        ))
    })?;
    let mut out = Decoded::default();
    for rs in request.resource_spans {
        let service: Arc<str> = rs
            .resource
            .iter()
            .flat_map(|r| &r.attributes)
            .find(|kv| kv.key == SERVICE_NAME_KEY)
            .and_then(|kv| kv.value.as_ref()?.string_value.as_deref())
            .map_or_else(|| Arc::from("unknown_service"), Arc::from);
        for ss in rs.scope_spans {
            for s in ss.spans {
                let (Some(trace_id), Some(span_id)) = (from_hex(&s.trace_id), from_hex(&s.span_id))
                else {
                    out.reject("a span's traceId and spanId must be hex");
                    continue;
                };
                out.push(
                    &service,
                    WireSpan {
                        trace_id,
                        span_id,
                        parent_span_id: from_hex(&s.parent_span_id).unwrap_or_default(),
                        name: s.name,
                        start_time_unix_nano: s
                            .start_time_unix_nano
                            .and_then(|t| t.get())
                            .unwrap_or(0),
                        end_time_unix_nano: s.end_time_unix_nano.and_then(|t| t.get()).unwrap_or(0),
                    },
                );
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::common::{AnyValue, KeyValue, any_value::Value};

    fn request() -> Vec<u8> {
        let resource = crate::otlp::Resource {
            attributes: vec![KeyValue {
                key: SERVICE_NAME_KEY.into(),
                value: Some(AnyValue {
                    value: Some(Value::StringValue("checkout".into())),
                }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let span = |t: u8, s: u8, name: &str| WireSpan {
            trace_id: vec![t; 16],
            span_id: vec![s; 8],
            parent_span_id: vec![],
            name: name.into(),
            start_time_unix_nano: 10,
            end_time_unix_nano: 20,
        };
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(resource),
                scope_spans: vec![ScopeSpans {
                    spans: vec![
                        span(1, 2, "GET /cart"),
                        span(0, 3, "zero trace"),
                        WireSpan {
                            span_id: vec![1, 2, 3],
                            ..span(1, 0, "short span id")
                        },
                        span(4, 5, &"n".repeat(1000)),
                    ],
                }],
            }],
        }
        .encode_to_vec()
    }

    #[test]
    fn protobuf_spans_keep_ids_name_service_and_times_and_bad_ones_are_counted() {
        let d = decode(&request()).unwrap();
        assert_eq!(d.spans.len(), 2, "{d:?}");
        assert_eq!(d.rejected, 2);
        assert!(!d.error_message.is_empty());
        let s = &d.spans[0];
        assert_eq!(s.trace_id, [1; 16]);
        assert_eq!(s.span_id, [2; 8]);
        assert_eq!(s.parent_span_id, [0; 8]);
        assert_eq!(s.name, "GET /cart");
        assert_eq!(&*s.service, "checkout");
        assert_eq!((s.start_unix_nanos, s.end_unix_nanos), (10, 20));
        assert_eq!(d.spans[1].name.len(), MAX_NAME_LEN);
        assert_eq!(d.response().partial_success.unwrap().rejected_spans, 2);
        assert!(decode(b"\x0a\xff\xff\xff\xff\x0f").is_err());
    }

    #[test]
    fn json_spans_read_like_protobuf_ones() {
        let body = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"checkout"}}]},
            "scopeSpans":[{"scope":{"name":"x"},"spans":[
              {"traceId":"0102030405060708090A0B0C0D0E0F10","spanId":"1112131415161718","parentSpanId":"","name":"GET /cart","kind":2,
               "startTimeUnixNano":"1700000000000000000","endTimeUnixNano":1700000000100000000,"attributes":[{"key":"a","value":{"intValue":"1"}}]},
              {"traceId":"zz","spanId":"1112131415161718"}]}]}]}"#;
        let d = decode_json(body).unwrap();
        assert_eq!(d.spans.len(), 1);
        assert_eq!(d.rejected, 1);
        let s = &d.spans[0];
        assert_eq!(s.trace_id[0], 1);
        assert_eq!(s.trace_id[15], 0x10);
        assert_eq!(s.span_id, [0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18]);
        assert_eq!(s.start_unix_nanos, 1_700_000_000_000_000_000);
        assert_eq!(s.end_unix_nanos, 1_700_000_000_100_000_000);
        assert_eq!(&*s.service, "checkout");
        assert!(decode_json(b"[1,2]").is_err());
    }
}
