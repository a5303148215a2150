use std::collections::BTreeMap;

use proflow_pipeline::pprof::{self, Label, ProfileBuilder, stacks_root_first};

use super::*;

const HEAP: [(&str, &str); 4] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_objects", "count"),
    ("inuse_space", "bytes"),
];
const MUTEX: [(&str, &str); 2] = [("contentions", "count"), ("delay", "nanoseconds")];

/// A profile of `types` whose samples are (root-first stack, values), at
/// `time` seconds. `unrelated` frames are interned first, so the same
/// stacks get other string indices and location ids.
fn profile_with(
    types: &[(&str, &str)],
    samples: &[(&str, Vec<i64>)],
    time: i64,
    unrelated: &[&str],
) -> Profile {
    let mut b = ProfileBuilder::new();
    for name in unrelated {
        b.frame(name);
    }
    for (ty, unit) in types {
        b.sample_type(ty, unit);
    }
    b.time(time * 1_000_000_000, 0);
    for (stack, values) in samples {
        b.sample_root_first(stack.split(';'), values.clone());
    }
    b.build()
}

fn profile(types: &[(&str, &str)], samples: &[(&str, Vec<i64>)], time: i64) -> Profile {
    profile_with(types, samples, time, &[])
}

/// Values by root-first stack; a stack met twice is a test error.
fn by_stack(p: &Profile) -> BTreeMap<String, Vec<i64>> {
    let mut out = BTreeMap::new();
    for (stack, sample) in stacks_root_first(p) {
        let previous = out.insert(stack.join(";"), sample.value.clone());
        assert!(previous.is_none(), "stack {stack:?} emitted twice");
    }
    out
}

fn expect_delta(outcome: DeltaOutcome) -> Profile {
    match outcome {
        DeltaOutcome::Delta(p) => p,
        other => panic!("expected a delta, got {other:?}"),
    }
}

fn map(entries: &[(&str, Vec<i64>)]) -> BTreeMap<String, Vec<i64>> {
    entries
        .iter()
        .map(|(s, v)| (s.to_string(), v.clone()))
        .collect()
}

fn state() -> (Arc<DeltaStore>, DeltaState) {
    let store = DeltaStore::new(1 << 20);
    let state = DeltaState::new(store.clone());
    (store, state)
}

#[test]
fn first_scrape_primes_and_the_state_is_counted_exactly() {
    let (store, mut state) = state();
    let p = profile(
        &HEAP,
        &[
            ("main;a", vec![1, 10, 1, 10]),
            ("main;b", vec![2, 20, 0, 0]),
        ],
        100,
    );
    assert_eq!(state.next(p.clone()), DeltaOutcome::Primed);
    assert_eq!(store.series(), 1);
    // Two stacks, each a key and two cumulative values.
    assert_eq!(store.used_bytes(), 2 * 3 * 8);
    drop(state);
    assert_eq!(store.series(), 0);
    assert_eq!(store.used_bytes(), 0);
}

#[test]
fn heap_deltas_difference_alloc_and_keep_inuse() {
    let (store, mut state) = state();
    let first = profile(
        &HEAP,
        &[
            ("main;alloc", vec![10, 1000, 5, 500]),
            ("main;steady", vec![3, 300, 3, 300]),
            ("main;freed", vec![4, 400, 0, 0]),
        ],
        100,
    );
    let second = profile(
        &HEAP,
        &[
            ("main;alloc", vec![15, 1600, 2, 200]),
            ("main;steady", vec![3, 300, 3, 300]),
            ("main;freed", vec![4, 400, 0, 0]),
        ],
        115,
    );
    assert_eq!(state.next(first.clone()), DeltaOutcome::Primed);
    let delta = expect_delta(state.next(second.clone()));
    assert_eq!(
        by_stack(&delta),
        map(&[
            ("main;alloc", vec![5, 600, 2, 200]),
            // Nothing allocated, but still in use: kept with zero allocs.
            ("main;steady", vec![0, 0, 3, 300]),
            // "main;freed": all zero after differencing, dropped.
        ])
    );
    assert_eq!(delta.duration_nanos, 15_000_000_000);
    assert_eq!(delta.time_nanos, second.time_nanos);
    assert_eq!(delta.sample_type, second.sample_type);
    assert_eq!(store.used_bytes(), 3 * 3 * 8);
}

