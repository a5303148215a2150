//! `/ingest` requests: the bytes up to the first NUL are the query string,
//! the rest the body (pprof, folded, groups, lines, tree, trie, speedscope
//! or JFR, as the query's `format` says);
//! each envelope made is checked.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let query = String::from_utf8_lossy(&data[..split]);
    let body = data.get(split + 1..).unwrap_or(&[]);
    if let Ok(envelopes) = proflow_receivers::pprof_push::fuzzing::ingest(&query, body) {
        envelopes.iter().for_each(proflow_fuzz::check_envelope);
    }
});
