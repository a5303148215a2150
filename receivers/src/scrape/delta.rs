//! Client-side deltas of cumulative profiles for the `scrape` receiver,
//! computed on the wire form.
//!
//! Go's `allocs`/`heap` (`alloc_objects`, `alloc_space`), `mutex` and
//! `block` (`contentions`, `delay`) profiles count from process start; what
//! the pipeline wants is what happened since the previous scrape. Lives here:
//!
//! - [`DeltaStore`]: the memory budget every delta state shares, with the
//!   gauges `/metrics` shows (bytes used, series held).
//! - [`DeltaState`]: the previous scrape of one (target, profile), reduced to
//!   a key per stack and its cumulative values; [`DeltaState::next`] turns
//!   the plain pprof bytes of a fresh scrape into a [`DeltaOutcome`].
//! - The stack keys: a 64-bit hash of each sample's stack and labels as
//!   content, because Go renumbers location ids and string indices in every
//!   profile it writes.
//! - The wire reading and writing: the profile is never decoded into structs.
//!   Its fields are walked as protobuf, the samples are rewritten with their
//!   new values and every other field is copied as it came.
//!
//! Only the sample types named in [`CUMULATIVE_TYPES`] are differenced; the
//! others (`inuse_*`, `samples`, `cpu`, …) pass as scraped. A profile with no
//! cumulative sample type passes whole on every scrape and keeps no state
//! ([`has_cumulative`] tells the caller before anything is read).
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
//! # The work of one call and its memory
//!
//! [`DeltaState::next`] walks the profile's top-level fields twice (once to
//! count them, once to note where each sample, location, function and
//! string is), hashes strings, functions, locations and samples once each,
//! sorts a (key, sample) pair per sample and writes the delta. What it
//! allocates for that is computed from the counts before it is allocated
//! ([`WORK_PER_SAMPLE`] and the like) and the delta's length is computed
//! before it is written; their sum must fit in the bytes the caller
//! granted, or the call is refused with [`DeltaError::OverBudget`].
//! Nothing is allocated per sample, per location or per string.
//!
//! # The emitted profile
//!
//! The scraped profile's bytes with its samples rewritten: each sample's
//! location ids, labels and unknown fields as they came, its values in one
//! packed field (cumulative ones replaced by their delta), and samples
//! whose values are all zero after differencing left out, so an emitted
//! delta may have no samples at all when nothing happened between two
//! scrapes. The string table, mappings, locations and functions are copied
//! as they are; those only dropped samples used are not pruned (pprof
//! allows unused ones, and pruning would cost a pass and a renumbering for
//! little). `duration_nanos` becomes the time between the two scrapes.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proflow_model::wire::{self, Value, WireError};

mod keys;
mod parts;
mod rewrite;

use keys::StackHasher;
use parts::{Parts, for_each_value};
use rewrite::{Prev, Rewrite};

/// The sample types (Go's names) whose values count since process start.
pub const CUMULATIVE_TYPES: [&str; 4] = ["alloc_objects", "alloc_space", "contentions", "delay"];

/// True when one of `sample_types` (type, unit) counts since process start:
/// only such profiles are differenced.
pub fn has_cumulative(sample_types: &[(String, String)]) -> bool {
    sample_types
        .iter()
        .any(|(t, _)| CUMULATIVE_TYPES.contains(&t.as_str()))
}

/// Bytes one key or one value of a state takes.
const WORD: usize = size_of::<u64>();

/// Scratch bytes [`DeltaState::next`] takes per sample: its place on the
/// wire, a (key, sample) pair to sort, its slot, and for each distinct key
/// (at most one a sample) its first sample and a [`Prev`].
pub const WORK_PER_SAMPLE: usize = size_of::<&[u8]>()
    + size_of::<(u64, usize)>()
    + size_of::<usize>()
    + size_of::<usize>()
    + size_of::<Prev>();
/// Scratch bytes per location or function: its place on the wire, its id
/// and hash, and an entry of the id map built when ids are not `1..=n` in
/// order.
pub const WORK_PER_ENTRY: usize = size_of::<&[u8]>() + 2 * WORD + SPARSE_ENTRY;
/// Scratch bytes per string: its place on the wire and its hash.
pub const WORK_PER_STRING: usize = size_of::<&[u8]>() + WORD;
/// Bytes an entry of a `HashMap<u64, usize>` takes, with its control byte
/// and the slack of a table at most 7/8 full, rounded up.
const SPARSE_ENTRY: usize = 2 * (size_of::<(u64, usize)>() + 1);