#[test]
fn mutex_deltas_drop_unchanged_stacks() {
    let (_store, mut state) = state();
    let first = profile(
        &MUTEX,
        &[("main;lock", vec![2, 2000]), ("main;quiet", vec![7, 7000])],
        100,
    );
    let second = profile(
        &MUTEX,
        &[("main;lock", vec![5, 9000]), ("main;quiet", vec![7, 7000])],
        110,
    );
    let third = second.clone();
    assert_eq!(state.next(first.clone()), DeltaOutcome::Primed);
    let delta = expect_delta(state.next(second.clone()));
    assert_eq!(by_stack(&delta), map(&[("main;lock", vec![3, 7000])]));
    // Nothing happened: a delta with no samples.
    let delta = expect_delta(state.next(third.clone()));
    assert!(delta.sample.is_empty());
}

#[test]
fn a_new_stack_comes_with_its_full_value() {
    let (_store, mut state) = state();
    let first = profile(&MUTEX, &[("main;a", vec![1, 100])], 100);
    let second = profile(
        &MUTEX,
        &[("main;a", vec![2, 150]), ("main;b;c", vec![4, 400])],
        110,
    );
    assert_eq!(state.next(first.clone()), DeltaOutcome::Primed);
    let delta = expect_delta(state.next(second.clone()));
    assert_eq!(
        by_stack(&delta),
        map(&[("main;a", vec![1, 50]), ("main;b;c", vec![4, 400])])
    );
}

#[test]
fn renumbered_locations_and_strings_still_match() {
    let (_store, mut state) = state();
    let first = profile(
        &HEAP,
        &[
            ("main;a;x", vec![1, 10, 1, 10]),
            ("main;b", vec![2, 20, 2, 20]),
        ],
        100,
    );
    // Other frames first, samples in the other order: other string
    // indices, function and location ids for the same stacks.
    let second = profile_with(
        &HEAP,
        &[
            ("main;b", vec![3, 30, 2, 20]),
            ("main;a;x", vec![1, 10, 1, 10]),
        ],
        115,
        &["zzz", "yyy", "x"],
    );
    assert_ne!(first.location, second.location);
    assert_ne!(first.string_table, second.string_table);
    assert_eq!(state.next(first.clone()), DeltaOutcome::Primed);
    let delta = expect_delta(state.next(second.clone()));
    assert_eq!(
        by_stack(&delta),
        map(&[
            ("main;a;x", vec![0, 0, 1, 10]),
            ("main;b", vec![1, 10, 2, 20])
        ])
    );
}

#[test]
fn duplicate_keys_are_summed_and_the_delta_goes_on_the_first() {
    let (store, mut state) = state();
    let first = profile(
        &HEAP,
        &[
            ("main;dup", vec![1, 10, 1, 10]),
            ("main;other", vec![1, 1, 1, 1]),
            ("main;dup", vec![2, 20, 2, 20]),
        ],
        100,
    );
    let second = profile(
        &HEAP,
        &[
            ("main;dup", vec![4, 40, 1, 10]),
            ("main;other", vec![1, 1, 0, 0]),
            ("main;dup", vec![3, 30, 0, 0]),
        ],
        115,
    );
    assert_eq!(state.next(first.clone()), DeltaOutcome::Primed);
    // Two distinct keys.
    assert_eq!(store.used_bytes(), 2 * 3 * 8);
    let delta = expect_delta(state.next(second.clone()));
    // (4 + 3) − (1 + 2) = 4 objects, (40 + 30) − (10 + 20) = 40 bytes,
    // on the first sample; the second has zero allocs and no inuse left,
    // so it is dropped; "main;other" is all zero too.
    let values: Vec<Vec<i64>> = delta.sample.iter().map(|s| s.value.clone()).collect();
    assert_eq!(values, vec![vec![4, 40, 1, 10]]);
}

