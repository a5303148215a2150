//! The scan's decoded-size estimate ([`Metadata::decoded_size`]) against what
//! decoding really allocates, measured by a counting global allocator: the
//! estimate must be an upper bound for ordinary profiles, or the budget
//! built on it bounds nothing.
//!
//! Its own test binary because it installs a global allocator ([`counting`]).

mod counting;

use bytes::Bytes;
use proflow_model::pprof::{self, Profile};
use proflow_model::testdata;
use proptest::prelude::*;

/// The decompressed-size cap of these tests: larger than any profile here.
const LIMIT: usize = 1 << 30;

/// The heap the decoded profile of `plain` holds once decoding returns.
fn decoded_heap(plain: &Bytes) -> (Profile, usize) {
    // The first clone of a Bytes made from a Vec allocates its shared header;
    // done here so that what decode clones is counted to the input, not to it.
    let plain = plain.clone();
    let (profile, retained, _) =
        counting::measure(|| pprof::decode(&plain, LIMIT).expect("decode"));
    // Profile is returned by value; its own struct is on the stack.
    (profile, retained as usize + size_of::<Profile>())
}

fn check(plain: &Bytes) -> (usize, usize) {
    let estimate = pprof::scan_metadata(plain, LIMIT)
        .expect("scan")
        .decoded_size;
    let (profile, heap) = decoded_heap(plain);
    assert!(
        estimate >= heap,
        "estimate {estimate} < real heap {heap} for a profile of {} bytes with {} samples",
        plain.len(),
        profile.sample.len()
    );
    (estimate, heap)
}

#[test]
fn estimate_bounds_the_heap_of_synthetic_cpu_profiles() {
    for (samples, functions) in [(0, 1), (1, 1), (60, 100), (1_000, 500), (20_000, 3_000)] {
        let plain = pprof::encode(&testdata::cpu_profile(samples, functions));
        let (estimate, _) = check(&plain);
        // Ordinary profiles stay well inside the budget.
        assert!(
            estimate <= pprof::decoded_budget(plain.len()),
            "{samples} samples: estimate {estimate} over budget"
        );
    }
}

/// Profiles with labels, inlined lines, mappings and comments: every
/// repeated field the estimate counts.
fn arb_profile() -> impl Strategy<Value = Profile> {
    let label =
        (0i64..50, 0i64..50, any::<i64>(), 0i64..50).prop_map(|(key, str, num, num_unit)| {
            pprof::Label {
                key,
                str,
                num,
                num_unit,
            }
        });
    let sample = (
        proptest::collection::vec(any::<u64>(), 0..40),
        proptest::collection::vec(any::<i64>(), 0..5),
        proptest::collection::vec(label, 0..6),
    )
        .prop_map(|(location_id, value, label)| pprof::Sample {
            location_id,
            value,
            label,
        });
    let line = (any::<u64>(), any::<i64>()).prop_map(|(function_id, line)| pprof::Line {
        function_id,
        line,
        column: 0,
    });
    let location = (
        any::<u64>(),
        any::<u64>(),
        proptest::collection::vec(line, 0..5),
    )
        .prop_map(|(id, address, line)| pprof::Location {
            id,
            mapping_id: 1,
            address,
            line,
            is_folded: false,
        });
    (
        proptest::collection::vec(sample, 0..60),
        proptest::collection::vec(location, 0..60),
        proptest::collection::vec("[a-zA-Z0-9_.]{0,40}", 0..60),
        proptest::collection::vec(any::<i64>(), 0..4),
        0usize..4,
    )
        .prop_map(|(sample, location, mut strings, comment, mappings)| {
            // Index 0 is "", 1 and 2 name the sample type.
            strings.splice(0..0, ["", "cpu", "nanoseconds"].map(String::from));
            Profile {
                sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
                sample,
                mapping: (0..mappings as u64)
                    .map(|id| pprof::Mapping {
                        id,
                        ..Default::default()
                    })
                    .collect(),
                location,
                function: vec![pprof::Function::default(); 3],
                string_table: strings,
                comment,
                ..Default::default()
            }
        })
}

proptest! {
    #[test]
    fn estimate_bounds_the_heap_of_random_profiles(profile in arb_profile()) {
        let plain = pprof::encode(&profile);
        let (estimate, _) = check(&plain);
        prop_assert!(estimate >= size_of::<Profile>());
    }
}
