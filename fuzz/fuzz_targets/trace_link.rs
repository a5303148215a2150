//! pprof profiles through the `trace_link` processor, which reads and
//! rewrites their sample labels on the protobuf wire without decoding them.
//! The first byte: bit 0 `drop_span_labels_after_link`, bit 1 the profile
//! arrives as OTLP (converted from the pprof first). The rest is pprof
//! bytes. Whatever it writes of a profile that decodes still decodes, with
//! the same samples (stacks and values), sample types and string table
//! (strings are only appended); its OTLP form decodes too.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use proflow_fuzz::LIMIT;
use proflow_model::model::{Envelope, Format, Labels, Payload};
use proflow_model::otlp::{self, Lost};
use proflow_model::pprof;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, bytes)) = data.split_first() else {
        return;
    };
    let drop_after_link = flags & 1 == 1;
    let as_otlp = flags & 2 == 2;
    let bytes = Bytes::copy_from_slice(bytes);
    let before = pprof::decode(&bytes, LIMIT).ok();
    let mut payload = Payload::from_bytes(bytes, LIMIT);
    if as_otlp {
        let Ok(converted) = payload.with_form(Format::Otlp, &mut Lost::default()) else {
            return;
        };
        let Ok(o) = converted.otlp() else {
            return;
        };
        payload = Payload::from_otlp((*o).clone());
    }
    let labels = Labels::from_pairs([("service_name", "shop")]);
    let envelope = Envelope {
        labels: labels.clone(),
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        sample_types: Vec::new(),
        period_type: None,
        period: 0,
        payload,
    };
    let out = proflow_processors::trace_link::fuzzing::process(vec![envelope], drop_after_link);
    assert_eq!(out.len(), 1, "the processor added or lost an envelope");
    let e = &out[0];
    assert_eq!(e.labels, labels, "series labels changed");
    if e.payload.has(Format::Otlp) {
        let o = e.payload.otlp().expect("an OTLP form that is not there");
        o.dictionary
            .decoded()
            .expect("a written dictionary does not decode");
        otlp::decode_all(&o.profiles).expect("a written OTLP profile does not decode");
    }
    let (Some(before), false) = (before, as_otlp) else {
        return;
    };
    let after = e
        .payload
        .decoded()
        .expect("a profile that decoded does not after the processor");
    assert_eq!(after.sample_type, before.sample_type);
    assert_eq!(
        after.sample.len(),
        before.sample.len(),
        "samples added or lost"
    );
    assert!(
        after.string_table.starts_with(&before.string_table),
        "strings changed, not appended"
    );
    for (a, b) in after.sample.iter().zip(&before.sample) {
        assert_eq!(
            (&a.location_id, &a.value),
            (&b.location_id, &b.value),
            "a sample's stack or values changed"
        );
    }
});
