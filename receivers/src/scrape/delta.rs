//! Client-side deltas of cumulative profiles for the `scrape` receiver.
//!
//! Go's `allocs`/`heap` (`alloc_objects`, `alloc_space`), `mutex` and
//! `block` (`contentions`, `delay`) profiles count from process start; what
//! the pipeline wants is what happened since the previous scrape. Lives here:
//!
//! - [`DeltaStore`]: the memory budget every delta state shares, with the
//!   gauges `/metrics` shows (bytes used, series held).
//! - [`DeltaState`]: the previous scrape of one (target, profile), reduced to
//!   a key per stack and its cumulative values; [`DeltaState::next`] turns a
//!   fresh scrape into a [`DeltaOutcome`].
//! - The stack keys: a 64-bit hash of each sample's stack and labels as
//!   content, because Go renumbers location ids and string indices in every
//!   profile it writes.
//!
//! Only the sample types named in [`CUMULATIVE_TYPES`] are differenced; the
//! others (`inuse_*`, `samples`, `cpu`, …) pass as scraped. A profile with no
//! cumulative sample type passes whole on every scrape and keeps no state.
//!
//! # The state and its memory
//!
//! A state is two sorted arrays: the distinct stack keys (8 bytes each) and,
//! key by key, the summed cumulative values (8 bytes per cumulative sample
//! type). That is `8 × (1 + w)` bytes per distinct stack for `w` cumulative
//! types: 24 for heap and allocs profiles (`w` = 2) as for mutex and block.
//! The count is what is asked of the allocator, not an estimate (its own
//! rounding aside): both arrays are boxed slices allocated at their final
//! length, and their lengths are known (and reserved in the store) before
//! they are allocated. Sorted arrays rather than a hash map: no load
//! factor slack or control bytes, no hash-flooding concern, and two sorted
//! arrays are compared in one linear merge.
//!
//! Not counted in the store: what [`DeltaState::next`] allocates for the
//! length of one call (hashes of the profile's strings, functions and
//! locations, a (key, sample) pair and a slot per sample) and, during that
//! call, the previous state next to the new one.
//! None of it is larger than the decoded profile the call was given, which
//! [`proflow_pipeline::pprof::decode`] already bounded.
//!
//! # The emitted profile
//!
//! The scraped profile itself (taken by value and changed in place, never
//! copied) with its string table, mappings, locations and functions as they
//! are; locations and functions that only dropped samples
//! used are not pruned (pprof allows unused ones, and pruning would cost a
//! pass and a renumbering for little). Its samples whose values are all zero
//! after differencing are left out, so an emitted delta may have no samples
//! at all when nothing happened between two scrapes.

use std::collections::HashMap;
use std::fmt;
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proflow_pipeline::pprof::{Profile, Sample};

/// The sample types (Go's names) whose values count since process start.
pub const CUMULATIVE_TYPES: [&str; 4] = ["alloc_objects", "alloc_space", "contentions", "delay"];

/// Bytes one key or one value of a state takes.
const WORD: usize = size_of::<u64>();

/// Memory all delta states may take together; shared by every scrape loop
/// (Arc).
#[derive(Debug)]
pub struct DeltaStore {
    limit: usize,
    // Relaxed ordering is enough for both counters: each is one variable
    // updated atomically on its own, and nothing else is published through
    // them.
    used: AtomicUsize,
    series: AtomicUsize,
}

impl DeltaStore {
    /// A store whose states may take `limit_bytes` together (0: none may
    /// keep state, so every cumulative profile is refused).
    pub fn new(limit_bytes: usize) -> Arc<DeltaStore> {
        Arc::new(DeltaStore {
            limit: limit_bytes,
            used: AtomicUsize::new(0),
            series: AtomicUsize::new(0),
        })
    }

    /// The limit the store was made with.
    pub fn limit_bytes(&self) -> usize {
        self.limit
    }

    /// Bytes the states hold now (for a `/metrics` gauge).
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Number of (target, profile) states holding data.
    pub fn series(&self) -> usize {
        self.series.load(Ordering::Relaxed)
    }

    /// Trades a state of `old` bytes for one of `new` bytes if the total
    /// stays within the limit; leaves the count unchanged otherwise.
    fn replace(&self, old: usize, new: usize) -> bool {
        self.used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                // `used` includes `old` (its holder has not released it), so
                // the subtraction cannot wrap; saturating keeps a bug from
                // turning into a huge count.
                let after = used.saturating_sub(old).checked_add(new)?;
                (after <= self.limit).then_some(after)
            })
            .is_ok()
    }

    fn release(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// What [`DeltaState::next`] makes of a scrape.
// The outcome is matched as soon as it is returned, never stored in bulk, so
// the size of an unboxed Profile costs nothing; boxing would cost an
// allocation per scrape.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum DeltaOutcome {
    /// First scrape (or first after a reset / after state was refused, or
    /// the sample types changed): nothing to emit, state primed.
    Primed,
    /// A counter went down: the process restarted. State re-primed with this
    /// scrape; nothing emitted.
    Reset,
    /// The difference since the previous scrape (or the whole profile when
    /// it has no cumulative sample type).
    Delta(Profile),
    /// The state would exceed the store's limit: nothing emitted, no state
    /// kept (the next scrape tries to prime again).
    StateFull,
}

