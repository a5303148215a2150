//! The pprof profile (`perftools.profiles`), written from the wire facts in
//! shared/formats.md, plus bounded decoding, encoding and a cheap metadata scan.
//!
//! Decoding untrusted bytes always goes through [`decode`] (or [`scan_metadata`]),
//! which cap the decompressed size, the element counts and the estimated heap
//! of the decoded profile ([`decoded_budget`]) before allocating anything
//! sized by input.

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

/// The gzip magic and its test, kept with the inflater.
pub use crate::inflate::{GZIP_MAGIC, is_gzip};

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
    /// The scan's estimate of the decoded heap ([`Metadata::decoded_size`])
    /// exceeds [`decoded_budget`].
    #[error(
        "the profile would take about {estimate} bytes of memory once decoded, more than its limit of {limit} bytes ({MAX_DECODED_BYTES_PER_BYTE} times its plain size, at most {MAX_DECODED_SIZE}): it holds too many samples, labels, location ids, values, lines or strings; send smaller profiles (split them by time)"
    )]
    DecodedTooLarge { estimate: usize, limit: usize },
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
    // One member whose trailer states a size within the limit (what every
    // pprof writer sends): inflated in one call into a buffer of that size.
    if let Some(stated) = crate::inflate::stated_size(bytes).filter(|&s| s <= limit) {
        out.reserve_exact(stated);
        match crate::inflate::inflate_whole(bytes, out, 0) {
            Ok(crate::inflate::Whole::Done) => return Ok(()),
            Ok(crate::inflate::Whole::Stream) => out.clear(),
            Err(e) => return Err(DecodeError::Gzip(e.to_string())),
        }
    }
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

/// Decodes a (possibly gzipped) pprof payload with a cap on the decompressed
/// size. The scan runs first, so a profile that would decode to more than its
/// [`decoded_budget`] is refused before prost allocates anything.
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

/// libdeflate's compressor at level 1 (its hash tables): one per thread,
/// made at the thread's first profile, never per profile.
struct Compressor(std::ptr::NonNull<libdeflate_sys::libdeflate_compressor>);

impl Drop for Compressor {
    fn drop(&mut self) {
        // SAFETY: made by libdeflate_alloc_compressor, freed once, here.
        unsafe { libdeflate_sys::libdeflate_free_compressor(self.0.as_ptr()) }
    }
}

thread_local! {
    static COMPRESSOR: std::cell::RefCell<Option<Compressor>> =
        const { std::cell::RefCell::new(None) };
}

/// Gzip-compresses bytes at a fast level (what pprof writers use): one call
/// of libdeflate at level 1, its compressor kept per thread (zlib's state,
/// made for every profile, was 300 KB allocated and zeroed each time).
pub fn gzip(bytes: &[u8]) -> Bytes {
    COMPRESSOR.with(|cell| {
        let Ok(mut cell) = cell.try_borrow_mut() else {
            return gzip_stream(bytes);
        };
        let compressor = match &*cell {
            Some(c) => c.0,
            None => {
                // SAFETY: allocates a compressor; null when out of memory.
                let made = unsafe { libdeflate_sys::libdeflate_alloc_compressor(1) };
                let Some(c) = std::ptr::NonNull::new(made) else {
                    return gzip_stream(bytes);
                };
                *cell = Some(Compressor(c));
                c
            }
        };
        // SAFETY: the compressor is this thread's alone.
        let bound = unsafe {
            libdeflate_sys::libdeflate_gzip_compress_bound(compressor.as_ptr(), bytes.len())
        };
        let mut out: Vec<u8> = Vec::with_capacity(bound);
        // SAFETY: the input is `bytes.len()` readable bytes, the output
        // `bound` writable ones (uninitialised memory libdeflate only writes).
        let written = unsafe {
            libdeflate_sys::libdeflate_gzip_compress(
                compressor.as_ptr(),
                bytes.as_ptr().cast(),
                bytes.len(),
                out.spare_capacity_mut().as_mut_ptr().cast(),
                bound,
            )
        };
        if written == 0 || written > bound {
            // Never with the bound libdeflate gave.
            return gzip_stream(bytes);
        }
        // SAFETY: libdeflate wrote `written` bytes, within the capacity.
        unsafe { out.set_len(written) };
        // Queues hold it: no room past what was written (a shrink in place).
        out.shrink_to_fit();
        Bytes::from(out)
    })
}

