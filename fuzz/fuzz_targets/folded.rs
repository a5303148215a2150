//! Folded (`a;b;c 12`) and `lines` text bodies: the first byte picks the
//! format (bit 0) and a sample rate (the rest); the profile made of the text
//! has a sample per distinct stack, no negative value, and survives its own
//! encoding.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let lines = first & 1 == 1;
    let sample_rate = u32::from(first >> 1) * 10;
    let Ok(profile) = proflow_receivers::pprof_push::fuzzing::folded(body, lines, sample_rate)
    else {
        assert!(!lines, "lines bodies have no counts to refuse");
        return;
    };
    assert_eq!(profile.sample_type.len(), 1);
    let lines_in_body = body.split(|&b| b == b'\n').count();
    assert!(
        profile.sample.len() <= lines_in_body,
        "more stacks than lines"
    );
    for s in &profile.sample {
        assert_eq!(s.value.len(), 1);
        assert!(s.value[0] >= 0, "a negative sample value");
    }
    proflow_fuzz::check_pprof_roundtrip(&profile);
});