#[test]
fn labels_addresses_and_lines_are_part_of_a_stack() {
    let key = |p: &Profile, i: usize| StackHasher::new(p).sample(&p.sample[i]);
    let base = profile(&MUTEX, &[("main;a", vec![1, 1]), ("main;a", vec![1, 1])], 1);
    assert_eq!(key(&base, 0), key(&base, 1));

    let mut labelled = base.clone();
    let bytes = labelled.string_table.len() as i64;
    labelled.string_table.push("bytes".into());
    for (sample, size) in labelled.sample.iter_mut().zip([16, 32]) {
        sample.label.push(Label {
            key: bytes,
            str: 0,
            num: size,
            num_unit: 0,
        });
    }
    assert_ne!(key(&labelled, 0), key(&labelled, 1));
    assert_ne!(key(&labelled, 0), key(&base, 0));

    let mut moved = base.clone();
    moved.location[0].address = 0x1234;
    assert_ne!(key(&moved, 0), key(&base, 0));
    let mut other_line = base.clone();
    other_line.location[0].line[0].line = 42;
    assert_ne!(key(&other_line, 0), key(&base, 0));
    let mut other_file = base.clone();
    other_file.string_table.push("main.go".into());
    other_file.function[0].filename = other_file.string_table.len() as i64 - 1;
    assert_ne!(key(&other_file, 0), key(&base, 0));
}

#[test]
fn a_counter_going_down_resets_then_deltas_resume() {
    let (store, mut state) = state();
    let before = profile(
        &MUTEX,
        &[("main;a", vec![10, 1000]), ("main;b", vec![5, 500])],
        100,
    );
    let grown = profile(
        &MUTEX,
        &[("main;a", vec![12, 1100]), ("main;b", vec![5, 500])],
        110,
    );
    // The process restarted: "main;b" starts over.
    let restarted = profile(
        &MUTEX,
        &[("main;a", vec![20, 2000]), ("main;b", vec![1, 10])],
        120,
    );
    let after = profile(
        &MUTEX,
        &[
            ("main;a", vec![21, 2100]),
            ("main;b", vec![3, 30]),
            ("main;c", vec![1, 1]),
        ],
        130,
    );
    assert_eq!(state.next(before.clone()), DeltaOutcome::Primed);
    expect_delta(state.next(grown.clone()));
    assert_eq!(state.next(restarted.clone()), DeltaOutcome::Reset);
    assert_eq!(store.series(), 1);
    let delta = expect_delta(state.next(after.clone()));
    assert_eq!(
        by_stack(&delta),
        map(&[
            ("main;a", vec![1, 100]),
            ("main;b", vec![2, 20]),
            ("main;c", vec![1, 1]),
        ])
    );
    assert_eq!(delta.duration_nanos, 10_000_000_000);
}

#[test]
fn a_full_store_refuses_state_and_gets_memory_back() {
    // Room for one state of two heap stacks (48 bytes), not two.
    let store = DeltaStore::new(70);
    let p = profile(
        &HEAP,
        &[("main;a", vec![1, 1, 1, 1]), ("main;b", vec![1, 1, 1, 1])],
        100,
    );
    let mut one = DeltaState::new(store.clone());
    let mut two = DeltaState::new(store.clone());
    assert_eq!(one.next(p.clone()), DeltaOutcome::Primed);
    assert_eq!(store.used_bytes(), 48);
    assert_eq!(two.next(p.clone()), DeltaOutcome::StateFull);
    assert_eq!((store.used_bytes(), store.series()), (48, 1));

    // A state that grows past the limit is dropped, not kept stale.
    let bigger = profile(
        &HEAP,
        &[
            ("main;a", vec![2, 2, 1, 1]),
            ("main;b", vec![2, 2, 1, 1]),
            ("main;c", vec![2, 2, 1, 1]),
        ],
        115,
    );
    assert_eq!(one.next(bigger.clone()), DeltaOutcome::StateFull);
    assert_eq!((store.used_bytes(), store.series()), (0, 0));

    // With the room given back, the other series primes, then deltas.
    assert_eq!(two.next(p.clone()), DeltaOutcome::Primed);
    assert_eq!(one.next(p.clone()), DeltaOutcome::StateFull);
    let grown = profile(
        &HEAP,
        &[("main;a", vec![3, 3, 1, 1]), ("main;b", vec![1, 1, 1, 1])],
        130,
    );
    let delta = expect_delta(two.next(grown.clone()));
    assert_eq!(
        by_stack(&delta),
        map(&[("main;a", vec![2, 2, 1, 1]), ("main;b", vec![0, 0, 1, 1])])
    );
    drop(two);
    drop(one);
    assert_eq!((store.used_bytes(), store.series()), (0, 0));

    // A store of 0 bytes keeps nothing.
    let none = DeltaStore::new(0);
    let mut state = DeltaState::new(none.clone());
    assert_eq!(state.next(p.clone()), DeltaOutcome::StateFull);
    assert_eq!((none.used_bytes(), none.series()), (0, 0));
}

