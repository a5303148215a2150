//! The id conventions found in the field, and their normal form.
//!
//! | convention | where | span | trace | name |
//! |---|---|---|---|---|
//! | Pyroscope (otel-profiling-go) | pprof sample labels | `span_id`, 16 hex | `trace_id`, 32 hex (since v0.6) | `span_name` |
//! | Pyroscope, older | pprof sample labels | `profile_id`, 16 hex | | |
//! | Datadog | pprof sample labels | `span id`, decimal; `local root span id`, decimal | | |
//! | OTLP | sample link | link `span_id`, 8 bytes | link `trace_id`, 16 bytes | |
//!
//! The same label keys are read as OTLP sample attributes. Hex is read in
//! either case and written lower-case; shorter hex is zero-padded on the
//! left (64-bit trace ids); an id of all zeros means none.

/// A trace id.
pub type TraceId = [u8; 16];
/// A span id.
pub type SpanId = [u8; 8];

pub const SPAN_ID: &str = "span_id";
pub const SPAN_NAME: &str = "span_name";
pub const TRACE_ID: &str = "trace_id";
pub const PROFILE_ID: &str = "profile_id";
pub const DD_SPAN_ID: &str = "span id";
pub const DD_LOCAL_ROOT_SPAN_ID: &str = "local root span id";

/// What a sample's correlation key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Key {
    SpanId,
    SpanName,
    TraceId,
    ProfileId,
    DdSpanId,
    DdLocalRoot,
}

impl Key {
    pub fn of(name: &str) -> Option<Key> {
        Key::of_bytes(name.as_bytes())
    }

    pub fn of_bytes(name: &[u8]) -> Option<Key> {
        // Every key is 7 to 18 bytes long: most strings end here.
        if !(7..=18).contains(&name.len()) {
            return None;
        }
        Some(match name {
            b"span_id" => Key::SpanId,
            b"span_name" => Key::SpanName,
            b"trace_id" => Key::TraceId,
            b"profile_id" => Key::ProfileId,
            b"span id" => Key::DdSpanId,
            b"local root span id" => Key::DdLocalRoot,
            _ => return None,
        })
    }
}

/// An id read from text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed<T> {
    Id(T),
    /// All zeros: no id.
    Zero,
    /// Not an id of this kind.
    Malformed,
}

/// `N` bytes from 1 to `2 * N` hex digits (either case), left-padded.
pub fn hex_id<const N: usize>(text: &str) -> Parsed<[u8; N]> {
    let digits = text.as_bytes();
    if digits.is_empty() || digits.len() > 2 * N {
        return Parsed::Malformed;
    }
    let mut out = [0u8; N];
    let pad = 2 * N - digits.len();
    for (i, &c) in digits.iter().enumerate() {
        let v = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return Parsed::Malformed,
        };
        let at = pad + i;
        out[at / 2] |= if at.is_multiple_of(2) { v << 4 } else { v };
    }
    if out == [0; N] {
        Parsed::Zero
    } else {
        Parsed::Id(out)
    }
}

/// A span id from its decimal form (Datadog's).
pub fn decimal_span(text: &str) -> Parsed<SpanId> {
    match text.parse::<u64>() {
        Ok(0) => Parsed::Zero,
        Ok(n) => Parsed::Id(n.to_be_bytes()),
        Err(_) => Parsed::Malformed,
    }
}

/// A span id from a numeric label (Datadog's, where written as a number).
pub fn numeric_span(n: i64) -> Parsed<SpanId> {
    if n == 0 {
        Parsed::Zero
    } else {
        Parsed::Id(n.to_be_bytes())
    }
}

/// True for an id written as zeros only (hex or decimal): no id.
pub fn is_zero(text: &str) -> bool {
    !text.is_empty() && text.bytes().all(|b| b == b'0')
}

pub use proflow_model::otlp::hex;

/// True when `text` is `id` in its normal form (lower-case hex, full length).
pub fn is_hex_of(text: &str, id: &[u8]) -> bool {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let t = text.as_bytes();
    t.len() == 2 * id.len()
        && id.iter().enumerate().all(|(i, b)| {
            t[2 * i] == DIGITS[usize::from(b >> 4)] && t[2 * i + 1] == DIGITS[usize::from(b & 15)]
        })
}

/// A map that stays a short vector while it is small (a profile names a
/// few spans: a scan beats hashing) and becomes a hash map when it is not
/// (a hostile profile naming a span per sample stays linear). It hashes
/// with foldhash, seeded per process and per map (foldhash calls itself
/// minimally DoS-resistant: collisions cannot be written into a profile
/// ahead of time without the seed), cheaper than SipHash on these small
/// keys (the `trace_link` bench: 15% less per profile).
#[derive(Debug)]
pub struct SmallMap<K, V> {
    few: Vec<(K, V)>,
    many: std::collections::HashMap<K, V, foldhash::fast::RandomState>,
}

