//! OTLP profiles requests as protobuf, the way the `otlp` receiver takes
//! them (gRPC, or OTLP/HTTP with bit 0 of the first byte saying
//! `Content-Encoding: gzip`): inflated within its limit, checked on the
//! wire, split into one envelope per profile. What is taken converts to
//! pprof and is written again whole; every profile of a request that
//! decodes is either an envelope or counted as refused.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_model::otlp::collector::ExportProfilesServiceRequest;
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let gzip = flags & 1 == 1;
    let split = match proflow_receivers::otlp::fuzzing::export(body, false, gzip) {
        Ok(split) => split,
        Err(message) => {
            assert!(!message.is_empty(), "a refusal without a reason");
            return;
        }
    };
    proflow_fuzz::check_otlp_split(&split);
    if gzip {
        return;
    }
    if let Ok(request) = ExportProfilesServiceRequest::decode(body) {
        let profiles: usize = request
            .resource_profiles
            .iter()
            .flat_map(|r| &r.scope_profiles)
            .map(|s| s.profiles.len())
            .sum();
        assert_eq!(
            split.envelopes.len() as u64 + split.rejected,
            profiles as u64,
            "profiles lost: neither taken nor refused"
        );
    }
});
