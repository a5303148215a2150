//! `/ingest` requests: the bytes up to the first NUL are the query string, the rest the body.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let query = String::from_utf8_lossy(&data[..split]);
    let body = data.get(split + 1..).unwrap_or(&[]);
    proflow_receivers::pprof_push::fuzzing::ingest(&query, body);
});