/// Entries a [`SmallMap`] scans before it hashes.
const SMALL: usize = 16;

impl<K: Eq + std::hash::Hash + Clone, V> Default for SmallMap<K, V> {
    fn default() -> Self {
        SmallMap {
            few: Vec::new(),
            many: std::collections::HashMap::default(),
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Keys compared or hashed by [`SmallMap::get`] on this thread: tests
    /// bound the work of a lookup by counting it, not by timing it.
    pub static PROBES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

impl<K: Eq + std::hash::Hash + Clone, V> SmallMap<K, V> {
    pub fn get(&self, k: &K) -> Option<&V> {
        #[cfg(test)]
        PROBES.with(|p| {
            let n = if self.many.is_empty() {
                self.few.len()
            } else {
                1
            };
            p.set(p.get() + n as u64);
        });
        if self.many.is_empty() {
            self.few.iter().find(|(x, _)| x == k).map(|(_, v)| v)
        } else {
            self.many.get(k)
        }
    }

    pub fn insert(&mut self, k: K, v: V) {
        if self.many.is_empty() && self.few.len() < SMALL {
            self.few.push((k, v));
            return;
        }
        if self.many.is_empty() {
            self.many.extend(self.few.drain(..));
        }
        self.many.insert(k, v);
    }
}

/// What one sample says of its span, read from its labels or link.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Found {
    /// From an OTLP link.
    pub link: Option<(TraceId, SpanId)>,
    pub span_id: Option<SpanId>,
    pub profile_id: Option<SpanId>,
    pub dd_span: Option<SpanId>,
    pub dd_root: Option<SpanId>,
    pub trace_id: Option<TraceId>,
    pub span_name: Option<std::sync::Arc<str>>,
    /// An id that is not one.
    pub malformed: bool,
    /// Whether any correlation key was there at all.
    pub any: bool,
    /// How a pprof sample's labels are written (default for OTLP).
    pub shape: Shape,
}

/// How a pprof sample's correlation labels are written, read with them, so
/// that a sample whose labels are already what the `labels` output writes
/// is seen to need no rewrite without walking it again.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Shape {
    /// `span_id` labels (saturating).
    pub span_labels: u8,
    /// Of those, the ones in normal form: full-length lower-case hex, not zero.
    pub normal_span_labels: u8,
    /// A `span_name` label, even an empty one.
    pub name_label: bool,
    /// A label, other than `span_name`, whose value is an all-zero id.
    pub zero_id: bool,
}

impl Shape {
    /// The shape one label gives: `key` with its string value `text`.
    pub fn of(key: Key, text: Option<&str>) -> Shape {
        let mut s = Shape::default();
        match key {
            Key::SpanId => {
                s.span_labels = 1;
                s.normal_span_labels = u8::from(text.is_some_and(is_normal_span));
            }
            Key::SpanName => s.name_label = true,
            _ => {}
        }
        s.zero_id = key != Key::SpanName && text.is_some_and(is_zero);
        s
    }

    fn merge(&mut self, other: &Shape) {
        self.span_labels = self.span_labels.saturating_add(other.span_labels);
        self.normal_span_labels = self
            .normal_span_labels
            .saturating_add(other.normal_span_labels);
        self.name_label |= other.name_label;
        self.zero_id |= other.zero_id;
    }
}

/// True when `text` is a span id in normal form.
fn is_normal_span(text: &str) -> bool {
    text.len() == 16
        && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
        && !is_zero(text)
}

impl Found {
    /// Reads one label or attribute: `text` for string values, `num` for
    /// numeric ones.
    pub fn read(&mut self, key: Key, text: Option<&str>, num: i64) {
        self.any = true;
        fn take<T>(slot: &mut Option<T>, malformed: &mut bool, p: Parsed<T>) {
            match p {
                Parsed::Id(id) => *slot = Some(id),
                Parsed::Zero => {}
                Parsed::Malformed => *malformed = true,
            }
        }
        let m = &mut self.malformed;
        match (key, text) {
            (Key::SpanId, Some(t)) => take(&mut self.span_id, m, hex_id(t)),
            (Key::ProfileId, Some(t)) => take(&mut self.profile_id, m, hex_id(t)),
            (Key::TraceId, Some(t)) => take(&mut self.trace_id, m, hex_id(t)),
            (Key::DdSpanId, Some(t)) => take(&mut self.dd_span, m, decimal_span(t)),
            (Key::DdLocalRoot, Some(t)) => take(&mut self.dd_root, m, decimal_span(t)),
            (Key::DdSpanId, None) => take(&mut self.dd_span, m, numeric_span(num)),
            (Key::DdLocalRoot, None) => take(&mut self.dd_root, m, numeric_span(num)),
            (Key::SpanName, Some(t)) if !t.is_empty() => self.span_name = Some(t.into()),
            (Key::SpanName, _) => {}
            (_, None) => *m = true,
        }
    }

