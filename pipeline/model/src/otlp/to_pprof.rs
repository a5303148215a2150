//! OTLP → pprof: profiles of one time window and period merge into one pprof
//! profile with one sample type per OTLP profile.

use std::borrow::Cow;

use super::dictionary::HashMap;

use super::check::{check_dictionary, get};
use super::common::any_value;
use super::{BUILD_ID_KEYS, ConvertError, Lost, hex, proto};
use crate::pprof;

/// `table[i]`, where index 0 of an empty table is the zero value: the checks
/// take a table a sender left empty as holding just its entry 0, so a
/// profile they passed must convert too.
fn entry<'t, T: Clone + Default>(
    table: &'t [T],
    what: &str,
    i: i32,
) -> Result<Cow<'t, T>, ConvertError> {
    if i == 0 && table.is_empty() {
        return Ok(Cow::Owned(T::default()));
    }
    get(table, what, i).map(Cow::Borrowed)
}

/// Builds one pprof profile, adding only what samples reference.
struct Builder<'d> {
    dict: &'d proto::ProfilesDictionary,
    profile: pprof::Profile,
    strings: HashMap<String, i64>,
    mappings: HashMap<i32, u64>,
    functions: HashMap<i32, u64>,
    locations: HashMap<i32, u64>,
    samples: HashMap<(i32, Vec<i32>, i32), usize>,
}

impl<'d> Builder<'d> {
    fn new(dict: &'d proto::ProfilesDictionary) -> Self {
        let mut b = Builder {
            dict,
            profile: pprof::Profile::default(),
            strings: HashMap::default(),
            mappings: HashMap::default(),
            functions: HashMap::default(),
            locations: HashMap::default(),
            samples: HashMap::default(),
        };
        b.intern("");
        b
    }

    fn intern(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn string(&self, i: i32) -> Result<&'d str, ConvertError> {
        if i == 0 && self.dict.string_table.is_empty() {
            return Ok("");
        }
        get(&self.dict.string_table, "string", i).map(String::as_str)
    }

    fn intern_ref(&mut self, i: i32) -> Result<i64, ConvertError> {
        let s = self.string(i)?;
        Ok(self.intern(s))
    }

    fn value_type(
        &mut self,
        t: Option<&proto::ValueType>,
    ) -> Result<pprof::ValueType, ConvertError> {
        let t = t.cloned().unwrap_or_default();
        Ok(pprof::ValueType {
            r#type: self.intern_ref(t.type_strindex)?,
            unit: self.intern_ref(t.unit_strindex)?,
        })
    }

    fn mapping(&mut self, i: i32, lost: &mut Lost) -> Result<u64, ConvertError> {
        if i == 0 {
            return Ok(0);
        }
        if let Some(&id) = self.mappings.get(&i) {
            return Ok(id);
        }
        let m = get(&self.dict.mapping_table, "mapping", i)?;
        let mut build_id = None;
        let mut others = 0;
        for &a in &m.attribute_indices {
            let attr = entry(&self.dict.attribute_table, "attribute", a)?;
            let key = self.string(attr.key_strindex)?;
            let rank = BUILD_ID_KEYS.iter().position(|k| *k == key);
            match (rank, self.attribute_text(&attr)?) {
                (Some(rank), Some(text)) => {
                    if build_id.as_ref().is_none_or(|(r, _)| rank < *r) {
                        build_id = Some((rank, text));
                    }
                }
                _ => others += 1,
            }
        }
        lost.add("mapping attributes other than a build id", others);
        let id = self.profile.mapping.len() as u64 + 1;
        let mapping = pprof::Mapping {
            id,
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename: self.intern_ref(m.filename_strindex)?,
            build_id: match build_id {
                Some((_, text)) => self.intern(&text),
                None => 0,
            },
            ..pprof::Mapping::default()
        };
        self.profile.mapping.push(mapping);
        self.mappings.insert(i, id);
        Ok(id)
    }

    fn function(&mut self, i: i32) -> Result<u64, ConvertError> {
        if let Some(&id) = self.functions.get(&i) {
            return Ok(id);
        }
        let f = entry(&self.dict.function_table, "function", i)?;
        let id = self.profile.function.len() as u64 + 1;
        let function = pprof::Function {
            id,
            name: self.intern_ref(f.name_strindex)?,
            system_name: self.intern_ref(f.system_name_strindex)?,
            filename: self.intern_ref(f.filename_strindex)?,
            start_line: f.start_line,
        };
        self.profile.function.push(function);
        self.functions.insert(i, id);
        Ok(id)
    }

