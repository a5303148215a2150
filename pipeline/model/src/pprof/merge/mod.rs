//! [`Merger`]: pprof profiles of one series summed into one, as a backend
//! sums them when it reads a time range: equal stacks with equal labels
//! become one sample whose values are the sums; strings, mappings,
//! functions and locations are kept once each. What the merged profile
//! holds is counted ([`Merger::held_bytes`]), so its memory can be granted
//! as it grows.
//!
//! A profile is read as [`ProfileParts`], straight off its plain bytes
//! where it has them. Lookups hash what the profile says and compare it
//! with what the merged profile holds, so a stack, location or string
//! already merged costs no allocation.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::mem::size_of;

use hashbrown::HashTable;

use super::{DecodeError, Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

mod parts;
pub use parts::ProfileParts;
use parts::SamplePart;

/// The merger's hash: fast, with a per-process random seed (the keys are
/// what senders choose).
type Seed = foldhash::quality::RandomState;
type MergeMap<K, V> = HashMap<K, V, Seed>;

/// A mapping by what it says (its id is the profile's own numbering).
type MappingKey = (u64, u64, u64, i64, i64, [bool; 4]);
/// A function by its strings and start line.
type FunctionKey = (i64, i64, i64, i64);

/// What one more string costs: the `String`, its table slot and its index
/// entry (counted twice for a table's room).
const STRING_COST: usize = size_of::<String>() + 2 * size_of::<i64>();
const MAPPING_COST: usize = size_of::<Mapping>() + 2 * size_of::<(MappingKey, u64)>();
const FUNCTION_COST: usize = size_of::<Function>() + 2 * size_of::<(FunctionKey, u64)>();
const LOCATION_COST: usize = size_of::<Location>() + 2 * size_of::<u64>();
const SAMPLE_COST: usize = size_of::<Sample>() + 2 * size_of::<usize>();

/// Maps a profile's own ids (mapping, function, location) to the merged
/// ones: a table indexed by id when the ids are dense, as writers number
/// them, else a map.
#[derive(Debug, Default)]
struct IdMap {
    dense: Vec<u64>,
    sparse: MergeMap<u64, u64>,
}

impl IdMap {
    fn clear(&mut self) {
        self.dense.clear();
        self.sparse.clear();
    }

    /// `merged` is never 0; `count` is how many ids the profile has.
    fn insert(&mut self, id: u64, merged: u64, count: usize) {
        match usize::try_from(id) {
            Ok(i) if i <= 2 * count + 16 => {
                if self.dense.len() <= i {
                    self.dense.resize(i + 1, 0);
                }
                self.dense[i] = merged;
            }
            _ => {
                self.sparse.insert(id, merged);
            }
        }
    }

    fn get(&self, id: u64) -> Option<u64> {
        let dense = usize::try_from(id)
            .ok()
            .and_then(|i| self.dense.get(i))
            .copied()
            .filter(|m| *m != 0);
        dense.or_else(|| self.sparse.get(&id).copied())
    }
}

/// What [`Merger::add`] reuses from one profile to the next.
#[derive(Debug, Default)]
struct Scratch {
    strings: Vec<i64>,
    mappings: IdMap,
    functions: IdMap,
    locations: IdMap,
    lines: Vec<Line>,
    sample: SamplePart,
    stack: Vec<u64>,
    labels: Vec<Label>,
}

/// Sums pprof profiles of the same sample and period types into one.
#[derive(Debug)]
pub struct Merger {
    profile: Profile,
    seed: Seed,
    /// Indices into the string table.
    strings: HashTable<i64>,
    mappings: MergeMap<MappingKey, u64>,
    functions: MergeMap<FunctionKey, u64>,
    /// Location ids (1-based positions).
    locations: HashTable<u64>,
    /// Positions in the sample list.
    samples: HashTable<usize>,
    /// The end of the latest profile merged (unix nanoseconds), 0 if none
    /// had a time.
    end_nanos: i64,
    held: usize,
    merged: usize,
    scratch: Scratch,
}

impl Merger {
    /// A merger holding `first`: the merged profile takes its sample types,
    /// period, comments and frame filters.
    pub fn new(first: &ProfileParts<'_>) -> Result<Merger, DecodeError> {
        let mut m = Merger {
            profile: Profile::default(),
            seed: Seed::default(),
            strings: HashTable::new(),
            mappings: MergeMap::default(),
            functions: MergeMap::default(),
            locations: HashTable::new(),
            samples: HashTable::new(),
            end_nanos: 0,
            held: 0,
            merged: 0,
            scratch: Scratch::default(),
        };
        m.intern("");
        let vt = |m: &mut Merger, (ty, unit): (i64, i64)| ValueType {
            r#type: m.intern(first.string(ty)),
            unit: m.intern(first.string(unit)),
        };
        m.profile.sample_type = first.sample_types.iter().map(|v| vt(&mut m, *v)).collect();
        m.profile.period_type = first.period_type.map(|v| vt(&mut m, v));
        m.profile.period = first.period;
        m.profile.drop_frames = m.intern(first.string(first.drop_frames));
        m.profile.keep_frames = m.intern(first.string(first.keep_frames));
        m.profile.comment = first
            .comments
            .iter()
            .map(|c| m.intern(first.string(*c)))
            .collect();
        m.profile.default_sample_type = m.intern(first.string(first.default_sample_type));
        m.profile.doc_url = m.intern(first.string(first.doc_url));
        m.add(first)?;
        Ok(m)
    }

    /// True when `p` has the merged profile's sample types and period type
    /// (by name and unit), so its values add up with the merged ones.
    pub fn fits(&self, p: &ProfileParts<'_>) -> bool {
        let same = |a: &ValueType, (ty, unit): (i64, i64)| {
            self.profile.string(a.r#type) == p.string(ty)
                && self.profile.string(a.unit) == p.string(unit)
        };
        self.profile.sample_type.len() == p.sample_types.len()
            && self
                .profile
                .sample_type
                .iter()
                .zip(&p.sample_types)
                .all(|(a, b)| same(a, *b))
            && match (&self.profile.period_type, p.period_type) {
                (Some(a), Some(b)) => same(a, b),
                (None, None) => true,
                _ => false,
            }
    }

    /// The most [`Merger::held_bytes`] can grow by when `p` is added (or
    /// starts a merger): as if each of its strings, mappings, functions,
    /// locations and samples were new. One pass over `p`, no allocation.
    pub fn bound(p: &ProfileParts<'_>) -> usize {
        let strings: usize = p.strings.iter().map(|s| s.len() + STRING_COST).sum();
        // The value types, comments and frame filters a new merger interns.
        let header = (2 * p.sample_types.len() + p.comments.len() + 8) * STRING_COST;
        let values = p.sample_count() * p.sample_types.len().max(1) * size_of::<i64>();
        strings
            + header
            + p.mappings.len() * MAPPING_COST
            + p.functions.len() * FUNCTION_COST
            + p.locations.len() * LOCATION_COST
            + p.lines.len() * size_of::<Line>()
            + p.sample_count() * SAMPLE_COST
            + values
            + p.sample_elements() * size_of::<Label>()
    }

    /// Adds `p`'s samples (call [`Merger::fits`] first: values are summed
    /// position by position). Returns how much [`Merger::held_bytes`] grew.
    /// References to ids `p` does not define are dropped, as a reader
    /// would find nothing there. A sample that cannot be read is an error;
    /// the samples before it are merged.
    pub fn add(&mut self, p: &ProfileParts<'_>) -> Result<usize, DecodeError> {
        let before = self.held;
        self.merged += 1;
        if p.time_nanos != 0 {
            let t = &mut self.profile.time_nanos;
            *t = if *t == 0 {
                p.time_nanos
            } else {
                (*t).min(p.time_nanos)
            };
            let end = p.time_nanos.saturating_add(p.duration_nanos.max(0));
            self.end_nanos = self.end_nanos.max(end);
            self.profile.duration_nanos = self.end_nanos.saturating_sub(self.profile.time_nanos);
        }
        let mut scratch = std::mem::take(&mut self.scratch);
        let result = self.add_parts(p, &mut scratch);
        self.scratch = scratch;
        result?;
        Ok(self.held - before)
    }

    fn add_parts(&mut self, p: &ProfileParts<'_>, s: &mut Scratch) -> Result<(), DecodeError> {
        // The profile's strings, then its ids, in the merged numbering.
        s.strings.clear();
        for text in &p.strings {
            let i = self.intern(text);
            s.strings.push(i);
        }
        let strings = &s.strings;
        let s0 = |i: i64| {
            usize::try_from(i)
                .ok()
                .and_then(|i| strings.get(i))
                .copied()
                .unwrap_or(0)
        };
        s.mappings.clear();
        for m in &p.mappings {
            let key = (
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                s0(m.filename),
                s0(m.build_id),
                m.has,
            );
            let id = self.mapping(key);
            s.mappings.insert(m.id, id, p.mappings.len());
        }
        s.functions.clear();
        for f in &p.functions {
            let key = (s0(f.name), s0(f.system_name), s0(f.filename), f.start_line);
            let id = self.function(key);
            s.functions.insert(f.id, id, p.functions.len());
        }
        s.locations.clear();
        for l in &p.locations {
            s.lines.clear();
            for &(function_id, line, column) in &p.lines[l.first..l.first + l.count] {
                if let Some(function_id) = s.functions.get(function_id) {
                    s.lines.push(Line {
                        function_id,
                        line,
                        column,
                    });
                }
            }
            let mapping = s.mappings.get(l.mapping_id).unwrap_or(0);
            let id = self.location(mapping, l.address, l.is_folded, &s.lines);
            s.locations.insert(l.id, id, p.locations.len());
        }
        for i in 0..p.sample_count() {
            let (ids, values, labels) = p.sample(i, &mut s.sample);
            s.stack.clear();
            s.stack
                .extend(ids.iter().filter_map(|id| s.locations.get(*id)));
            s.labels.clear();
            s.labels
                .extend(labels.iter().map(|&(key, str, num, unit)| Label {
                    key: s0(key),
                    str: s0(str),
                    num,
                    num_unit: s0(unit),
                }));
            self.sample(&s.stack, &s.labels, values);
        }
        Ok(())
    }

    /// How many profiles were merged.
    pub fn merged(&self) -> usize {
        self.merged
    }

    /// About what the merged profile and the indexes hold in memory.
    pub fn held_bytes(&self) -> usize {
        self.held
    }

    /// The merged profile.
    pub fn finish(self) -> Profile {
        self.profile
    }

    fn intern(&mut self, s: &str) -> i64 {
        let hash = self.seed.hash_one(s);
        let table = &self.profile.string_table;
        if let Some(&i) = self.strings.find(hash, |&i| table[i as usize] == s) {
            return i;
        }
        let i = table.len() as i64;
        self.held += s.len() + STRING_COST;
        self.profile.string_table.push(s.to_owned());
        let (seed, table) = (&self.seed, &self.profile.string_table);
        self.strings
            .insert_unique(hash, i, |&j| seed.hash_one(table[j as usize].as_str()));
        i
    }

    fn mapping(&mut self, key: MappingKey) -> u64 {
        if let Some(&id) = self.mappings.get(&key) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        let (memory_start, memory_limit, file_offset, filename, build_id, has) = key;
        self.profile.mapping.push(Mapping {
            id,
            memory_start,
            memory_limit,
            file_offset,
            filename,
            build_id,
            has_functions: has[0],
            has_filenames: has[1],
            has_line_numbers: has[2],
            has_inline_frames: has[3],
        });
        self.held += MAPPING_COST;
        self.mappings.insert(key, id);
        id
    }

    fn function(&mut self, key: FunctionKey) -> u64 {
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        let (name, system_name, filename, start_line) = key;
        self.profile.function.push(Function {
            id,
            name,
            system_name,
            filename,
            start_line,
        });
        self.held += FUNCTION_COST;
        self.functions.insert(key, id);
        id
    }

    fn location_hash(seed: &Seed, mapping: u64, address: u64, folded: bool, lines: &[Line]) -> u64 {
        let mut h = seed.build_hasher();
        (mapping, address, folded, lines.len()).hash(&mut h);
        for l in lines {
            (l.function_id, l.line, l.column).hash(&mut h);
        }
        h.finish()
    }

    fn location(&mut self, mapping_id: u64, address: u64, is_folded: bool, lines: &[Line]) -> u64 {
        let hash = Self::location_hash(&self.seed, mapping_id, address, is_folded, lines);
        let all = &self.profile.location;
        let same = |&id: &u64| {
            let l = &all[id as usize - 1];
            l.mapping_id == mapping_id
                && l.address == address
                && l.is_folded == is_folded
                && l.line == lines
        };
        if let Some(&id) = self.locations.find(hash, same) {
            return id;
        }
        let id = all.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line: lines.to_vec(),
            is_folded,
        });
        self.held += LOCATION_COST + size_of_val(lines);
        let (seed, all) = (&self.seed, &self.profile.location);
        self.locations.insert_unique(hash, id, |&id| {
            let l = &all[id as usize - 1];
            Self::location_hash(seed, l.mapping_id, l.address, l.is_folded, &l.line)
        });
        id
    }

    fn sample_hash(seed: &Seed, stack: &[u64], labels: &[Label]) -> u64 {
        let mut h = seed.build_hasher();
        stack.hash(&mut h);
        labels.len().hash(&mut h);
        for l in labels {
            (l.key, l.str, l.num, l.num_unit).hash(&mut h);
        }
        h.finish()
    }

    fn sample(&mut self, stack: &[u64], labels: &[Label], values: &[i64]) {
        let hash = Self::sample_hash(&self.seed, stack, labels);
        let all = &self.profile.sample;
        let same = |&i: &usize| all[i].location_id == stack && all[i].label == labels;
        if let Some(&i) = self.samples.find(hash, same) {
            let merged = &mut self.profile.sample[i].value;
            for (j, v) in values.iter().enumerate() {
                match merged.get_mut(j) {
                    Some(m) => *m = m.saturating_add(*v),
                    None => {
                        merged.push(*v);
                        self.held += size_of::<i64>();
                    }
                }
            }
            return;
        }
        self.held += SAMPLE_COST + size_of_val(stack) + size_of_val(values) + size_of_val(labels);
        let i = all.len();
        self.profile.sample.push(Sample {
            location_id: stack.to_vec(),
            value: values.to_vec(),
            label: labels.to_vec(),
        });
        let (seed, all) = (&self.seed, &self.profile.sample);
        self.samples.insert_unique(hash, i, |&i| {
            Self::sample_hash(seed, &all[i].location_id, &all[i].label)
        });
    }
}

#[cfg(test)]
mod tests;
