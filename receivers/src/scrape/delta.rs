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

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proflow_pipeline::wire::{self, Value, WireError};

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
#[derive(Debug, Clone, PartialEq)]
pub enum DeltaOutcome {
    /// First scrape (or first after a reset / after state was refused, or
    /// the sample types changed): nothing to emit, state primed.
    Primed,
    /// A counter went down: the process restarted. State re-primed with this
    /// scrape; nothing emitted.
    Reset,
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
        let parts = match Parts::read(plain, granted) {
            Ok(parts) => parts,
            Err(e) => {
                // Whatever comes next is compared with a profile we could
                // read, not with one from before a broken one.
                self.clear();
                return Err(e);
            }
        };
        let result = self.next_parts(plain, &parts, granted);
        if result.is_err() {
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
        let result = self.difference(plain, parts, &order, &column, layout, new_bytes, granted);
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

        let outcome = match &self.held {
            None => DeltaOutcome::Primed,
            // Another profile shape under the same series (the target was
            // replaced by something else): start over as on a first scrape.
            Some(old) if old.layout != layout || old.width != width => DeltaOutcome::Primed,
            Some(old) => match Rewrite::new(column, old, &new, &first, &slot_of) {
                Some(rewrite) => {
                    DeltaOutcome::Delta(rewrite.delta(plain, parts, old, &new, granted)?)
                }
                None => DeltaOutcome::Reset,
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

/// Where the profile's top-level fields are, as slices of its bytes.
struct Parts<'a> {
    /// (type, unit) string indices of each sample type.
    sample_types: Vec<(i64, i64)>,
    samples: Vec<&'a [u8]>,
    locations: Vec<&'a [u8]>,
    functions: Vec<&'a [u8]>,
    strings: Vec<&'a [u8]>,
    time_nanos: i64,
    duration_nanos: i64,
    /// The scratch this call takes, from the counts.
    work: usize,
}

impl<'a> Parts<'a> {
    /// Counts the fields, checks the work fits in `granted`, then notes
    /// where each one is.
    fn read(plain: &'a [u8], granted: usize) -> Result<Parts<'a>, DeltaError> {
        let mut count = [0usize; 7];
        for field in wire::fields(plain) {
            let (tag, value) = field?;
            if let (1..=6, Value::Bytes(_)) = (tag, value) {
                count[tag as usize] += 1;
            }
        }
        let [_, types, samples, _, locations, functions, strings] = count;
        let work = [
            types.saturating_mul(size_of::<(i64, i64)>() + size_of::<Option<usize>>()),
            samples.saturating_mul(WORK_PER_SAMPLE),
            locations
                .saturating_add(functions)
                .saturating_mul(WORK_PER_ENTRY),
            strings.saturating_mul(WORK_PER_STRING),
        ]
        .into_iter()
        .fold(0, usize::saturating_add);
        if work > granted {
            return Err(DeltaError::OverBudget {
                need: work,
                granted,
            });
        }
        let mut parts = Parts {
            sample_types: Vec::with_capacity(types),
            samples: Vec::with_capacity(samples),
            locations: Vec::with_capacity(locations),
            functions: Vec::with_capacity(functions),
            strings: Vec::with_capacity(strings),
            time_nanos: 0,
            duration_nanos: 0,
            work,
        };
        for field in wire::fields(plain) {
            match field? {
                (1, Value::Bytes(b)) => parts.sample_types.push(value_type(b)?),
                (2, Value::Bytes(b)) => parts.samples.push(b),
                (4, Value::Bytes(b)) => parts.locations.push(b),
                (5, Value::Bytes(b)) => parts.functions.push(b),
                (6, Value::Bytes(b)) => parts.strings.push(b),
                // Mappings and the period type: copied, never read.
                (3 | 11, Value::Bytes(_)) => {}
                (1..=6 | 11, _) => {
                    return Err(malformed("a message field is not length-delimited"));
                }
                (9, Value::Varint(v)) => parts.time_nanos = v as i64,
                (10, Value::Varint(v)) => parts.duration_nanos = v as i64,
                (7..=10 | 12, Value::Bytes(_) | Value::Fixed32(_) | Value::Fixed64(_)) => {
                    return Err(malformed("an integer field is not a varint"));
                }
                _ => {}
            }
        }
        Ok(parts)
    }

    /// For each sample type, its column among the cumulative values (`None`
    /// for the others).
    fn cumulative_columns(&self, hasher: &StackHasher) -> Vec<Option<usize>> {
        let mut next = 0;
        self.sample_types
            .iter()
            .map(|&(t, _)| {
                let name = hasher.string_bytes(self, t);
                CUMULATIVE_TYPES
                    .iter()
                    .any(|c| c.as_bytes() == name)
                    .then(|| {
                        next += 1;
                        next - 1
                    })
            })
            .collect()
    }
}

/// Fields 1 to `N` of a message whose fields are all integers (a
/// ValueType, Function, Line or Label), 0 when absent, the last when
/// repeated; other field numbers are skipped, as a decoder skips unknown
/// ones. `what` names the message in the error.
fn varints<const N: usize>(message: &[u8], what: &str) -> Result<[u64; N], DeltaError> {
    let mut out = [0u64; N];
    for field in wire::fields(message) {
        let (tag, value) = field?;
        let Some(slot) = (tag as usize).checked_sub(1).and_then(|i| out.get_mut(i)) else {
            continue;
        };
        match value {
            Value::Varint(v) => *slot = v,
            _ => {
                return Err(DeltaError::Malformed(format!(
                    "field {tag} of a {what} is not a varint"
                )));
            }
        }
    }
    Ok(out)
}

/// A ValueType's (type, unit) string indices.
fn value_type(bytes: &[u8]) -> Result<(i64, i64), DeltaError> {
    let [t, u] = varints(bytes, "ValueType")?;
    Ok((t as i64, u as i64))
}

/// Calls `f` with each varint of a repeated integer field met as `value`:
/// one unpacked element, or every element of a packed run.
fn for_each_varint(value: Value<'_>, mut f: impl FnMut(u64)) -> Result<(), DeltaError> {
    match value {
        Value::Varint(v) => f(v),
        Value::Bytes(mut packed) => {
            while !packed.is_empty() {
                f(wire::read_varint(&mut packed)?);
            }
        }
        Value::Fixed32(_) | Value::Fixed64(_) => {
            return Err(malformed(
                "a repeated integer field is neither varint nor packed",
            ));
        }
    }
    Ok(())
}

/// Calls `f` with (index, value) of each value of a sample, in order.
fn for_each_value(sample: &[u8], mut f: impl FnMut(usize, i64)) -> Result<(), DeltaError> {
    let mut index = 0usize;
    for field in wire::fields(sample) {
        let (tag, value) = field?;
        if tag == 2 {
            for_each_varint(value, |v| {
                f(index, v as i64);
                index += 1;
            })?;
        }
    }
    Ok(())
}

/// Where a key's previous values are while the delta is written.
#[derive(Clone, Copy)]
pub(crate) struct Prev {
    /// The key's first sample, which carries the key's whole delta; later
    /// samples of the key get 0.
    first: usize,
    /// The key's slot in the previous state, or `usize::MAX` when it is new
    /// (its whole value is new).
    before: usize,
}

/// How the samples of a scrape are rewritten into its delta.
struct Rewrite<'s> {
    /// Column of each sample type among the cumulative ones.
    column: &'s [Option<usize>],
    /// Per slot of the new state.
    prev: Vec<Prev>,
    slot_of: &'s [usize],
}

impl<'s> Rewrite<'s> {
    /// `None` when a cumulative value went down (a restart). `new` is the
    /// scrape's state, `first` the first sample of each of its keys and
    /// `slot_of` the slot of each of its samples.
    fn new(
        column: &'s [Option<usize>],
        old: &Held,
        new: &Held,
        first: &[usize],
        slot_of: &'s [usize],
    ) -> Option<Rewrite<'s>> {
        // Both key arrays are sorted: one merge finds each key's previous slot.
        let mut prev = Vec::with_capacity(new.keys.len());
        let mut j = 0;
        for (slot, key) in new.keys.iter().enumerate() {
            while old.keys.get(j).is_some_and(|k| k < key) {
                j += 1;
            }
            let before = if old.keys.get(j) == Some(key) {
                let went_down = new
                    .values(slot)
                    .iter()
                    .zip(old.values(j))
                    .any(|(now, before)| now < before);
                if went_down {
                    return None;
                }
                j
            } else {
                usize::MAX
            };
            prev.push(Prev {
                first: first.get(slot).copied().unwrap_or(usize::MAX),
                before,
            });
        }
        Some(Rewrite {
            column,
            prev,
            slot_of,
        })
    }

    /// The delta profile: `plain` with its samples rewritten and its
    /// duration replaced by the time since the previous scrape.
    fn delta(
        &self,
        plain: &[u8],
        parts: &Parts<'_>,
        old: &Held,
        new: &Held,
        granted: usize,
    ) -> Result<Delta, DeltaError> {
        // The delta covers the time between the two scrapes; the duration Go
        // writes in a cumulative profile is only how long writing it took. A
        // clock that went back leaves the scraped duration.
        let duration = (old.time_nanos > 0 && parts.time_nanos > old.time_nanos)
            .then(|| parts.time_nanos - old.time_nanos);
        let mut length = Count(0);
        self.write(plain, old, new, duration, &mut length)?;
        // The scratch (`Prev`s included) and the delta itself.
        let need = parts.work.saturating_add(length.0);
        if need > granted {
            return Err(DeltaError::OverBudget { need, granted });
        }
        let mut bytes = Vec::with_capacity(length.0);
        let samples = self.write(plain, old, new, duration, &mut bytes)?;
        debug_assert_eq!(bytes.len(), length.0);
        Ok(Delta {
            bytes,
            samples,
            time_nanos: parts.time_nanos,
            duration_nanos: duration.unwrap_or(parts.duration_nanos),
        })
    }

    /// Writes the delta profile to `out`; returns how many samples it kept.
    fn write(
        &self,
        plain: &[u8],
        old: &Held,
        new: &Held,
        duration: Option<i64>,
        out: &mut impl Sink,
    ) -> Result<usize, DeltaError> {
        let mut kept = 0;
        let mut index = 0;
        let mut duration_written = false;
        let mut fields = wire::fields(plain);
        loop {
            let start = plain.len() - fields.rest().len();
            let Some(field) = fields.next() else { break };
            let (tag, value) = field?;
            let raw = &plain[start..plain.len() - fields.rest().len()];
            match (tag, value, duration) {
                (2, Value::Bytes(sample), _) => {
                    if self.write_sample(sample, index, old, new, out)? {
                        kept += 1;
                    }
                    index += 1;
                }
                (10, Value::Varint(_), Some(d)) => {
                    if !duration_written {
                        out.varint(DURATION_KEY);
                        out.varint(d as u64);
                        duration_written = true;
                    }
                }
                _ => out.put(raw),
            }
        }
        if let (Some(d), false) = (duration, duration_written) {
            out.varint(DURATION_KEY);
            out.varint(d as u64);
        }
        Ok(kept)
    }

    /// Writes sample `index` with its new values, unless they are all zero;
    /// true when it was written.
    fn write_sample(
        &self,
        sample: &[u8],
        index: usize,
        old: &Held,
        new: &Held,
        out: &mut impl Sink,
    ) -> Result<bool, DeltaError> {
        let slot = self.slot_of.get(index).copied().unwrap_or(usize::MAX);
        let Some(prev) = self.prev.get(slot) else {
            return Ok(false);
        };
        let now = new.values(slot);
        let before = old.values(prev.before);
        let first = prev.first == index;
        let value_of = |index: usize, v: i64| match self.column.get(index) {
            Some(&Some(k)) if first => {
                // Not negative (no value went down), but a crafted
                // negative previous value could overflow the plain
                // subtraction.
                let now = now.get(k).copied().unwrap_or(0);
                now.saturating_sub(before.get(k).copied().unwrap_or(0))
            }
            Some(&Some(_)) => 0,
            _ => v,
        };
        // The new values' packed length, and whether any is not zero.
        let mut values_len = 0usize;
        let mut any = false;
        for_each_value(sample, |i, v| {
            let v = value_of(i, v);
            any |= v != 0;
            values_len += varint_len(v as u64);
        })?;
        if !any {
            return Ok(false);
        }
        // Every field but the values, as it came: their length first.
        let mut rest = 0usize;
        each_raw_field(sample, |tag, raw| {
            if tag != 2 {
                rest += raw.len();
            }
        })?;
        let values_field = 1 + varint_len(values_len as u64) + values_len;
        out.varint(SAMPLE_KEY);
        out.varint((rest + values_field) as u64);
        // Location ids, values, then labels and any other field: Go's
        // order; each field's elements keep theirs.
        each_raw_field(sample, |tag, raw| {
            if tag == 1 {
                out.put(raw);
            }
        })?;
        out.varint(VALUE_KEY);
        out.varint(values_len as u64);
        for_each_value(sample, |i, v| out.varint(value_of(i, v) as u64))?;
        each_raw_field(sample, |tag, raw| {
            if tag > 2 {
                out.put(raw);
            }
        })?;
        Ok(true)
    }
}

/// Key of a profile's `sample` field (2, length-delimited).
const SAMPLE_KEY: u64 = (2 << 3) | 2;
/// Key of a sample's packed `value` field (2, length-delimited).
const VALUE_KEY: u64 = (2 << 3) | 2;
/// Key of a profile's `duration_nanos` field (10, varint).
const DURATION_KEY: u64 = 10 << 3;

/// Calls `f` with each field of `message` as (field number, its bytes on
/// the wire, key included).
fn each_raw_field(message: &[u8], mut f: impl FnMut(u32, &[u8])) -> Result<(), DeltaError> {
    let mut fields = wire::fields(message);
    loop {
        let start = message.len() - fields.rest().len();
        let Some(field) = fields.next() else {
            return Ok(());
        };
        let (tag, _) = field?;
        f(tag, &message[start..message.len() - fields.rest().len()]);
    }
}

/// Bytes the varint of `v` takes.
fn varint_len(v: u64) -> usize {
    // 1 for 0..=127, one more per 7 bits.
    (64 - (v | 1).leading_zeros() as usize).div_ceil(7)
}

/// Where the delta is written: counted first, then written into a buffer
/// of exactly that length.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn varint(&mut self, v: u64);
}

/// A sink that only counts.
struct Count(usize);

impl Sink for Count {
    fn put(&mut self, bytes: &[u8]) {
        self.0 += bytes.len();
    }
    fn varint(&mut self, v: u64) {
        self.0 += varint_len(v);
    }
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
    fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.push((v as u8) | 0x80);
            v >>= 7;
        }
        self.push(v as u8);
    }
}

