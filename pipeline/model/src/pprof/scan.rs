//! The one pass of [`scan_plain`](super::scan_plain) over a plain profile's
//! top-level fields: element counts checked as they pass, the decoded size
//! estimated, and only the strings naming the sample and period types read.

use super::{
    DecodeError, DecodedSize, EARLY_STRINGS, MAX_PROFILE_ELEMENTS, MAX_SAMPLE_TYPES, Metadata,
    scan_value_type, walk_fields,
};
use crate::wire::{self, Value};

/// A protobuf error saying `what` is wrong.
fn bad(what: &str) -> DecodeError {
    DecodeError::Protobuf(what.to_string())
}

/// What [`scan_plain`](super::scan_plain)'s one pass over a profile has found so far.
pub(super) struct PlainScan<'a> {
    meta: Metadata,
    /// (type, unit) string indices of each sample type.
    sample_types: Vec<(i64, i64)>,
    period_type: Option<(i64, i64)>,
    /// Samples, locations, functions, mappings and strings.
    elements: usize,
    size: DecodedSize,
    /// Where the string table starts, for the rare second walk (writers put
    /// it after the samples and locations).
    first_string_at: Option<usize>,
    /// The first strings, as they pass: no second walk for them.
    early: [&'a [u8]; EARLY_STRINGS],
    /// The string table's length.
    strings: usize,
}

impl<'a> PlainScan<'a> {
    /// Nothing found yet in a plain profile of `plain_size` bytes.
    pub(super) fn new(plain_size: usize) -> Self {
        PlainScan {
            meta: Metadata {
                plain_size,
                ..Metadata::default()
            },
            sample_types: Vec::new(),
            period_type: None,
            elements: 0,
            size: DecodedSize::default(),
            first_string_at: None,
            early: [&[]; EARLY_STRINGS],
            strings: 0,
        }
    }

    /// Takes the top-level field `tag` of the profile, at offset `at`, into
    /// account.
    pub(super) fn field(
        &mut self,
        at: usize,
        tag: u32,
        field: Value<'a>,
    ) -> Result<(), DecodeError> {
        if tag == 6 && self.first_string_at.is_none() {
            self.first_string_at = Some(at);
        }
        let size = &mut self.size;
        match field {
            Value::Varint(v) => match tag {
                9 => self.meta.time_nanos = v as i64,
                10 => self.meta.duration_nanos = v as i64,
                12 => self.meta.period = v as i64,
                13 => size.comments += 1,
                _ => {}
            },
            Value::Bytes(bytes) => match tag {
                1 => {
                    if self.sample_types.len() == MAX_SAMPLE_TYPES {
                        return Err(DecodeError::TooManyElements {
                            what: "sample types",
                            limit: MAX_SAMPLE_TYPES,
                        });
                    }
                    self.sample_types.push(scan_value_type(bytes)?);
                    size.sample_types += 1;
                }
                11 => self.period_type = Some(scan_value_type(bytes)?),
                2..=6 => self.element(tag, bytes)?,
                // Packed repeated int64.
                13 => size.comments += wire::count_varints(bytes),
                // Unknown fields are skipped by prost: nothing is allocated.
                _ => {}
            },
            Value::Fixed64(_) | Value::Fixed32(_) => {}
        }
        Ok(())
    }

    /// Counts one sample, mapping, location, function or string (`tag` 2
    /// to 6), refusing a profile with too many of them.
    fn element(&mut self, tag: u32, bytes: &'a [u8]) -> Result<(), DecodeError> {
        self.elements += 1;
        if self.elements > MAX_PROFILE_ELEMENTS {
            return Err(DecodeError::TooManyElements {
                what: "samples, locations, functions, mappings and strings",
                limit: MAX_PROFILE_ELEMENTS,
            });
        }
        let (meta, size) = (&mut self.meta, &mut self.size);
        match tag {
            2 => {
                meta.sample_count += 1;
                let (ids, labels) = size.sample(bytes)?;
                meta.deepest_stack = meta.deepest_stack.max(ids);
                meta.most_sample_labels = meta.most_sample_labels.max(labels);
            }
            3 => size.mappings += 1,
            4 => size.location(bytes)?,
            5 => size.functions += 1,
            _ => {
                if let Some(slot) = self.early.get_mut(self.strings) {
                    *slot = bytes;
                }
                self.strings += 1;
                size.string(bytes.len());
            }
        }
        Ok(())
    }

    /// Sets the estimate of the decoded profile's heap, refusing a profile
    /// whose estimate is over `budget`.
    pub(super) fn check_decoded_size(&mut self, budget: usize) -> Result<(), DecodeError> {
        self.meta.decoded_size = self.size.total();
        if self.meta.decoded_size > budget {
            return Err(DecodeError::DecodedTooLarge {
                estimate: self.meta.decoded_size,
                limit: budget,
            });
        }
        Ok(())
    }

    /// The metadata with the sample and period types named: only the
    /// strings they name are read, from the string table of `buf`.
    pub(super) fn name_types(self, buf: &'a [u8]) -> Result<Metadata, DecodeError> {
        let PlainScan {
            mut meta,
            sample_types,
            period_type,
            first_string_at,
            early,
            strings,
            ..
        } = self;
        let mut wanted: Vec<i64> = sample_types.iter().flat_map(|&(t, u)| [t, u]).collect();
        if let Some((t, u)) = period_type {
            wanted.extend([t, u]);
        }
        if wanted.iter().any(|&i| i < 0) {
            return Err(bad("negative string index"));
        }
        if wanted.iter().any(|&i| i != 0 && i as u64 >= strings as u64) {
            return Err(bad("string index out of range"));
        }
        let far = far_strings(buf, first_string_at, &wanted)?;
        let s = |i: i64| -> Result<String, DecodeError> {
            // Checked above: 0 <= i < strings, or i == 0 with no string table.
            let bytes = match usize::try_from(i) {
                Ok(i) if i < EARLY_STRINGS => early[i],
                _ => far
                    .iter()
                    .find(|(j, _)| *j == i)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| bad("string index out of range"))?,
            };
            std::str::from_utf8(bytes)
                .map(str::to_owned)
                .map_err(|_| bad("string table entry is not UTF-8"))
        };
        for (t, u) in sample_types {
            meta.sample_types.push((s(t)?, s(u)?));
        }
        if let Some((t, u)) = period_type {
            meta.period_type = Some((s(t)?, s(u)?));
        }
        Ok(meta)
    }
}

/// The `wanted` strings past the first [`EARLY_STRINGS`] (index, bytes),
/// in one more walk of `buf` from the first string (at `first_string_at`);
/// none, and no walk, when every wanted string is an early one.
fn far_strings<'a>(
    buf: &'a [u8],
    first_string_at: Option<usize>,
    wanted: &[i64],
) -> Result<Vec<(i64, &'a [u8])>, DecodeError> {
    let mut far: Vec<(i64, &[u8])> = Vec::new();
    if wanted.iter().any(|&i| i as u64 >= EARLY_STRINGS as u64) {
        let mut index = 0i64;
        let from = &buf[first_string_at.unwrap_or(buf.len())..];
        walk_fields(from, |tag, field| {
            if let (6, Value::Bytes(bytes)) = (tag, field) {
                if index >= EARLY_STRINGS as i64 && wanted.contains(&index) {
                    far.push((index, bytes));
                }
                index += 1;
            }
            Ok(())
        })?;
    }
    Ok(far)
}
