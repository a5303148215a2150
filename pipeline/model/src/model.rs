//! The envelope a profile travels in: series labels, time range, sample types,
//! period and the payload (`model/payload.rs`: the form the profile arrived in,
//! decoded and converted only when asked), and the batches envelopes go
//! through the pipeline in.

use std::sync::Arc;

mod payload;
pub use payload::{ConvertCache, Encoded, Format, Payload, PayloadError};

use crate::delivery::{Ack, Delivery};
use crate::pprof::{self};

/// The label holding the profile type (`process_cpu`, `memory`, ...).
pub const NAME_LABEL: &str = "__name__";
/// The label that names a profile's tenant, as Loki's and Alloy's users set
/// it in relabelling: it wins over the tenant a sender named
/// (`X-Scope-OrgID`), never over one a bearer token is bound to (see
/// [`BatchMeta::tenant_of`]). Receivers drop it from what senders send.
pub const TENANT_LABEL: &str = "__tenant_id__";

/// The tenant of a request that names none (Pyroscope's); defined beside
/// the memory budget, which holds each tenant to its share.
pub use crate::memory::ANONYMOUS_TENANT;
/// The label holding the service name.
pub const SERVICE_NAME_LABEL: &str = "service_name";
/// `service_name` of profiles whose sender names no service (Pyroscope's
/// fallback).
pub const UNKNOWN_SERVICE: &str = "unknown_service";

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

/// Here rather than beside [`pprof::Metadata`], so that the codec knows
/// nothing of the envelope.
impl pprof::Metadata {
    /// The envelope's value types, moving the strings out of the scan.
    pub fn take_value_types(&mut self) -> (Vec<ValueType>, Option<ValueType>) {
        (
            std::mem::take(&mut self.sample_types)
                .into_iter()
                .map(|(t, u)| ValueType::new(t, u))
                .collect(),
            self.period_type.take().map(|(t, u)| ValueType::new(t, u)),
        )
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

/// Where a batch came from: what exporters and logs may need to know about
/// its sender. Shared by every copy of the batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BatchMeta {
    /// The receiver's component id (`pprof_push`, `kafka/eu`).
    pub receiver: Arc<str>,
    /// The tenant the sender named (Pyroscope's `X-Scope-OrgID`), if any.
    pub tenant: Option<String>,
    /// The tenant is the one the sender's bearer token is bound to: no
    /// label may change it (the pipeline drops [`TENANT_LABEL`] from such a
    /// batch's profiles before any exporter sees them). Not kept in
    /// persistent queues: they hold what the pipeline made of it.
    pub tenant_bound: bool,
    /// The sender's address, for receivers that have one.
    pub client: Option<std::net::SocketAddr>,
    /// True only for profiles proflow made on this host (the `ebpf`
    /// receiver's): their mappings name this host's files and their kernel
    /// frames this host's kernel, so processors may read those (the
    /// `symbolize` processor's `local` and `kernel` sources). False for
    /// everything that came from elsewhere (pushed, from Kafka, scraped),
    /// whose paths and addresses a sender chose.
    pub this_host: bool,
}

impl BatchMeta {
    /// The tenant of a profile of this batch with `labels`: its
    /// [`TENANT_LABEL`] when set, else the batch's (empty is none).
    pub fn tenant_of<'a>(&'a self, labels: &'a Labels) -> Option<&'a str> {
        labels
            .get(TENANT_LABEL)
            .filter(|t| !t.is_empty())
            .or(self.tenant.as_deref().filter(|t| !t.is_empty()))
    }

    /// The tenant a profile of this batch with `labels` is written under:
    /// [`BatchMeta::tenant_of`], unless the tenant is bound to the sender's
    /// token ([`BatchMeta::tenant_bound`]), which no label changes.
    pub fn tenant_written<'a>(&'a self, labels: &'a Labels) -> Option<&'a str> {
        if self.tenant_bound {
            self.tenant.as_deref().filter(|t| !t.is_empty())
        } else {
            self.tenant_of(labels)
        }
    }
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
mod tests;
