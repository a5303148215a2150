//! The span index: span id → (trace id, name, service, start, end) for the
//! spans a `traces` pipeline fed the processor, bounded in time (`window`)
//! and in count (`max_spans`), with the oldest let go first.
//!
//! Spans are kept in generations: a few hash maps, each taking spans for a
//! slice of the window until it is full or its slice is over, then the
//! next. The oldest generation is let go whole once it is past the window
//! or the index is at `max_spans`, so eviction costs nothing per span and
//! memory stays flat once the index is full. A generation takes as many
//! spans as fill a power-of-two table to the load the hash table grows at,
//! so a full generation spends about 56 bytes a span plus the names
//! (interned per generation, at most [`NAMES_PER_GENERATION`] of them and
//! [`NAME_BYTES_PER_GENERATION`] bytes). Maps grow as spans come, so a
//! quiet index holds little.
//!
//! Lookups go newest generation first. A lock guards it all; inserts and
//! lookups take it once per request or per batch.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::telemetry::TraceLinkTelemetry;
use proflow_model::spans::{Span, SpanConsumer};
use tokio::sync::Notify;

use super::ids::{SpanId, TraceId};

/// The fewest generations an index has (a window slice each).
const GENERATIONS: usize = 8;
/// The most distinct (service, name) pairs a generation interns; spans
/// beyond it keep their ids but not their names (so a service that puts
/// ids in span names cannot grow the index past its bound).
pub const NAMES_PER_GENERATION: usize = 4096;
/// The most bytes of interned names a generation holds.
pub const NAME_BYTES_PER_GENERATION: usize = 1 << 20;
/// No name interned.
const NO_NAME: u32 = u32::MAX;

/// What the index knows of a span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    pub trace_id: TraceId,
    pub name: Option<Arc<str>>,
    pub service: Option<Arc<str>>,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    trace_id: TraceId,
    start: u64,
    end: u64,
    name: u32,
}

/// Span ids are the senders': random when well made, chosen by whoever
/// sends them otherwise. foldhash, seeded at random per process and per
/// map, so ids cannot be chosen to collide (the unseeded multiply this had
/// put every id whose `id ^ id >> 32` ends in the same bits in one bucket,
/// and a service sending such ids stalled every insert and lookup under the
/// index's lock). The `quality` variant: `fast` hashes a u64 with one
/// multiply by a per-process seed, and with some seeds ids that differ only
/// in their high bits still share a bucket by the handful.
type IdMap = HashMap<u64, Entry, foldhash::quality::RandomState>;

struct Generation {
    spans: IdMap,
    /// (service, name) by interned number.
    names: Vec<(Arc<str>, Arc<str>)>,
    /// `service \0 name` → its number.
    name_ids: HashMap<Box<str>, u32>,
    name_bytes: usize,
    opened: Instant,
}

impl Generation {
    fn new(now: Instant) -> Self {
        Generation {
            spans: IdMap::default(),
            names: Vec::new(),
            name_ids: HashMap::new(),
            name_bytes: 0,
            opened: now,
        }
    }

    fn bytes(&self) -> usize {
        // A hash table slot is its entry and one control byte.
        let slot = std::mem::size_of::<(u64, Entry)>() + 1;
        let buckets = (self.spans.capacity() * 8).div_ceil(7);
        buckets * slot
            + self.names.capacity() * std::mem::size_of::<(Arc<str>, Arc<str>)>()
            + self.name_ids.capacity() * (std::mem::size_of::<(Box<str>, u32)>() + 1)
            + self.name_bytes
    }

    fn intern(&mut self, service: &Arc<str>, name: &str, scratch: &mut String) -> u32 {
        scratch.clear();
        scratch.push_str(service);
        scratch.push('\u{0}');
        scratch.push_str(name);
        if let Some(&i) = self.name_ids.get(scratch.as_str()) {
            return i;
        }
        if self.names.len() >= NAMES_PER_GENERATION
            || self.name_bytes + 2 * scratch.len() > NAME_BYTES_PER_GENERATION
        {
            return NO_NAME;
        }
        let i = self.names.len() as u32;
        self.name_bytes += 2 * scratch.len() + 4 * std::mem::size_of::<usize>();
        self.names.push((service.clone(), Arc::from(name)));
        self.name_ids.insert(Box::from(scratch.as_str()), i);
        i
    }
}