#[test]
fn profiles_without_cumulative_types_pass_and_keep_nothing() {
    let (store, mut state) = state();
    let cpu = profile(
        &[("samples", "count"), ("cpu", "nanoseconds")],
        &[("main;a", vec![3, 30])],
        1,
    );
    assert_eq!(state.next(cpu.clone()), DeltaOutcome::Delta(cpu.clone()));
    assert_eq!(state.next(cpu.clone()), DeltaOutcome::Delta(cpu.clone()));
    assert_eq!((store.used_bytes(), store.series()), (0, 0));

    // A series whose profile loses its cumulative types lets its state go.
    let mutex = profile(&MUTEX, &[("main;a", vec![1, 1])], 1);
    assert_eq!(state.next(mutex.clone()), DeltaOutcome::Primed);
    assert_eq!(store.series(), 1);
    assert_eq!(state.next(cpu.clone()), DeltaOutcome::Delta(cpu.clone()));
    assert_eq!((store.used_bytes(), store.series()), (0, 0));
}

#[test]
fn changed_sample_types_prime_again() {
    let (store, mut state) = state();
    let mutex = profile(&MUTEX, &[("main;a", vec![5, 500])], 100);
    let swapped = profile(
        &[("delay", "nanoseconds"), ("contentions", "count")],
        &[("main;a", vec![600, 6])],
        110,
    );
    assert_eq!(state.next(mutex.clone()), DeltaOutcome::Primed);
    assert_eq!(state.next(swapped.clone()), DeltaOutcome::Primed);
    let heap = profile(&HEAP, &[("main;a", vec![1, 1, 1, 1])], 120);
    assert_eq!(state.next(heap.clone()), DeltaOutcome::Primed);
    assert_eq!((store.used_bytes(), store.series()), (24, 1));
}

#[test]
fn the_delta_roundtrips_as_pprof_and_keeps_the_tables() {
    let (_store, mut state) = state();
    let first = profile(&HEAP, &[("main;a", vec![1, 10, 1, 10])], 100);
    let second = profile(
        &HEAP,
        &[("main;a", vec![2, 20, 1, 10]), ("main;b", vec![1, 8, 1, 8])],
        115,
    );
    state.next(first.clone());
    let delta = expect_delta(state.next(second.clone()));
    assert_eq!(delta.string_table, second.string_table);
    assert_eq!(delta.location, second.location);
    assert_eq!(delta.function, second.function);
    let back = pprof::decode(&pprof::encode(&delta), 1 << 20).unwrap();
    assert_eq!(back, delta);
}

#[test]
fn no_time_leaves_the_duration() {
    let (_store, mut state) = state();
    let mut first = profile(&MUTEX, &[("main;a", vec![1, 1])], 0);
    first.duration_nanos = 7;
    let mut second = profile(&MUTEX, &[("main;a", vec![2, 2])], 0);
    second.duration_nanos = 9;
    state.next(first.clone());
    assert_eq!(expect_delta(state.next(second.clone())).duration_nanos, 9);
}

