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
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
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

/// The gzip pprof bytes of [`cpu_profile`].
pub fn cpu_profile_gzip(samples: usize, functions: usize) -> bytes::Bytes {
    pprof::gzip(&pprof::encode(&cpu_profile(samples, functions)))
}

/// The typical ~4 KB gzip CPU profile used by benchmarks and the load tool.
pub fn typical_cpu_profile_gzip() -> bytes::Bytes {
    cpu_profile_gzip(TYPICAL_SAMPLES, TYPICAL_FUNCTIONS)
}
