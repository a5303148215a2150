//! Reading and writing correlation in pprof profiles, on the protobuf wire:
//! the profile is never decoded. Its string table is read as slices of the
//! (decompressed) bytes; a profile none of whose strings is a correlation
//! key is done there. Otherwise each sample's labels are read, and the
//! profile is written again by copying every field as it is but the samples
//! whose labels change, with the strings it needs appended to the string
//! table (at the end of the message, so every existing index stays).

use std::sync::Arc;

use bytes::Bytes;
use proflow_model::wire::{self, Value};
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint};

use super::ids::{self, Found, Key, Shape, SmallMap, SpanId, TraceId};
use super::{Link, Rules};

const SAMPLE: u32 = 2;
const STRING_TABLE: u32 = 6;
const SAMPLE_LABEL: u32 = 3;

/// A profile's bytes and what of them correlation needs, found in one walk
/// of its top-level fields.
pub struct Wire {
    plain: Bytes,
    /// Each string of the table, as a range of `plain`.
    strings: Vec<(u32, u32)>,
    /// The string indexes holding correlation keys.
    keys: Vec<(i64, Key)>,
    /// Each sample: the range of its field (key and length included) and
    /// where its message starts.
    samples: Vec<(u32, u32, u32)>,
}

/// One label as the wire holds it.
#[derive(Debug, Clone, Copy, Default)]
struct RawLabel {
    key: i64,
    str: i64,
    num: i64,
}

fn label(bytes: &[u8]) -> Option<RawLabel> {
    let mut l = RawLabel::default();
    for f in wire::fields(bytes) {
        match f.ok()? {
            (1, Value::Varint(v)) => l.key = v as i64,
            (2, Value::Varint(v)) => l.str = v as i64,
            (3, Value::Varint(v)) => l.num = v as i64,
            _ => {}
        }
    }
    Some(l)
}

impl Wire {
    /// `None` when no string of the profile is a correlation key (or the
    /// bytes are not a profile: it goes on for the exporters to report).
    /// Profiles past 4 GiB are not read (none is; the receivers' limits are
    /// far lower).
    pub fn scan(plain: Bytes) -> Option<Wire> {
        u32::try_from(plain.len()).ok()?;
        let mut strings = Vec::with_capacity(256);
        let mut keys = Vec::new();
        let mut samples = Vec::with_capacity(64);
        let base = plain.as_ptr() as usize;
        let at = |s: &[u8]| (s.as_ptr() as usize - base) as u32;
        let mut fields = wire::fields(&plain);
        loop {
            let start = plain.len() - fields.rest().len();
            let Some(f) = fields.next() else { break };
            match f.ok()? {
                (STRING_TABLE, Value::Bytes(s)) => {
                    if let Some(k) = Key::of_bytes(s) {
                        keys.push((strings.len() as i64, k));
                    }
                    strings.push((at(s), s.len() as u32));
                }
                (SAMPLE, Value::Bytes(s)) => {
                    let end = plain.len() - fields.rest().len();
                    samples.push((start as u32, end as u32, at(s)));
                }
                _ => {}
            }
        }
        if keys.is_empty() {
            return None;
        }
        Some(Wire {
            plain,
            strings,
            keys,
            samples,
        })
    }

    /// The profile's bytes, decompressed.
    pub fn plain(&self) -> &Bytes {
        &self.plain
    }

    fn key(&self, index: i64) -> Option<Key> {
        // In index order, as the table was walked.
        self.keys
            .binary_search_by_key(&index, |(i, _)| *i)
            .ok()
            .map(|i| self.keys[i].1)
    }

    fn text(&self, index: i64) -> Option<&str> {
        let &(at, len) = self.strings.get(usize::try_from(index).ok()?)?;
        std::str::from_utf8(&self.plain[at as usize..(at + len) as usize]).ok()
    }

    fn sample(&self, i: usize) -> &[u8] {
        let (_, end, body) = self.samples[i];
        &self.plain[body as usize..end as usize]
    }

