//! [`WireMerge`]: several OTLP dictionaries merged into one, deduplicated,
//! on their protobuf bytes, and their profiles re-indexed into it, without
//! decoding either (the OTLP exporter's batches of small requests, each
//! with its own dictionary).
//!
//! Each table entry of each dictionary is rewritten once into a scratch
//! buffer (its indexes into other tables replaced by the merged ones),
//! looked up by its bytes in that table and added when new; tables are
//! taken in the order their references need (strings; attributes and
//! functions; mappings and links; locations; stacks). A profile is then
//! written again with every index it holds replaced. Fields that hold no
//! index are copied as they are, unknown ones too.
//!
//! Index 0 of every table is the zero value and stays 0; an entry whose
//! rewritten bytes are empty (the zero value) becomes 0 as well. Values
//! given by reference inside attribute values (`string_value_strindex`,
//! `key_strindex`, nested in arrays and key-value lists) are re-indexed at
//! any depth the checks take ([`MAX_DEPTH`]).
//!
//! The input must have passed [`super::check_dictionary_wire`] and
//! [`super::check_profile_wire`] (a receiver's checks); anything else is an
//! error, never a panic: an index of a repeated field out of range, a field
//! of the wrong wire type, bad framing. A singular index field may occur
//! more than once; decoding keeps the last occurrence, the only one the
//! checks look at, so an earlier one out of range is written as 0.

use std::hash::BuildHasher;

use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use super::ConvertError;
use crate::wire::{self, Value};

/// Messages nested deeper than this below a dictionary entry are refused:
/// the attribute's value and the levels the checks let it hold
/// ([`super::check::MAX_VALUE_NESTING`]), so whatever passed the checks is
/// merged.
pub const MAX_DEPTH: usize = super::check::MAX_VALUE_NESTING + 1;

/// The dictionary's tables by field number less one.
const MAPPING: usize = 0;
const LOCATION: usize = 1;
const FUNCTION: usize = 2;
const LINK: usize = 3;
const STRING: usize = 4;
const ATTRIBUTE: usize = 5;
const STACK: usize = 6;
const TABLES: usize = 7;

/// The order tables are merged in: each after the tables its entries refer to.
const ORDER: [usize; TABLES] = [STRING, ATTRIBUTE, FUNCTION, MAPPING, LINK, LOCATION, STACK];

/// The messages whose fields hold indexes (OTLP profiles 1.10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Msg {
    Mapping,
    Location,
    Line,
    Function,
    Link,
    Attribute,
    AnyValue,
    ArrayValue,
    KeyValueList,
    KeyValue,
    Stack,
    Profile,
    Sample,
    ValueType,
}

impl Msg {
    /// The message of a dictionary table's entries (strings are not messages).
    fn of_table(table: usize) -> Msg {
        match table {
            MAPPING => Msg::Mapping,
            LOCATION => Msg::Location,
            FUNCTION => Msg::Function,
            LINK => Msg::Link,
            ATTRIBUTE => Msg::Attribute,
            _ => Msg::Stack,
        }
    }
}

/// What one field of a message is, for re-indexing.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// Holds no index: copied as it is.
    Copy,
    /// An index into a table (one varint, or packed ones) of a repeated
    /// field: each must be in range.
    Index(usize),
    /// An index of a singular field. Decoding keeps the last occurrence
    /// (and the receiver's checks check only that one), so an earlier one
    /// out of range is written as 0: it is overwritten all the same.
    One(usize),
    /// A message that may hold indexes.
    Message(Msg),
}

