use super::*;
use proflow_model::pprof::{self, ProfileBuilder};

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
fn decoding_is_bounded_before_it_starts() {
    let typical = request(
        &[("__name__", "process_cpu"), ("service_name", "app")],
        vec![cpu_profile(1)],
    );
    let proto = typical.encode_to_vec();
    let cost = decode_cost(Codec::Proto, &proto);
    assert!(
        cost >= proto.len() && cost < 16 * 1024 + proto.len(),
        "{cost}"
    );
    // Empty labels are two bytes each on the wire and a struct each decoded.
    let json = format!(
        r#"{{"series":[{{"labels":[{}]}}]}}"#,
        vec!["{}"; 120].join(",")
    );
    let cost = decode_cost(Codec::Json, json.as_bytes());
    assert!(
        cost >= 120 * std::mem::size_of::<LabelPair>() + json.len(),
        "{cost} for {} bytes",
        json.len()
    );
}

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
    let batch = to_batch(req, &mut DecompressBudget::new(1 << 20), 7).unwrap();
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
    assert_eq!(
        e.sample_types[1],
        proflow_model::model::ValueType::new("cpu", "nanoseconds")
    );
    assert_eq!(
        e.period_type,
        Some(proflow_model::model::ValueType::new("cpu", "nanoseconds"))
    );
    assert_eq!(e.period, 10_000_000);
    assert_eq!(e.payload.encoded().unwrap().bytes, raw);
    assert!(e.payload.encoded().unwrap().gzipped);
    assert!(!e.payload.is_decoded());
    // The plain bytes the check inflated go along for the processors.
    for e in &batch {
        assert!(e.payload.has_plain());
        assert_eq!(e.payload.plain().unwrap(), cpu_profile(T));
    }
}

#[test]
fn missing_labels_are_inferred() {
    let batch = to_batch(
        request(&[], vec![cpu_profile(0)]),
        &mut DecompressBudget::new(1 << 20),
        7,
    )
    .unwrap();
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
        &mut DecompressBudget::new(1 << 20),
        7,
    )
    .unwrap();
    assert_eq!(batch[0].start_unix_nanos, 7);
}