    /// What each sample says of its span (`None` for a sample without any
    /// correlation label), or `None` when no sample says anything. Each
    /// distinct label is read once (samples of one span share theirs).
    pub fn read(&self) -> Option<Vec<Option<Found>>> {
        let mut out = Vec::with_capacity(self.samples.len());
        let mut any = false;
        let mut seen: SmallMap<(i64, i64, i64), Found> = SmallMap::default();
        for i in 0..self.samples.len() {
            let mut found: Option<Found> = None;
            for sf in wire::fields(self.sample(i)) {
                let (SAMPLE_LABEL, Value::Bytes(l)) = sf.ok()? else {
                    continue;
                };
                let l = label(l)?;
                let Some(key) = self.key(l.key) else { continue };
                let id = (l.key, l.str, l.num);
                let f = found.get_or_insert_with(Found::default);
                if let Some(piece) = seen.get(&id) {
                    f.merge(piece);
                    continue;
                }
                let mut piece = Found::default();
                let text = if l.str != 0 {
                    // Not UTF-8: not an id.
                    Some(self.text(l.str).unwrap_or("\u{fffd}"))
                } else {
                    None
                };
                piece.read(key, text, l.num);
                piece.shape = Shape::of(key, text);
                f.merge(&piece);
                seen.insert(id, piece);
            }
            any |= found.is_some();
            out.push(found);
        }
        any.then_some(out)
    }
}

/// How the labels of one sample are written.
#[derive(Debug, Clone, Copy)]
pub struct Mode {
    /// Write `span_id` and `span_name` in their normal form.
    pub labels: bool,
    /// Write `trace_id` too.
    pub trace_label: bool,
    /// For linked samples, write `trace_id` and `span_id` whatever
    /// `labels` says (the OTLP conversion makes them the sample's link).
    pub link_labels: bool,
}

/// Strings the rewrite appends, each once.
struct NewStrings<'w> {
    wire: &'w Wire,
    added: Vec<String>,
    spans: SmallMap<SpanId, i64>,
    traces: SmallMap<TraceId, i64>,
    names: SmallMap<Arc<str>, i64>,
    keys: SmallMap<Key, i64>,
}

impl NewStrings<'_> {
    fn push(&mut self, s: String) -> i64 {
        self.added.push(s);
        (self.wire.strings.len() + self.added.len() - 1) as i64
    }

    fn key(&mut self, key: Key, name: &str) -> i64 {
        if let Some(&(i, _)) = self.wire.keys.iter().find(|(_, k)| *k == key) {
            return i;
        }
        if let Some(&i) = self.keys.get(&key) {
            return i;
        }
        let i = self.push(name.to_owned());
        self.keys.insert(key, i);
        i
    }

    fn span(&mut self, id: &SpanId) -> i64 {
        if let Some(&i) = self.spans.get(id) {
            return i;
        }
        let i = self.push(ids::hex(id));
        self.spans.insert(*id, i);
        i
    }

    fn trace(&mut self, id: &TraceId) -> i64 {
        if let Some(&i) = self.traces.get(id) {
            return i;
        }
        let i = self.push(ids::hex(id));
        self.traces.insert(*id, i);
        i
    }

    fn name(&mut self, name: &Arc<str>) -> i64 {
        if let Some(&i) = self.names.get(name) {
            return i;
        }
        let i = self.push(name.to_string());
        self.names.insert(name.clone(), i);
        i
    }
}

fn put_label(out: &mut Vec<u8>, key: i64, str: i64) {
    let len = 1 + encoded_len_varint(key as u64) + 1 + encoded_len_varint(str as u64);
    encode_key(SAMPLE_LABEL, WireType::LengthDelimited, out);
    encode_varint(len as u64, out);
    encode_key(1, WireType::Varint, out);
    encode_varint(key as u64, out);
    encode_key(2, WireType::Varint, out);
    encode_varint(str as u64, out);
}

/// The bytes of one field of `fields` just read, key included.
fn raw<'a>(before: &'a [u8], after: &'a [u8]) -> &'a [u8] {
    &before[..before.len() - after.len()]
}

/// What [`write`] made.
pub enum Written {
    /// Every sample's labels were in their normal form already: the profile
    /// goes on as it came (its gzip bytes too).
    Same,
    /// The profile again, uncompressed.
    New(Vec<u8>),
}

