//! [`Merger`]: pprof profiles of one series summed into one, as a backend
//! sums them when it reads a time range: equal stacks with equal labels
//! become one sample whose values are the sums; strings, mappings,
//! functions and locations are kept once each. What the merged profile
//! holds is counted ([`Merger::held_bytes`]), so its memory can be granted
//! as it grows.

use std::collections::HashMap;
use std::mem::size_of;

use super::{Function, Label, Line, Location, Mapping, Profile, Sample, ValueType};

/// The merger's indexes, keyed by what senders choose: a fast hash with a
/// per-process random seed.
type MergeMap<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// A mapping by what it says (its id is the profile's own numbering).
type MappingKey = (u64, u64, u64, i64, i64, [bool; 4]);
/// A function by its strings and start line.
type FunctionKey = (i64, i64, i64, i64);
/// A location by its mapping, address, lines and folding.
type LocationKey = (u64, u64, Vec<(u64, i64, i64)>, bool);
/// A sample by its stack and labels.
type SampleKey = (Vec<u64>, Vec<(i64, i64, i64, i64)>);

/// Sums pprof profiles of the same sample and period types into one.
#[derive(Debug)]
pub struct Merger {
    profile: Profile,
    strings: MergeMap<String, i64>,
    mappings: MergeMap<MappingKey, u64>,
    functions: MergeMap<FunctionKey, u64>,
    locations: MergeMap<LocationKey, u64>,
    samples: MergeMap<SampleKey, usize>,
    /// The end of the latest profile merged (unix nanoseconds), 0 if none
    /// had a time.
    end_nanos: i64,
    held: usize,
    merged: usize,
}

/// What one more string costs, with its index entry (counted twice for a
/// map's room).
const STRING_COST: usize = 2 * size_of::<String>() + 2 * size_of::<(String, i64)>();

impl Merger {
    /// A merger holding `first`: the merged profile takes its sample types,
    /// period, comments and frame filters.
    pub fn new(first: &Profile) -> Merger {
        let mut m = Merger {
            profile: Profile::default(),
            strings: MergeMap::default(),
            mappings: MergeMap::default(),
            functions: MergeMap::default(),
            locations: MergeMap::default(),
            samples: MergeMap::default(),
            end_nanos: 0,
            held: 0,
            merged: 0,
        };
        m.intern("");
        let vt = |m: &mut Merger, v: &ValueType| ValueType {
            r#type: m.intern(first.string(v.r#type)),
            unit: m.intern(first.string(v.unit)),
        };
        m.profile.sample_type = first.sample_type.iter().map(|v| vt(&mut m, v)).collect();
        m.profile.period_type = first.period_type.as_ref().map(|v| vt(&mut m, v));
        m.profile.period = first.period;
        m.profile.drop_frames = m.intern(first.string(first.drop_frames));
        m.profile.keep_frames = m.intern(first.string(first.keep_frames));
        m.profile.comment = first
            .comment
            .iter()
            .map(|c| m.intern(first.string(*c)))
            .collect();
        m.profile.default_sample_type = m.intern(first.string(first.default_sample_type));
        m.profile.doc_url = m.intern(first.string(first.doc_url));
        m.add(first);
        m
    }

