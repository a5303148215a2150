//! The envelope a profile travels in: series labels, time range, sample types,
//! period and the payload. The payload keeps the bytes that arrived and decodes
//! them only when asked; clones share everything through `Arc`/`Bytes`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;

use crate::delivery::{Ack, Delivery};
use crate::pprof::{self, DecodeError};

/// The label holding the profile type (`process_cpu`, `memory`, ...).
pub const NAME_LABEL: &str = "__name__";
/// The label holding the service name.
pub const SERVICE_NAME_LABEL: &str = "service_name";

/// One series label.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Label {
    pub name: String,
    pub value: String,
}

/// Series labels: sorted by name, names unique. Every constructor keeps that invariant.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Labels(Vec<Label>);

/// True when `name` is a valid Prometheus label name: `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_valid_label_name(name: &str) -> bool {
    let mut chars = name.bytes();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == b'_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

impl Labels {
    pub fn new() -> Self {
        Labels(Vec::new())
    }

    /// Builds labels from pairs; a later pair with the same name wins. Empty values
    /// are dropped (Prometheus semantics: an empty label is an absent label).
    pub fn from_pairs<N: Into<String>, V: Into<String>>(
        pairs: impl IntoIterator<Item = (N, V)>,
    ) -> Self {
        let mut labels = Labels::new();
        for (n, v) in pairs {
            labels.set(n, v);
        }
        labels
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .binary_search_by(|l| l.name.as_str().cmp(name))
            .ok()
            .map(|i| self.0[i].value.as_str())
    }

    /// Sets `name` to `value`; an empty value removes the label.
    pub fn set(&mut self, name: impl Into<String>, value: impl Into<String>) {
        let name = name.into();
        let value = value.into();
        match self.0.binary_search_by(|l| l.name.as_str().cmp(&name)) {
            Ok(i) if value.is_empty() => {
                self.0.remove(i);
            }
            Ok(i) => self.0[i].value = value,
            Err(_) if value.is_empty() => {}
            Err(i) => self.0.insert(i, Label { name, value }),
        }
    }

    pub fn remove(&mut self, name: &str) -> Option<String> {
        match self.0.binary_search_by(|l| l.name.as_str().cmp(name)) {
            Ok(i) => Some(self.0.remove(i).value),
            Err(_) => None,
        }
    }

    /// Keeps only the labels for which `keep` returns true.
    pub fn retain(&mut self, mut keep: impl FnMut(&Label) -> bool) {
        self.0.retain(|l| keep(l));
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Label> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The names that are not valid Prometheus label names.
    pub fn invalid_names(&self) -> impl Iterator<Item = &str> {
        self.0
            .iter()
            .filter(|l| !is_valid_label_name(&l.name))
            .map(|l| l.name.as_str())
    }

    /// Removes `__`-prefixed labels except those in `keep` (what exporters do before sending).
    pub fn without_internal(&self, keep: &[&str]) -> Labels {
        Labels(
            self.0
                .iter()
                .filter(|l| !l.name.starts_with("__") || keep.contains(&l.name.as_str()))
                .cloned()
                .collect(),
        )
    }

    /// `{a="1", b="2"}` in Prometheus text form.
    pub fn to_selector_string(&self) -> String {
        let mut s = String::from("{");
        for (i, l) in self.0.iter().enumerate() {
            if i > 0 {
                s.push_str(", ");
            }
            s.push_str(&l.name);
            s.push_str("=\"");
            for c in l.value.chars() {
                match c {
                    '"' => s.push_str("\\\""),
                    '\\' => s.push_str("\\\\"),
                    '\n' => s.push_str("\\n"),
                    c => s.push(c),
                }
            }
            s.push('"');
        }
        s.push('}');
        s
    }
}

impl<'a> IntoIterator for &'a Labels {
    type Item = &'a Label;
    type IntoIter = std::slice::Iter<'a, Label>;
    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

/// A sample type or period type by name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ValueType {
    pub r#type: String,
    pub unit: String,
}

impl ValueType {
    pub fn new(ty: impl Into<String>, unit: impl Into<String>) -> Self {
        ValueType {
            r#type: ty.into(),
            unit: unit.into(),
        }
    }
}

/// The encoded form of a pprof payload, as it arrived or as we encoded it.
#[derive(Debug, Clone)]
pub struct Encoded {
    /// The protobuf bytes, gzipped when `gzipped` is true.
    pub bytes: Bytes,
    pub gzipped: bool,
}

#[derive(Debug)]
struct PayloadInner {
    /// The bytes as they arrived; for a payload made from a profile, encoded
    /// on first use and kept (counted in [`Payload::size_bytes`] from the start).
    encoded: OnceLock<Encoded>,
    /// The profile, for a payload made from one.
    profile: Option<Arc<pprof::Profile>>,
    /// What this payload keeps alive, fixed at construction so queue
    /// accounting never changes while the payload waits.
    size: usize,
    /// Set once anything decoded the bytes (tests and benchmarks check that
    /// pass-through never decodes).
    decoded_once: AtomicBool,
}

/// A pprof profile, held as bytes or as a decoded profile. Cloning is an
/// `Arc` clone: fan-out copies no payload.
///
/// Nothing derived from the bytes is cached: a decoded profile is several
/// times larger than its bytes, and a cache filled by one exporter after the
/// payload was admitted would pin memory no queue counted. So
/// [`Payload::decoded`] and [`Payload::gzipped`] (of plain bytes) make a fresh
/// value each call, and the caller drops it when done.
#[derive(Debug, Clone)]
pub struct Payload {
    inner: Arc<PayloadInner>,
    /// Cap on the decompressed size when decoding (set by the receiver).
    decode_limit: usize,
}

impl Payload {
    /// A payload from pprof bytes as they arrived (gzip detected by magic bytes).
    ///
    /// The payload keeps `bytes` alive, and with them the whole buffer they
    /// are a slice of: a receiver that cut several profiles out of one request
    /// buffer should [`Payload::detach`] them so each pins only itself.
    pub fn from_bytes(bytes: Bytes, decode_limit: usize) -> Self {
        let gzipped = pprof::is_gzip(&bytes);
        let size = bytes.len();
        let encoded = OnceLock::new();
        let _ = encoded.set(Encoded { bytes, gzipped });
        Payload {
            inner: Arc::new(PayloadInner {
                encoded,
                profile: None,
                size,
                decoded_once: AtomicBool::new(false),
            }),
            decode_limit,
        }
    }

