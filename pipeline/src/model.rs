//! The envelope a profile travels in: series labels, time range, sample types,
//! period and the payload. The payload keeps the bytes that arrived and decodes
//! them only when asked; clones share everything through `Arc`/`Bytes`.

use std::sync::{Arc, OnceLock};

use bytes::Bytes;

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

#[derive(Debug, Default)]
struct PayloadInner {
    encoded: OnceLock<Encoded>,
    gzipped: OnceLock<Bytes>,
    decoded: OnceLock<Result<Arc<pprof::Profile>, DecodeError>>,
}

/// A pprof profile, held as bytes and/or decoded, each form made on first use
/// and cached. Cloning is an `Arc` clone: fan-out copies no payload.
#[derive(Debug, Clone)]
pub struct Payload {
    inner: Arc<PayloadInner>,
    /// Cap on the decompressed size when decoding (set by the receiver).
    decode_limit: usize,
}

impl Payload {
    /// A payload from pprof bytes as they arrived (gzip detected by magic bytes).
    pub fn from_bytes(bytes: Bytes, decode_limit: usize) -> Self {
        let inner = PayloadInner::default();
        let gzipped = pprof::is_gzip(&bytes);
        if gzipped {
            let _ = inner.gzipped.set(bytes.clone());
        }
        let _ = inner.encoded.set(Encoded { bytes, gzipped });
        Payload {
            inner: Arc::new(inner),
            decode_limit,
        }
    }

    /// A payload from a decoded profile (for example converted from folded text
    /// or changed by a processor). Bytes are made when first needed.
    pub fn from_profile(profile: pprof::Profile) -> Self {
        let inner = PayloadInner::default();
        let _ = inner.decoded.set(Ok(Arc::new(profile)));
        Payload {
            inner: Arc::new(inner),
            decode_limit: pprof::DEFAULT_MAX_DECOMPRESSED,
        }
    }

    /// The encoded bytes (encoding the decoded form once, if that is all we have).
    pub fn encoded(&self) -> &Encoded {
        self.inner
            .encoded
            .get_or_init(|| match self.inner.decoded.get() {
                Some(Ok(p)) => Encoded {
                    bytes: pprof::encode(p),
                    gzipped: false,
                },
                // Unreachable by construction: every constructor sets one of the two.
                _ => Encoded {
                    bytes: Bytes::new(),
                    gzipped: false,
                },
            })
    }

    /// Gzipped pprof bytes: the arrived bytes when they were gzipped, else compressed once.
    pub fn gzipped(&self) -> Bytes {
        self.inner
            .gzipped
            .get_or_init(|| pprof::gzip(&self.encoded().bytes))
            .clone()
    }

    /// The decoded profile, decoding once on first use.
    pub fn decoded(&self) -> Result<Arc<pprof::Profile>, DecodeError> {
        self.inner
            .decoded
            .get_or_init(|| pprof::decode(&self.encoded().bytes, self.decode_limit).map(Arc::new))
            .clone()
    }

    /// True when the decoded form has been made (for tests and benchmarks that
    /// check the pass-through path never decodes).
    pub fn is_decoded(&self) -> bool {
        self.inner.decoded.get().is_some()
    }

    /// Bytes this payload accounts for in queues: the encoded size if known,
    /// otherwise an estimate from the decoded form.
    pub fn size_bytes(&self) -> usize {
        if let Some(e) = self.inner.encoded.get() {
            return e.bytes.len();
        }
        match self.inner.decoded.get() {
            Some(Ok(p)) => prost::Message::encoded_len(p.as_ref()),
            _ => 0,
        }
    }
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

/// The unit that moves through the pipeline: the profiles of one request.
pub type Batch = Vec<Envelope>;

/// Bytes a batch accounts for.
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
        assert!(clone.is_decoded(), "clones share the decoded cache");
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
        assert!(p.size_bytes() > 0);
    }
}
