//! The bound of what decoding OTLP JSON takes ([`json::decode_cost`],
//! [`spans::json_decode_cost`]) against the peak a counting global allocator
//! sees while decoding: it must hold for ordinary requests and for hostile
//! ones (arrays of empty objects, objects of one member, long strings, deep
//! nesting), or the memory budget built on it bounds nothing.
//!
//! Its own test binary because it installs a global allocator ([`counting`]).

mod counting;

use proflow_model::otlp::{self, AttributeLabels, json};
use proflow_model::{spans, testdata};

/// The most the heap grew while `work` ran.
fn peak_of<T>(work: impl FnOnce() -> T) -> (T, usize) {
    let (out, _, peak) = counting::measure(work);
    (out, peak)
}

/// A profiles request whose one profile's `samples` are `sample` repeated.
fn samples_doc(sample: &str, n: usize) -> String {
    let samples = vec![sample; n].join(",");
    format!(
        r#"{{"resourceProfiles":[{{"scopeProfiles":[{{"profiles":[{{"samples":[{samples}]}}]}}]}}],"dictionary":{{"stringTable":[""]}}}}"#
    )
}

fn check_profiles(what: &str, doc: &[u8]) -> (f64, f64) {
    // The bound's own scan counts too: it runs before anything is granted.
    let (bound, peak) = peak_of(|| {
        let bound = json::decode_cost(doc);
        let _ = json::decode_request(doc)
            .ok()
            .map(|r| otlp::split_decoded(r, &AttributeLabels::default()));
        bound
    });
    assert!(
        peak <= bound,
        "{what}: decoding took {peak} bytes at its peak, more than the bound {bound} ({} bytes of JSON)",
        doc.len()
    );
    let len = doc.len().max(1) as f64;
    (bound as f64 / len, peak as f64 / len)
}

