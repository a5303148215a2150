//! Config text through YAML parsing, env expansion and the top-level document.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = proflow_config::Document::parse_with_env(text, &|_| Some("x".into()));
    }
});