/// Memory all delta states may take together; shared by every scrape loop
/// (Arc).
///
/// Shared fairly: a state's share is the limit over the series holding
/// state (and the one asking). A state within its share that finds no room
/// puts the store under pressure for its next scrapes and those of the
/// others (twice as many calls as there are series); under pressure, a
/// state over its share is refused at its next scrape, which gives its
/// memory back, so one target with a huge profile cannot keep every other
/// target's state out. Without pressure a state may take what is free.
#[derive(Debug)]
pub struct DeltaStore {
    limit: usize,
    // Relaxed ordering is enough for the counters: each is one variable
    // updated atomically on its own, and nothing else is published through
    // them.
    used: AtomicUsize,
    series: AtomicUsize,
    /// Calls of [`DeltaStore::replace`] left under pressure.
    pressure: AtomicUsize,
}

impl DeltaStore {
    /// A store whose states may take `limit_bytes` together (0: none may
    /// keep state, so every cumulative profile is refused).
    pub fn new(limit_bytes: usize) -> Arc<DeltaStore> {
        Arc::new(DeltaStore {
            limit: limit_bytes,
            used: AtomicUsize::new(0),
            series: AtomicUsize::new(0),
            pressure: AtomicUsize::new(0),
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

    /// Trades a state of `old` bytes (0: none yet) for one of `new` bytes
    /// if the total stays within the limit and, under pressure, `new` is
    /// within the state's share; leaves the count unchanged otherwise.
    fn replace(&self, old: usize, new: usize) -> bool {
        let pressed = self
            .pressure
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(1))
            .is_ok();
        // The holders, and one more: this state if it holds nothing yet,
        // else the one waiting when there is pressure.
        let sharers = self
            .series
            .load(Ordering::Relaxed)
            .saturating_add(usize::from(old == 0 || pressed))
            .max(1);
        let share = self.limit / sharers;
        if pressed && new > share {
            return false;
        }
        let fits = self.fits(old, new);
        if !fits && new <= share {
            self.pressure
                .store(sharers.saturating_mul(2), Ordering::Relaxed);
        }
        fits
    }

    /// [`DeltaStore::replace`]'s trade, if the total stays within the limit.
    fn fits(&self, old: usize, new: usize) -> bool {
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
#[derive(Debug, Clone, PartialEq)]
pub enum DeltaOutcome {
    /// First scrape (or first after a reset / after state was refused, or
    /// the sample types changed): state primed. Its instant values
    /// (`inuse_*`) are emitted, every cumulative value 0, when it has any.
    Primed(Option<Delta>),
    /// A counter went down: the process restarted. State re-primed with this
    /// scrape; its instant values emitted as on a first scrape.
    Reset(Option<Delta>),
    /// The profile has no cumulative sample type: it passes as scraped, and
    /// the state (of no use now) is forgotten.
    Unchanged,
    /// The difference since the previous scrape.
    Delta(Delta),
    /// The state would exceed the store's limit: nothing emitted, no state
    /// kept (the next scrape tries to prime again).
    StateFull,
}

/// A delta profile: plain pprof bytes and what the envelope needs of them.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The profile, plain (not gzipped) protobuf.
    pub bytes: Vec<u8>,
    /// How many samples it holds: 0 when nothing happened in the interval.
    pub samples: usize,
    /// Stacks whose `alloc_objects` went down since the previous scrape (an
    /// estimate, see [`CUMULATIVE_TYPES`]): their delta there is 0.
    pub went_down: usize,
    /// When the scrape was written (the profile's `time_nanos`).
    pub time_nanos: i64,
    /// The time the delta covers: since the previous scrape, or as
    /// scraped when the profiles carry no time.
    pub duration_nanos: i64,
}

/// Why a scrape could not be differenced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeltaError {
    #[error("the profile is not valid pprof: {0}")]
    Malformed(String),
    #[error("differencing this profile takes {need} bytes, more than the {granted} granted for it")]
    OverBudget { need: usize, granted: usize },
}

impl From<WireError> for DeltaError {
    fn from(e: WireError) -> Self {
        DeltaError::Malformed(e.to_string())
    }
}

fn malformed(what: &str) -> DeltaError {
    DeltaError::Malformed(what.to_owned())
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

    /// Given the plain pprof bytes of a fresh scrape, what to emit.
    /// `granted` is the memory the caller holds for this call's work and
    /// its result (see the module docs); the state itself is counted in
    /// the store.
    pub fn next(&mut self, plain: &[u8], granted: usize) -> Result<DeltaOutcome, DeltaError> {
        let result =
            Parts::read(plain, granted).and_then(|parts| self.next_parts(plain, &parts, granted));
        if result.is_err() {
            // Whatever comes next is compared with a profile we could
            // read, not with one from before a broken one.
            self.clear();
        }
        result
    }

    fn next_parts(
        &mut self,
        plain: &[u8],
        parts: &Parts<'_>,
        granted: usize,
    ) -> Result<DeltaOutcome, DeltaError> {
        let hasher = StackHasher::new(parts)?;
        let column = parts.cumulative_columns(&hasher);
        let restarts = parts::restart_columns(parts, &hasher, &column);
        let width = column.iter().flatten().count();
        if width == 0 {
            // Nothing to difference, so nothing to remember; a state left
            // from a profile that had cumulative types is of no use now.
            self.clear();
            return Ok(DeltaOutcome::Unchanged);
        }
        let layout = hasher.layout(&parts.sample_types);

        // Sorting (key, sample index) puts equal keys together with their
        // first sample first, and gives the keys in the state's order.
        let mut order: Vec<(u64, usize)> = Vec::with_capacity(parts.samples.len());
        for (i, sample) in parts.samples.iter().enumerate() {
            order.push((hasher.sample(sample)?, i));
        }
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
            return Ok(DeltaOutcome::StateFull);
        };

        // From here the store counts the new state in place of the old
        // one: a failure gives the new state's bytes back and forgets the
        // old state without giving its bytes back a second time.
        let result = self.difference(
            plain, parts, &order, &column, &restarts, layout, new_bytes, granted,
        );
        drop(order);
        match result {
            Ok((new, outcome)) => {
                if self.held.is_none() {
                    self.store.series.fetch_add(1, Ordering::Relaxed);
                }
                // Whatever the outcome, this scrape is the one the next is
                // compared with.
                self.held = Some(new);
                Ok(outcome)
            }
            Err(e) => {
                if self.held.take().is_some() {
                    self.store.series.fetch_sub(1, Ordering::Relaxed);
                }
                self.store.release(new_bytes);
                Err(e)
            }
        }
    }

    /// The new state (its `new_bytes` already counted in the store) from
    /// the sorted (key, sample) pairs, and what to emit.
    #[allow(clippy::too_many_arguments)]
    fn difference(
        &self,
        plain: &[u8],
        parts: &Parts<'_>,
        order: &[(u64, usize)],
        column: &[Option<usize>],
        restarts: &[bool],
        layout: u64,
        new_bytes: usize,
        granted: usize,
    ) -> Result<(Held, DeltaOutcome), DeltaError> {
        let width = column.iter().flatten().count();
        let distinct = new_bytes / WORD / (width + 1);
        let mut keys = Vec::with_capacity(distinct);
        // `distinct * width` fits: it is below `new_bytes`, which did not
        // overflow.
        let mut values = Vec::with_capacity(distinct * width);
        let mut slot_of = vec![0usize; parts.samples.len()];
        let mut first = Vec::with_capacity(distinct);
        for group in order.chunk_by(|a, b| a.0 == b.0) {
            let slot = keys.len();
            keys.push(group[0].0);
            first.push(group[0].1);
            let start = values.len();
            values.resize(start + width, 0i64);
            let sums = &mut values[start..];
            for &(_, i) in group {
                slot_of[i] = slot;
                let sample = parts.samples.get(i).copied().unwrap_or_default();
                for_each_value(sample, |index, v| {
                    if let Some(&Some(k)) = column.get(index) {
                        // Saturating keeps crafted values from overflowing.
                        sums[k] = sums[k].saturating_add(v);
                    }
                })?;
            }
        }
        let new = Held {
            layout,
            width,
            time_nanos: parts.time_nanos,
            keys: keys.into_boxed_slice(),
            values: values.into_boxed_slice(),
        };
        debug_assert_eq!(new.bytes(), new_bytes);

        let instant = || instant(plain, parts, column, &new, &first, &slot_of, granted);
        let outcome = match &self.held {
            None => DeltaOutcome::Primed(instant()?),
            // Another profile shape under the same series (the target was
            // replaced by something else): start over as on a first scrape.
            Some(old) if old.layout != layout || old.width != width => {
                DeltaOutcome::Primed(instant()?)
            }
            Some(old) => match Rewrite::new(column, restarts, old, &new, &first, &slot_of) {
                Some(rewrite) => {
                    DeltaOutcome::Delta(rewrite.delta(plain, parts, old, &new, granted)?)
                }
                None => DeltaOutcome::Reset(instant()?),
            },
        };
        Ok((new, outcome))
    }

    /// Forgets the state and gives its memory back.
    pub fn clear(&mut self) {
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

/// A scrape's instant values alone (`inuse_*`: every cumulative value 0),
/// for a scrape with nothing to difference against; `None` when it has no
/// instant sample type, none of its values is above 0, or writing them
/// would take more than `granted` (the state is primed all the same).
fn instant(
    plain: &[u8],
    parts: &Parts<'_>,
    column: &[Option<usize>],
    new: &Held,
    first: &[usize],
    slot_of: &[usize],
    granted: usize,
) -> Result<Option<Delta>, DeltaError> {
    if column.iter().all(Option::is_some) {
        return Ok(None);
    }
    // Against itself nothing went down, so every cumulative delta is 0.
    let Some(rewrite) = Rewrite::new(column, &[], new, new, first, slot_of) else {
        return Ok(None);
    };
    match rewrite.delta(plain, parts, new, new, granted) {
        Ok(d) if d.samples > 0 => Ok(Some(d)),
        Ok(_) | Err(DeltaError::OverBudget { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests;