/// [`gzip`] through zlib-rs's stream, where libdeflate cannot be used.
fn gzip_stream(bytes: &[u8]) -> Bytes {
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
    /// Most location ids of one sample (the deepest stack).
    pub deepest_stack: usize,
    /// Most labels of one sample.
    pub most_sample_labels: usize,
    /// The heap [`decode`] would allocate for this profile, estimated from the
    /// wire (see [`MAX_DECODED_BYTES_PER_BYTE`]); an upper bound of what the
    /// decoded [`Profile`] holds.
    pub decoded_size: usize,
}

thread_local! {
    static SCAN_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Reads sample types, period and times from a (possibly gzipped) pprof payload
/// while counting, not decoding, samples, locations and the rest. Checks the
/// protobuf framing of the profile and of its samples and locations, the
/// element caps and the [`decoded_budget`]. Cheap compared to [`decode`].
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
/// have together. Real profiles stay far below it (a large Go heap profile
/// has some 100,000). What they decode to is bounded by
/// [`MAX_DECODED_BYTES_PER_BYTE`].
pub const MAX_PROFILE_ELEMENTS: usize = 1_000_000;

/// Most heap a decoded profile may take per byte of its plain protobuf, as
/// the scan estimates it ([`Metadata::decoded_size`]) before anything is
/// decoded. Decoding amplifies: every repeated element becomes a struct, a
/// `Vec` holds at least 4 elements and, grown push by push, up to twice its
/// length. Per wire byte: an empty Sample (2 bytes) becomes a 72-byte struct,
/// 36 to 72 bytes per byte with slack; a sample with one empty label (4
/// bytes) 200 bytes; a location with one empty line (4 bytes) 152; an empty
/// Label or Line inside a sample or location (2 bytes) 32 or 24, so 12 to 32
/// per byte; a 1-byte varint of a packed `location_id`, `value` or `comment`
/// an 8-byte integer, 8 to 16 per byte. Real profiles (Go heap and CPU, Java
/// through JFR, .NET, fgprof) decode to 4 to 13 bytes per byte, profiles of
/// one-frame stacks up to about 21 with slack, so this refuses only crafted
/// shapes. Shapes that amplify no more than real profiles do (labels, packed
/// varints) are bounded by [`MAX_DECODED_SIZE`].
pub const MAX_DECODED_BYTES_PER_BYTE: usize = 32;

/// Most heap any decoded profile may take, whatever its size: a profile of
/// the default `max_decompressed_size` (64 MiB) decoding at 8 bytes per byte,
/// as real Go heap profiles do (Pyroscope's 43 MB test profile decodes to
/// 347 MB).
pub const MAX_DECODED_SIZE: usize = 512 << 20;

/// The budget below which any profile may decode, whatever its ratio: tiny
/// profiles carry more `Vec` slack per byte and are harmless.
pub const MIN_DECODED_BUDGET: usize = 1 << 20;

/// The decoded-size budget of a profile of `plain_size` bytes:
/// [`MAX_DECODED_BYTES_PER_BYTE`] times its size, at least
/// [`MIN_DECODED_BUDGET`] and at most [`MAX_DECODED_SIZE`]. It bounds what
/// the decoded profile holds; while decoding, a `Vec` being regrown briefly
/// holds its old and new buffers.
pub fn decoded_budget(plain_size: usize) -> usize {
    plain_size
        .saturating_mul(MAX_DECODED_BYTES_PER_BYTE)
        .clamp(MIN_DECODED_BUDGET, MAX_DECODED_SIZE)
}

/// The heap a `Vec<T>` of `len` elements of `elem` bytes holds when it was
/// grown one push at a time, as prost grows repeated fields: std's amortized
/// growth starts at 4 elements (8 for bytes) and doubles.
fn vec_heap(len: usize, elem: usize) -> usize {
    if len == 0 {
        return 0;
    }
    let min_capacity = if elem == 1 { 8 } else { 4 };
    len.checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .max(min_capacity)
        .saturating_mul(elem)
}

/// The heap of a string of `len` bytes copied out of the wire (prost reserves
/// exactly the length, at least 8).
fn string_heap(len: usize) -> usize {
    if len == 0 { 0 } else { len.max(8) }
}

/// Counts repeated elements of a profile on the wire to estimate the heap its
/// decoded form takes, including the nested ones (sample location ids,
/// values and labels, location lines) and `Vec` growth slack.
#[derive(Debug, Default)]
struct DecodedSize {
    sample_types: usize,
    samples: usize,
    mappings: usize,
    locations: usize,
    functions: usize,
    strings: usize,
    comments: usize,
    /// The heap of the Vecs and strings inside elements, summed as they are met.
    inner: usize,
}

impl DecodedSize {
    /// Counts a Sample's location ids, values (packed or not) and labels;
    /// returns the ids and the labels.
    fn sample(&mut self, sample: &[u8]) -> Result<(usize, usize), DecodeError> {
        let (mut ids, mut values, mut labels) = (0usize, 0usize, 0usize);
        for field in wire::fields(sample) {
            match field? {
                (1, Value::Bytes(packed)) => ids += wire::count_varints(packed),
                (1, _) => ids += 1,
                (2, Value::Bytes(packed)) => values += wire::count_varints(packed),
                (2, _) => values += 1,
                (3, _) => labels += 1,
                _ => {}
            }
        }
        self.samples += 1;
        self.add_inner(vec_heap(ids, size_of::<u64>()));
        self.add_inner(vec_heap(values, size_of::<i64>()));
        self.add_inner(vec_heap(labels, size_of::<Label>()));
        Ok((ids, labels))
    }

    /// Counts a Location's lines.
    fn location(&mut self, location: &[u8]) -> Result<(), DecodeError> {
        let mut lines = 0usize;
        for field in wire::fields(location) {
            if field?.0 == 4 {
                lines += 1;
            }
        }
        self.locations += 1;
        self.add_inner(vec_heap(lines, size_of::<Line>()));
        Ok(())
    }

    fn string(&mut self, len: usize) {
        self.strings += 1;
        self.add_inner(string_heap(len));
    }

    fn add_inner(&mut self, bytes: usize) {
        self.inner = self.inner.saturating_add(bytes);
    }

    fn total(&self) -> usize {
        [
            size_of::<Profile>(),
            vec_heap(self.sample_types, size_of::<ValueType>()),
            vec_heap(self.samples, size_of::<Sample>()),
            vec_heap(self.mappings, size_of::<Mapping>()),
            vec_heap(self.locations, size_of::<Location>()),
            vec_heap(self.functions, size_of::<Function>()),
            vec_heap(self.strings, size_of::<String>()),
            vec_heap(self.comments, size_of::<i64>()),
            self.inner,
        ]
        .into_iter()
        .fold(0, usize::saturating_add)
    }
}

/// How many string table entries the scan's one pass keeps the place of
/// (index → bytes), enough for the sample and period types of every writer
/// seen: Go, pprof-rs, async-profiler's converters and proflow intern those
/// first. A profile that names a later entry there costs a second walk of
/// its string table.
const EARLY_STRINGS: usize = 32;

/// Scans a plain (not gzipped) profile without decoding it: its metadata,
/// with the decoded size estimated and checked against the budget, and the
/// element counts checked against their limits. The loop over the fields
/// stays in this one function with its state in locals (it runs once a
/// field of every profile); naming the types afterwards is [`TypeStrings`].
fn scan_plain(buf: &[u8]) -> Result<Metadata, DecodeError> {
    let mut sample_types: Vec<(i64, i64)> = Vec::new();
    let mut period_type: Option<(i64, i64)> = None;
    let mut meta = Metadata {
        plain_size: buf.len(),
        ..Metadata::default()
    };
    let mut elements = 0usize;
    let mut size = DecodedSize::default();
    // Where the string table starts, for the rare second walk (writers put
    // it after the samples and locations).
    let mut first_string_at = None;
    // The first strings, as they pass: no second walk for them.
    let mut early: [&[u8]; EARLY_STRINGS] = [&[]; EARLY_STRINGS];
    let mut strings = 0usize;
    let mut fields = wire::fields(buf);
    loop {
        let at = buf.len() - fields.rest().len();
        let Some(field) = fields.next() else { break };
        let (tag, field) = field?;
        if tag == 6 && first_string_at.is_none() {
            first_string_at = Some(at);
        }
        match field {
            Value::Varint(v) => match tag {
                9 => meta.time_nanos = v as i64,
                10 => meta.duration_nanos = v as i64,
                12 => meta.period = v as i64,
                13 => size.comments += 1,
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
                    size.sample_types += 1;
                }
                11 => period_type = Some(scan_value_type(bytes)?),
                2..=6 => {
                    elements += 1;
                    if elements > MAX_PROFILE_ELEMENTS {
                        return Err(DecodeError::TooManyElements {
                            what: "samples, locations, functions, mappings and strings",
                            limit: MAX_PROFILE_ELEMENTS,
                        });
                    }
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
                            if let Some(slot) = early.get_mut(strings) {
                                *slot = bytes;
                            }
                            strings += 1;
                            size.string(bytes.len());
                        }
                    }
                }
                // Packed repeated int64.
                13 => size.comments += wire::count_varints(bytes),
                // Unknown fields are skipped by prost: nothing is allocated.
                _ => {}
            },
            Value::Fixed64(_) | Value::Fixed32(_) => {}
        }
    }
    meta.decoded_size = size.total();
    let budget = decoded_budget(buf.len());
    if meta.decoded_size > budget {
        return Err(DecodeError::DecodedTooLarge {
            estimate: meta.decoded_size,
            limit: budget,
        });
    }

    let types = TypeStrings {
        sample_types,
        period_type,
        early,
        strings,
        first_string_at,
    };
    types.name(buf, meta)
}