fn rule(msg: Msg, field: u32) -> Rule {
    use Msg as M;
    use Rule::{Copy, Index, Message, One};
    match (msg, field) {
        // Mapping: filename_strindex, attribute_indices.
        (M::Mapping, 4) => One(STRING),
        (M::Mapping, 5) => Index(ATTRIBUTE),
        // Location: mapping_index, lines, attribute_indices.
        (M::Location, 1) => One(MAPPING),
        (M::Location, 3) => Message(M::Line),
        (M::Location, 4) => Index(ATTRIBUTE),
        // Line: function_index.
        (M::Line, 1) => One(FUNCTION),
        // Function: name, system name, file name.
        (M::Function, 1..=3) => One(STRING),
        // KeyValueAndUnit: key_strindex, value, unit_strindex.
        (M::Attribute, 1 | 3) => One(STRING),
        (M::Attribute, 2) => Message(M::AnyValue),
        // AnyValue: array, key-value list, string_value_strindex.
        (M::AnyValue, 5) => Message(M::ArrayValue),
        (M::AnyValue, 6) => Message(M::KeyValueList),
        (M::AnyValue, 8) => One(STRING),
        (M::ArrayValue, 1) => Message(M::AnyValue),
        (M::KeyValueList, 1) => Message(M::KeyValue),
        // KeyValue: value, key_strindex.
        (M::KeyValue, 2) => Message(M::AnyValue),
        (M::KeyValue, 3) => One(STRING),
        // Stack: location_indices.
        (M::Stack, 1) => Index(LOCATION),
        // Profile: sample_type, samples, period_type, attribute_indices.
        (M::Profile, 1 | 5) => Message(M::ValueType),
        (M::Profile, 2) => Message(M::Sample),
        (M::Profile, 11) => Index(ATTRIBUTE),
        // Sample: stack_index, attribute_indices, link_index.
        (M::Sample, 1) => One(STACK),
        (M::Sample, 2) => Index(ATTRIBUTE),
        (M::Sample, 3) => One(LINK),
        // ValueType: type_strindex, unit_strindex.
        (M::ValueType, 1 | 2) => One(STRING),
        _ => Copy,
    }
}

fn bad(what: &str, e: impl std::fmt::Display) -> ConvertError {
    ConvertError::new(format!("merging dictionaries: {what}: {e}"))
}

/// One merged table: its entries' bytes end to end, and a hash index of them.
#[derive(Debug, Default)]
struct Table {
    bytes: Vec<u8>,
    /// Where each entry ends in `bytes` (entry `i` starts where `i - 1` ends).
    ends: Vec<usize>,
    /// Entry hash → the last entry with that hash.
    by_hash: super::dictionary::HashMap<u64, u32>,
    /// Entry → the previous entry with the same hash (`u32::MAX`: none).
    same_hash: Vec<u32>,
}

impl Table {
    fn entry(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    /// The index of an entry with these bytes, added if there is none.
    fn intern(&mut self, entry: &[u8], hasher: &foldhash::quality::RandomState) -> u32 {
        let hash = hasher.hash_one(entry);
        let mut at = self.by_hash.get(&hash).copied().unwrap_or(u32::MAX);
        while at != u32::MAX {
            if self.entry(at as usize) == entry {
                return at;
            }
            at = self.same_hash[at as usize];
        }
        // Indexes are int32 on the wire; the tables of accepted requests
        // stay far below (each was bounded by its request's size).
        let i = self.len() as u32;
        self.bytes.extend_from_slice(entry);
        self.ends.push(self.bytes.len());
        self.same_hash
            .push(self.by_hash.insert(hash, i).unwrap_or(u32::MAX));
        i
    }
}

/// Where each entry of one source dictionary went, table by table.
#[derive(Debug, Default, Clone)]
pub struct Remap {
    tables: [Vec<u32>; TABLES],
}

impl Remap {
    fn get(&self, table: usize, raw: u64) -> Result<u64, ConvertError> {
        // int32 on the wire: decoding keeps the low 32 bits.
        let i = raw as i32;
        if i == 0 {
            return Ok(0);
        }
        usize::try_from(i)
            .ok()
            .and_then(|i| self.tables[table].get(i))
            .map(|&n| u64::from(n))
            .ok_or_else(|| {
                bad(
                    "an index",
                    format!(
                        "{i} is out of range of a table of {}",
                        self.tables[table].len()
                    ),
                )
            })
    }
}

/// Merges dictionaries and re-indexes profiles; see the module docs.
#[derive(Debug)]
pub struct WireMerge {
    tables: [Table; TABLES],
    hasher: foldhash::quality::RandomState,
    scratch: Vec<u8>,
    /// Each entry of the dictionary being added: its table and bytes.
    spans: Vec<(usize, std::ops::Range<usize>)>,
}

impl Default for WireMerge {
    fn default() -> Self {
        WireMerge::new()
    }
}

impl WireMerge {
    pub fn new() -> Self {
        let hasher = foldhash::quality::RandomState::default();
        let mut tables: [Table; TABLES] = Default::default();
        for t in &mut tables {
            // Entry 0: the zero value (empty bytes), for every table.
            t.intern(&[], &hasher);
        }
        WireMerge {
            tables,
            hasher,
            scratch: Vec::new(),
            spans: Vec::new(),
        }
    }

