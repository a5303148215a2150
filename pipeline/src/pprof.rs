//! The pprof profile (`perftools.profiles`), written from the wire facts in
//! shared/formats.md, plus bounded decoding, encoding and a cheap metadata scan.
//!
//! Decoding untrusted bytes always goes through [`decode`] (or [`scan_metadata`]),
//! which cap the decompressed size before allocating anything sized by input.

use std::io::Read;

use bytes::Bytes;
use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use crate::wire::{self, Value, WireError};

/// A pprof profile: the decoded form of a payload.
#[derive(Clone, PartialEq, Message)]
pub struct Profile {
    #[prost(message, repeated, tag = "1")]
    pub sample_type: Vec<ValueType>,
    #[prost(message, repeated, tag = "2")]
    pub sample: Vec<Sample>,
    #[prost(message, repeated, tag = "3")]
    pub mapping: Vec<Mapping>,
    #[prost(message, repeated, tag = "4")]
    pub location: Vec<Location>,
    #[prost(message, repeated, tag = "5")]
    pub function: Vec<Function>,
    /// Index 0 must be the empty string.
    #[prost(string, repeated, tag = "6")]
    pub string_table: Vec<String>,
    #[prost(int64, tag = "7")]
    pub drop_frames: i64,
    #[prost(int64, tag = "8")]
    pub keep_frames: i64,
    #[prost(int64, tag = "9")]
    pub time_nanos: i64,
    #[prost(int64, tag = "10")]
    pub duration_nanos: i64,
    #[prost(message, optional, tag = "11")]
    pub period_type: Option<ValueType>,
    #[prost(int64, tag = "12")]
    pub period: i64,
    #[prost(int64, repeated, tag = "13")]
    pub comment: Vec<i64>,
    #[prost(int64, tag = "14")]
    pub default_sample_type: i64,
    #[prost(int64, tag = "15")]
    pub doc_url: i64,
}

/// A sample type or period type: string-table indices of type and unit.
#[derive(Clone, Copy, PartialEq, Eq, Message)]
pub struct ValueType {
    #[prost(int64, tag = "1")]
    pub r#type: i64,
    #[prost(int64, tag = "2")]
    pub unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Sample {
    /// Leaf first.
    #[prost(uint64, repeated, tag = "1")]
    pub location_id: Vec<u64>,
    #[prost(int64, repeated, tag = "2")]
    pub value: Vec<i64>,
    #[prost(message, repeated, tag = "3")]
    pub label: Vec<Label>,
}

#[derive(Clone, PartialEq, Message)]
pub struct Label {
    #[prost(int64, tag = "1")]
    pub key: i64,
    #[prost(int64, tag = "2")]
    pub str: i64,
    #[prost(int64, tag = "3")]
    pub num: i64,
    #[prost(int64, tag = "4")]
    pub num_unit: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Mapping {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub memory_start: u64,
    #[prost(uint64, tag = "3")]
    pub memory_limit: u64,
    #[prost(uint64, tag = "4")]
    pub file_offset: u64,
    #[prost(int64, tag = "5")]
    pub filename: i64,
    #[prost(int64, tag = "6")]
    pub build_id: i64,
    #[prost(bool, tag = "7")]
    pub has_functions: bool,
    #[prost(bool, tag = "8")]
    pub has_filenames: bool,
    #[prost(bool, tag = "9")]
    pub has_line_numbers: bool,
    #[prost(bool, tag = "10")]
    pub has_inline_frames: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Location {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(uint64, tag = "2")]
    pub mapping_id: u64,
    #[prost(uint64, tag = "3")]
    pub address: u64,
    /// The last entry is the caller; earlier ones were inlined into it.
    #[prost(message, repeated, tag = "4")]
    pub line: Vec<Line>,
    #[prost(bool, tag = "5")]
    pub is_folded: bool,
}

#[derive(Clone, PartialEq, Message)]
pub struct Line {
    #[prost(uint64, tag = "1")]
    pub function_id: u64,
    #[prost(int64, tag = "2")]
    pub line: i64,
    #[prost(int64, tag = "3")]
    pub column: i64,
}

#[derive(Clone, PartialEq, Message)]
pub struct Function {
    #[prost(uint64, tag = "1")]
    pub id: u64,
    #[prost(int64, tag = "2")]
    pub name: i64,
    #[prost(int64, tag = "3")]
    pub system_name: i64,
    #[prost(int64, tag = "4")]
    pub filename: i64,
    #[prost(int64, tag = "5")]
    pub start_line: i64,
}

impl Profile {
    /// The string at `index` of the string table, or `""` when out of range.
    pub fn string(&self, index: i64) -> &str {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.string_table.get(i))
            .map(String::as_str)
            .unwrap_or("")
    }
}

/// The gzip magic bytes.
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// True when `bytes` start with the gzip magic.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[..2] == GZIP_MAGIC
}