struct Inner {
    generations: std::collections::VecDeque<Generation>,
    /// Spans held, over every generation.
    len: usize,
    /// The last service seen, so a request of one service interns it once.
    last_service: Option<Arc<str>>,
    scratch: String,
}

/// The index; shared by the processor and the receivers that feed it.
pub struct SpanIndex {
    inner: Mutex<Inner>,
    /// Spans a generation takes.
    per_generation: usize,
    /// Generations kept (`max_spans` over `per_generation`, rounded down).
    max_generations: usize,
    /// How long a generation takes spans.
    slice: Duration,
    window: Duration,
    /// Woken on every insert, for batches waiting for spans.
    pub arrived: Notify,
    telemetry: Option<TraceLinkTelemetry>,
}

impl SpanIndex {
    pub fn new(window: Duration, max_spans: usize, telemetry: Option<TraceLinkTelemetry>) -> Self {
        // A generation's size fills a power-of-two table to 7/8, the load
        // the table grows at; at least GENERATIONS of them.
        let target = max_spans.div_ceil(GENERATIONS).max(1);
        let mut per_generation = target.min(7);
        while per_generation * 2 <= target {
            per_generation *= 2;
        }
        // Never more than max_spans: up to a generation fewer.
        let max_generations = (max_spans / per_generation).max(1);
        SpanIndex {
            inner: Mutex::new(Inner {
                generations: Default::default(),
                len: 0,
                last_service: None,
                scratch: String::new(),
            }),
            per_generation,
            max_generations,
            slice: window / GENERATIONS as u32,
            window,
            arrived: Notify::new(),
            telemetry,
        }
    }

    /// Drops generations past the window, and the oldest while over
    /// `max_generations`; returns (by window, by count) spans let go.
    fn evict(&self, inner: &mut Inner, now: Instant) -> (u64, u64) {
        let (mut by_window, mut by_count) = (0, 0);
        while inner.generations.len() > self.max_generations {
            if let Some(g) = inner.generations.pop_front() {
                inner.len -= g.spans.len();
                by_count += g.spans.len() as u64;
            }
        }
        // A generation is past the window when the newest span it could
        // hold (taken up to one slice after it opened) is.
        while let Some(g) = inner.generations.front() {
            if now.duration_since(g.opened) <= self.window + self.slice {
                break;
            }
            let n = g.spans.len();
            inner.generations.pop_front();
            inner.len -= n;
            by_window += n as u64;
        }
        (by_window, by_count)
    }

    /// Adds spans (a span seen again is updated in its newest generation).
    pub fn insert(&self, spans: &[Span]) {
        self.insert_at(spans, Instant::now());
    }

    fn insert_at(&self, spans: &[Span], now: Instant) {
        if spans.is_empty() {
            return;
        }
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let inner = &mut *inner;
        let mut evicted = self.evict(inner, now);
        for s in spans {
            let rotate = match inner.generations.back() {
                None => true,
                Some(g) => {
                    g.spans.len() >= self.per_generation
                        || now.duration_since(g.opened) >= self.slice
                }
            };
            if rotate {
                inner.generations.push_back(Generation::new(now));
                let (w, c) = self.evict(inner, now);
                evicted.0 += w;
                evicted.1 += c;
            }
            let service = match &inner.last_service {
                Some(last) if Arc::ptr_eq(last, &s.service) || **last == *s.service => last.clone(),
                _ => {
                    inner.last_service = Some(s.service.clone());
                    s.service.clone()
                }
            };
            let Some(g) = inner.generations.back_mut() else {
                return;
            };
            let name = g.intern(&service, &s.name, &mut inner.scratch);
            let entry = Entry {
                trace_id: s.trace_id,
                start: s.start_unix_nanos,
                end: s.end_unix_nanos,
                name,
            };
            if g.spans
                .insert(u64::from_be_bytes(s.span_id), entry)
                .is_none()
            {
                inner.len += 1;
            }
        }
        if let Some(t) = &self.telemetry {
            t.indexed(spans.len() as u64, evicted.0, evicted.1);
            t.index(
                inner.len,
                inner.generations.iter().map(Generation::bytes).sum(),
            );
        }
        self.arrived.notify_waiters();
    }