    /// A payload from a decoded profile (for example converted from folded text
    /// or changed by a processor). Bytes are made when first needed and kept;
    /// the size counts both.
    pub fn from_profile(profile: pprof::Profile) -> Self {
        let size = heap_size(&profile) + prost::Message::encoded_len(&profile);
        Payload {
            inner: Arc::new(PayloadInner {
                encoded: OnceLock::new(),
                profile: Some(Arc::new(profile)),
                size,
                decoded_once: AtomicBool::new(true),
            }),
            decode_limit: pprof::DEFAULT_MAX_DECOMPRESSED,
        }
    }

    /// The same payload holding its own copy of the bytes, so it no longer
    /// keeps a larger buffer (a whole request) alive. A payload made from a
    /// profile is returned as it is.
    pub fn detach(&self) -> Payload {
        match (&self.inner.profile, self.inner.encoded.get()) {
            (None, Some(e)) => {
                Payload::from_bytes(Bytes::copy_from_slice(&e.bytes), self.decode_limit)
            }
            _ => self.clone(),
        }
    }

    /// The encoded bytes (encoding the profile once, if that is all we have).
    pub fn encoded(&self) -> &Encoded {
        self.inner
            .encoded
            .get_or_init(|| match &self.inner.profile {
                Some(p) => Encoded {
                    bytes: pprof::encode(p),
                    gzipped: false,
                },
                // Unreachable by construction: a payload without a profile was
                // made from bytes, which set `encoded`.
                None => Encoded {
                    bytes: Bytes::new(),
                    gzipped: false,
                },
            })
    }

    /// Gzipped pprof bytes: the arrived bytes when they were gzipped (shared,
    /// no copy), else compressed now.
    pub fn gzipped(&self) -> Bytes {
        let e = self.encoded();
        if e.gzipped {
            e.bytes.clone()
        } else {
            pprof::gzip(&e.bytes)
        }
    }

    /// The decoded profile: the payload's own for one made from a profile,
    /// else decoded now from the bytes (not cached; see the type's docs).
    pub fn decoded(&self) -> Result<Arc<pprof::Profile>, DecodeError> {
        if let Some(p) = &self.inner.profile {
            return Ok(p.clone());
        }
        self.inner.decoded_once.store(true, Ordering::Relaxed);
        pprof::decode(&self.encoded().bytes, self.decode_limit).map(Arc::new)
    }

