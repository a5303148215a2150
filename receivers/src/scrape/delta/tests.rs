use std::collections::BTreeMap;

use proflow_model::pprof::{self, Label, Profile, ProfileBuilder, Sample, stacks_root_first};

use super::parts::Sink;
use super::*;

/// What a scrape came to, its delta decoded.
// Matched at once, never stored: boxing would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, PartialEq)]
enum Out {
    Primed,
    Reset,
    Unchanged,
    Delta(Profile),
    StateFull,
}

/// Makes the tests' profiles into the bytes a target serves, and decodes
/// the delta as a backend would.
trait Scrape {
    fn scrape(&mut self, p: Profile) -> Out;
}

impl Scrape for DeltaState {
    fn scrape(&mut self, p: Profile) -> Out {
        let plain = pprof::encode(&p);
        match self
            .next(&plain, 1 << 30)
            .expect("a profile the tests made")
        {
            DeltaOutcome::Primed(_) => Out::Primed,
            DeltaOutcome::Reset(_) => Out::Reset,
            DeltaOutcome::Unchanged => Out::Unchanged,
            DeltaOutcome::StateFull => Out::StateFull,
            DeltaOutcome::Delta(d) => {
                // prost itself: some tests carry references out of range,
                // which decode() would refuse (and the scan before it).
                let back = <Profile as prost::Message>::decode(&d.bytes[..])
                    .expect("the delta decodes as protobuf");
                assert_eq!(back.sample.len(), d.samples, "samples counted");
                assert_eq!(back.time_nanos, d.time_nanos, "time read");
                assert_eq!(back.duration_nanos, d.duration_nanos, "duration written");
                Out::Delta(back)
            }
        }
    }
}

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