#[test]
fn the_profiles_bound_holds_for_ordinary_and_hostile_requests() {
    // An ordinary request: what the Collector's OTLP/HTTP exporter sends.
    let ordinary = json::encode_request(&testdata::otlp_request(4, 200, 50));
    let (ratio, peak) = check_profiles("ordinary", &ordinary);
    eprintln!(
        "ordinary request: {} bytes, bound {ratio:.1}x its size, peak {peak:.1}x",
        ordinary.len(),
    );
    assert!(
        ratio < 2.5 * peak,
        "an ordinary request is not charged far beyond what it takes: bound {ratio:.1}x, peak {peak:.1}x"
    );
    for (what, doc) in [
        ("empty samples", samples_doc("{}", 50_000)),
        (
            "one-member samples",
            samples_doc(r#"{"stackIndex":1}"#, 30_000),
        ),
        (
            "unknown members",
            samples_doc(r#"{"x":1,"y":2,"z":3,"w":4,"v":5,"u":6}"#, 10_000),
        ),
        (
            "values",
            samples_doc(
                &format!(r#"{{"values":[{}]}}"#, vec![r#""7""#; 5_000].join(",")),
                20,
            ),
        ),
        (
            "long strings",
            format!(
                r#"{{"dictionary":{{"stringTable":[{}]}}}}"#,
                vec![format!("\"{}\"", "s".repeat(10_000)); 200].join(",")
            ),
        ),
        (
            "nested arrays",
            format!("{}{}", "[".repeat(120), "]".repeat(120)),
        ),
        ("empty", String::new()),
    ] {
        let (ratio, peak) = check_profiles(what, doc.as_bytes());
        eprintln!(
            "{what}: {} bytes, bound {ratio:.1}x, peak {peak:.1}x",
            doc.len()
        );
    }
}

#[test]
fn the_spans_bound_holds_for_ordinary_and_hostile_requests() {
    let span = r#"{"traceId":"0af7651916cd43dd8448eb211c80319c","spanId":"b7ad6b7169203331","name":"GET /api","startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000100000000"}"#;
    let doc = |spans: &str| {
        format!(
            r#"{{"resourceSpans":[{{"resource":{{"attributes":[{{"key":"service.name","value":{{"stringValue":"api"}}}}]}},"scopeSpans":[{{"spans":[{spans}]}}]}}]}}"#
        )
    };
    for (what, body) in [
        ("ordinary", doc(&vec![span; 2_000].join(","))),
        ("empty spans", doc(&vec!["{}"; 50_000].join(","))),
        (
            "empty resources",
            format!(r#"{{"resourceSpans":[{}]}}"#, vec!["{}"; 50_000].join(",")),
        ),
    ] {
        let (bound, peak) = peak_of(|| {
            let bound = spans::json_decode_cost(body.as_bytes());
            let _ = spans::decode_json(body.as_bytes());
            bound
        });
        assert!(
            peak <= bound,
            "{what}: decoding took {peak} bytes at its peak, more than the bound {bound}"
        );
        eprintln!(
            "spans {what}: {} bytes, bound {:.1}x, peak {:.1}x",
            body.len(),
            bound as f64 / body.len() as f64,
            peak as f64 / body.len() as f64
        );
    }
}

/// A protobuf field of bytes: tag, length, the bytes.
fn field(number: u8, bytes: &[u8]) -> Vec<u8> {
    let mut out = vec![(number << 3) | 2];
    let mut len = bytes.len();
    while len >= 0x80 {
        out.push((len as u8) | 0x80);
        len >>= 7;
    }
    out.push(len as u8);
    out.extend_from_slice(bytes);
    out
}

#[test]
fn the_protobuf_spans_bound_holds_for_the_smallest_spans() {
    // Spans of nothing but their ids: the most spans a body can carry.
    let mut span = field(1, &[7; 16]);
    span.extend(field(2, &[9; 8]));
    for (what, spans) in [
        ("smallest", field(2, &span)),
        ("named", {
            let mut named = span.clone();
            named.extend(field(5, &[b'n'; 300]));
            field(2, &named)
        }),
    ] {
        let scope = spans.repeat(20_000);
        let body = field(1, &field(2, &scope));
        let bound = spans::decode_cost(&body);
        let (decoded, peak) = peak_of(|| spans::decode(&body));
        assert_eq!(decoded.unwrap().spans.len(), 20_000);
        assert!(
            peak <= bound,
            "{what}: decoding took {peak} bytes at its peak, more than the bound {bound}"
        );
        eprintln!(
            "protobuf spans {what}: {} bytes, bound {:.1}x, peak {:.1}x",
            body.len(),
            bound as f64 / body.len() as f64,
            peak as f64 / body.len() as f64
        );
    }
}

/// Any JSON value, nested a few levels, with OTLP's names among its keys.
fn any_json() -> impl proptest::strategy::Strategy<Value = serde_json::Value> {
    use proptest::prelude::*;
    use serde_json::Value;
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        "[a-z0-9]{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 400, 12, |inner| {
        let key = prop_oneof![
            Just("resourceProfiles".to_owned()),
            Just("scopeProfiles".to_owned()),
            Just("profiles".to_owned()),
            Just("samples".to_owned()),
            Just("values".to_owned()),
            Just("dictionary".to_owned()),
            Just("stringTable".to_owned()),
            Just("locationTable".to_owned()),
            Just("resourceSpans".to_owned()),
            Just("scopeSpans".to_owned()),
            Just("spans".to_owned()),
            "[a-z]{1,8}",
        ];
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..12).prop_map(Value::Array),
            proptest::collection::btree_map(key, inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest::proptest! {
    #[test]
    fn the_bounds_hold_for_any_document(doc in any_json()) {
        let text = serde_json::to_vec(&doc).unwrap();
        let bound = json::decode_cost(&text);
        let (_, peak) = peak_of(|| {
            json::decode_request(&text)
                .ok()
                .map(|r| otlp::split_decoded(r, &AttributeLabels::default()))
        });
        proptest::prop_assert!(peak <= bound, "profiles: peak {} > bound {} for {}", peak, bound, String::from_utf8_lossy(&text));
        let bound = spans::json_decode_cost(&text);
        let (_, peak) = peak_of(|| spans::decode_json(&text));
        proptest::prop_assert!(peak <= bound, "spans: peak {} > bound {} for {}", peak, bound, String::from_utf8_lossy(&text));
    }
}
