//! The stack keys: a hash of each sample's stack and labels by content.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

use super::parts::{for_each_varint, varints};
use super::*;

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
pub(super) struct StackHasher {
    strings: Vec<u64>,
    empty: u64,
    locations: ById,
}

impl StackHasher {
    pub(super) fn new(parts: &Parts<'_>) -> Result<StackHasher, DeltaError> {
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
    pub(super) fn string_bytes<'a>(&self, parts: &Parts<'a>, index: i64) -> &'a [u8] {
        usize::try_from(index)
            .ok()
            .and_then(|i| parts.strings.get(i))
            .copied()
            .unwrap_or_default()
    }

    /// The key of a sample: its locations in order, then its labels.
    pub(super) fn sample(&self, sample: &[u8]) -> Result<u64, DeltaError> {
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
    pub(super) fn layout(&self, sample_types: &[(i64, i64)]) -> u64 {
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
    pub(super) fn new(ids: &[u64], hashes: Vec<u64>) -> ById {
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