    /// Adds a dictionary's entries (those not there yet); returns where each
    /// of its entries is in the merged one.
    pub fn add_dictionary(&mut self, dictionary: &[u8]) -> Result<Remap, ConvertError> {
        // One walk: where each table's entries are, in order.
        let mut spans = std::mem::take(&mut self.spans);
        spans.clear();
        for f in wire::fields(dictionary) {
            let (n, v) = f.map_err(|e| bad("the dictionary", e))?;
            let table = match n {
                1..=7 => n as usize - 1,
                _ => continue,
            };
            let Value::Bytes(entry) = v else {
                return Err(bad("the dictionary", format!("field {n} is not a message")));
            };
            let start = entry.as_ptr() as usize - dictionary.as_ptr() as usize;
            spans.push((table, start..start + entry.len()));
        }
        let mut remap = Remap::default();
        let merged = self.add_tables(dictionary, &spans, &mut remap);
        self.spans = spans;
        merged?;
        for (table, t) in self.tables.iter().enumerate() {
            if t.len() > i32::MAX as usize {
                return Err(bad(
                    "the dictionary",
                    format!("table {} would hold more than 2^31 entries", table + 1),
                ));
            }
        }
        Ok(remap)
    }

    /// Interns each table's entries (`spans` of `dictionary`, in wire
    /// order), the tables in [`ORDER`], into `remap`.
    fn add_tables(
        &mut self,
        dictionary: &[u8],
        spans: &[(usize, std::ops::Range<usize>)],
        remap: &mut Remap,
    ) -> Result<(), ConvertError> {
        let mut scratch = std::mem::take(&mut self.scratch);
        let mut result = Ok(());
        'tables: for table in ORDER {
            let mut first = true;
            for (t, span) in spans {
                if *t != table {
                    continue;
                }
                let entry = &dictionary[span.clone()];
                // Entry 0 is the zero value (checked on arrival): index 0.
                if std::mem::take(&mut first) {
                    remap.tables[table].push(0);
                    continue;
                }
                let merged = if table == STRING || table == LINK {
                    self.tables[table].intern(entry, &self.hasher)
                } else {
                    scratch.clear();
                    if let Err(e) = rewrite(Msg::of_table(table), entry, remap, &mut scratch, 0) {
                        result = Err(e);
                        break 'tables;
                    }
                    self.tables[table].intern(&scratch, &self.hasher)
                };
                remap.tables[table].push(merged);
            }
        }
        self.scratch = scratch;
        result
    }

    /// Appends `profile` (a `Profile` message's bytes) to `out` with every
    /// index re-indexed by `remap` (its dictionary's, from
    /// [`WireMerge::add_dictionary`] of this merge).
    pub fn add_profile(
        &self,
        profile: &[u8],
        remap: &Remap,
        out: &mut Vec<u8>,
    ) -> Result<(), ConvertError> {
        rewrite(Msg::Profile, profile, remap, out, 0)
    }