    fn location(&mut self, i: i32, lost: &mut Lost) -> Result<u64, ConvertError> {
        if let Some(&id) = self.locations.get(&i) {
            return Ok(id);
        }
        let l = entry(&self.dict.location_table, "location", i)?;
        lost.add("location attributes", l.attribute_indices.len());
        let mapping_id = self.mapping(l.mapping_index, lost)?;
        let mut lines = Vec::with_capacity(l.lines.len());
        for line in &l.lines {
            lines.push(pprof::Line {
                function_id: self.function(line.function_index)?,
                line: line.line,
                column: line.column,
            });
        }
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(pprof::Location {
            id,
            mapping_id,
            address: l.address,
            line: lines,
            is_folded: false,
        });
        self.locations.insert(i, id);
        Ok(id)
    }

    /// An attribute's value as text, for strings (inline or by reference);
    /// `None` for other kinds.
    fn attribute_text(&self, a: &proto::KeyValueAndUnit) -> Result<Option<String>, ConvertError> {
        Ok(match a.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::StringValue(s)) => Some(s.clone()),
            Some(any_value::Value::StringValueStrindex(i)) => Some(self.string(*i)?.to_owned()),
            _ => None,
        })
    }

    fn label(&mut self, a: i32, lost: &mut Lost) -> Result<Option<pprof::Label>, ConvertError> {
        let attr = entry(&self.dict.attribute_table, "attribute", a)?;
        let key = self.intern_ref(attr.key_strindex)?;
        let unit = self.intern_ref(attr.unit_strindex)?;
        let text = |s: &str, b: &mut Self| pprof::Label {
            key,
            str: b.intern(s),
            ..pprof::Label::default()
        };
        Ok(match attr.value.as_ref().and_then(|v| v.value.as_ref()) {
            Some(any_value::Value::IntValue(n)) => Some(pprof::Label {
                key,
                num: *n,
                num_unit: unit,
                ..pprof::Label::default()
            }),
            Some(any_value::Value::StringValue(s)) => Some(text(s, self)),
            Some(any_value::Value::StringValueStrindex(i)) => {
                let s = self.string(*i)?;
                Some(text(s, self))
            }
            Some(any_value::Value::BoolValue(v)) => {
                lost.add("attribute value kinds (bool, double) written as text", 1);
                Some(text(&v.to_string(), self))
            }
            Some(any_value::Value::DoubleValue(v)) => {
                lost.add("attribute value kinds (bool, double) written as text", 1);
                Some(text(&v.to_string(), self))
            }
            _ => {
                lost.add("attributes with array, map, bytes or no value", 1);
                None
            }
        })
    }

    /// Adds one OTLP profile's samples as sample type `t` of `types`.
    fn add_samples(
        &mut self,
        p: &proto::Profile,
        t: usize,
        types: usize,
        lost: &mut Lost,
    ) -> Result<(), ConvertError> {
        for (n, s) in p.samples.iter().enumerate() {
            // pprof has no time per sample: the sample's total is kept, the
            // times of its events are not.
            lost.add("sample timestamps", s.timestamps_unix_nano.len());
            let value = match (s.values.is_empty(), s.timestamps_unix_nano.is_empty()) {
                (false, true) => s.values.iter().fold(0i64, |a, v| a.saturating_add(*v)),
                (false, false) if s.values.len() == s.timestamps_unix_nano.len() => {
                    s.values.iter().fold(0i64, |a, v| a.saturating_add(*v))
                }
                (false, false) => {
                    return Err(ConvertError::new(format!(
                        "sample {n} has {} values but {} timestamps; OTLP profiles 1.10 requires as many of each",
                        s.values.len(),
                        s.timestamps_unix_nano.len()
                    )));
                }
                (true, false) => s.timestamps_unix_nano.len() as i64,
                (true, true) => {
                    return Err(ConvertError::new(format!(
                        "sample {n} has neither values nor timestamps; is the sender on OTLP profiles 1.10 (v1development)? Earlier versions numbered Sample's fields differently"
                    )));
                }
            };
            let key = (s.stack_index, s.attribute_indices.clone(), s.link_index);
            if let Some(&at) = self.samples.get(&key) {
                let slot = &mut self.profile.sample[at].value[t];
                *slot = slot.saturating_add(value);
                continue;
            }
            let stack = entry(&self.dict.stack_table, "stack", s.stack_index)?;
            let mut location_id = Vec::with_capacity(stack.location_indices.len());
            for &l in &stack.location_indices {
                location_id.push(self.location(l, lost)?);
            }
            let mut label = Vec::with_capacity(s.attribute_indices.len() + 2);
            for &a in &s.attribute_indices {
                label.extend(self.label(a, lost)?);
            }
            if s.link_index != 0 {
                let link = get(&self.dict.link_table, "link", s.link_index)?;
                for (name, id) in [("trace_id", &link.trace_id), ("span_id", &link.span_id)] {
                    if !id.is_empty() {
                        let key = self.intern(name);
                        label.push(pprof::Label {
                            key,
                            str: self.intern(&hex(id)),
                            ..pprof::Label::default()
                        });
                    }
                }
            }
            let mut values = vec![0i64; types];
            values[t] = value;
            self.samples.insert(key, self.profile.sample.len());
            self.profile.sample.push(pprof::Sample {
                location_id,
                value: values,
                label,
            });
        }
        Ok(())
    }
}

