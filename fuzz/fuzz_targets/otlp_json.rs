//! OTLP profiles requests as OTLP JSON (OTLP/HTTP `application/json`, or
//! a Kafka record): decoded, then split and checked as protobuf requests
//! are. What decodes is written as JSON again and reads back the same.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_model::otlp::json;

fuzz_target!(|data: &[u8]| {
    if let Ok(request) = json::decode_request(data) {
        let written = json::encode_request(&request);
        let back = json::decode_request(&written).expect("JSON written of a request does not read");
        assert!(back == request, "a request changed on its way through JSON");
    }
    match proflow_receivers::otlp::fuzzing::export(data, true, false) {
        Ok(split) => proflow_fuzz::check_otlp_split(&split),
        Err(message) => assert!(!message.is_empty(), "a refusal without a reason"),
    }
});