/// Stands for a function or location id the profile does not define, so
/// such a reference still hashes the same way every time.
const MISSING: u64 = 0x6d69_7373_696e_6721;

/// Hashes one profile's stacks by content.
///
/// Go writes a new string table and new location and function ids in every
/// profile, so a stack is known again by what it is: each location's address
/// and its lines' function name, system name, file name, line and column,
/// plus the sample's labels. Strings are hashed once each, functions and
/// locations once each from those, and a sample from its locations' hashes,
/// so hashing costs no allocation per sample and reads each string once per
/// scrape rather than once per use.
///
/// The hasher is foldhash (its `quality` variant) with a fixed seed: fast
/// on the short strings and words a profile is made of, and the same
/// content gives the same key in every run (which makes tests
/// deterministic); keys are never stored outside the process. A fixed seed
/// lets a target choose stacks whose keys collide, which only merges that
/// target's own stacks in its own series: the seed protects nothing else,
/// since the keys live in sorted arrays, not in a hash table.
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
    fn new(parts: &Parts<'_>) -> Result<StackHasher, DeltaError> {
        let strings: Vec<u64> = parts.strings.iter().map(|s| hash_bytes(s)).collect();
        let empty = hash_bytes(b"");
        let string = |index: u64| string_hash(&strings, empty, index as i64);

        let mut ids = Vec::with_capacity(parts.functions.len());
        let mut hashes = Vec::with_capacity(parts.functions.len());
        for function in &parts.functions {
            let [id, name, system_name, filename, _start_line] = varints(function, "Function")?;
            let mut h = key_hasher();
            h.write_u64(string(name));
            h.write_u64(string(system_name));
            h.write_u64(string(filename));
            ids.push(id);
            hashes.push(h.finish());
        }
        let functions = ById::new(&ids, hashes);

        ids.clear();
        let mut hashes = Vec::with_capacity(parts.locations.len());
        for location in &parts.locations {
            let (mut id, mut address, mut lines) = (0, 0, 0usize);
            let mut h = key_hasher();
            for field in wire::fields(location) {
                match field? {
                    (1, Value::Varint(v)) => id = v,
                    (3, Value::Varint(v)) => address = v,
                    (4, Value::Bytes(line)) => {
                        let [function, number, column] = varints(line, "Line")?;
                        h.write_u64(functions.get(function));
                        h.write_u64(number);
                        h.write_u64(column);
                        lines += 1;
                    }
                    (1..=3 | 5, Value::Varint(_)) => {}
                    (1..=5, _) => {
                        return Err(malformed("a Location field has the wrong wire type"));
                    }
                    _ => {}
                }
            }
            // Lines are three words each: their count and the address
            // after them leave no two locations alike by accident.
            h.write_usize(lines);
            h.write_u64(address);
            ids.push(id);
            hashes.push(h.finish());
        }
        let locations = ById::new(&ids, hashes);

        Ok(StackHasher {
            strings,
            empty,
            locations,
        })
    }

    fn string(&self, index: i64) -> u64 {
        string_hash(&self.strings, self.empty, index)
    }

    /// The bytes of string `index` (`""` when out of range).
    fn string_bytes<'a>(&self, parts: &Parts<'a>, index: i64) -> &'a [u8] {
        usize::try_from(index)
            .ok()
            .and_then(|i| parts.strings.get(i))
            .copied()
            .unwrap_or_default()
    }

    /// The key of a sample: its locations in order, then its labels.
    fn sample(&self, sample: &[u8]) -> Result<u64, DeltaError> {
        // Location ids and labels are separate repeated fields a writer may
        // interleave: each has its own hasher, and their counts keep a
        // stack and its labels from reading as another stack with others.
        let mut stack = key_hasher();
        let mut labels = key_hasher();
        let (mut depth, mut count) = (0usize, 0usize);
        for field in wire::fields(sample) {
            match field? {
                (1, value) => for_each_varint(value, |id| {
                    stack.write_u64(self.locations.get(id));
                    depth += 1;
                })?,
                (2, Value::Varint(_) | Value::Bytes(_)) => {}
                (3, Value::Bytes(label)) => {
                    let [key, str, num, unit] = varints(label, "Label")?;
                    labels.write_u64(self.string(key as i64));
                    labels.write_u64(self.string(str as i64));
                    labels.write_u64(num);
                    labels.write_u64(self.string(unit as i64));
                    count += 1;
                }
                (2 | 3, _) => return Err(malformed("a Sample field has the wrong wire type")),
                _ => {}
            }
        }
        let mut h = key_hasher();
        h.write_usize(depth);
        h.write_u64(stack.finish());
        h.write_usize(count);
        h.write_u64(labels.finish());
        Ok(h.finish())
    }

    /// The hash of the sample types, type and unit, in order.
    fn layout(&self, sample_types: &[(i64, i64)]) -> u64 {
        let mut h = key_hasher();
        h.write_usize(sample_types.len());
        for &(t, u) in sample_types {
            h.write_u64(self.string(t));
            h.write_u64(self.string(u));
        }
        h.finish()
    }
}

/// The seed of every stack key (any constant would do).
const KEYS: foldhash::quality::FixedState =
    foldhash::quality::FixedState::with_seed(0x7072_6f66_6c6f_7721);

fn key_hasher() -> impl Hasher {
    KEYS.build_hasher()
}

fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = key_hasher();
    h.write(bytes);
    h.finish()
}

/// The hash of string `index`; an index out of range reads as `""`, as
/// a decoder's `Profile::string` does.
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
    fn new(ids: &[u64], hashes: Vec<u64>) -> ById {
        let dense = ids
            .iter()
            .enumerate()
            .all(|(i, &id)| u64::try_from(i).is_ok_and(|i| id == i + 1));
        let sparse = (!dense).then(|| {
            let mut map = HashMap::with_capacity(hashes.len());
            for (i, &id) in ids.iter().enumerate() {
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
