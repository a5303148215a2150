//! pprof bytes (plain or gzip) through the metadata scan and the full
//! decode: what decodes was scanned alike, holds no more heap than the scan
//! estimated (the bound that keeps a crafted profile from taking memory),
//! and encodes back to bytes that decode to it.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use proflow_fuzz::{LIMIT, check_pprof_roundtrip, pprof_heap};
use proflow_model::pprof;

fuzz_target!(|data: &[u8]| {
    let scanned = pprof::scan_metadata(data, LIMIT);
    let Ok(p) = pprof::decode(&Bytes::copy_from_slice(data), LIMIT) else {
        return;
    };
    let meta = scanned.expect("decode took a profile the scan refuses");
    assert_eq!(meta.sample_count, p.sample.len());
    let types: Vec<(String, String)> = p
        .sample_type
        .iter()
        .map(|t| (p.string(t.r#type).to_owned(), p.string(t.unit).to_owned()))
        .collect();
    assert_eq!(meta.sample_types, types);
    assert_eq!(
        (meta.period, meta.time_nanos, meta.duration_nanos),
        (p.period, p.time_nanos, p.duration_nanos)
    );
    let heap = pprof_heap(&p);
    assert!(
        heap <= meta.decoded_size,
        "decoded to {heap} bytes of heap; the scan estimated at most {}",
        meta.decoded_size
    );
    for (stack, _) in pprof::stacks_root_first(&p) {
        assert!(stack.len() <= p.location.len() * 64 + 64);
    }
    check_pprof_roundtrip(&p);
});