/// Why a payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("corrupt gzip data: {0}")]
    Gzip(String),
    #[error(
        "decompressed profile exceeds the limit of {limit} bytes; raise max_decompressed_size if this profile is legitimate"
    )]
    TooLarge { limit: usize },
    #[error("malformed pprof protobuf: {0}")]
    Protobuf(String),
    #[error("the profile has more than {limit} {what}; send smaller profiles (split them by time)")]
    TooManyElements { what: &'static str, limit: usize },
}

impl From<WireError> for DecodeError {
    fn from(e: WireError) -> Self {
        DecodeError::Protobuf(e.to_string())
    }
}

/// Default cap for decompressed profiles when no component set one.
pub const DEFAULT_MAX_DECOMPRESSED: usize = 64 << 20;

/// Decompresses `bytes` if gzipped, refusing to grow past `limit` bytes.
/// Plain input is returned as is (no copy) if within `limit`.
pub fn decompress(bytes: &Bytes, limit: usize) -> Result<Bytes, DecodeError> {
    if !is_gzip(bytes) {
        if bytes.len() > limit {
            return Err(DecodeError::TooLarge { limit });
        }
        return Ok(bytes.clone());
    }
    let mut out = Vec::new();
    gunzip_into(bytes, limit, &mut out)?;
    Ok(Bytes::from(out))
}

/// Gunzips into `out` (cleared first). Reads at most `limit + 1` bytes, so a
/// decompression bomb costs at most `limit` bytes of memory.
pub fn gunzip_into(bytes: &[u8], limit: usize, out: &mut Vec<u8>) -> Result<(), DecodeError> {
    out.clear();
    // Multi-member gzip is legal and Go's reader accepts it, so read every
    // member. The bufread decoder reads the slice in place (no copy into a
    // BufReader); the first chunk's size hint avoids regrowing for typical sizes.
    out.reserve(bytes.len().saturating_mul(4).min(limit.saturating_add(1)));
    let decoder = flate2::bufread::MultiGzDecoder::new(bytes);
    let mut limited = decoder.take(limit as u64 + 1);
    limited
        .read_to_end(out)
        .map_err(|e| DecodeError::Gzip(e.to_string()))?;
    if out.len() > limit {
        return Err(DecodeError::TooLarge { limit });
    }
    Ok(())
}

/// Decodes a (possibly gzipped) pprof payload with a cap on the decompressed size.
pub fn decode(bytes: &Bytes, limit: usize) -> Result<Profile, DecodeError> {
    let plain = decompress(bytes, limit)?;
    // The scan bounds how many structs decoding creates before prost allocates them.
    scan_plain(&plain)?;
    Profile::decode(plain).map_err(|e| DecodeError::Protobuf(e.to_string()))
}

/// Encodes a profile as plain protobuf bytes.
pub fn encode(profile: &Profile) -> Bytes {
    Bytes::from(profile.encode_to_vec())
}

/// Gzip-compresses bytes at a fast level (what pprof writers use).
pub fn gzip(bytes: &[u8]) -> Bytes {
    let mut enc = GzEncoder::new(
        Vec::with_capacity(bytes.len() / 3 + 64),
        Compression::fast(),
    );
    // Writing to a Vec cannot fail.
    let _ = std::io::Write::write_all(&mut enc, bytes);
    Bytes::from(enc.finish().unwrap_or_default())
}

