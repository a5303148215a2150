//! [`ProfileParts`]: what the merger reads of one profile, from a decoded
//! [`Profile`] or straight off the plain protobuf bytes. Read off the wire,
//! strings stay slices of the bytes and samples stay unread until merged,
//! so a profile costs a few `Vec`s, not one allocation per string, sample
//! and location as decoding does.

use super::super::{DecodeError, MAX_PROFILE_ELEMENTS, Profile};
use crate::wire::{self, Value};

/// A mapping of the profile: its id and what it says.
#[derive(Debug, Clone, Copy)]
pub(super) struct MappingPart {
    pub(super) id: u64,
    pub(super) memory_start: u64,
    pub(super) memory_limit: u64,
    pub(super) file_offset: u64,
    pub(super) filename: i64,
    pub(super) build_id: i64,
    pub(super) has: [bool; 4],
}

/// A function of the profile: its id, name, system name, file, start line.
#[derive(Debug, Clone, Copy)]
pub(super) struct FunctionPart {
    pub(super) id: u64,
    pub(super) name: i64,
    pub(super) system_name: i64,
    pub(super) filename: i64,
    pub(super) start_line: i64,
}

/// A location of the profile; its lines are `lines[first..first + count]`
/// of [`ProfileParts`].
#[derive(Debug, Clone, Copy)]
pub(super) struct LocationPart {
    pub(super) id: u64,
    pub(super) mapping_id: u64,
    pub(super) address: u64,
    pub(super) is_folded: bool,
    pub(super) first: usize,
    pub(super) count: usize,
}

/// A sample of the profile, as it needs merging.
#[derive(Debug, Default)]
pub(super) struct SamplePart {
    /// Leaf first, the profile's location ids.
    pub(super) location_ids: Vec<u64>,
    pub(super) values: Vec<i64>,
    /// (key, str, num, num_unit) as the profile's string indices.
    pub(super) labels: Vec<(i64, i64, i64, i64)>,
}

/// One sample's location ids (leaf first), values and labels (key, str,
/// num, num_unit as the profile's string indices).
pub(super) type SampleView<'s> = (&'s [u64], &'s [i64], &'s [(i64, i64, i64, i64)]);

/// Where the samples are.
#[derive(Debug)]
enum Samples<'a> {
    Decoded(&'a [super::super::Sample]),
    /// Read off the wire into one table each of location ids, values and
    /// labels; each sample's `(ids, values, labels)` ends in them.
    Wire {
        ends: Vec<(usize, usize, usize)>,
        all: SamplePart,
    },
}

/// One profile as the merger reads it ([`ProfileParts::of`] a decoded
/// profile, [`ProfileParts::read`] plain bytes).
#[derive(Debug)]
pub struct ProfileParts<'a> {
    pub(super) strings: Vec<&'a str>,
    pub(super) sample_types: Vec<(i64, i64)>,
    pub(super) period_type: Option<(i64, i64)>,
    pub(super) period: i64,
    pub(super) time_nanos: i64,
    pub(super) duration_nanos: i64,
    pub(super) drop_frames: i64,
    pub(super) keep_frames: i64,
    pub(super) comments: Vec<i64>,
    pub(super) default_sample_type: i64,
    pub(super) doc_url: i64,
    pub(super) mappings: Vec<MappingPart>,
    pub(super) functions: Vec<FunctionPart>,
    pub(super) locations: Vec<LocationPart>,
    /// Every location's lines: (function id, line, column).
    pub(super) lines: Vec<(u64, i64, i64)>,
    samples: Samples<'a>,
    /// The labels and location ids of the wire samples, counted when read.
    sample_elements: usize,
}

fn bad(what: impl std::fmt::Display) -> DecodeError {
    DecodeError::Protobuf(what.to_string())
}

/// An int64 or uint64 scalar field, `what` naming it in errors.
fn varint(value: Value<'_>, what: &str) -> Result<u64, DecodeError> {
    match value {
        Value::Varint(v) => Ok(v),
        _ => Err(bad(format_args!("{what} is not a varint"))),
    }
}