    /// True when the payload holds a decoded profile or was ever decoded (for
    /// tests and benchmarks that check the pass-through path never decodes).
    pub fn is_decoded(&self) -> bool {
        self.inner.decoded_once.load(Ordering::Relaxed)
    }

    /// Bytes of memory this payload keeps alive, as queues account them: the
    /// bytes' length, or for a payload made from a profile an estimate of the
    /// profile's heap plus its encoding.
    pub fn size_bytes(&self) -> usize {
        self.inner.size
    }
}

/// The heap a decoded profile holds: every vector's capacity and string's
/// capacity (a close estimate; allocator overhead is not counted).
fn heap_size(p: &pprof::Profile) -> usize {
    use std::mem::size_of;
    let samples: usize = p
        .sample
        .iter()
        .map(|s| {
            s.location_id.capacity() * size_of::<u64>()
                + s.value.capacity() * size_of::<i64>()
                + s.label.capacity() * size_of::<pprof::Label>()
        })
        .sum();
    let locations: usize = p
        .location
        .iter()
        .map(|l| l.line.capacity() * size_of::<pprof::Line>())
        .sum();
    let strings: usize = p.string_table.iter().map(String::capacity).sum();
    size_of::<pprof::Profile>()
        + p.sample_type.capacity() * size_of::<pprof::ValueType>()
        + p.sample.capacity() * size_of::<pprof::Sample>()
        + samples
        + p.mapping.capacity() * size_of::<pprof::Mapping>()
        + p.location.capacity() * size_of::<pprof::Location>()
        + locations
        + p.function.capacity() * size_of::<pprof::Function>()
        + p.string_table.capacity() * size_of::<String>()
        + strings
        + p.comment.capacity() * size_of::<i64>()
}

/// A profile in flight: series labels, times, value types and the payload.
#[derive(Debug, Clone)]
pub struct Envelope {
    pub labels: Labels,
    /// Start of the profiled interval, unix nanoseconds.
    pub start_unix_nanos: i64,
    /// End of the profiled interval, unix nanoseconds.
    pub end_unix_nanos: i64,
    /// Sample types in payload order.
    pub sample_types: Vec<ValueType>,
    pub period_type: Option<ValueType>,
    pub period: i64,
    pub payload: Payload,
}

impl Envelope {
    pub fn size_bytes(&self) -> usize {
        self.payload.size_bytes()
    }
}

/// Where a batch came from: what exporters and logs may need to know about
/// its sender. Shared by every copy of the batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchMeta {
    /// The receiver's component id (`pprof_push`, `kafka/eu`).
    pub receiver: Arc<str>,
    /// The tenant the sender named (Pyroscope's `X-Scope-OrgID`), if any.
    pub tenant: Option<String>,
    /// The sender's address, for receivers that have one.
    pub client: Option<std::net::SocketAddr>,
}

/// The unit that moves through the pipeline: the profiles of one request (or
/// one Kafka record, one scrape), where they came from, and the share of the
/// acknowledgement that reports what became of them.
#[derive(Debug)]
pub struct Batch {
    pub envelopes: Vec<Envelope>,
    pub meta: Arc<BatchMeta>,
    pub ack: Ack,
}

impl Batch {
    /// A batch nobody awaits the delivery of.
    pub fn new(envelopes: Vec<Envelope>, meta: Arc<BatchMeta>) -> Self {
        Batch {
            envelopes,
            meta,
            ack: Ack::none(),
        }
    }

    /// A batch whose delivery the sender can await.
    pub fn tracked(envelopes: Vec<Envelope>, meta: Arc<BatchMeta>) -> (Self, Delivery) {
        let (ack, delivery) = Ack::new(envelopes.len());
        (
            Batch {
                envelopes,
                meta,
                ack,
            },
            delivery,
        )
    }

    /// Profiles in the batch.
    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// Bytes the batch accounts for in queues.
    pub fn size_bytes(&self) -> usize {
        batch_bytes(&self.envelopes)
    }
}

/// What an exporter is asked to send: the profiles of one or more batches in
/// arrival order, each run with the [`BatchMeta`] of the batch it came from.
#[derive(Debug, Clone, Default)]
pub struct ExportBatch {
    envelopes: Vec<Envelope>,
    /// `(end, meta)`: envelopes before `end` (and after the previous end)
    /// came from the batch described by `meta`.
    sources: Vec<(usize, Arc<BatchMeta>)>,
}

impl ExportBatch {
    pub fn new() -> Self {
        ExportBatch::default()
    }