/// True when writing `mode` would leave a sample as it is, told from what
/// [`Wire::read`] found in it and its `link` alone: for the `labels` output
/// by itself (what Pyroscope's clients mostly send already), a linked
/// sample with one `span_id` label in normal form for its span and a
/// `span_name` label (or no name to write), or an unlinked one without
/// zero ids. Other modes are not told this way (`false`: walk the sample).
fn unchanged(found: &Found, link: Option<&Link>, rules: &Rules, mode: Mode) -> bool {
    if !mode.labels || mode.trace_label || mode.link_labels || rules.drop_after_link {
        return false;
    }
    let shape = &found.shape;
    match link {
        None => !shape.zero_id,
        Some(link) => {
            shape.span_labels == 1
                && shape.normal_span_labels == 1
                && found.span_id == Some(link.span)
                && (shape.name_label || link.name.is_none())
        }
    }
}

/// The profile with its samples' correlation labels written by `links` (one
/// per sample, as [`Wire::read`] gave them and the index completed them);
/// `found` is what [`Wire::read`] gave (samples without any correlation
/// label are copied as they are). A label already in its normal form is
/// kept where it is. `None` if the bytes turn out not to be a profile.
pub fn write(
    w: &Wire,
    links: &[Option<Link>],
    found: &[Option<Found>],
    rules: &Rules,
    mode: Mode,
) -> Option<Written> {
    write_samples(w, links, found, rules, mode, true)
}

/// [`write`], with `shortcut` false walking every sample (tests check that
/// the shortcut never changes what is written).
pub(super) fn write_samples(
    w: &Wire,
    links: &[Option<Link>],
    found: &[Option<Found>],
    rules: &Rules,
    mode: Mode,
    shortcut: bool,
) -> Option<Written> {
    let plain = &w.plain[..];
    // Made at the first sample that changes.
    let mut out = Vec::new();
    let mut strings = NewStrings {
        wire: w,
        added: Vec::new(),
        spans: SmallMap::default(),
        traces: SmallMap::default(),
        names: SmallMap::default(),
        keys: SmallMap::default(),
    };
    let mut body: Vec<u8> = Vec::with_capacity(256);
    let mut changed = false;
    // Copied up to here.
    let mut copied = 0;
    for (i, &(start, end, _)) in w.samples.iter().enumerate() {
        let link = links.get(i).and_then(Option::as_ref);
        let Some(f) = found.get(i).and_then(Option::as_ref) else {
            continue;
        };
        if (link.is_none() && !mode.labels) || (shortcut && unchanged(f, link, rules, mode)) {
            continue;
        }
        body.clear();
        let mut labels = SampleLabels::new(link, rules, mode);
        let dropped = labels.copy_kept(w, w.sample(i), &mut body)?;
        let added = labels.add_missing(&mut strings, &mut body);
        if !dropped && !added {
            continue;
        }
        if !changed {
            out.reserve(plain.len() + links.len() * 16 + 256);
        }
        changed = true;
        out.extend_from_slice(&plain[copied..start as usize]);
        copied = end as usize;
        encode_key(SAMPLE, WireType::LengthDelimited, &mut out);
        encode_varint(body.len() as u64, &mut out);
        out.extend_from_slice(&body);
    }
    if !changed {
        return Some(Written::Same);
    }
    out.extend_from_slice(&plain[copied..]);
    for s in &strings.added {
        encode_key(STRING_TABLE, WireType::LengthDelimited, &mut out);
        encode_varint(s.len() as u64, &mut out);
        out.extend_from_slice(s.as_bytes());
    }
    Some(Written::New(out))
}

/// The labels of one sample being written: what its link and the mode ask
/// for, and which of the labels asked for the sample has already (each
/// kept where it is).
struct SampleLabels<'l> {
    link: Option<&'l Link>,
    mode: Mode,
    /// The link's span id is written (`span_id`).
    write_ids: bool,
    /// The link's trace id is written (`trace_id`).
    write_trace: bool,
    /// The other correlation labels of a linked sample are dropped.
    drop_rest: bool,
    had_name: bool,
    span_kept: bool,
    trace_kept: bool,
}

