//! Synthetic profiles for benchmarks and tests: deterministic, shaped like a
//! real CPU profile (deep stacks over a few hundred functions).

use crate::pprof::{self, Profile, ProfileBuilder};

/// Samples of the typical profile: with [`TYPICAL_FUNCTIONS`] its gzip encoding
/// is about 4 KB (8.5 KB plain), a typical 10-second CPU push.
pub const TYPICAL_SAMPLES: usize = 60;
/// Distinct functions of the typical profile.
pub const TYPICAL_FUNCTIONS: usize = 100;

/// A CPU profile with `samples` stacks over `functions` function names.
pub fn cpu_profile(samples: usize, functions: usize) -> Profile {
    cpu_profile_of_stacks(samples, functions, 0x2545_f491_4f6c_dd1d)
}

/// A CPU profile like [`cpu_profile`] whose stacks are drawn from
/// `stacks_seed`: profiles of other seeds share the functions, not the
/// stacks.
pub fn cpu_profile_of_stacks(samples: usize, functions: usize, stacks_seed: u64) -> Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type("samples", "count")
        .sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_700_000_000_000_000_000, 10_000_000_000);
    let names: Vec<String> = (0..functions.max(1))
        .map(|i| {
            format!(
                "github.com/acme/service/pkg{}.(*Handler).Method{}",
                i % 17,
                i
            )
        })
        .collect();
    // A small LCG keeps the data deterministic without an RNG dependency.
    let mut x: u64 = stacks_seed;
    let mut next = |m: usize| {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (x >> 33) as usize % m
    };
    for _ in 0..samples {
        let depth = 8 + next(24);
        let stack: Vec<&str> = (0..depth)
            .map(|_| names[next(names.len())].as_str())
            .collect();
        let count = 1 + next(20) as i64;
        b.sample_root_first(stack, vec![count, count * 10_000_000]);
    }
    b.build()
}

/// The gzip pprof bytes of [`cpu_profile`], compressed as a stream at zlib's
/// fastest level (as Go's pprof writer does), not by [`pprof::gzip`]: the
/// bytes benchmarks push stay what they were before proflow's own
/// compressor changed.
pub fn cpu_profile_gzip(samples: usize, functions: usize) -> bytes::Bytes {
    let plain = pprof::encode(&cpu_profile(samples, functions));
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    // Writing to a Vec cannot fail.
    let _ = std::io::Write::write_all(&mut enc, &plain);
    bytes::Bytes::from(enc.finish().unwrap_or_default())
}

/// The typical ~4 KB gzip CPU profile used by benchmarks and the load tool.
pub fn typical_cpu_profile_gzip() -> bytes::Bytes {
    cpu_profile_gzip(TYPICAL_SAMPLES, TYPICAL_FUNCTIONS)
}

/// A CPU profile like [`cpu_profile`] whose stacks and values come from `seed`
/// (profiles of several services in one OTLP request differ this way).
pub fn cpu_profile_seeded(samples: usize, functions: usize, seed: u64) -> Profile {
    let mut p = cpu_profile(samples, functions);
    // Rotate the samples' values and stacks by the seed: same functions,
    // different totals per stack.
    let n = p.sample.len().max(1);
    let shift = (seed as usize) % n;
    p.sample.rotate_left(shift);
    for (i, s) in p.sample.iter_mut().enumerate() {
        let f = 1 + ((i as u64 + seed) % 7) as i64;
        for v in &mut s.value {
            *v *= f;
        }
    }
    p
}

/// An OTLP profiles request shaped like a real one: `services` resources
/// (`service.name` = `load-<i>`), each with one scope holding the two OTLP
/// profiles (samples/count and cpu/nanoseconds) of a synthetic CPU profile,
/// all sharing one dictionary.
pub fn otlp_request(
    services: usize,
    samples: usize,
    functions: usize,
) -> crate::otlp::collector::ExportProfilesServiceRequest {
    use crate::otlp::{self, common, proto};
    let mut dict = otlp::DictionaryBuilder::new();
    let mut lost = otlp::Lost::default();
    let mut resource_profiles = Vec::new();
    for i in 0..services.max(1) {
        let profile = cpu_profile_seeded(samples, functions, i as u64);
        let profiles = otlp::pprof_to_otlp(&profile, &mut dict, &mut lost).unwrap_or_default();
        resource_profiles.push(proto::ResourceProfiles {
            resource: Some(otlp::Resource {
                attributes: vec![common::KeyValue {
                    key: "service.name".to_owned(),
                    value: Some(common::AnyValue {
                        value: Some(common::any_value::Value::StringValue(format!("load-{i}"))),
                    }),
                    key_strindex: 0,
                }],
                ..Default::default()
            }),
            scope_profiles: vec![proto::ScopeProfiles {
                scope: Some(common::InstrumentationScope {
                    name: "proflow-load".to_owned(),
                    ..Default::default()
                }),
                profiles,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        });
    }
    otlp::collector::ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dict.finish()),
    }
}

/// A profile's stacks as folded text keys (root first, `;`-separated, by
/// each location's innermost function name) with the sum of their first
/// value: what tests compare profiles by.
pub fn folded_totals(p: &Profile) -> std::collections::BTreeMap<String, i64> {
    let name = |id: u64| -> &str {
        let Some(l) = p.location.iter().find(|l| l.id == id) else {
            return "";
        };
        let Some(line) = l.line.first() else {
            return "";
        };
        p.function
            .iter()
            .find(|f| f.id == line.function_id)
            .map(|f| p.string(f.name))
            .unwrap_or("")
    };
    let mut out = std::collections::BTreeMap::new();
    for s in &p.sample {
        let names: Vec<&str> = s.location_id.iter().rev().map(|id| name(*id)).collect();
        *out.entry(names.join(";")).or_default() += s.value.first().copied().unwrap_or(0);
    }
    out
}