/// The previous scrape of one (target, profile); dropping it gives its
/// memory back to the store.
pub struct DeltaState {
    store: Arc<DeltaStore>,
    held: Option<Held>,
}

/// What a state keeps of a scrape.
struct Held {
    /// Hash of the profile's sample types (type and unit, in order): a
    /// profile whose types changed is not comparable with this one.
    layout: u64,
    /// Number of cumulative sample types: values per key.
    width: usize,
    time_nanos: i64,
    /// Distinct stack keys, ascending.
    keys: Box<[u64]>,
    /// `width` summed cumulative values per key, in the order of `keys`.
    values: Box<[i64]>,
}

impl Held {
    /// The heap this state holds: exactly its two slices.
    fn bytes(&self) -> usize {
        size_of_val(&*self.keys) + size_of_val(&*self.values)
    }

    /// The values of the key at `slot`.
    fn values(&self, slot: usize) -> &[i64] {
        let start = slot.saturating_mul(self.width);
        self.values
            .get(start..start.saturating_add(self.width))
            .unwrap_or(&[])
    }
}

impl fmt::Debug for DeltaState {
    // The keys themselves say nothing to a reader; their number does.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("DeltaState");
        match &self.held {
            Some(held) => d
                .field("stacks", &held.keys.len())
                .field("bytes", &held.bytes()),
            None => d.field("stacks", &"none"),
        };
        d.finish()
    }
}

impl DeltaState {
    /// An empty state (the next scrape primes it) counted in `store`.
    pub fn new(store: Arc<DeltaStore>) -> DeltaState {
        DeltaState { store, held: None }
    }

    /// Given a freshly scraped cumulative profile, what to emit.
    ///
    /// Takes the profile by value: the delta is written into it (values
    /// replaced, unchanged samples removed), so nothing is copied.
    pub fn next(&mut self, current: Profile) -> DeltaOutcome {
        let cumulative = cumulative_indices(&current);
        if cumulative.is_empty() {
            // Nothing to difference, so nothing to remember; a state left
            // from a profile that had cumulative types is of no use now.
            self.clear();
            return DeltaOutcome::Delta(current);
        }
        let width = cumulative.len();
        let hasher = StackHasher::new(&current);
        let layout = hasher.layout(&current);

        // Sorting (key, sample index) puts equal keys together with their
        // first sample first, and gives the keys in the state's order. This
        // scratch (16 bytes a sample, 8 more for `slot_of`) is sized by a
        // sample list already in memory at 72 bytes or more a sample.
        let mut order: Vec<(u64, usize)> = current
            .sample
            .iter()
            .enumerate()
            .map(|(i, sample)| (hasher.sample(sample), i))
            .collect();
        order.sort_unstable();
        let distinct = order.chunk_by(|a, b| a.0 == b.0).count();

        // Reserve the new state before allocating it; it replaces the old
        // one whatever the outcome, so the old one's bytes are given back.
        let old_bytes = self.held.as_ref().map_or(0, Held::bytes);
        let new_bytes = distinct
            .checked_mul(width.saturating_add(1))
            .and_then(|words| words.checked_mul(WORD));
        let Some(new_bytes) = new_bytes.filter(|&b| self.store.replace(old_bytes, b)) else {
            self.clear();
            return DeltaOutcome::StateFull;
        };

        let mut keys = Vec::with_capacity(distinct);
        // `distinct * width` fits: it is below `new_bytes`, which did not
        // overflow.
        let mut values = Vec::with_capacity(distinct * width);
        let mut slot_of = vec![0usize; current.sample.len()];
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            let slot = keys.len();
            keys.push(group[0].0);
            let start = values.len();
            values.resize(start + width, 0i64);
            for &(_, i) in group {
                slot_of[i] = slot;
                let Some(sample) = current.sample.get(i) else {
                    continue;
                };
                for (sum, &c) in values[start..].iter_mut().zip(&cumulative) {
                    // A value missing from a short (malformed) sample counts
                    // as 0; saturating keeps crafted values from overflowing.
                    *sum = sum.saturating_add(sample.value.get(c).copied().unwrap_or(0));
                }
            }
        }
        let new = Held {
            layout,
            width,
            time_nanos: current.time_nanos,
            keys: keys.into_boxed_slice(),
            values: values.into_boxed_slice(),
        };
        debug_assert_eq!(new.bytes(), new_bytes);