    /// Strings plus locations of the merged dictionary.
    pub fn entries(&self) -> usize {
        self.tables[STRING].len() + self.tables[LOCATION].len()
    }

    /// The merged dictionary's bytes (a `ProfilesDictionary` message).
    pub fn finish(&self) -> Vec<u8> {
        let len: usize = self
            .tables
            .iter()
            .map(|t| t.bytes.len() + t.len() * (1 + wire::MAX_VARINT_LEN))
            .sum();
        let mut out = Vec::with_capacity(len);
        for (table, t) in self.tables.iter().enumerate() {
            for i in 0..t.len() {
                let entry = t.entry(i);
                encode_key(table as u32 + 1, WireType::LengthDelimited, &mut out);
                encode_varint(entry.len() as u64, &mut out);
                out.extend_from_slice(entry);
            }
        }
        out
    }
}

/// Writes `msg` (a message of kind `kind`) to `out` with its indexes
/// re-indexed by `remap`.
fn rewrite(
    kind: Msg,
    msg: &[u8],
    remap: &Remap,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), ConvertError> {
    if depth > MAX_DEPTH {
        return Err(bad(
            "an attribute value",
            format!("nested deeper than {MAX_DEPTH}"),
        ));
    }
    let mut fields = wire::fields(msg);
    loop {
        let before = fields.rest();
        let Some(f) = fields.next() else {
            return Ok(());
        };
        let (n, v) = f.map_err(|e| bad("a message", e))?;
        match (rule(kind, n), v) {
            (Rule::Copy, _) => {
                let used = before.len() - fields.rest().len();
                out.extend_from_slice(&before[..used]);
            }
            (Rule::Index(table), Value::Varint(i)) => {
                encode_key(n, WireType::Varint, out);
                encode_varint(remap.get(table, i)?, out);
            }
            (Rule::One(table), Value::Varint(i)) => {
                encode_key(n, WireType::Varint, out);
                encode_varint(remap.get(table, i).unwrap_or(0), out);
            }
            (Rule::Index(table), Value::Bytes(mut packed)) => {
                framed(n, out, |out| {
                    while !packed.is_empty() {
                        let i = wire::read_varint(&mut packed).map_err(|e| bad("an index", e))?;
                        encode_varint(remap.get(table, i)?, out);
                    }
                    Ok(())
                })?;
            }
            (Rule::Message(m), Value::Bytes(inner)) => {
                framed(n, out, |out| rewrite(m, inner, remap, out, depth + 1))?;
            }
            _ => {
                return Err(bad(
                    "a message",
                    format!("field {n} has the wrong wire type"),
                ));
            }
        }
    }
}

/// Writes a length-delimited field `n` whose body `body` writes: the body
/// goes after room for the longest length a body can have, then moves back
/// over the room the length did not need.
fn framed(
    n: u32,
    out: &mut Vec<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), ConvertError>,
) -> Result<(), ConvertError> {
    const ROOM: usize = 5;
    encode_key(n, WireType::LengthDelimited, out);
    let at = out.len();
    out.extend_from_slice(&[0; ROOM]);
    body(out)?;
    let len = out.len() - at - ROOM;
    // Protobuf's bound on a message (2 GiB less a byte) fits the room.
    if len > i32::MAX as usize {
        return Err(bad(
            "a message",
            "longer than 2 GiB, the most protobuf allows",
        ));
    }
    let need = encoded_len_varint(len as u64);
    out.copy_within(at + ROOM.., at + need);
    out.truncate(out.len() - (ROOM - need));
    let mut rest = len;
    for byte in &mut out[at..at + need] {
        // Seven bits a byte, low first; the last byte's high bit clear.
        *byte = (rest & 0x7f) as u8 | if rest > 0x7f { 0x80 } else { 0 };
        rest >>= 7;
    }
    Ok(())
}

#[cfg(test)]
mod tests;
