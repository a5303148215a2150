//! Config text through YAML parsing, env expansion and the top-level
//! document: a refusal always names at least one problem, and the same text
//! is refused for the same problems every time.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = |_: &str| Some("x".to_owned());
    match proflow_config::Document::parse_with_env(text, &env) {
        Ok(doc) => {
            let again = proflow_config::Document::parse_with_env(text, &env)
                .expect("the same text parsed once, then refused");
            assert_eq!(doc.receivers.len(), again.receivers.len());
        }
        Err(errors) => {
            assert!(!errors.0.is_empty(), "a refusal that names no problem");
            let again = proflow_config::Document::parse_with_env(text, &env)
                .expect_err("the same text refused once, then parsed");
            assert_eq!(errors, again, "the same text refused for other reasons");
        }
    }
});