/// The parts of a profile that describe it, read without decoding samples.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Metadata {
    /// (type, unit) of each sample value.
    pub sample_types: Vec<(String, String)>,
    /// (type, unit) of the period, if any.
    pub period_type: Option<(String, String)>,
    pub period: i64,
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// Size of the plain (decompressed) protobuf.
    pub plain_size: usize,
    pub sample_count: usize,
}

thread_local! {
    static SCAN_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads sample types, period and times from a (possibly gzipped) pprof payload
/// while skipping samples, locations and functions. Also checks that the
/// top-level protobuf structure is well formed. Cheap compared to [`decode`].
pub fn scan_metadata(bytes: &[u8], limit: usize) -> Result<Metadata, DecodeError> {
    if is_gzip(bytes) {
        SCAN_BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            gunzip_into(bytes, limit, &mut buf)?;
            let result = scan_plain(&buf);
            // Do not keep a huge buffer alive in the thread after an outlier.
            if buf.capacity() > 4 << 20 {
                *buf = Vec::new();
            }
            result
        })
    } else {
        if bytes.len() > limit {
            return Err(DecodeError::TooLarge { limit });
        }
        scan_plain(bytes)
    }
}

/// Most sample types a profile may have (real profiles have one to four).
pub const MAX_SAMPLE_TYPES: usize = 64;
/// Most samples, locations, functions, mappings and strings a profile may
/// have together. Decoding multiplies a 2-byte empty entry into a 48-72 byte
/// struct, so this, not the byte size alone, bounds decoded memory (about
/// 72 MB at most). Real profiles stay far below it (a large Go heap profile
/// has some 100,000).
pub const MAX_PROFILE_ELEMENTS: usize = 1_000_000;

fn scan_plain(buf: &[u8]) -> Result<Metadata, DecodeError> {
    let bad = |what: &str| DecodeError::Protobuf(what.to_string());
    let mut sample_types: Vec<(i64, i64)> = Vec::new();
    let mut period_type: Option<(i64, i64)> = None;
    let mut meta = Metadata {
        plain_size: buf.len(),
        ..Metadata::default()
    };
    let mut elements = 0usize;
    walk_fields(buf, |tag, field| {
        match field {
            Value::Varint(v) => match tag {
                9 => meta.time_nanos = v as i64,
                10 => meta.duration_nanos = v as i64,
                12 => meta.period = v as i64,
                _ => {}
            },
            Value::Bytes(bytes) => match tag {
                1 => {
                    if sample_types.len() == MAX_SAMPLE_TYPES {
                        return Err(DecodeError::TooManyElements {
                            what: "sample types",
                            limit: MAX_SAMPLE_TYPES,
                        });
                    }
                    sample_types.push(scan_value_type(bytes)?);
                }
                11 => period_type = Some(scan_value_type(bytes)?),
                2..=6 => {
                    if tag == 2 {
                        meta.sample_count += 1;
                    }
                    elements += 1;
                    if elements > MAX_PROFILE_ELEMENTS {
                        return Err(DecodeError::TooManyElements {
                            what: "samples, locations, functions, mappings and strings",
                            limit: MAX_PROFILE_ELEMENTS,
                        });
                    }
                }
                // Packed repeated int64 comment (13) and unknown fields are skipped.
                _ => {}
            },
            Value::Fixed64(_) | Value::Fixed32(_) => {}
        }
        Ok(())
    })?;

    // Only the strings the sample and period types name are read, in a second
    // pass, so the string table is never collected.
    let mut wanted: Vec<i64> = sample_types.iter().flat_map(|&(t, u)| [t, u]).collect();
    if let Some((t, u)) = period_type {
        wanted.extend([t, u]);
    }
    if wanted.iter().any(|&i| i < 0) {
        return Err(bad("negative string index"));
    }
    let mut found: Vec<(i64, String)> = Vec::with_capacity(wanted.len());
    let mut index = 0i64;
    walk_fields(buf, |tag, field| {
        if let (6, Value::Bytes(bytes)) = (tag, field) {
            if wanted.contains(&index) && !found.iter().any(|(i, _)| *i == index) {
                let text = std::str::from_utf8(bytes)
                    .map_err(|_| bad("string table entry is not UTF-8"))?;
                found.push((index, text.to_owned()));
            }
            index += 1;
        }
        Ok(())
    })?;
    let s = |i: i64| -> Result<String, DecodeError> {
        match found.iter().find(|(j, _)| *j == i) {
            Some((_, text)) => Ok(text.clone()),
            None if i == 0 => Ok(String::new()),
            None => Err(bad("string index out of range")),
        }
    };
    for (t, u) in sample_types {
        meta.sample_types.push((s(t)?, s(u)?));
    }
    if let Some((t, u)) = period_type {
        meta.period_type = Some((s(t)?, s(u)?));
    }
    Ok(meta)
}