    /// True when `p` has the merged profile's sample types and period type
    /// (by name and unit), so its values add up with the merged ones.
    pub fn fits(&self, p: &Profile) -> bool {
        let same = |a: &ValueType, b: &ValueType| {
            self.profile.string(a.r#type) == p.string(b.r#type)
                && self.profile.string(a.unit) == p.string(b.unit)
        };
        self.profile.sample_type.len() == p.sample_type.len()
            && self
                .profile
                .sample_type
                .iter()
                .zip(&p.sample_type)
                .all(|(a, b)| same(a, b))
            && match (&self.profile.period_type, &p.period_type) {
                (Some(a), Some(b)) => same(a, b),
                (None, None) => true,
                _ => false,
            }
    }

    /// Adds `p`'s samples (call [`Merger::fits`] first: values are summed
    /// position by position). Returns how much [`Merger::held_bytes`] grew.
    /// References to ids `p` does not define are dropped, as a reader
    /// would find nothing there.
    pub fn add(&mut self, p: &Profile) -> usize {
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
        // The profile's strings, then its ids, in the merged numbering.
        let strings: Vec<i64> = p.string_table.iter().map(|s| self.intern(s)).collect();
        let s = |i: i64| {
            usize::try_from(i)
                .ok()
                .and_then(|i| strings.get(i))
                .copied()
        };
        let s0 = |i: i64| s(i).unwrap_or(0);
        let mut mapping_ids: MergeMap<u64, u64> = MergeMap::default();
        for m in &p.mapping {
            let key = (
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                s0(m.filename),
                s0(m.build_id),
                [
                    m.has_functions,
                    m.has_filenames,
                    m.has_line_numbers,
                    m.has_inline_frames,
                ],
            );
            let id = self.mapping(key);
            mapping_ids.insert(m.id, id);
        }
        let mut function_ids: MergeMap<u64, u64> = MergeMap::default();
        for f in &p.function {
            let key = (s0(f.name), s0(f.system_name), s0(f.filename), f.start_line);
            let id = self.function(key);
            function_ids.insert(f.id, id);
        }
        let mut location_ids: MergeMap<u64, u64> = MergeMap::default();
        for l in &p.location {
            let lines = l
                .line
                .iter()
                .filter_map(|line| {
                    let f = function_ids.get(&line.function_id)?;
                    Some((*f, line.line, line.column))
                })
                .collect();
            let mapping = mapping_ids.get(&l.mapping_id).copied().unwrap_or(0);
            let id = self.location((mapping, l.address, lines, l.is_folded));
            location_ids.insert(l.id, id);
        }
        for sample in &p.sample {
            let stack: Vec<u64> = sample
                .location_id
                .iter()
                .filter_map(|id| location_ids.get(id).copied())
                .collect();
            let labels: Vec<(i64, i64, i64, i64)> = sample
                .label
                .iter()
                .map(|l| (s0(l.key), s0(l.str), l.num, s0(l.num_unit)))
                .collect();
            self.sample((stack, labels), &sample.value);
        }
        self.held - before
    }

    /// The most [`Merger::held_bytes`] can grow by when `p` is added (or
    /// starts a merger): as if each of its strings, mappings, functions,
    /// locations and samples were new. One pass over `p`, no allocation.
    pub fn bound(p: &Profile) -> usize {
        let strings: usize = p
            .string_table
            .iter()
            .map(|s| 2 * s.len() + STRING_COST)
            .sum();
        let mappings =
            p.mapping.len() * (size_of::<Mapping>() + 2 * size_of::<(MappingKey, u64)>());
        let functions =
            p.function.len() * (size_of::<Function>() + 2 * size_of::<(FunctionKey, u64)>());
        let locations: usize = p
            .location
            .iter()
            .map(|l| {
                size_of::<Location>()
                    + 2 * size_of::<(LocationKey, u64)>()
                    + l.line.len() * (size_of::<Line>() + 2 * size_of::<(u64, i64, i64)>())
            })
            .sum();
        let samples: usize = p
            .sample
            .iter()
            .map(|s| {
                size_of::<Sample>()
                    + 2 * size_of::<(SampleKey, usize)>()
                    + 2 * s.location_id.len() * size_of::<u64>()
                    + s.value.len().max(p.sample_type.len()) * size_of::<i64>()
                    + s.label.len() * (size_of::<Label>() + 2 * size_of::<(i64, i64, i64, i64)>())
            })
            .sum();
        // The value types, comments and frame filters a new merger interns.
        let header = (2 * p.sample_type.len() + p.comment.len() + 8) * STRING_COST;
        strings + mappings + functions + locations + samples + header
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
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.held += 2 * s.len() + STRING_COST;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
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
        self.held += size_of::<Mapping>() + 2 * size_of::<(MappingKey, u64)>();
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
        self.held += size_of::<Function>() + 2 * size_of::<(FunctionKey, u64)>();
        self.functions.insert(key, id);
        id
    }

    fn location(&mut self, key: LocationKey) -> u64 {
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let (mapping_id, address, ref lines, is_folded) = key;
        self.profile.location.push(Location {
            id,
            mapping_id,
            address,
            line: lines
                .iter()
                .map(|&(function_id, line, column)| Line {
                    function_id,
                    line,
                    column,
                })
                .collect(),
            is_folded,
        });
        self.held += size_of::<Location>()
            + 2 * size_of::<(LocationKey, u64)>()
            + lines.len() * (size_of::<Line>() + 2 * size_of::<(u64, i64, i64)>());
        self.locations.insert(key, id);
        id
    }

    fn sample(&mut self, key: SampleKey, values: &[i64]) {
        if let Some(&i) = self.samples.get(&key) {
            let merged = &mut self.profile.sample[i].value;
            for (j, v) in values.iter().enumerate() {
                match merged.get_mut(j) {
                    Some(m) => *m = m.saturating_add(*v),
                    None => merged.push(*v),
                }
            }
            return;
        }
        let (stack, labels) = &key;
        self.held += size_of::<Sample>()
            + 2 * size_of::<(SampleKey, usize)>()
            + 2 * stack.len() * size_of::<u64>()
            + size_of_val(values)
            + labels.len() * (size_of::<Label>() + 2 * size_of::<(i64, i64, i64, i64)>());
        self.profile.sample.push(Sample {
            location_id: stack.clone(),
            value: values.to_vec(),
            label: labels
                .iter()
                .map(|&(key, str, num, num_unit)| Label {
                    key,
                    str,
                    num,
                    num_unit,
                })
                .collect(),
        });
        self.samples.insert(key, self.profile.sample.len() - 1);
    }
}

#[cfg(test)]
mod tests {
    use super::super::ProfileBuilder;
    use super::*;

