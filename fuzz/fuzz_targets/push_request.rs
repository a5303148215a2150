//! Connect Push bodies: the first byte picks JSON or binary protobuf.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((first, body)) = data.split_first() {
        proflow_receivers::pprof_push::fuzzing::push(first & 1 == 1, body);
    }
});
