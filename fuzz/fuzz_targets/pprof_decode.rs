//! pprof bytes (plain or gzip) through the metadata scan and the full decode.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_pipeline::pprof;

fuzz_target!(|data: &[u8]| {
    let _ = pprof::scan_metadata(data, 1 << 20);
    let bytes = bytes::Bytes::copy_from_slice(data);
    if let Ok(p) = pprof::decode(&bytes, 1 << 20) {
        for _ in pprof::stacks_root_first(&p) {}
    }
});