/// What [`scan_plain`] keeps to name the sample and period types once its
/// walk is done: their string indices, the first strings as they passed,
/// the string table's length and where it starts.
struct TypeStrings<'a> {
    sample_types: Vec<(i64, i64)>,
    period_type: Option<(i64, i64)>,
    early: [&'a [u8]; EARLY_STRINGS],
    strings: usize,
    first_string_at: Option<usize>,
}

impl TypeStrings<'_> {
    /// Reads only the strings the sample and period types name (those past
    /// the first ones in one more walk from the first string) into `meta`.
    fn name(self, buf: &[u8], mut meta: Metadata) -> Result<Metadata, DecodeError> {
        let bad = |what: &str| DecodeError::Protobuf(what.to_string());
        let TypeStrings {
            sample_types,
            period_type,
            early,
            strings,
            first_string_at,
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
        // Those past the first ones, in one more walk from the first string.
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

mod builder;
mod merge;
pub use builder::ProfileBuilder;
pub use merge::{Merger, ProfileParts};

/// Cuts every stack deeper than `depth` locations to its `depth` root-most
/// ones: the leaf-most are dropped (a sample's first location is its leaf),
/// as Pyroscope truncates them, with nothing put in their place. Returns
/// the locations cut.
pub fn truncate_stacks(profile: &mut Profile, depth: usize) -> u64 {
    let mut cut = 0u64;
    for s in &mut profile.sample {
        if s.location_id.len() > depth {
            let extra = s.location_id.len() - depth;
            s.location_id.drain(..extra);
            cut += extra as u64;
        }
    }
    cut
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
mod tests;