/// Converts OTLP profiles that share `dict` into pprof profiles. Profiles with
/// the same time, duration, period type and period merge into one pprof
/// profile with one sample type per OTLP profile (in order); samples with the
/// same stack, attributes and link add up. Profile-level attributes (which
/// describe the series, not the samples), location attributes, original
/// payloads and attribute kinds pprof has no place for are counted in `lost`.
pub fn otlp_to_pprof(
    dict: &proto::ProfilesDictionary,
    profiles: &[proto::Profile],
    lost: &mut Lost,
) -> Result<Vec<pprof::Profile>, ConvertError> {
    check_dictionary(dict)?;
    otlp_to_pprof_checked(dict, profiles, lost)
}

/// [`otlp_to_pprof`] for a dictionary that has passed
/// [`check_dictionary`] already: the profiles of one request share their
/// dictionary, so a batch of them checks it once, not once per profile (its
/// cost is the whole dictionary's, whatever one profile uses of it).
pub fn otlp_to_pprof_checked(
    dict: &proto::ProfilesDictionary,
    profiles: &[proto::Profile],
    lost: &mut Lost,
) -> Result<Vec<pprof::Profile>, ConvertError> {
    // Group by window, keeping the order in which windows first appear.
    type Window = (u64, u64, Option<(i32, i32)>, i64);
    let mut windows: Vec<(Window, Vec<&proto::Profile>)> = Vec::new();
    for p in profiles {
        let key = (
            p.time_unix_nano,
            p.duration_nano,
            p.period_type
                .as_ref()
                .map(|t| (t.type_strindex, t.unit_strindex)),
            p.period,
        );
        match windows.iter_mut().find(|(k, _)| *k == key) {
            Some((_, group)) => group.push(p),
            None => windows.push((key, vec![p])),
        }
    }
    let mut out = Vec::with_capacity(windows.len());
    for (_, group) in windows {
        let mut b = Builder::new(dict);
        let first = group[0];
        for p in &group {
            let sample_type = b.value_type(p.sample_type.as_ref())?;
            b.profile.sample_type.push(sample_type);
            lost.add("profile attributes", p.attribute_indices.len());
            lost.add(
                "original payloads",
                usize::from(!p.original_payload.is_empty()),
            );
            lost.add(
                "dropped attribute counts",
                p.dropped_attributes_count as usize,
            );
        }
        let types = group.len();
        for (t, p) in group.iter().enumerate() {
            b.add_samples(p, t, types, lost)?;
        }
        b.profile.period_type = match &first.period_type {
            Some(t) => Some(b.value_type(Some(t))?),
            None => None,
        };
        b.profile.period = first.period;
        b.profile.time_nanos = i64::try_from(first.time_unix_nano).unwrap_or(i64::MAX);
        b.profile.duration_nanos = i64::try_from(first.duration_nano).unwrap_or(i64::MAX);
        out.push(b.profile);
    }
    Ok(out)
}
