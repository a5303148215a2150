//! JFR uploads as `/ingest?format=jfr` converts them (`pprof_push::jfr`): the
//! recording, and the agent's labels (a `LabelsSnapshot`) when the input is
//! cut in two (first byte odd: a 2-byte length, the labels, the recording).
//! What converts is one profile per kind of event, each with sample types,
//! every sample with as many values as types, and it survives its encoding.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, rest)) = data.split_first() else {
        return;
    };
    let (labels, recording) = if first & 1 == 1 {
        match proflow_fuzz::two_parts(rest) {
            Some(parts) => parts,
            None => return,
        }
    } else {
        (&[][..], rest)
    };
    let Ok(envelopes) = proflow_receivers::pprof_push::fuzzing::jfr(recording, labels) else {
        return;
    };
    let mut names = std::collections::BTreeSet::new();
    for e in &envelopes {
        proflow_fuzz::check_envelope(e);
        let profile = e.payload.decoded().expect("a converted profile");
        let profile = profile.as_ref();
        assert!(
            !profile.sample_type.is_empty(),
            "a profile without sample types"
        );
        for s in &profile.sample {
            assert_eq!(s.value.len(), profile.sample_type.len());
            assert!(!s.location_id.is_empty(), "a sample without frames");
        }
        let types: Vec<&str> = profile
            .sample_type
            .iter()
            .map(|t| profile.string(t.r#type))
            .collect();
        assert!(
            names.insert((e.labels.get("__name__").map(str::to_owned), types.join(","))),
            "two profiles of one kind"
        );
        proflow_fuzz::check_pprof_roundtrip(profile);
    }
});