/// A repeated scalar field, packed or not: each value goes to `out`.
fn repeated(value: Value<'_>, what: &str, mut out: impl FnMut(u64)) -> Result<(), DecodeError> {
    match value {
        Value::Varint(v) => out(v),
        Value::Bytes(mut packed) => {
            while !packed.is_empty() {
                out(wire::read_varint(&mut packed)?);
            }
        }
        _ => return Err(bad(format_args!("{what} is neither a varint nor packed"))),
    }
    Ok(())
}

fn message<'a>(value: Value<'a>, what: &str) -> Result<&'a [u8], DecodeError> {
    match value {
        Value::Bytes(b) => Ok(b),
        _ => Err(bad(format_args!("{what} is not a message"))),
    }
}

/// A ValueType message: (type, unit).
fn value_type(bytes: &[u8]) -> Result<(i64, i64), DecodeError> {
    let mut vt = (0, 0);
    for f in wire::fields(bytes) {
        match f? {
            (1, v) => vt.0 = varint(v, "ValueType.type")? as i64,
            (2, v) => vt.1 = varint(v, "ValueType.unit")? as i64,
            _ => {}
        }
    }
    Ok(vt)
}

impl<'a> ProfileParts<'a> {
    /// The parts of a decoded profile.
    pub fn of(p: &'a Profile) -> ProfileParts<'a> {
        let mut lines = Vec::new();
        let locations = p
            .location
            .iter()
            .map(|l| {
                let first = lines.len();
                lines.extend(l.line.iter().map(|x| (x.function_id, x.line, x.column)));
                LocationPart {
                    id: l.id,
                    mapping_id: l.mapping_id,
                    address: l.address,
                    is_folded: l.is_folded,
                    first,
                    count: l.line.len(),
                }
            })
            .collect();
        ProfileParts {
            strings: p.string_table.iter().map(String::as_str).collect(),
            sample_types: p.sample_type.iter().map(|v| (v.r#type, v.unit)).collect(),
            period_type: p.period_type.map(|v| (v.r#type, v.unit)),
            period: p.period,
            time_nanos: p.time_nanos,
            duration_nanos: p.duration_nanos,
            drop_frames: p.drop_frames,
            keep_frames: p.keep_frames,
            comments: p.comment.clone(),
            default_sample_type: p.default_sample_type,
            doc_url: p.doc_url,
            mappings: p
                .mapping
                .iter()
                .map(|m| MappingPart {
                    id: m.id,
                    memory_start: m.memory_start,
                    memory_limit: m.memory_limit,
                    file_offset: m.file_offset,
                    filename: m.filename,
                    build_id: m.build_id,
                    has: [
                        m.has_functions,
                        m.has_filenames,
                        m.has_line_numbers,
                        m.has_inline_frames,
                    ],
                })
                .collect(),
            functions: p
                .function
                .iter()
                .map(|f| FunctionPart {
                    id: f.id,
                    name: f.name,
                    system_name: f.system_name,
                    filename: f.filename,
                    start_line: f.start_line,
                })
                .collect(),
            locations,
            lines,
            sample_elements: p
                .sample
                .iter()
                .map(|s| s.location_id.len() + s.label.len())
                .sum(),
            samples: Samples::Decoded(&p.sample),
        }
    }

    /// The parts of a plain (not gzipped) pprof profile, read off its bytes
    /// as prost would decode them (the last of a repeated singular field
    /// wins, repeated scalars packed or not, unknown fields skipped), and
    /// refused as prost would refuse them (bad framing, a wrong wire type
    /// for a known field, a string that is not UTF-8). At most
    /// [`MAX_PROFILE_ELEMENTS`] strings, samples, locations, lines,
    /// functions and mappings together.
    pub fn read(plain: &'a [u8]) -> Result<ProfileParts<'a>, DecodeError> {
        let mut parts = ProfileParts {
            strings: Vec::new(),
            sample_types: Vec::new(),
            period_type: None,
            period: 0,
            time_nanos: 0,
            duration_nanos: 0,
            drop_frames: 0,
            keep_frames: 0,
            comments: Vec::new(),
            default_sample_type: 0,
            doc_url: 0,
            mappings: Vec::new(),
            functions: Vec::new(),
            locations: Vec::new(),
            lines: Vec::new(),
            samples: Samples::Decoded(&[]),
            sample_elements: 0,
        };
        let mut samples: Vec<&'a [u8]> = Vec::new();
        let mut elements = 0usize;
        for f in wire::fields(plain) {
            let (field, value) = f?;
            elements += 1;
            if elements > MAX_PROFILE_ELEMENTS {
                return Err(DecodeError::TooManyElements {
                    what: "elements (strings, samples, locations, functions and mappings)",
                    limit: MAX_PROFILE_ELEMENTS,
                });
            }
            match field {
                1 => parts
                    .sample_types
                    .push(value_type(message(value, "sample_type")?)?),
                2 => samples.push(message(value, "sample")?),
                3 => parts.mappings.push(mapping(message(value, "mapping")?)?),
                4 => {
                    let l = parts.location(message(value, "location")?)?;
                    elements += l.count;
                    parts.locations.push(l);
                }
                5 => parts.functions.push(function(message(value, "function")?)?),
                6 => {
                    let s = std::str::from_utf8(message(value, "string_table")?)
                        .map_err(|_| bad("a string of the string table is not UTF-8"))?;
                    parts.strings.push(s);
                }
                7 => parts.drop_frames = varint(value, "drop_frames")? as i64,
                8 => parts.keep_frames = varint(value, "keep_frames")? as i64,
                9 => parts.time_nanos = varint(value, "time_nanos")? as i64,
                10 => parts.duration_nanos = varint(value, "duration_nanos")? as i64,
                11 => parts.period_type = Some(value_type(message(value, "period_type")?)?),
                12 => parts.period = varint(value, "period")? as i64,
                13 => {
                    let comments = &mut parts.comments;
                    repeated(value, "comment", |c| comments.push(c as i64))?;
                }
                14 => parts.default_sample_type = varint(value, "default_sample_type")? as i64,
                15 => parts.doc_url = varint(value, "doc_url")? as i64,
                _ => {}
            }
        }
        // Every sample is read now, so a profile is taken or refused whole:
        // merging it cannot fail half-way.
        let mut all = SamplePart::default();
        let mut ends = Vec::with_capacity(samples.len());
        for bytes in &samples {
            read_sample(bytes, &mut all)?;
            ends.push((all.location_ids.len(), all.values.len(), all.labels.len()));
        }
        parts.sample_elements = all.location_ids.len() + all.labels.len();
        parts.samples = Samples::Wire { ends, all };
        Ok(parts)
    }

    fn location(&mut self, bytes: &[u8]) -> Result<LocationPart, DecodeError> {
        let mut l = LocationPart {
            id: 0,
            mapping_id: 0,
            address: 0,
            is_folded: false,
            first: self.lines.len(),
            count: 0,
        };
        for f in wire::fields(bytes) {
            match f? {
                (1, v) => l.id = varint(v, "Location.id")?,
                (2, v) => l.mapping_id = varint(v, "Location.mapping_id")?,
                (3, v) => l.address = varint(v, "Location.address")?,
                (4, v) => {
                    let mut line = (0, 0, 0);
                    for f in wire::fields(message(v, "Location.line")?) {
                        match f? {
                            (1, v) => line.0 = varint(v, "Line.function_id")?,
                            (2, v) => line.1 = varint(v, "Line.line")? as i64,
                            (3, v) => line.2 = varint(v, "Line.column")? as i64,
                            _ => {}
                        }
                    }
                    self.lines.push(line);
                    l.count += 1;
                }
                (5, v) => l.is_folded = varint(v, "Location.is_folded")? != 0,
                _ => {}
            }
        }
        Ok(l)
    }

    /// How many samples there are.
    pub(super) fn sample_count(&self) -> usize {
        match &self.samples {
            Samples::Decoded(s) => s.len(),
            Samples::Wire { ends, .. } => ends.len(),
        }
    }

    /// Sample `i`: its location ids, values and labels, read off the wire
    /// when the profile was, else copied into `scratch`.
    pub(super) fn sample<'s>(&'s self, i: usize, scratch: &'s mut SamplePart) -> SampleView<'s> {
        match &self.samples {
            Samples::Decoded(s) => {
                let s = &s[i];
                scratch.location_ids.clear();
                scratch.values.clear();
                scratch.labels.clear();
                scratch.location_ids.extend_from_slice(&s.location_id);
                scratch.values.extend_from_slice(&s.value);
                scratch
                    .labels
                    .extend(s.label.iter().map(|l| (l.key, l.str, l.num, l.num_unit)));
                (&scratch.location_ids, &scratch.values, &scratch.labels)
            }
            Samples::Wire { ends, all } => {
                let start = i.checked_sub(1).map(|j| ends[j]).unwrap_or((0, 0, 0));
                let end = ends[i];
                (
                    &all.location_ids[start.0..end.0],
                    &all.values[start.1..end.1],
                    &all.labels[start.2..end.2],
                )
            }
        }
    }

    /// How many location ids and labels the samples hold, for
    /// [`super::Merger::bound`].
    pub(super) fn sample_elements(&self) -> usize {
        self.sample_elements
    }

    /// The string at `index`, `""` when out of range.
    pub(super) fn string(&self, index: i64) -> &'a str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.strings.get(i))
            .copied()
            .unwrap_or("")
    }
}

/// A Sample message, appended to `out`'s tables.
fn read_sample(bytes: &[u8], out: &mut SamplePart) -> Result<(), DecodeError> {
    for f in wire::fields(bytes) {
        match f? {
            (1, v) => repeated(v, "Sample.location_id", |id| out.location_ids.push(id))?,
            (2, v) => repeated(v, "Sample.value", |x| out.values.push(x as i64))?,
            (3, v) => {
                let mut l = (0, 0, 0, 0);
                for f in wire::fields(message(v, "Sample.label")?) {
                    match f? {
                        (1, v) => l.0 = varint(v, "Label.key")? as i64,
                        (2, v) => l.1 = varint(v, "Label.str")? as i64,
                        (3, v) => l.2 = varint(v, "Label.num")? as i64,
                        (4, v) => l.3 = varint(v, "Label.num_unit")? as i64,
                        _ => {}
                    }
                }
                out.labels.push(l);
            }
            _ => {}
        }
    }
    Ok(())
}

fn mapping(bytes: &[u8]) -> Result<MappingPart, DecodeError> {
    let mut m = MappingPart {
        id: 0,
        memory_start: 0,
        memory_limit: 0,
        file_offset: 0,
        filename: 0,
        build_id: 0,
        has: [false; 4],
    };
    for f in wire::fields(bytes) {
        match f? {
            (1, v) => m.id = varint(v, "Mapping.id")?,
            (2, v) => m.memory_start = varint(v, "Mapping.memory_start")?,
            (3, v) => m.memory_limit = varint(v, "Mapping.memory_limit")?,
            (4, v) => m.file_offset = varint(v, "Mapping.file_offset")?,
            (5, v) => m.filename = varint(v, "Mapping.filename")? as i64,
            (6, v) => m.build_id = varint(v, "Mapping.build_id")? as i64,
            (n @ 7..=10, v) => m.has[n as usize - 7] = varint(v, "Mapping.has_*")? != 0,
            _ => {}
        }
    }
    Ok(m)
}

fn function(bytes: &[u8]) -> Result<FunctionPart, DecodeError> {
    let mut f = FunctionPart {
        id: 0,
        name: 0,
        system_name: 0,
        filename: 0,
        start_line: 0,
    };
    for field in wire::fields(bytes) {
        match field? {
            (1, v) => f.id = varint(v, "Function.id")?,
            (2, v) => f.name = varint(v, "Function.name")? as i64,
            (3, v) => f.system_name = varint(v, "Function.system_name")? as i64,
            (4, v) => f.filename = varint(v, "Function.filename")? as i64,
            (5, v) => f.start_line = varint(v, "Function.start_line")? as i64,
            _ => {}
        }
    }
    Ok(f)
}