/// Calls `f` with each top-level field of a protobuf message; the wire walk
/// checks the framing as it goes (tag 0, bad wire types, lengths past the end).
fn walk_fields<'a>(
    buf: &'a [u8],
    mut f: impl FnMut(u32, Value<'a>) -> Result<(), DecodeError>,
) -> Result<(), DecodeError> {
    for field in wire::fields(buf) {
        let (tag, value) = field?;
        f(tag, value)?;
    }
    Ok(())
}

fn scan_value_type(buf: &[u8]) -> Result<(i64, i64), DecodeError> {
    let (mut t, mut u) = (0i64, 0i64);
    walk_fields(buf, |tag, value| {
        match (tag, value) {
            (1, Value::Varint(v)) => t = v as i64,
            (2, Value::Varint(v)) => u = v as i64,
            (_, Value::Varint(_)) => {}
            _ => {
                return Err(DecodeError::Protobuf(
                    "unexpected field in ValueType".to_owned(),
                ));
            }
        }
        Ok(())
    })?;
    Ok((t, u))
}

/// Builds a profile with string interning; used by receivers that convert text
/// formats and by tests.
#[derive(Debug, Default)]
pub struct ProfileBuilder {
    profile: Profile,
    strings: std::collections::HashMap<String, i64>,
    functions: std::collections::HashMap<i64, u64>,
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

