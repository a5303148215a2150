//! Spans: the traces side input of processors that correlate profiles with
//! traces (`trace_link`'s span index). proflow does not export traces; a
//! receiver in a `traces` pipeline decodes what it needs of each span and
//! hands the spans to the [`SpanConsumer`]s of that pipeline's processors.
//!
//! A protobuf `ExportTraceServiceRequest` is read on the wire
//! ([`crate::wire`]), with the trace protocol's field numbers: of each span
//! only the ids, the name and the times, and of each resource only its
//! `service.name` attribute. Everything else (attributes, events, links,
//! status, scopes) is skipped without being decoded or allocated. Names and
//! service names are cut at [`MAX_NAME_LEN`] bytes before they are copied.
//! OTLP JSON is parsed with serde into the same [`Span`]s.

use std::sync::Arc;

use prost::Message;
use serde::Deserialize;

use crate::model::UNKNOWN_SERVICE;
use crate::otlp::{SERVICE_NAME_KEY, id_from_hex};
use crate::wire::{self, Value};

/// Longest span or service name kept (longer ones are cut at a character
/// boundary).
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

/// Takes spans a receiver accepted. Called on the receiver's task (or its
/// blocking pool for large requests): it must not block for long (an index
/// insert under a short lock is the intent).
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

    /// Adds a span, or counts it refused.
    fn push(&mut self, service: &Arc<str>, ids: Ids, name: &str, start: u64, end: u64) {
        let (Ok(trace_id), Ok(span_id)) = (
            <[u8; 16]>::try_from(ids.trace),
            <[u8; 8]>::try_from(ids.span),
        ) else {
            return self.reject("a span's trace_id must be 16 bytes and its span_id 8");
        };
        if trace_id == [0; 16] || span_id == [0; 8] {
            return self.reject("a span's trace_id and span_id must not be all zero");
        }
        self.spans.push(Span {
            trace_id,
            span_id,
            parent_span_id: <[u8; 8]>::try_from(ids.parent).unwrap_or([0; 8]),
            name: cut(name).to_owned(),
            service: service.clone(),
            start_unix_nanos: start,
            end_unix_nanos: end,
        });
    }
}

/// A span's ids as they arrived.
#[derive(Clone, Copy, Default)]
struct Ids<'a> {
    trace: &'a [u8],
    span: &'a [u8],
    parent: &'a [u8],
}

/// `text` cut to [`MAX_NAME_LEN`] bytes at a character boundary.
fn cut(text: &str) -> &str {
    if text.len() <= MAX_NAME_LEN {
        return text;
    }
    let mut at = MAX_NAME_LEN;
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    &text[..at]
}

fn bad(e: wire::WireError) -> DecodeError {
    DecodeError(format!(
        "the body is not an OTLP ExportTraceServiceRequest: {e}"
    ))
}

fn utf8<'a>(bytes: &'a [u8], what: &str) -> Result<&'a str, DecodeError> {
    std::str::from_utf8(bytes).map_err(|_| DecodeError(format!("a {what} is not UTF-8")))
}

/// The `service.name` of a `Resource` message: its attributes (field 1,
/// `KeyValue{key=1, value=2: AnyValue{string_value=1}}`) are walked, none
/// decoded.
fn service_of(resource: &[u8]) -> Result<Option<Arc<str>>, DecodeError> {
    for f in wire::fields(resource) {
        let (1, Value::Bytes(kv)) = f.map_err(bad)? else {
            continue;
        };
        let mut key: &[u8] = &[];
        let mut value: &[u8] = &[];
        for f in wire::fields(kv) {
            match f.map_err(bad)? {
                (1, Value::Bytes(k)) => key = k,
                (2, Value::Bytes(v)) => value = v,
                _ => {}
            }
        }
        if key != SERVICE_NAME_KEY.as_bytes() {
            continue;
        }
        for f in wire::fields(value) {
            if let (1, Value::Bytes(s)) = f.map_err(bad)? {
                return Ok(Some(Arc::from(cut(utf8(s, "service.name")?))));
            }
        }
    }
    Ok(None)
}

/// Reads one `Span` message (trace_id=1, span_id=2, parent_span_id=4,
/// name=5, start=7 and end=8 fixed64) into `out`.
fn read_span(bytes: &[u8], service: &Arc<str>, out: &mut Decoded) -> Result<(), DecodeError> {
    let mut ids = Ids::default();
    let mut name: &[u8] = &[];
    let (mut start, mut end) = (0, 0);
    for f in wire::fields(bytes) {
        match f.map_err(bad)? {
            (1, Value::Bytes(v)) => ids.trace = v,
            (2, Value::Bytes(v)) => ids.span = v,
            (4, Value::Bytes(v)) => ids.parent = v,
            (5, Value::Bytes(v)) => name = v,
            (7, Value::Fixed64(v)) => start = v,
            (8, Value::Fixed64(v)) => end = v,
            _ => {}
        }
    }
    out.push(service, ids, utf8(name, "span name")?, start, end);
    Ok(())
}

/// The fewest bytes an accepted span takes on the wire: its trace id and
/// span id fields (a tag, a length and 16 or 8 bytes).
const MIN_SPAN_WIRE: usize = 2 + 16 + 2 + 8;