        let outcome = match &self.held {
            None => {
                self.store.series.fetch_add(1, Ordering::Relaxed);
                DeltaOutcome::Primed
            }
            // Another profile shape under the same series (the target was
            // replaced by something else): start over as on a first scrape.
            Some(old) if old.layout != layout || old.width != width => DeltaOutcome::Primed,
            Some(old) => match difference(current, &cumulative, old, &new, &slot_of) {
                Some(delta) => DeltaOutcome::Delta(delta),
                None => DeltaOutcome::Reset,
            },
        };
        // Whatever the outcome, this scrape is the one the next is compared
        // with; the store already counts it instead of the old state.
        self.held = Some(new);
        outcome
    }

    /// Forgets the state and gives its memory back.
    fn clear(&mut self) {
        if let Some(held) = self.held.take() {
            self.store.release(held.bytes());
            self.store.series.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl Drop for DeltaState {
    fn drop(&mut self) {
        self.clear();
    }
}

/// Indices of the profile's cumulative sample types.
fn cumulative_indices(profile: &Profile) -> Vec<usize> {
    profile
        .sample_type
        .iter()
        .enumerate()
        .filter(|(_, t)| CUMULATIVE_TYPES.contains(&profile.string(t.r#type)))
        .map(|(i, _)| i)
        .collect()
}

/// Where a key's previous values are while the delta is written.
#[derive(Clone, Copy)]
enum Prev {
    /// Not in the previous scrape: its whole value is new.
    New,
    /// At this slot of the previous state.
    At(usize),
    /// Already written on the key's first sample; later samples of the key
    /// get 0.
    Written,
}

/// The delta profile of `current` against `old`, or `None` when a
/// cumulative value went down (a restart). `new` is `current`'s state and
/// `slot_of` the slot of each of its samples in it. The delta is written
/// into `current` itself: cumulative values replaced, samples left with
/// nothing but zeros removed.
fn difference(
    mut current: Profile,
    cumulative: &[usize],
    old: &Held,
    new: &Held,
    slot_of: &[usize],
) -> Option<Profile> {
    // Both key arrays are sorted: one merge finds each key's previous slot.
    let mut prev = Vec::with_capacity(new.keys.len());
    let mut j = 0;
    for (slot, key) in new.keys.iter().enumerate() {
        while old.keys.get(j).is_some_and(|k| k < key) {
            j += 1;
        }
        if old.keys.get(j) == Some(key) {
            let went_down = new
                .values(slot)
                .iter()
                .zip(old.values(j))
                .any(|(now, before)| now < before);
            if went_down {
                return None;
            }
            prev.push(Prev::At(j));
        } else {
            prev.push(Prev::New);
        }
    }

    let mut slots = slot_of.iter();
    current.sample.retain_mut(|sample| {
        let Some(state) = slots
            .next()
            .and_then(|&slot| Some((slot, prev.get_mut(slot)?)))
        else {
            return false;
        };
        let (slot, state) = state;
        let value = &mut sample.value;
        match *state {
            Prev::Written => {
                for &c in cumulative {
                    if let Some(v) = value.get_mut(c) {
                        *v = 0;
                    }
                }
            }
            Prev::New | Prev::At(_) => {
                let before = match *state {
                    Prev::At(j) => old.values(j),
                    _ => &[],
                };
                for (k, (&c, &now)) in cumulative.iter().zip(new.values(slot)).enumerate() {
                    if let Some(v) = value.get_mut(c) {
                        // Not negative (no value went down), but a crafted
                        // negative previous value could overflow the plain
                        // subtraction.
                        *v = now.saturating_sub(before.get(k).copied().unwrap_or(0));
                    }
                }
                *state = Prev::Written;
            }
        }
        value.iter().any(|&v| v != 0)
    });

    // The delta covers the time between the two scrapes; the duration Go
    // writes in a cumulative profile is only how long writing it took. A
    // clock that went back leaves the scraped duration.
    if old.time_nanos > 0 && current.time_nanos > old.time_nanos {
        current.duration_nanos = current.time_nanos - old.time_nanos;
    }
    Some(current)
}

/// Stands for a function or location id the profile does not define, so
/// such a reference still hashes the same way every time.
const MISSING: u64 = 0x6d69_7373_696e_6721;

/// Hashes one profile's stacks by content.
///
/// Go writes a new string table and new location and function ids in every
/// profile, so a stack is known again by what it is: each location's address
/// and its lines' function name, system name, file name and line number,
/// plus the sample's labels. Strings are hashed once each, functions and
/// locations once each from those, and a sample from its locations' hashes,
/// so hashing costs no allocation per sample and reads each string once per
/// scrape rather than once per use.
///
/// The hasher is std's SipHash with fixed keys (`DefaultHasher::new`): the
/// same content gives the same key for the life of the process (and, in
/// practice, between runs, which makes tests deterministic); keys are never
/// stored outside it.
///
/// 64 bits are enough: two different stacks of one series must collide to
/// matter, and for a profile of `n` distinct stacks that happens with
/// probability about `n² / 2⁶⁵` (10⁻¹² at 10,000 stacks, 3 × 10⁻¹⁰ at
/// 100,000). A collision merges the two stacks' deltas onto one of them for
/// that series, totals unchanged; 128 bits would add 8 bytes to every key
/// held (a third more for heap profiles) to make that rarer still.
struct StackHasher {
    strings: Vec<u64>,
    empty: u64,
    locations: ById,
}

impl StackHasher {
    fn new(profile: &Profile) -> StackHasher {
        // One u64 per string, function and location: far less than the
        // decoded profile holds for them.
        let strings: Vec<u64> = profile
            .string_table
            .iter()
            .map(|s| hash_bytes(s.as_bytes()))
            .collect();
        let empty = hash_bytes(b"");
        let string = |index: i64| string_hash(&strings, empty, index);

        let function_hashes = profile
            .function
            .iter()
            .map(|f| {
                let mut h = DefaultHasher::new();
                h.write_u64(string(f.name));
                h.write_u64(string(f.system_name));
                h.write_u64(string(f.filename));
                h.finish()
            })
            .collect();
        let functions = ById::new(profile.function.iter().map(|f| f.id), function_hashes);

        let location_hashes = profile
            .location
            .iter()
            .map(|l| {
                let mut h = DefaultHasher::new();
                h.write_u64(l.address);
                h.write_usize(l.line.len());
                for line in &l.line {
                    h.write_u64(functions.get(line.function_id));
                    h.write_i64(line.line);
                }
                h.finish()
            })
            .collect();
        let locations = ById::new(profile.location.iter().map(|l| l.id), location_hashes);

        StackHasher {
            strings,
            empty,
            locations,
        }
    }

    fn string(&self, index: i64) -> u64 {
        string_hash(&self.strings, self.empty, index)
    }

    /// The key of a sample: its locations in order, then its labels.
    fn sample(&self, sample: &Sample) -> u64 {
        let mut h = DefaultHasher::new();
        // The counts keep a stack and its labels from reading as another
        // stack with other labels.
        h.write_usize(sample.location_id.len());
        for &id in &sample.location_id {
            h.write_u64(self.locations.get(id));
        }
        h.write_usize(sample.label.len());
        for label in &sample.label {
            h.write_u64(self.string(label.key));
            h.write_u64(self.string(label.str));
            h.write_i64(label.num);
            h.write_u64(self.string(label.num_unit));
        }
        h.finish()
    }

    /// The hash of the sample types, type and unit, in order.
    fn layout(&self, profile: &Profile) -> u64 {
        let mut h = DefaultHasher::new();
        h.write_usize(profile.sample_type.len());
        for t in &profile.sample_type {
            h.write_u64(self.string(t.r#type));
            h.write_u64(self.string(t.unit));
        }
        h.finish()
    }
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// The hash of string `index`; an index out of range reads as `""`, as
/// [`Profile::string`] does.
fn string_hash(strings: &[u64], empty: u64, index: i64) -> u64 {
    usize::try_from(index)
        .ok()
        .and_then(|i| strings.get(i))
        .copied()
        .unwrap_or(empty)
}

/// Hashes of a profile's functions or locations, found by id.
struct ById {
    hashes: Vec<u64>,
    /// Id → index when the ids are not `1..=n` in order. Go writes them in
    /// that order, so the map is built only for other writers.
    sparse: Option<HashMap<u64, usize>>,
}

impl ById {
    fn new(ids: impl Iterator<Item = u64> + Clone, hashes: Vec<u64>) -> ById {
        let dense = ids
            .clone()
            .enumerate()
            .all(|(i, id)| u64::try_from(i).is_ok_and(|i| id == i + 1));
        let sparse = (!dense).then(|| {
            let mut map = HashMap::with_capacity(hashes.len());
            for (i, id) in ids.enumerate() {
                // A duplicated id (malformed) means its first entry, as the
                // dense case would.
                map.entry(id).or_insert(i);
            }
            map
        });
        ById { hashes, sparse }
    }

    fn get(&self, id: u64) -> u64 {
        let index = match &self.sparse {
            None => id.checked_sub(1).and_then(|i| usize::try_from(i).ok()),
            Some(map) => map.get(&id).copied(),
        };
        index
            .and_then(|i| self.hashes.get(i))
            .copied()
            .unwrap_or(MISSING)
    }
}

#[cfg(test)]
mod tests {
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
}
