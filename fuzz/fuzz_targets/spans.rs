//! OTLP trace requests (the `otlp` receiver's traces, for `trace_link`):
//! bit 0 of the first byte picks OTLP JSON or protobuf. Every span kept has
//! ids that are not zero and names within the cut, refusals are counted with
//! their reason, and a protobuf request that decodes whole has each of its
//! spans either kept (with its ids, in order) or refused.
#![no_main]
use libfuzzer_sys::fuzz_target;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use proflow_model::spans::{self, MAX_NAME_LEN};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let json = flags & 1 == 1;
    let decoded = if json {
        spans::decode_json(body)
    } else {
        spans::decode(body)
    };
    let Ok(decoded) = decoded else {
        return;
    };
    assert_eq!(decoded.rejected == 0, decoded.error_message.is_empty());
    assert_eq!(
        decoded.response().partial_success.is_some(),
        decoded.rejected > 0
    );
    for s in &decoded.spans {
        assert_ne!(s.trace_id, [0; 16], "a span kept with a zero trace id");
        assert_ne!(s.span_id, [0; 8], "a span kept with a zero span id");
        assert!(s.name.len() <= MAX_NAME_LEN && s.service.len() <= MAX_NAME_LEN);
    }
    if json {
        return;
    }
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return;
    };
    let all: Vec<_> = request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .collect();
    assert_eq!(
        decoded.spans.len() + decoded.rejected,
        all.len(),
        "spans neither kept nor refused"
    );
    let kept = all
        .iter()
        .filter(|s| s.trace_id.len() == 16 && s.span_id.len() == 8);
    let kept = kept.filter(|s| s.trace_id != [0; 16] && s.span_id != [0; 8]);
    for (span, want) in decoded.spans.iter().zip(kept) {
        assert_eq!(span.trace_id.as_slice(), want.trace_id.as_slice());
        assert_eq!(span.span_id.as_slice(), want.span_id.as_slice());
        assert!(
            want.name.starts_with(&span.name),
            "a name other than the span's"
        );
    }
});