/// An upper bound of the memory [`decode`] allocates for `body`: at most
/// one span per [`MIN_SPAN_WIRE`] bytes (in a vector that may have
/// doubled), names copied from the body, known before decoding.
pub fn decode_cost(body: &[u8]) -> usize {
    let spans = body.len() / MIN_SPAN_WIRE + 1;
    spans
        .saturating_mul(2 * std::mem::size_of::<Span>())
        .saturating_add(body.len())
        .saturating_add(crate::json_shape::BASE)
}

/// Reads a protobuf `ExportTraceServiceRequest` (resource_spans=1:
/// {resource=1, scope_spans=2: {spans=2}}).
pub fn decode(body: &[u8]) -> Result<Decoded, DecodeError> {
    let mut out = Decoded::default();
    let unknown: Arc<str> = Arc::from(UNKNOWN_SERVICE);
    for f in wire::fields(body) {
        let (1, Value::Bytes(rs)) = f.map_err(bad)? else {
            continue;
        };
        // The resource may come after its spans on the wire: find it first.
        let mut service = None;
        for f in wire::fields(rs) {
            if let (1, Value::Bytes(resource)) = f.map_err(bad)? {
                service = service_of(resource)?;
            }
        }
        let service = service.unwrap_or_else(|| unknown.clone());
        for f in wire::fields(rs) {
            let (2, Value::Bytes(ss)) = f.map_err(bad)? else {
                continue;
            };
            for f in wire::fields(ss) {
                if let (2, Value::Bytes(span)) = f.map_err(bad)? {
                    read_span(span, &service, &mut out)?;
                }
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

/// An upper bound of the memory [`decode_json`] allocates for `body` (the
/// request's structs and the spans made from them), known before decoding.
pub fn json_decode_cost(body: &[u8]) -> usize {
    use std::mem::size_of;
    let largest = [
        size_of::<JsonResourceSpans>(),
        size_of::<JsonResource>(),
        size_of::<JsonKeyValue>(),
        size_of::<JsonAnyValue>(),
        size_of::<JsonScopeSpans>(),
        size_of::<JsonSpan>(),
    ]
    .into_iter()
    .max()
    .unwrap_or(0);
    let shape = crate::json_shape::JsonShape::scan(body);
    // Each object is one struct and perhaps a span; a scalar may be
    // buffered (untagged numbers); strings are copied into the structs and
    // the spans' names.
    shape
        .built_bytes(largest + size_of::<Span>(), 32)
        .saturating_add(shape.string_bytes)
        .saturating_add(crate::json_shape::BASE)
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
            .map_or_else(|| Arc::from(UNKNOWN_SERVICE), |s| Arc::from(cut(s)));
        for ss in rs.scope_spans {
            for s in ss.spans {
                let (Some(trace), Some(span)) =
                    (id_from_hex::<16>(&s.trace_id), id_from_hex::<8>(&s.span_id))
                else {
                    out.reject("a span's traceId must be 32 hex digits and its spanId 16");
                    continue;
                };
                let parent = id_from_hex::<8>(&s.parent_span_id).unwrap_or_default();
                let ids = Ids {
                    trace: &trace,
                    span: &span,
                    parent: &parent,
                };
                let start = s.start_time_unix_nano.and_then(|t| t.get()).unwrap_or(0);
                let end = s.end_time_unix_nano.and_then(|t| t.get()).unwrap_or(0);
                out.push(&service, ids, &s.name, start, end);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::common::{AnyValue, KeyValue, any_value::Value as Any};

    // The request side, to build test requests with prost.
    #[derive(Clone, PartialEq, Message)]
    struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        resource: Option<crate::otlp::Resource>,
        #[prost(message, repeated, tag = "2")]
        scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct ScopeSpans {
        #[prost(message, repeated, tag = "2")]
        spans: Vec<WireSpan>,
    }
    #[derive(Clone, PartialEq, Message)]
    struct WireSpan {
        #[prost(bytes = "vec", tag = "1")]
        trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        name: String,
        #[prost(fixed64, tag = "7")]
        start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        end_time_unix_nano: u64,
    }

    fn request() -> Vec<u8> {
        let resource = crate::otlp::Resource {
            attributes: vec![KeyValue {
                key: SERVICE_NAME_KEY.into(),
                value: Some(AnyValue {
                    value: Some(Any::StringValue("checkout".into())),
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
        // A service name is cut like a span name; a name that is not UTF-8
        // refuses the request.
        let mut r = ExportTraceServiceRequest::decode(request().as_slice()).unwrap();
        let rs = &mut r.resource_spans[0];
        rs.resource.as_mut().unwrap().attributes[0].value = Some(AnyValue {
            value: Some(Any::StringValue("s".repeat(1000))),
        });
        assert_eq!(
            decode(&r.encode_to_vec()).unwrap().spans[0].service.len(),
            MAX_NAME_LEN
        );
        let mut bytes = r.encode_to_vec();
        let at = bytes.windows(9).position(|w| w == b"GET /cart").unwrap();
        bytes[at] = 0xff;
        assert!(decode(&bytes).unwrap_err().0.contains("UTF-8"));
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