#[test]
fn malformed_references_do_not_panic() {
    let (_store, mut state) = state();
    let mut p = profile(
        &MUTEX,
        &[("main;a", vec![1, 1]), ("main;b", vec![2, 2])],
        100,
    );
    p.sample[0].location_id.push(999);
    p.sample[1].value.truncate(1);
    p.location[0].line[0].function_id = 999;
    p.function[0].name = -5;
    p.function[1].filename = 1 << 40;
    p.sample_type[1].unit = 1 << 40;
    p.sample.push(Sample {
        location_id: vec![],
        value: vec![i64::MIN, i64::MAX, 3],
        label: vec![Label {
            key: -1,
            str: 1 << 50,
            num: 0,
            num_unit: 7777,
        }],
    });
    // Sparse, repeated ids.
    p.location[1].id = 1 << 60;
    p.location.push(p.location[1].clone());
    assert_eq!(state.next(p.clone()), DeltaOutcome::Primed);
    let mut q = p.clone();
    q.sample[2].value = vec![i64::MAX, i64::MAX, 3];
    q.time_nanos = i64::MAX;
    let delta = expect_delta(state.next(q.clone()));
    assert_eq!(delta.sample.len(), 1);
    assert_eq!(delta.sample[0].value, vec![i64::MAX, 0, 3]);
    let mut r = q.clone();
    r.sample[2].value = vec![i64::MIN, 0, 3];
    assert_eq!(state.next(r.clone()), DeltaOutcome::Reset);
}

/// A deterministic shuffle, so each scrape lists its samples in another
/// order (and so numbers its locations differently).
fn shuffle<T>(items: &mut [T], mut seed: u64) {
    for i in (1..items.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        items.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

const STACKS: [&str; 6] = [
    "main", "main;a", "main;a;b", "main;c;b", "other;a", "main;a;a",
];

proptest::proptest! {
    #[test]
    fn deltas_add_up_to_last_minus_first(
        scrapes in 2usize..7,
        stacks in proptest::collection::vec(
            (
                0usize..6,
                proptest::collection::vec((0i64..1_000_000, 0i64..1_000_000, 0i64..100), 6),
            ),
            STACKS.len(),
        ),
        seeds in proptest::collection::vec(proptest::num::u64::ANY, 6),
    ) {
        // For each stack: the scrape it appears in, then per scrape its
        // alloc increments and its (not cumulative) inuse count.
        let cumulative = |s: usize, upto: usize| -> Option<[i64; 2]> {
            let (start, steps) = &stacks[s];
            (upto >= *start).then(|| {
                steps[*start..=upto]
                    .iter()
                    .fold([0, 0], |[o, b], (dobj, dbytes, _)| [o + dobj, b + dbytes])
            })
        };
        let (_store, mut state) = state();
        let mut sums: BTreeMap<String, [i64; 2]> = BTreeMap::new();
        for (n, &seed) in seeds.iter().enumerate().take(scrapes) {
            let mut samples: Vec<(&str, Vec<i64>)> = (0..STACKS.len())
                .filter_map(|s| {
                    let [objects, bytes] = cumulative(s, n)?;
                    let inuse = stacks[s].1[n].2;
                    Some((STACKS[s], vec![objects, bytes, inuse, inuse * 8]))
                })
                .collect();
            shuffle(&mut samples, seed | 1);
            let p = profile(&HEAP, &samples, 100 + n as i64);
            let outcome = state.next(p.clone());
            if n == 0 {
                proptest::prop_assert_eq!(outcome, DeltaOutcome::Primed);
                continue;
            }
            let delta = expect_delta(outcome);
            let back = pprof::decode(&pprof::encode(&delta), 1 << 20).unwrap();
            proptest::prop_assert_eq!(&back, &delta);
            for (stack, values) in by_stack(&delta) {
                let s = STACKS.iter().position(|&x| x == stack).unwrap();
                // Not cumulative: as scraped.
                let inuse = stacks[s].1[n].2;
                proptest::prop_assert_eq!(&values[2..], &[inuse, inuse * 8][..]);
                let sum = sums.entry(stack).or_default();
                sum[0] += values[0];
                sum[1] += values[1];
            }
        }
        let last = scrapes - 1;
        for (s, stack) in STACKS.iter().enumerate() {
            let expected = match (cumulative(s, 0), cumulative(s, last)) {
                (Some(first), Some(last)) => [last[0] - first[0], last[1] - first[1]],
                (None, Some(last)) => last,
                _ => [0, 0],
            };
            let got = sums.get(*stack).copied().unwrap_or_default();
            proptest::prop_assert_eq!(got, expected, "stack {}", stack);
        }
    }
}
