//! `multipart/form-data` bodies of `/ingest`: the bytes up to the first
//! NUL are the Content-Type (boundary and all), the rest the body. The parts
//! read are each within the part limit, and bytes of the body.
#![no_main]
use libfuzzer_sys::fuzz_target;

/// The per-part limit (`max_request_body_size` for an uncompressed body).
const PART_LIMIT: usize = 512;

fuzz_target!(|data: &[u8]| {
    let split = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    let content_type = String::from_utf8_lossy(&data[..split]);
    let body = data.get(split + 1..).unwrap_or(&[]);
    let Ok((profile, config)) =
        proflow_receivers::pprof_push::fuzzing::multipart(&content_type, body, PART_LIMIT)
    else {
        return;
    };
    for part in [profile, config].into_iter().flatten() {
        assert!(
            part.len() <= PART_LIMIT,
            "a part of {} bytes passed the limit",
            part.len()
        );
        assert!(part.len() <= body.len(), "a part longer than the body");
    }
});
