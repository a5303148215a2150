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
mod tests;