    /// Adds what `other` (read from one label) says.
    pub fn merge(&mut self, other: &Found) {
        fn or<T: Clone>(slot: &mut Option<T>, v: &Option<T>) {
            if v.is_some() {
                slot.clone_from(v);
            }
        }
        or(&mut self.link, &other.link);
        or(&mut self.span_id, &other.span_id);
        or(&mut self.profile_id, &other.profile_id);
        or(&mut self.dd_span, &other.dd_span);
        or(&mut self.dd_root, &other.dd_root);
        or(&mut self.trace_id, &other.trace_id);
        or(&mut self.span_name, &other.span_name);
        self.malformed |= other.malformed;
        self.any |= other.any;
        self.shape.merge(&other.shape);
    }

    /// The span this sample is linked to: the link's, else the labels' in
    /// order of precedence (`span_id`, `profile_id`, Datadog's); with
    /// `root_only`, Datadog's local root first.
    pub fn span(&self, root_only: bool) -> Option<SpanId> {
        if let Some((_, s)) = self.link {
            return Some(s);
        }
        let labelled = self.span_id.or(self.profile_id);
        if root_only {
            self.dd_root.or(labelled).or(self.dd_span)
        } else {
            labelled.or(self.dd_span).or(self.dd_root)
        }
    }

    /// The trace id the sample names itself.
    pub fn trace(&self) -> Option<TraceId> {
        self.link.map(|(t, _)| t).or(self.trace_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_ids_are_read_in_any_case_padded_and_checked() {
        assert_eq!(
            hex_id::<8>("00F067aa0ba902b7"),
            Parsed::Id([0, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7])
        );
        assert_eq!(hex_id::<8>("1"), Parsed::Id([0, 0, 0, 0, 0, 0, 0, 1]));
        assert_eq!(
            hex_id::<8>("abc"),
            Parsed::Id([0, 0, 0, 0, 0, 0, 0x0a, 0xbc])
        );
        assert_eq!(hex_id::<8>("0000000000000000"), Parsed::Zero);
        assert_eq!(hex_id::<8>("00000000000000000"), Parsed::Malformed);
        assert_eq!(hex_id::<8>(""), Parsed::Malformed);
        assert_eq!(hex_id::<8>("xyz"), Parsed::Malformed);
        assert_eq!(hex_id::<8>("-1"), Parsed::Malformed);
        let t = hex_id::<16>("4bf92f3577b34da6a3ce929d0e0e4736");
        assert!(matches!(t, Parsed::Id(id) if hex(&id) == "4bf92f3577b34da6a3ce929d0e0e4736"));
        // A 64-bit trace id becomes the low half.
        assert!(
            matches!(hex_id::<16>("a3ce929d0e0e4736"), Parsed::Id(id) if hex(&id) == "0000000000000000a3ce929d0e0e4736")
        );
    }

    #[test]
    fn decimal_span_ids_are_datadogs() {
        assert_eq!(
            decimal_span("1311768467463790320"),
            Parsed::Id(0x1234_5678_9abc_def0u64.to_be_bytes())
        );
        assert_eq!(decimal_span("18446744073709551615"), Parsed::Id([0xff; 8]));
        assert_eq!(decimal_span("0"), Parsed::Zero);
        assert_eq!(decimal_span("18446744073709551616"), Parsed::Malformed);
        assert_eq!(decimal_span("12ab"), Parsed::Malformed);
        assert_eq!(numeric_span(-1), Parsed::Id([0xff; 8]));
    }

    #[test]
    fn precedence_of_spans() {
        let mut f = Found::default();
        f.read(Key::DdSpanId, Some("2"), 0);
        f.read(Key::DdLocalRoot, Some("1"), 0);
        assert_eq!(f.span(false), Some(2u64.to_be_bytes()));
        assert_eq!(f.span(true), Some(1u64.to_be_bytes()));
        f.read(Key::ProfileId, Some("03"), 0);
        assert_eq!(f.span(false), Some(3u64.to_be_bytes()));
        f.read(Key::SpanId, Some("04"), 0);
        assert_eq!(f.span(false), Some(4u64.to_be_bytes()));
        f.link = Some(([9; 16], [5; 8]));
        assert_eq!(f.span(true), Some([5; 8]));
        assert_eq!(f.trace(), Some([9; 16]));
        assert!(!f.malformed);
        f.read(Key::TraceId, Some("not hex"), 0);
        assert!(f.malformed);
    }
}