    /// Appends the profiles of one batch.
    pub fn push(&mut self, envelopes: Vec<Envelope>, meta: Arc<BatchMeta>) {
        if envelopes.is_empty() {
            return;
        }
        if self.envelopes.is_empty() {
            self.envelopes = envelopes;
        } else {
            self.envelopes.extend(envelopes);
        }
        match self.sources.last_mut() {
            // Consecutive batches from the same source stay one run.
            Some((end, m)) if Arc::ptr_eq(m, &meta) || **m == *meta => *end = self.envelopes.len(),
            _ => self.sources.push((self.envelopes.len(), meta)),
        }
    }

    /// Every profile, in order.
    pub fn envelopes(&self) -> &[Envelope] {
        &self.envelopes
    }

    pub fn len(&self) -> usize {
        self.envelopes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.envelopes.is_empty()
    }

    /// Runs of profiles with where they came from (exporters that send per
    /// tenant group by this).
    pub fn sources(&self) -> impl Iterator<Item = (&BatchMeta, &[Envelope])> {
        let mut start = 0;
        self.sources.iter().map(move |(end, meta)| {
            let run = &self.envelopes[start..*end];
            start = *end;
            (meta.as_ref(), run)
        })
    }
}

impl From<Vec<Envelope>> for ExportBatch {
    /// Profiles from one unnamed source (tests, benchmarks, tools).
    fn from(envelopes: Vec<Envelope>) -> Self {
        let mut b = ExportBatch::new();
        b.push(envelopes, Arc::new(BatchMeta::default()));
        b
    }
}

/// Bytes some envelopes account for.
pub fn batch_bytes(batch: &[Envelope]) -> usize {
    batch.iter().map(Envelope::size_bytes).sum()
}

/// Current time in unix nanoseconds.
pub fn now_unix_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_stay_sorted_unique_and_drop_empty() {
        let mut l = Labels::from_pairs([("b", "2"), ("a", "1"), ("b", "3"), ("c", "")]);
        assert_eq!(l.to_selector_string(), r#"{a="1", b="3"}"#);
        l.set("a", "");
        assert_eq!(l.get("a"), None);
        assert_eq!(l.get("b"), Some("3"));
        l.set("__name__", "process_cpu");
        assert_eq!(l.iter().next().map(|l| l.name.as_str()), Some("__name__"));
        assert_eq!(l.without_internal(&[]).get("__name__"), None);
        assert_eq!(
            l.without_internal(&["__name__"]).get("__name__"),
            Some("process_cpu")
        );
    }

    #[test]
    fn label_name_validity() {
        assert!(is_valid_label_name("service_name"));
        assert!(is_valid_label_name("_x9"));
        assert!(!is_valid_label_name("9x"));
        assert!(!is_valid_label_name("a-b"));
        assert!(!is_valid_label_name(""));
    }

    #[test]
    fn payload_from_bytes_never_decodes_until_asked() {
        let mut b = pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds");
        b.sample_root_first(["main", "hot"], vec![5]);
        let gz = pprof::gzip(&pprof::encode(&b.build()));
        let p = Payload::from_bytes(gz.clone(), 1 << 20);
        let clone = p.clone();
        assert!(!p.is_decoded());
        assert_eq!(
            clone.gzipped().as_ptr(),
            gz.as_ptr(),
            "gzip bytes are shared, not copied"
        );
        assert!(!p.is_decoded());
        assert_eq!(p.decoded().unwrap().sample.len(), 1);
        assert!(clone.is_decoded(), "clones share the payload");
        assert_eq!(p.size_bytes(), gz.len());
        let detached = p.detach();
        assert_ne!(detached.gzipped().as_ptr(), gz.as_ptr(), "detach copies");
        assert_eq!(detached.gzipped(), gz);
    }

    #[test]
    fn payload_from_profile_encodes_once() {
        let mut b = pprof::ProfileBuilder::new();
        b.sample_type("samples", "count");
        b.sample_root_first(["a"], vec![1]);
        let p = Payload::from_profile(b.build());
        let gz = p.gzipped();
        assert!(pprof::is_gzip(&gz));
        assert_eq!(pprof::decode(&gz, 1 << 20).unwrap(), *p.decoded().unwrap());
        assert!(
            p.size_bytes() > p.encoded().bytes.len(),
            "the decoded profile is counted too"
        );
        assert!(std::ptr::eq(p.encoded(), p.encoded()), "encoded once");
    }
}