    /// Looks up every span of `ids`, under one lock: `f(i, known)` for each
    /// one found.
    pub fn lookup_all(&self, ids: &[SpanId], mut f: impl FnMut(usize, Known)) {
        let Ok(inner) = self.inner.lock() else {
            return;
        };
        let now = Instant::now();
        for (i, id) in ids.iter().enumerate() {
            let key = u64::from_be_bytes(*id);
            for g in inner.generations.iter().rev() {
                if now.duration_since(g.opened) > self.window + self.slice {
                    break;
                }
                if let Some(e) = g.spans.get(&key) {
                    let (service, name) = match g.names.get(e.name as usize) {
                        Some((s, n)) => (Some(s.clone()), Some(n.clone())),
                        None => (None, None),
                    };
                    f(
                        i,
                        Known {
                            trace_id: e.trace_id,
                            name,
                            service,
                            start_unix_nanos: e.start,
                            end_unix_nanos: e.end,
                        },
                    );
                    break;
                }
            }
        }
    }

    /// True when every one of `ids` is indexed.
    pub fn has_all(&self, ids: &[SpanId]) -> bool {
        let Ok(inner) = self.inner.lock() else {
            return false;
        };
        let now = Instant::now();
        ids.iter().all(|id| {
            let key = u64::from_be_bytes(*id);
            inner
                .generations
                .iter()
                .rev()
                .take_while(|g| now.duration_since(g.opened) <= self.window + self.slice)
                .any(|g| g.spans.contains_key(&key))
        })
    }

    /// Spans held and the memory they take.
    pub fn size(&self) -> (usize, usize) {
        match self.inner.lock() {
            Ok(inner) => (
                inner.len,
                inner.generations.iter().map(Generation::bytes).sum(),
            ),
            Err(_) => (0, 0),
        }
    }
}

