//! Connect Push bodies (`push.v1`): the first byte picks JSON or binary
//! protobuf; the body is decoded and made into envelopes as the receiver
//! does, and each envelope is checked.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((first, body)) = data.split_first() else {
        return;
    };
    if let Ok(envelopes) = proflow_receivers::pprof_push::fuzzing::push(first & 1 == 1, body) {
        envelopes.iter().for_each(proflow_fuzz::check_envelope);
    }
});
