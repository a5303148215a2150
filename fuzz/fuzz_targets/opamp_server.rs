//! What an OpAMP server sends over WebSocket (or, without the header, as a
//! plain HTTP answer): a `ServerToAgent` message, and the remote config's
//! text taken out of it. Never a panic; the text, when there is one, is
//! the body of one of the message's config files.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_opamp::transport::decode_ws;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = decode_ws(data) else {
        return;
    };
    if let Some(remote) = msg.remote_config {
        let bodies: Vec<Vec<u8>> = remote
            .config
            .iter()
            .flat_map(|c| c.config_map.values())
            .map(|f| f.body.clone())
            .collect();
        if let Ok(text) = proflow_opamp::config_text(remote) {
            assert!(bodies.iter().any(|b| b == text.as_bytes()));
        }
    }
});