fn expect_delta(outcome: Out) -> Profile {
    match outcome {
        Out::Delta(p) => p,
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
    assert_eq!(state.scrape(p.clone()), Out::Primed);
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
    assert_eq!(state.scrape(first.clone()), Out::Primed);
    let delta = expect_delta(state.scrape(second.clone()));
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
    assert_eq!(state.scrape(first.clone()), Out::Primed);
    let delta = expect_delta(state.scrape(second.clone()));
    assert_eq!(by_stack(&delta), map(&[("main;lock", vec![3, 7000])]));
    // Nothing happened: a delta with no samples.
    let delta = expect_delta(state.scrape(third.clone()));
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
    assert_eq!(state.scrape(first.clone()), Out::Primed);
    let delta = expect_delta(state.scrape(second.clone()));
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
    assert_eq!(state.scrape(first.clone()), Out::Primed);
    let delta = expect_delta(state.scrape(second.clone()));
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
    assert_eq!(state.scrape(first.clone()), Out::Primed);
    // Two distinct keys.
    assert_eq!(store.used_bytes(), 2 * 3 * 8);
    let delta = expect_delta(state.scrape(second.clone()));
    // (4 + 3) − (1 + 2) = 4 objects, (40 + 30) − (10 + 20) = 40 bytes,
    // on the first sample; the second has zero allocs and no inuse left,
    // so it is dropped; "main;other" is all zero too.
    let values: Vec<Vec<i64>> = delta.sample.iter().map(|s| s.value.clone()).collect();
    assert_eq!(values, vec![vec![4, 40, 1, 10]]);
}

#[test]
fn labels_addresses_and_lines_are_part_of_a_stack() {
    let key = |p: &Profile, i: usize| {
        let plain = pprof::encode(p);
        let parts = Parts::read(&plain, 1 << 30).unwrap();
        StackHasher::new(&parts)
            .unwrap()
            .sample(parts.samples[i])
            .unwrap()
    };
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
    assert_eq!(state.scrape(before.clone()), Out::Primed);
    expect_delta(state.scrape(grown.clone()));
    assert_eq!(state.scrape(restarted.clone()), Out::Reset);
    assert_eq!(store.series(), 1);
    let delta = expect_delta(state.scrape(after.clone()));
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
    assert_eq!(one.scrape(p.clone()), Out::Primed);
    assert_eq!(store.used_bytes(), 48);
    assert_eq!(two.scrape(p.clone()), Out::StateFull);
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
    assert_eq!(one.scrape(bigger.clone()), Out::StateFull);
    assert_eq!((store.used_bytes(), store.series()), (0, 0));

    // With the room given back, the other series primes, then deltas.
    assert_eq!(two.scrape(p.clone()), Out::Primed);
    assert_eq!(one.scrape(p.clone()), Out::StateFull);
    let grown = profile(
        &HEAP,
        &[("main;a", vec![3, 3, 1, 1]), ("main;b", vec![1, 1, 1, 1])],
        130,
    );
    let delta = expect_delta(two.scrape(grown.clone()));
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
    assert_eq!(state.scrape(p.clone()), Out::StateFull);
    assert_eq!((none.used_bytes(), none.series()), (0, 0));
}

#[test]
fn a_series_within_its_share_gets_room_from_one_over_its_share() {
    // Heap stacks take 24 bytes each: `big` 72, `small` 48 (within half of
    // 100), not both.
    let store = DeltaStore::new(100);
    let stacks = |n: usize, v: i64| -> Vec<(String, Vec<i64>)> {
        (0..n)
            .map(|i| (format!("main;f{i}"), vec![v, v, 1, 1]))
            .collect()
    };
    let at = |stacks: &[(String, Vec<i64>)], time: i64| {
        let refs: Vec<(&str, Vec<i64>)> = stacks
            .iter()
            .map(|(s, v)| (s.as_str(), v.clone()))
            .collect();
        profile(&HEAP, &refs, time)
    };
    let mut big = DeltaState::new(store.clone());
    let mut small = DeltaState::new(store.clone());
    assert_eq!(big.scrape(at(&stacks(3, 1), 100)), Out::Primed);
    // Within its share, no room: refused, and the store is under pressure.
    assert_eq!(small.scrape(at(&stacks(2, 1), 100)), Out::StateFull);
    assert_eq!((store.used_bytes(), store.series()), (72, 1));
    // The state over its share gives way at its next scrape...
    assert_eq!(big.scrape(at(&stacks(3, 2), 110)), Out::StateFull);
    assert_eq!((store.used_bytes(), store.series()), (0, 0));
    // ... and the one within its share gets the room, and keeps it.
    assert_eq!(small.scrape(at(&stacks(2, 2), 110)), Out::Primed);
    expect_delta(small.scrape(at(&stacks(2, 3), 120)));
    for t in [120, 130, 140] {
        assert_eq!(big.scrape(at(&stacks(3, 3), t)), Out::StateFull);
    }
    expect_delta(small.scrape(at(&stacks(2, 4), 130)));
    assert_eq!((store.used_bytes(), store.series()), (48, 1));
    // Alone again, the big one may take what is free.
    drop(small);
    assert_eq!(big.scrape(at(&stacks(3, 4), 150)), Out::Primed);
    assert_eq!((store.used_bytes(), store.series()), (72, 1));
}

#[test]
fn profiles_without_cumulative_types_pass_and_keep_nothing() {
    let (store, mut state) = state();
    let cpu = profile(
        &[("samples", "count"), ("cpu", "nanoseconds")],
        &[("main;a", vec![3, 30])],
        1,
    );
    assert_eq!(state.scrape(cpu.clone()), Out::Unchanged);
    assert_eq!(state.scrape(cpu.clone()), Out::Unchanged);
    assert_eq!((store.used_bytes(), store.series()), (0, 0));

    // A series whose profile loses its cumulative types lets its state go.
    let mutex = profile(&MUTEX, &[("main;a", vec![1, 1])], 1);
    assert_eq!(state.scrape(mutex.clone()), Out::Primed);
    assert_eq!(store.series(), 1);
    assert_eq!(state.scrape(cpu.clone()), Out::Unchanged);
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
    assert_eq!(state.scrape(mutex.clone()), Out::Primed);
    assert_eq!(state.scrape(swapped.clone()), Out::Primed);
    let heap = profile(&HEAP, &[("main;a", vec![1, 1, 1, 1])], 120);
    assert_eq!(state.scrape(heap.clone()), Out::Primed);
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
    state.scrape(first.clone());
    let delta = expect_delta(state.scrape(second.clone()));
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
    state.scrape(first.clone());
    assert_eq!(expect_delta(state.scrape(second.clone())).duration_nanos, 9);
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
    assert_eq!(state.scrape(p.clone()), Out::Primed);
    let mut q = p.clone();
    q.sample[2].value = vec![i64::MAX, i64::MAX, 3];
    q.time_nanos = i64::MAX;
    let delta = expect_delta(state.scrape(q.clone()));
    assert_eq!(delta.sample.len(), 1);
    assert_eq!(delta.sample[0].value, vec![i64::MAX, 0, 3]);
    let mut r = q.clone();
    r.sample[2].value = vec![i64::MIN, 0, 3];
    assert_eq!(state.scrape(r.clone()), Out::Reset);
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
            let outcome = state.scrape(p.clone());
            if n == 0 {
                proptest::prop_assert_eq!(outcome, Out::Primed);
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

/// A protobuf field written by hand, for shapes prost never writes.
fn field(out: &mut Vec<u8>, number: u64, wire: u64, body: &[u8]) {
    Sink::varint(out, number << 3 | wire);
    if wire == 2 {
        Sink::varint(out, body.len() as u64);
    }
    out.extend_from_slice(body);
}

fn varint(v: u64) -> Vec<u8> {
    let mut out = Vec::new();
    Sink::varint(&mut out, v);
    out
}

/// `p` with every sample rewritten unpacked (one field per location id
/// and per value, values before ids), an unknown field in each sample and
/// at the end of the profile, and no `duration_nanos`.
fn unpacked(p: &Profile) -> Vec<u8> {
    let mut bare = p.clone();
    let samples = std::mem::take(&mut bare.sample);
    bare.duration_nanos = 0;
    let mut out = pprof::encode(&bare).to_vec();
    for s in &samples {
        let mut body = Vec::new();
        for &v in &s.value {
            field(&mut body, 2, 0, &varint(v as u64));
        }
        for &id in &s.location_id {
            field(&mut body, 1, 0, &varint(id));
        }
        field(&mut body, 99, 0, &varint(7));
        field(&mut out, 2, 2, &body);
    }
    field(&mut out, 100, 2, b"kept as it came");
    out
}

#[test]
fn unpacked_fields_and_unknown_ones_read_and_pass() {
    let (_store, mut state) = state();
    let first = profile(
        &MUTEX,
        &[("main;a", vec![1, 100]), ("main;b", vec![2, 5])],
        100,
    );
    let second = profile(
        &MUTEX,
        &[("main;a", vec![4, 400]), ("main;b", vec![2, 5])],
        130,
    );
    // The same stacks, packed then unpacked: one key each way.
    assert_eq!(state.scrape(first.clone()), Out::Primed);
    let Ok(DeltaOutcome::Delta(d)) = state.next(&unpacked(&second), 1 << 30) else {
        panic!("expected a delta");
    };
    assert_eq!(d.samples, 1);
    let back = <Profile as prost::Message>::decode(&d.bytes[..]).unwrap();
    assert_eq!(by_stack(&back), map(&[("main;a", vec![3, 300])]));
    // No duration came: the interval is written.
    assert_eq!(back.duration_nanos, 30_000_000_000);
    assert_eq!(d.duration_nanos, 30_000_000_000);
    // Unknown fields pass as they came, in the profile and in its sample.
    let tail = b"kept as it came";
    assert!(d.bytes.windows(tail.len()).any(|w| w == tail));
    let sample = wire::fields(&d.bytes)
        .filter_map(|f| match f.unwrap() {
            (2, Value::Bytes(b)) => Some(b),
            _ => None,
        })
        .next()
        .unwrap();
    assert!(wire::fields(sample).any(|f| f.unwrap() == (99, Value::Varint(7))));
    // Its values went out packed, in one field.
    let value_fields = wire::fields(sample)
        .filter(|f| matches!(f, Ok((2, Value::Bytes(_)))))
        .count();
    assert_eq!(value_fields, 1);
}

#[test]
fn a_delta_is_the_scrape_with_only_samples_and_duration_changed() {
    let (_store, mut state) = state();
    let mut first = profile(&HEAP, &[("main;a", vec![1, 10, 1, 10])], 100);
    // What Go writes too: a mapping, a period type, a comment.
    first.mapping.push(pprof::Mapping {
        id: 1,
        memory_start: 0x1000,
        memory_limit: 0x2000,
        ..Default::default()
    });
    first.period_type = Some(first.sample_type[1]);
    first.period = 512 * 1024;
    first.comment = vec![0];
    for f in &mut first.function {
        f.start_line = 12;
    }
    first.duration_nanos = 5;
    let mut second = first.clone();
    second.time_nanos += 15_000_000_000;
    second.sample[0].value = vec![3, 30, 1, 10];
    state.scrape(first);
    let plain = pprof::encode(&second);
    let Ok(DeltaOutcome::Delta(d)) = state.next(&plain, 1 << 30) else {
        panic!("expected a delta");
    };
    // Field by field, in order: all as they came but the sample and the
    // duration.
    let before: Vec<_> = wire::fields(&plain).map(Result::unwrap).collect();
    let after: Vec<_> = wire::fields(&d.bytes).map(Result::unwrap).collect();
    assert_eq!(before.len(), after.len());
    for (b, a) in before.iter().zip(&after) {
        match b.0 {
            2 | 10 => assert_eq!(a.0, b.0),
            _ => assert_eq!(a, b),
        }
    }
    assert!(after.contains(&(10, Value::Varint(15_000_000_000))));
}

#[test]
fn malformed_profiles_are_refused_and_forget_the_state() {
    let (store, mut state) = state();
    let p = profile(&MUTEX, &[("main;a", vec![1, 1])], 100);
    assert_eq!(state.scrape(p.clone()), Out::Primed);
    assert_eq!(store.series(), 1);
    let plain = pprof::encode(&p).to_vec();
    // A truncated profile, then a sample whose value is a fixed64.
    let truncated = &plain[..plain.len() - 1];
    assert!(matches!(
        state.next(truncated, 1 << 30),
        Err(DeltaError::Malformed(_))
    ));
    assert_eq!((store.used_bytes(), store.series()), (0, 0));
    let mut bad = plain.clone();
    let mut sample = Vec::new();
    field(&mut sample, 2, 1, &[0; 8]);
    field(&mut bad, 2, 2, &sample);
    let e = state.next(&bad, 1 << 30).unwrap_err();
    assert!(e.to_string().contains("wrong wire type"), "{e}");
    // What follows primes again.
    assert_eq!(state.scrape(p), Out::Primed);
}

#[test]
fn the_work_is_counted_before_it_is_allocated() {
    let (store, mut state) = state();
    let samples: Vec<(&str, Vec<i64>)> = STACKS.iter().map(|s| (*s, vec![1, 1])).collect();
    let p = pprof::encode(&profile(&MUTEX, &samples, 100));
    // Too little for the scratch: refused before anything is read.
    let e = state.next(&p, 100).unwrap_err();
    let DeltaError::OverBudget { need, granted } = e else {
        panic!("{e:?}")
    };
    assert_eq!(granted, 100);
    assert!(need >= STACKS.len() * WORK_PER_SAMPLE, "{need}");
    assert_eq!(store.series(), 0);
    // Enough for the scratch but not for the delta written: refused too.
    assert_eq!(state.next(&p, need).unwrap(), DeltaOutcome::Primed(None));
    let grown: Vec<(&str, Vec<i64>)> = STACKS.iter().map(|s| (*s, vec![2, 2])).collect();
    let q = pprof::encode(&profile(&MUTEX, &grown, 110));
    assert!(matches!(
        state.next(&q, need),
        Err(DeltaError::OverBudget { .. })
    ));
    assert_eq!(
        state.next(&q, need + q.len()).unwrap(),
        DeltaOutcome::Primed(None)
    );
}

#[test]
fn a_failure_after_the_state_was_counted_gives_its_bytes_back() {
    let (store, mut state) = state();
    let p = profile(&MUTEX, &[("main;a", vec![1, 1])], 100);
    assert_eq!(state.scrape(p.clone()), Out::Primed);
    assert_eq!((store.used_bytes(), store.series()), (24, 1));
    // A sample whose packed values end in an unfinished varint: the stack
    // is read (and the new state counted) before its values are.
    let mut bad = pprof::encode(&p).to_vec();
    let mut sample = Vec::new();
    field(&mut sample, 2, 2, &[0x80]);
    field(&mut bad, 2, 2, &sample);
    let e = state.next(&bad, 1 << 30).unwrap_err();
    assert!(matches!(e, DeltaError::Malformed(_)), "{e}");
    assert_eq!((store.used_bytes(), store.series()), (0, 0));
    // The same from an empty state.
    let e = state.next(&bad, 1 << 30).unwrap_err();
    assert!(matches!(e, DeltaError::Malformed(_)), "{e}");
    assert_eq!((store.used_bytes(), store.series()), (0, 0));
    assert_eq!(state.scrape(p), Out::Primed);
    assert_eq!((store.used_bytes(), store.series()), (24, 1));
}

#[test]
fn an_allocation_estimate_going_down_is_no_restart() {
    // Go scales a stack's alloc_objects by its average allocation size:
    // one large allocation on "main;grow" raises the average and lowers the
    // estimate (52429 to 3) while alloc_space still grows.
    let (_store, mut heap) = state();
    let before = profile(
        &HEAP,
        &[
            ("main;grow", vec![52_429, 524_290, 0, 0]),
            ("main;steady", vec![100, 1_000, 10, 100]),
        ],
        100,
    );
    let after = profile(
        &HEAP,
        &[
            ("main;grow", vec![3, 1_627_000, 0, 0]),
            ("main;steady", vec![150, 1_500, 10, 100]),
        ],
        110,
    );
    assert_eq!(heap.scrape(before), Out::Primed);
    let plain = pprof::encode(&after);
    let DeltaOutcome::Delta(d) = heap.next(&plain, 1 << 30).unwrap() else {
        panic!("a delta, not a reset");
    };
    assert_eq!(d.went_down, 1);
    let delta = <Profile as prost::Message>::decode(&d.bytes[..]).unwrap();
    assert_eq!(
        by_stack(&delta),
        map(&[
            ("main;grow", vec![0, 1_102_710, 0, 0]),
            ("main;steady", vec![50, 500, 10, 100]),
        ])
    );
    // alloc_space going down is a restart.
    let restarted = profile(
        &HEAP,
        &[
            ("main;grow", vec![5, 1_000, 0, 0]),
            ("main;steady", vec![160, 1_600, 10, 100]),
        ],
        120,
    );
    assert_eq!(heap.scrape(restarted), Out::Reset);
    // A profile of alloc_objects alone is judged by it.
    let (_store, mut alone) = state();
    let only = [("alloc_objects", "count")];
    assert_eq!(
        alone.scrape(profile(&only, &[("a", vec![10])], 1)),
        Out::Primed
    );
    assert_eq!(
        alone.scrape(profile(&only, &[("a", vec![5])], 2)),
        Out::Reset
    );
}

#[test]
fn a_first_scrape_emits_its_instant_values_alone() {
    let (_store, mut heap) = state();
    let first = profile(
        &HEAP,
        &[
            ("main;live", vec![500, 5_000, 20, 200]),
            ("main;gone", vec![300, 3_000, 0, 0]),
        ],
        100,
    );
    let DeltaOutcome::Primed(Some(d)) = heap.next(&pprof::encode(&first), 1 << 30).unwrap() else {
        panic!("a first scrape with in-use values emits them");
    };
    let instant = <Profile as prost::Message>::decode(&d.bytes[..]).unwrap();
    // What is in use now; nothing of what was allocated since the start.
    assert_eq!(
        by_stack(&instant),
        map(&[("main;live", vec![0, 0, 20, 200])])
    );
    // A profile of cumulative types alone has nothing to emit first.
    let (_store, mut mutex) = state();
    let p = profile(&MUTEX, &[("main;a", vec![1, 1])], 100);
    assert_eq!(
        mutex.next(&pprof::encode(&p), 1 << 30).unwrap(),
        DeltaOutcome::Primed(None)
    );
}