#[test]
fn bad_requests() {
    let err = to_batch(
        PushRequest { series: vec![] },
        &mut DecompressBudget::new(1 << 20),
        0,
    )
    .unwrap_err();
    assert!(err.error.to_string().contains("no profiles"));
    let err = to_batch(
        request(&[("bad-name", "x")], vec![cpu_profile(T)]),
        &mut DecompressBudget::new(1 << 20),
        0,
    )
    .unwrap_err();
    assert!(err.error.to_string().contains("bad-name"), "{}", err.error);
    assert_eq!(err.profiles, 1);
    let err = to_batch(
        request(&[], vec![Bytes::from_static(b"\xff\xff")]),
        &mut DecompressBudget::new(1 << 20),
        0,
    )
    .unwrap_err();
    assert!(
        err.error.to_string().contains("series 0 profile 0"),
        "{}",
        err.error
    );
    let err = to_batch(
        request(&[], vec![Bytes::new()]),
        &mut DecompressBudget::new(1 << 20),
        0,
    )
    .unwrap_err();
    assert!(
        err.error.to_string().contains("no sample types"),
        "{}",
        err.error
    );
    let bomb = pprof::gzip(&vec![0u8; 1 << 16]);
    let err = to_batch(
        request(&[], vec![bomb]),
        &mut DecompressBudget::new(1 << 10),
        0,
    )
    .unwrap_err();
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

/// A PushRequest of `series` series, each with `labels` labels and
/// `samples` empty samples (2 bytes each on the wire).
fn shaped(series: usize, labels: usize, samples: usize) -> PushRequest {
    PushRequest {
        series: (0..series)
            .map(|_| RawProfileSeries {
                labels: (0..labels)
                    .map(|i| LabelPair {
                        name: format!("l{i}"),
                        value: "v".into(),
                    })
                    .collect(),
                samples: vec![RawSample::default(); samples],
            })
            .collect(),
    }
}

/// The same shape in proto3 JSON, with `{}` for every element.
fn shaped_json(series: usize, labels: usize, samples: usize) -> Bytes {
    let list = |item: &str, n: usize| vec![item; n].join(",");
    let one = format!(
        r#"{{"labels":[{}],"samples":[{}]}}"#,
        list("{}", labels),
        list("{}", samples)
    );
    Bytes::from(format!(r#"{{"series":[{}]}}"#, list(&one, series)))
}

fn refused_with(codec: Codec, body: Bytes, needle: &str) {
    let err = decode_request(codec, body).unwrap_err();
    assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST, "{err}");
    assert!(err.to_string().contains(needle), "{codec:?}: {err}");
}

#[test]
fn item_counts_are_capped_in_both_codecs() {
    let cases = [
        // (series, labels, samples), what the refusal names
        ((MAX_SERIES_PER_REQUEST + 1, 0, 0), "more than 1000 series"),
        ((1, 0, MAX_SAMPLES_PER_SERIES + 1), "more than 1000 samples"),
        ((11, 0, 1_000), "more than 10000 samples"),
        ((1, MAX_LABELS_PER_SERIES + 1, 1), "more than 128 labels"),
    ];
    for ((series, labels, samples), needle) in cases {
        let proto = Bytes::from(shaped(series, labels, samples).encode_to_vec());
        refused_with(Codec::Proto, proto, needle);
        refused_with(Codec::Json, shaped_json(series, labels, samples), needle);
    }
    // Right at the limits both codecs decode.
    for (series, labels, samples) in [
        (MAX_SERIES_PER_REQUEST, 0, 0),
        (10, MAX_LABELS_PER_SERIES, MAX_SAMPLES_PER_SERIES),
    ] {
        let want = shaped(series, labels, samples);
        let proto = Bytes::from(want.encode_to_vec());
        assert_eq!(decode_request(Codec::Proto, proto).unwrap(), want);
        let json = decode_request(Codec::Json, shaped_json(series, labels, samples)).unwrap();
        assert_eq!(json.series.len(), series);
        assert_eq!(json.series[0].labels.len(), labels);
        assert_eq!(json.series[0].samples.len(), samples);
    }
    // A request built by hand is held to the same limits.
    let err = to_batch(
        shaped(1, 0, MAX_SAMPLES_PER_SERIES + 1),
        &mut DecompressBudget::new(1 << 20),
        0,
    )
    .unwrap_err();
    assert!(
        err.error.to_string().contains("1000 samples"),
        "{}",
        err.error
    );
}

#[test]
fn the_wire_walk_refuses_before_decoding() {
    // 2-byte empty series past the cap, then framing prost would reject.
    let mut wire = [0x0a, 0x00].repeat(MAX_SERIES_PER_REQUEST + 1);
    wire.extend_from_slice(&[0x0a, 0xff]);
    refused_with(Codec::Proto, Bytes::from(wire), "1000 series");
    // Unknown fields of every wire type are skipped, not counted.
    let mut wire = vec![0x10, 0x01, 0x19, 0, 0, 0, 0, 0, 0, 0, 0, 0x25, 0, 0, 0, 0];
    wire.extend_from_slice(&[0x0a, 0x04, 0x1a, 0x02, 0x0a, 0x00]);
    let req = decode_request(Codec::Proto, Bytes::from(wire)).unwrap();
    assert_eq!(req.series.len(), 1);
    assert!(req.series[0].samples.is_empty());
    for bad in [&b"\x00\x00"[..], b"\x0b", b"\x0a\x05\x01", b"\x11\x00"] {
        refused_with(
            Codec::Proto,
            Bytes::copy_from_slice(bad),
            "malformed PushRequest",
        );
    }
    // JSON arrays that are neither arrays nor null are refused.
    refused_with(
        Codec::Json,
        Bytes::from_static(br#"{"series":{"labels":[]}}"#),
        "malformed JSON",
    );
}

#[test]
fn profiles_that_would_decode_too_large_are_refused() {
    // Samples with one empty label each decode to some 50 times their size.
    let crafted = Bytes::from([0x12, 0x02, 0x1a, 0x00].repeat(100_000));
    let err = to_batch(
        request(&[], vec![pprof::gzip(&crafted)]),
        &mut DecompressBudget::new(1 << 20),
        0,
    )
    .unwrap_err();
    assert_eq!(err.error.status(), axum::http::StatusCode::BAD_REQUEST);
    let message = err.error.to_string();
    assert!(message.starts_with("series 0 profile 0: "), "{message}");
    let limit = pprof::decoded_budget(crafted.len());
    assert!(
        message.contains(&format!("more than its limit of {limit} bytes")),
        "{message}"
    );
}

#[test]
fn profiles_share_the_request_budget() {
    let raw = pprof::gzip(&cpu_profile(T));
    let plain = pprof::scan_metadata(&raw, 1 << 20).unwrap().plain_size;
    let mut budget = DecompressBudget::new(2 * plain);
    to_batch(request(&[], vec![raw.clone(), raw.clone()]), &mut budget, 0).unwrap();
    assert_eq!(budget.remaining(), 0);
    let mut budget = DecompressBudget::new(2 * plain + plain / 2);
    let err = to_batch(request(&[], vec![raw.clone(); 3]), &mut budget, 0).unwrap_err();
    assert_eq!(
        err.error.status(),
        axum::http::StatusCode::PAYLOAD_TOO_LARGE
    );
    let message = err.error.to_string();
    assert!(message.contains("series 0 profile 2"), "{message}");
    assert!(
        message.contains(&format!(
            "max_decompressed_size ({} bytes)",
            2 * plain + plain / 2
        )),
        "{message}"
    );
    // Plain profiles inflate nothing.
    let mut budget = DecompressBudget::new(1 << 20);
    to_batch(request(&[], vec![cpu_profile(T); 3]), &mut budget, 0).unwrap();
    assert_eq!(budget.remaining(), 1 << 20);
}

proptest::proptest! {
    #[test]
    fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        for codec in [Codec::Proto, Codec::Json] {
            if let Ok(req) = decode_request(codec, Bytes::from(body.clone())) {
                let _ = to_batch(req, &mut DecompressBudget::new(4096), 0);
            }
        }
    }

    #[test]
    fn never_panics_on_random_profiles(raw in proptest::collection::vec(proptest::num::u8::ANY, 0..256)) {
        let wire = request(&[("service_name", "s")], vec![Bytes::from(raw)]).encode_to_vec();
        if let Ok(req) = decode_request(Codec::Proto, Bytes::from(wire)) {
            let _ = to_batch(req, &mut DecompressBudget::new(4096), 0);
        }
    }
}

#[test]
fn a_profile_of_no_sample_makes_no_envelope() {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds").time(T, 10_000_000_000);
    let empty = pprof::encode(&b.build());
    let labels = [("__name__", "process_cpu"), ("service_name", "app")];
    let mut budget = DecompressBudget::new(1 << 20);
    let batch = to_batch(
        request(&labels, vec![empty.clone(), cpu_profile(T)]),
        &mut budget,
        T,
    )
    .unwrap();
    assert_eq!(batch.len(), 1, "only the profile with a sample");
    let batch = to_batch(request(&labels, vec![empty]), &mut budget, T).unwrap();
    assert!(batch.is_empty());
}

#[test]
fn a_sender_cannot_name_the_tenant_by_label() {
    let labels = [
        ("__name__", "process_cpu"),
        ("service_name", "app"),
        (proflow_model::model::TENANT_LABEL, "someone-else"),
    ];
    let mut budget = DecompressBudget::new(1 << 20);
    let batch = to_batch(request(&labels, vec![cpu_profile(T)]), &mut budget, T).unwrap();
    assert_eq!(
        batch[0].labels.get(proflow_model::model::TENANT_LABEL),
        None
    );
    assert_eq!(batch[0].labels.get("service_name"), Some("app"));
}