    /// Folded stacks (root first, `;`-separated) with their values, as a
    /// CPU profile starting at `time` seconds.
    fn cpu(time: i64, stacks: &[(&str, i64)]) -> Profile {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(time * 1_000_000_000, 1_000_000_000);
        for (stack, v) in stacks {
            b.sample_root_first(stack.split(';'), vec![*v]);
        }
        b.build()
    }

    #[test]
    fn equal_stacks_add_up_and_new_ones_join() {
        // The second profile numbers its frames in another order.
        let a = cpu(100, &[("main;work", 30), ("main;idle", 10)]);
        let b = cpu(101, &[("main;gc", 5), ("main;work", 20)]);
        let mut m = Merger::new(&a);
        assert!(m.fits(&b));
        assert!(m.add(&b) > 0);
        assert_eq!(m.merged(), 2);
        let merged = m.finish();
        let want: std::collections::BTreeMap<String, i64> = [
            ("main;gc".to_owned(), 5),
            ("main;idle".to_owned(), 10),
            ("main;work".to_owned(), 50),
        ]
        .into();
        assert_eq!(crate::testdata::folded_totals(&merged), want);
        // One sample per stack, one function per name.
        assert_eq!(merged.sample.len(), 3);
        assert_eq!(merged.function.len(), 4);
        // From the first start to the last end.
        assert_eq!(merged.time_nanos, 100_000_000_000);
        assert_eq!(merged.duration_nanos, 2_000_000_000);
        assert_eq!(merged.period, 10_000_000);
        // What a reader decodes is what was merged.
        let bytes = super::super::encode(&merged);
        assert_eq!(
            super::super::decode(&bytes, 1 << 20).expect("decodes"),
            merged
        );
    }

    #[test]
    fn merging_a_profile_again_holds_nothing_more() {
        let a = cpu(1, &[("a;b;c", 1), ("a;b", 2)]);
        let mut m = Merger::new(&a);
        let held = m.held_bytes();
        assert!(held > 0);
        assert_eq!(m.add(&a), 0);
        assert_eq!(m.held_bytes(), held);
        assert_eq!(
            crate::testdata::folded_totals(&m.finish()).get("a;b;c"),
            Some(&2)
        );
    }

    #[test]
    fn what_a_profile_adds_is_within_its_bound() {
        let a = cpu(1, &[("main;work", 30), ("main;idle", 10)]);
        let b = cpu(2, &[("main;gc;mark;scan", 5), ("other;x", 20)]);
        let m0 = Merger::new(&a);
        assert!(m0.held_bytes() <= Merger::bound(&a));
        let mut m = m0;
        let grew = m.add(&b);
        assert!(grew > 0 && grew <= Merger::bound(&b), "{grew}");
    }

    #[test]
    fn other_types_do_not_fit() {
        let a = cpu(1, &[("a", 1)]);
        let mut alloc = ProfileBuilder::new();
        alloc.sample_type("alloc_space", "bytes");
        alloc.sample_root_first(["a"], vec![1]);
        let m = Merger::new(&a);
        assert!(!m.fits(&alloc.build()));
        let mut wall = ProfileBuilder::new();
        wall.sample_type("cpu", "nanoseconds")
            .period("wall", "nanoseconds", 1);
        assert!(!m.fits(&wall.build()));
    }

    #[test]
    fn labels_and_addresses_keep_samples_apart() {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds");
        let f = b.frame("f");
        b.sample_with_labels(vec![f], vec![1], &[("span_id", "1")]);
        b.sample_with_labels(vec![f], vec![2], &[("span_id", "2")]);
        b.sample_with_labels(vec![f], vec![4], &[("span_id", "1")]);
        let mut p = b.build();
        // A second location of `f` at another address in a mapping.
        p.mapping.push(Mapping {
            id: 7,
            memory_start: 0x1000,
            memory_limit: 0x2000,
            filename: 0,
            ..Mapping::default()
        });
        let mut at = p.location[0].clone();
        at.id = 9;
        at.mapping_id = 7;
        at.address = 0x1234;
        p.location.push(at);
        p.sample.push(Sample {
            location_id: vec![9],
            value: vec![8],
            label: vec![],
        });
        // A stack naming a location the profile does not define loses that frame.
        p.sample.push(Sample {
            location_id: vec![404],
            value: vec![16],
            label: vec![],
        });
        let merged = Merger::new(&p).finish();
        let values: Vec<i64> = merged.sample.iter().map(|s| s.value[0]).collect();
        assert_eq!(values, vec![5, 2, 8, 16]);
        assert_eq!(merged.location.len(), 2);
        assert_eq!(merged.mapping.len(), 1);
        assert_eq!(merged.location[1].address, 0x1234);
        assert!(merged.sample[3].location_id.is_empty());
    }
}