impl<'l> SampleLabels<'l> {
    /// What writing `mode` asks of a sample with `link`.
    fn new(link: Option<&'l Link>, rules: &Rules, mode: Mode) -> Self {
        let linked = link.is_some_and(|l| l.trace.is_some());
        SampleLabels {
            link,
            mode,
            write_ids: link.is_some()
                && (mode.labels || mode.trace_label || (mode.link_labels && linked)),
            write_trace: linked && (mode.trace_label || mode.link_labels),
            drop_rest: rules.drop_after_link && linked,
            had_name: false,
            span_kept: false,
            trace_kept: false,
        }
    }

    /// Copies the fields of `sample` to `body` but the labels that go; true
    /// when one went, `None` when the bytes are not a sample.
    fn copy_kept(&mut self, w: &Wire, sample: &[u8], body: &mut Vec<u8>) -> Option<bool> {
        let mut dropped = false;
        let mut sf = wire::fields(sample);
        loop {
            let before = sf.rest();
            let Some(f) = sf.next() else { break };
            let (field, value) = f.ok()?;
            let this = raw(before, sf.rest());
            let keep = match (field, value) {
                (SAMPLE_LABEL, Value::Bytes(l)) => self.keep(w, label(l)?),
                _ => true,
            };
            if keep {
                body.extend_from_slice(this);
            } else {
                dropped = true;
            }
        }
        Some(dropped)
    }

    /// True when label `l` stays as it is (noting the `span_id`,
    /// `trace_id` and `span_name` labels that stay).
    fn keep(&mut self, w: &Wire, l: RawLabel) -> bool {
        // String 0 is the empty string (read so, as `read` does, whatever a
        // profile put there).
        let text = || {
            if l.str == 0 {
                ""
            } else {
                w.text(l.str).unwrap_or_default()
            }
        };
        match (w.key(l.key), self.link) {
            (None, _) => true,
            // All-zero ids mean none: dropped where labels are written.
            (Some(key), None) => !(key != Key::SpanName && ids::is_zero(text())),
            (Some(Key::SpanId), Some(link)) if self.write_ids => {
                // One label in normal form stays where it is.
                let keep = !self.span_kept && ids::is_hex_of(text(), &link.span);
                self.span_kept |= keep;
                keep
            }
            (Some(Key::SpanId), _) => !self.drop_rest,
            (Some(Key::TraceId), Some(link)) if self.write_trace => {
                let keep =
                    !self.trace_kept && link.trace.is_some_and(|t| ids::is_hex_of(text(), &t));
                self.trace_kept |= keep;
                keep
            }
            (Some(Key::TraceId), _) => !self.drop_rest,
            (Some(Key::SpanName), _) => {
                let keep = !self.drop_rest || self.mode.labels;
                self.had_name |= keep;
                keep
            }
            (Some(Key::ProfileId | Key::DdSpanId | Key::DdLocalRoot), _) => !self.drop_rest,
        }
    }

    /// Appends to `body` the labels of the link that the sample did not
    /// keep; true when it appended any.
    fn add_missing(&self, strings: &mut NewStrings, body: &mut Vec<u8>) -> bool {
        let Some(link) = self.link else {
            return false;
        };
        let mut added = false;
        if self.write_ids && !self.span_kept {
            let key = strings.key(Key::SpanId, ids::SPAN_ID);
            let value = strings.span(&link.span);
            put_label(body, key, value);
            added = true;
        }
        if let Some(t) = link
            .trace
            .as_ref()
            .filter(|_| self.write_trace && !self.trace_kept)
        {
            let key = strings.key(Key::TraceId, ids::TRACE_ID);
            let value = strings.trace(t);
            put_label(body, key, value);
            added = true;
        }
        if self.mode.labels
            && !self.had_name
            && let Some(n) = &link.name
        {
            let key = strings.key(Key::SpanName, ids::SPAN_NAME);
            let value = strings.name(n);
            put_label(body, key, value);
            added = true;
        }
        added
    }
}