    /// The location id of a function-only frame named `name` (one location per function).
    pub fn frame(&mut self, name: &str) -> u64 {
        let name_idx = self.intern(name);
        if let Some(&loc) = self.functions.get(&name_idx) {
            return loc;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(Function {
            id,
            name: name_idx,
            system_name: name_idx,
            filename: 0,
            start_line: 0,
        });
        self.profile.location.push(Location {
            id,
            mapping_id: 0,
            address: 0,
            line: vec![Line {
                function_id: id,
                line: 0,
                column: 0,
            }],
            is_folded: false,
        });
        self.functions.insert(name_idx, id);
        id
    }

    /// Adds a sample whose stack is given root first (as folded text writes it).
    pub fn sample_root_first<'a>(
        &mut self,
        stack: impl IntoIterator<Item = &'a str>,
        values: Vec<i64>,
    ) -> &mut Self {
        let mut ids: Vec<u64> = stack.into_iter().map(|f| self.frame(f)).collect();
        ids.reverse();
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

/// Iterates each sample's stack as function names, root first (for folded output).
pub fn stacks_root_first(profile: &Profile) -> impl Iterator<Item = (Vec<&str>, &Sample)> {
    use std::collections::HashMap;
    let functions: HashMap<u64, &Function> = profile.function.iter().map(|f| (f.id, f)).collect();
    let locations: HashMap<u64, &Location> = profile.location.iter().map(|l| (l.id, l)).collect();
    profile.sample.iter().map(move |sample| {
        let mut frames = Vec::with_capacity(sample.location_id.len());
        for id in sample.location_id.iter().rev() {
            match locations.get(id) {
                Some(loc) if !loc.line.is_empty() => {
                    // Lines are innermost first; root-first order wants the caller first.
                    for line in loc.line.iter().rev() {
                        let name = functions
                            .get(&line.function_id)
                            .map(|f| profile.string(f.name))
                            .unwrap_or("?");
                        frames.push(name);
                    }
                }
                _ => frames.push("?"),
            }
        }
        (frames, sample)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_profile() -> Profile {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(1_700_000_000_000_000_000, 10_000_000_000);
        b.sample_root_first(["main", "work", "hot"], vec![30]);
        b.sample_root_first(["main", "idle"], vec![10]);
        b.build()
    }

    #[test]
    fn scan_reads_metadata_of_plain_and_gzip() {
        let p = sample_profile();
        let plain = encode(&p);
        for bytes in [plain.clone(), gzip(&plain)] {
            let m = scan_metadata(&bytes, 1 << 20).unwrap();
            assert_eq!(
                m.sample_types,
                vec![("cpu".to_string(), "nanoseconds".to_string())]
            );
            assert_eq!(m.period_type, Some(("cpu".into(), "nanoseconds".into())));
            assert_eq!(m.period, 10_000_000);
            assert_eq!(m.time_nanos, 1_700_000_000_000_000_000);
            assert_eq!(m.duration_nanos, 10_000_000_000);
            assert_eq!(m.sample_count, 2);
            assert_eq!(m.plain_size, plain.len());
        }
    }

    #[test]
    fn decode_roundtrips() {
        let p = sample_profile();
        let back = decode(&gzip(&encode(&p)), 1 << 20).unwrap();
        assert_eq!(back, p);
        let stacks: Vec<Vec<&str>> = stacks_root_first(&back).map(|(s, _)| s).collect();
        assert_eq!(
            stacks,
            vec![vec!["main", "work", "hot"], vec!["main", "idle"]]
        );
    }

    #[test]
    fn decompression_bomb_is_refused_at_the_limit() {
        let zeros = vec![0u8; 10 << 20];
        let bomb = gzip(&zeros);
        assert!(bomb.len() < 100 << 10);
        assert_eq!(
            scan_metadata(&bomb, 1 << 20),
            Err(DecodeError::TooLarge { limit: 1 << 20 })
        );
        assert_eq!(
            decode(&bomb, 1 << 20),
            Err(DecodeError::TooLarge { limit: 1 << 20 })
        );
    }

    #[test]
    fn corrupt_input_is_an_error_not_a_panic() {
        assert!(matches!(
            scan_metadata(&[0x1f, 0x8b, 1, 2, 3], 1024),
            Err(DecodeError::Gzip(_))
        ));
        assert!(matches!(
            scan_metadata(&[0x0a, 0xff, 0xff, 0xff, 0x0f], 1024),
            Err(DecodeError::Protobuf(_))
        ));
        assert!(matches!(
            scan_metadata(b"hello world", 1024),
            Err(DecodeError::Protobuf(_))
        ));
    }

    #[test]
    fn element_counts_are_capped_before_decoding() {
        // 2-byte empty samples: tiny on the wire, 72 bytes each once decoded.
        let many = [0x12u8, 0x00].repeat(MAX_PROFILE_ELEMENTS + 1);
        let expected = DecodeError::TooManyElements {
            what: "samples, locations, functions, mappings and strings",
            limit: MAX_PROFILE_ELEMENTS,
        };
        assert_eq!(scan_metadata(&many, 64 << 20), Err(expected.clone()));
        assert_eq!(decode(&Bytes::from(many), 64 << 20), Err(expected));
        let types = [0x0au8, 0x00].repeat(MAX_SAMPLE_TYPES + 1);
        assert!(matches!(
            scan_metadata(&types, 1 << 20),
            Err(DecodeError::TooManyElements {
                what: "sample types",
                ..
            })
        ));
        assert!(
            matches!(
                scan_metadata(&[0x00, 0x00], 1 << 20),
                Err(DecodeError::Protobuf(_))
            ),
            "field number 0"
        );
    }

    proptest::proptest! {
        #[test]
        fn scan_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let _ = scan_metadata(&data, 4096);
            let _ = decode(&Bytes::from(data), 4096);
        }
    }
}
