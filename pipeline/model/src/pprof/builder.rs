//! [`ProfileBuilder`]: a pprof profile made sample by sample, every string,
//! function and location interned once; with what it holds counted, so a
//! conversion can grant its memory before it grows.

use super::{Function, Label, Line, Location, Profile, Sample, ValueType};

/// The builder's indexes, keyed by what senders choose (frame names): a
/// fast hash with a per-process random seed.
type BuilderMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;

/// Builds a profile with string interning; used by receivers that convert text
/// formats and JFR, and by tests.
#[derive(Debug, Default)]
pub struct ProfileBuilder {
    profile: Profile,
    strings: BuilderMap<String, i64>,
    /// Function name → the location of its line-less frame.
    functions: BuilderMap<i64, u64>,
    /// Function name → function id.
    function_ids: BuilderMap<i64, u64>,
    /// (function id, line) → location id, for frames with a line.
    lines: BuilderMap<(u64, i64), u64>,
    /// The bytes of every string interned, and of every sample's ids,
    /// values and labels: for [`ProfileBuilder::held_bytes`].
    string_bytes: usize,
    sample_bytes: usize,
}

impl ProfileBuilder {
    pub fn new() -> Self {
        let mut b = ProfileBuilder::default();
        b.intern("");
        b
    }

    /// The string-table index of `s`, adding it if new.
    pub fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.string_bytes += s.len();
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    pub fn sample_type(&mut self, ty: &str, unit: &str) -> &mut Self {
        let v = ValueType {
            r#type: self.intern(ty),
            unit: self.intern(unit),
        };
        self.profile.sample_type.push(v);
        self
    }

    pub fn period(&mut self, ty: &str, unit: &str, period: i64) -> &mut Self {
        let v = ValueType {
            r#type: self.intern(ty),
            unit: self.intern(unit),
        };
        self.profile.period_type = Some(v);
        self.profile.period = period;
        self
    }

    pub fn time(&mut self, time_nanos: i64, duration_nanos: i64) -> &mut Self {
        self.profile.time_nanos = time_nanos;
        self.profile.duration_nanos = duration_nanos;
        self
    }

    /// Distinct frames (functions) so far.
    pub fn frames(&self) -> usize {
        self.profile.function.len()
    }

    /// Whether a frame named `name` was added already ([`ProfileBuilder::frame`]
    /// would allocate nothing for it).
    pub fn has_frame(&self, name: &str) -> bool {
        self.strings
            .get(name)
            .is_some_and(|i| self.functions.contains_key(i))
    }

    /// The location id of a function-only frame named `name` (one location per function).
    pub fn frame(&mut self, name: &str) -> u64 {
        let name_idx = self.intern(name);
        if let Some(&loc) = self.functions.get(&name_idx) {
            return loc;
        }
        let function = self.function(name_idx);
        let id = self.location(function, 0);
        self.functions.insert(name_idx, id);
        id
    }

    /// The location id of a frame in function `name` at `line` (one
    /// location per function and line; line 0 is the function-only frame).
    pub fn frame_at(&mut self, name: &str, line: i64) -> u64 {
        if line == 0 {
            return self.frame(name);
        }
        let name_idx = self.intern(name);
        let function = self.function(name_idx);
        if let Some(&loc) = self.lines.get(&(function, line)) {
            return loc;
        }
        let id = self.location(function, line);
        self.lines.insert((function, line), id);
        id
    }

    fn function(&mut self, name_idx: i64) -> u64 {
        if let Some(&id) = self.function_ids.get(&name_idx) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(Function {
            id,
            name: name_idx,
            system_name: name_idx,
            filename: 0,
            start_line: 0,
        });
        self.function_ids.insert(name_idx, id);
        id
    }

    fn location(&mut self, function_id: u64, line: i64) -> u64 {
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line {
                function_id,
                line,
                column: 0,
            }],
            is_folded: false,
        });
        id
    }

    /// Adds a sample of `locations` (leaf first, as pprof keeps them) with
    /// string labels.
    pub fn sample_with_labels(
        &mut self,
        locations: Vec<u64>,
        values: Vec<i64>,
        labels: &[(&str, &str)],
    ) -> &mut Self {
        let label = labels
            .iter()
            .map(|(k, v)| Label {
                key: self.intern(k),
                str: self.intern(v),
                num: 0,
                num_unit: 0,
            })
            .collect::<Vec<Label>>();
        self.sample_bytes += Self::sample_size(locations.len(), values.len(), label.len());
        self.profile.sample.push(Sample {
            location_id: locations,
            value: values,
            label,
        });
        self
    }

    fn sample_size(locations: usize, values: usize, labels: usize) -> usize {
        use std::mem::size_of;
        size_of::<Sample>()
            + locations * size_of::<u64>()
            + values * size_of::<i64>()
            + labels * size_of::<Label>()
    }

    /// The most [`ProfileBuilder::held_bytes`] can grow by when a sample of
    /// frames named `names`, `values` values and labels of `label_bytes`
    /// bytes (`labels` of them) is added: each frame new, each string too.
    pub fn sample_bound(
        names: impl Iterator<Item = usize>,
        values: usize,
        labels: usize,
        label_bytes: usize,
    ) -> usize {
        use std::mem::size_of;
        let string = 2 * size_of::<String>() + 2 * size_of::<(String, i64)>();
        let frame = size_of::<u64>()
            + size_of::<Function>()
            + 2 * size_of::<(i64, u64)>()
            + size_of::<Location>()
            + size_of::<Line>()
            + 2 * size_of::<((u64, i64), u64)>()
            + string;
        let frames: usize = names.map(|n| frame + 2 * n).sum();
        frames + Self::sample_size(0, values, labels) + labels * 2 * string + 2 * label_bytes
    }

    /// About what the profile made so far holds in memory, with the
    /// builder's indexes (each entry counted twice over for a map's room).
    pub fn held_bytes(&self) -> usize {
        use std::mem::size_of;
        let p = &self.profile;
        2 * self.string_bytes
            + p.string_table.len() * (2 * size_of::<String>() + 2 * size_of::<(String, i64)>())
            + p.function.len() * (size_of::<Function>() + 2 * size_of::<(i64, u64)>())
            + p.location.len()
                * (size_of::<Location>() + size_of::<Line>() + 2 * size_of::<((u64, i64), u64)>())
            + self.sample_bytes
    }

    /// Adds a sample whose stack is given root first (as folded text writes it).
    pub fn sample_root_first<'a>(
        &mut self,
        stack: impl IntoIterator<Item = &'a str>,
        values: Vec<i64>,
    ) -> &mut Self {
        let mut ids: Vec<u64> = stack.into_iter().map(|f| self.frame(f)).collect();
        ids.reverse();
        self.sample_bytes += Self::sample_size(ids.len(), values.len(), 0);
        self.profile.sample.push(Sample {
            location_id: ids,
            value: values,
            label: Vec::new(),
        });
        self
    }

    pub fn build(self) -> Profile {
        self.profile
    }
}