impl SpanConsumer for SpanIndex {
    fn consume_spans(&self, spans: &[Span]) {
        self.insert(spans);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn span(n: u64, name: &str) -> Span {
        let mut trace_id = [0u8; 16];
        trace_id[8..].copy_from_slice(&(n ^ 0xfeed).to_be_bytes());
        trace_id[0] = 1;
        Span {
            trace_id,
            span_id: n.to_be_bytes(),
            parent_span_id: [0; 8],
            name: name.to_owned(),
            service: Arc::from("svc"),
            start_unix_nanos: n,
            end_unix_nanos: n + 1,
        }
    }

    #[test]
    fn finds_what_it_took_with_name_and_service() {
        let index = SpanIndex::new(Duration::from_secs(60), 1000, None);
        index.insert(&[span(1, "GET /a"), span(2, "GET /b")]);
        let mut found = Vec::new();
        index.lookup_all(
            &[2u64.to_be_bytes(), 3u64.to_be_bytes(), 1u64.to_be_bytes()],
            |i, k| found.push((i, k)),
        );
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].0, 0);
        assert_eq!(found[0].1.trace_id, span(2, "").trace_id);
        assert_eq!(found[0].1.name.as_deref(), Some("GET /b"));
        assert_eq!(found[0].1.service.as_deref(), Some("svc"));
        assert_eq!(found[1].0, 2);
        assert!(index.has_all(&[1u64.to_be_bytes()]));
        assert!(!index.has_all(&[1u64.to_be_bytes(), 9u64.to_be_bytes()]));
    }

    #[test]
    fn more_spans_than_max_evicts_the_oldest_and_memory_stays_flat() {
        let max = 10_000;
        let index = SpanIndex::new(Duration::from_secs(3600), max, None);
        let mut sizes = Vec::new();
        for round in 0..10u64 {
            let spans: Vec<Span> = (0..max as u64)
                .map(|i| span(round * max as u64 + i + 1, "op"))
                .collect();
            index.insert(&spans);
            let (len, bytes) = index.size();
            assert!(len <= max, "{len} spans held, more than max_spans {max}");
            sizes.push(bytes);
        }
        // Flat once full: the last rounds take the same memory.
        assert_eq!(sizes[3], sizes[9], "{sizes:?}");
        let (len, bytes) = index.size();
        assert!(len > max * 3 / 4, "{len}");
        assert!(bytes / len < 100, "{} bytes a span", bytes / len);
        // The newest are there, the oldest are gone.
        assert!(index.has_all(&[(10 * max as u64).to_be_bytes()]));
        assert!(!index.has_all(&[1u64.to_be_bytes()]));
    }

    #[test]
    fn spans_past_the_window_are_let_go() {
        let index = SpanIndex::new(Duration::from_secs(80), 1000, None);
        let t0 = Instant::now();
        index.insert_at(&[span(1, "old")], t0);
        index.insert_at(&[span(2, "new")], t0 + Duration::from_secs(85));
        assert!(index.has_all(&[2u64.to_be_bytes()]));
        // Slice 10s: the first generation holds spans until 10s, kept until 90s.
        assert!(index.has_all(&[1u64.to_be_bytes()]));
        index.insert_at(&[span(3, "newer")], t0 + Duration::from_secs(95));
        assert_eq!(index.size().0, 2);
    }

    /// Ids that all fell in one bucket under the unseeded multiply the
    /// index hashed with (`(id ^ id >> 32) * K`: the low bits of a product
    /// are those of the low bits multiplied) spread over the buckets now,
    /// and two maps hash one id differently (each is seeded on its own).
    #[test]
    fn ids_built_to_collide_spread_and_each_map_has_its_own_seed() {
        use std::hash::BuildHasher;
        let ids: Vec<u64> = (1..=4096u64).map(|x| (x << 32) | x).collect();
        let old = |id: u64| (id ^ (id >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mask = 0xffff;
        let old_buckets: std::collections::HashSet<u64> =
            ids.iter().map(|&id| old(id) & mask).collect();
        assert_eq!(
            old_buckets.len(),
            1,
            "the old hash put them all in one bucket"
        );
        let (a, b) = (IdMap::default(), IdMap::default());
        let buckets: std::collections::HashSet<u64> = ids
            .iter()
            .map(|&id| a.hasher().hash_one(id) & mask)
            .collect();
        // 4096 keys over 65536 buckets: about 3970 distinct if spread.
        assert!(buckets.len() > 3500, "{} buckets", buckets.len());
        assert!(
            ids.iter()
                .any(|&id| a.hasher().hash_one(id) != b.hasher().hash_one(id)),
            "two maps, two seeds"
        );
        let index = SpanIndex::new(Duration::from_secs(60), 100_000, None);
        let spans: Vec<Span> = ids.iter().map(|&id| span(id, "op")).collect();
        index.insert(&spans);
        let all: Vec<SpanId> = ids.iter().map(|id| id.to_be_bytes()).collect();
        assert!(index.has_all(&all));
        assert_eq!(index.size().0, ids.len());
    }

    #[test]
    fn names_are_bounded_per_generation() {
        let index = SpanIndex::new(Duration::from_secs(60), 100_000, None);
        let spans: Vec<Span> = (1..=(NAMES_PER_GENERATION as u64 + 10))
            .map(|i| span(i, &format!("op {i}")))
            .collect();
        index.insert(&spans);
        let mut named = 0;
        let ids: Vec<SpanId> = spans.iter().map(|s| s.span_id).collect();
        index.lookup_all(&ids, |_, k| named += usize::from(k.name.is_some()));
        assert_eq!(named, NAMES_PER_GENERATION);
        assert!(index.has_all(&ids));
    }
}
