//! The `aggregate` processor: the profiles of one series are merged over a
//! window and go on as one profile, so a fleet's pushes (2,000 pods every
//! 10 s) reach the backend as one write per series per window. Values of
//! equal stacks are summed, as the backend sums them when it reads the
//! window, so every total read back is the same.
//!
//! A series is its labels (tenant included), with its sample and period
//! types. Its window opens with its first profile and closes `window`
//! later; the pipeline then passes the merged profile through the
//! processors listed after this one and into the exporter queues. What the
//! open windows hold is charged to `service.limits.max_in_flight_bytes`,
//! under the tenant's share; past half the budget, or past `max_series`,
//! a profile goes on unmerged at once.

mod config;
pub mod telemetry;

pub use config::{AggregateProcessorConfig, MAX_WINDOW, MIN_WINDOW};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration as StdDuration, Instant};

use async_trait::async_trait;
use proflow_core::component::Processor;
use proflow_model::memory::{MemoryBudget, MemoryGrant};
use proflow_model::model::{BatchMeta, Envelope, Format, Labels, Payload, ValueType, batch_bytes};
use proflow_model::otlp::Lost;
use proflow_model::pprof::{MAX_DECODED_BYTES_PER_BYTE, Merger, Profile, ProfileParts};

use telemetry::AggregateTelemetry;

/// What tells one series' window from another's: the tenant the profiles
/// are written under, where they came from as far as later processors
/// care, the labels, and the value types.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    tenant: Option<String>,
    tenant_bound: bool,
    this_host: bool,
    labels: Labels,
    sample_types: Vec<ValueType>,
    period_type: Option<ValueType>,
}

/// One series' open window.
struct Window {
    opened: Instant,
    merger: Merger,
    start_unix_nanos: i64,
    end_unix_nanos: i64,
    period: i64,
    meta: Arc<BatchMeta>,
    /// What the merger holds, charged to the in-flight budget.
    grant: MemoryGrant,
}

/// The running `aggregate` processor.
pub struct AggregateProcessor(Arc<Windows>);

/// What a batch's profiles may account for and still be merged on the
/// async worker (a typical push takes tens of microseconds); a larger batch
/// is merged on the blocking pool, so no request stalls the others.
const MERGE_INLINE_MAX: usize = 64 << 10;

/// What became of one profile given to the windows.
enum Absorbed {
    /// Merged into its series' window.
    Merged,
    /// Given back to go on unmerged, with why (the `result` it is counted
    /// under).
    Passed(Envelope, &'static str),
}

/// The open windows and what bounds them.
struct Windows {
    window: StdDuration,
    max_series: usize,
    memory: MemoryBudget,
    open: Mutex<HashMap<SeriesKey, Window>>,
    telemetry: AggregateTelemetry,
}

impl AggregateProcessor {
    /// Series with an open window.
    pub fn open_series(&self) -> usize {
        self.0.lock().len()
    }
}

impl Windows {
    /// Merges each profile of a batch, returning those that go on unmerged.
    fn absorb_all(&self, batch: Vec<Envelope>, meta: &Arc<BatchMeta>) -> Vec<Envelope> {
        let now = Instant::now();
        let mut merged = 0;
        let unmerged: Vec<Envelope> = batch
            .into_iter()
            .filter_map(|e| match self.absorb(e, meta, now) {
                Absorbed::Merged => {
                    merged += 1;
                    None
                }
                Absorbed::Passed(e, why) => {
                    self.telemetry.profiles(why, 1);
                    Some(e)
                }
            })
            .collect();
        self.telemetry.profiles("merged", merged);
        self.telemetry.open_series(self.lock().len());
        unmerged
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<SeriesKey, Window>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Merges `e` into its series' window, or gives it back to go on
    /// unmerged.
    fn absorb(&self, e: Envelope, meta: &Arc<BatchMeta>, now: Instant) -> Absorbed {
        // Read off its plain bytes where it has them (no decoding); an OTLP
        // profile is converted first.
        let read = match Source::of(&e.payload) {
            Some(source) => source,
            None => return Absorbed::Passed(e, "unreadable"),
        };
        let tenant = meta.tenant_written(&e.labels).map(str::to_owned);
        // What reading it takes is granted first: its tables hold at most
        // what prost's decoding would, per byte of the profile.
        let mut reading = self.memory.grant_for(tenant.as_deref());
        if reading.try_grow(read.reading_bound()).is_err() {
            return Absorbed::Passed(e, "no_room");
        }
        let Ok(parts) = read.parts() else {
            return Absorbed::Passed(e, "unreadable");
        };
        let key = SeriesKey {
            tenant,
            tenant_bound: meta.tenant_bound,
            this_host: meta.this_host,
            labels: e.labels.clone(),
            sample_types: e.sample_types.clone(),
            period_type: e.period_type.clone(),
        };
        let bound = Merger::bound(&parts);
        let mut open = self.lock();
        if let Some(w) = open.get_mut(&key) {
            if !w.merger.fits(&parts) {
                return Absorbed::Passed(e, "other_types");
            }
            if !self.room(&mut w.grant, bound) {
                return Absorbed::Passed(e, "no_room");
            }
            match w.merger.add(&parts) {
                Ok(grew) => w.grant.shrink(bound.saturating_sub(grew)),
                // Cannot happen: reading the profile checked every sample.
                // Were it to, what was merged of it is not sent twice.
                Err(_) => return Absorbed::Merged,
            }
            w.start_unix_nanos = w.start_unix_nanos.min(e.start_unix_nanos);
            w.end_unix_nanos = w.end_unix_nanos.max(e.end_unix_nanos);
            return Absorbed::Merged;
        }
        if open.len() >= self.max_series {
            return Absorbed::Passed(e, "max_series");
        }
        let mut grant = self.memory.grant_for(key.tenant.as_deref());
        if !self.room(&mut grant, bound) {
            return Absorbed::Passed(e, "no_room");
        }
        let Ok(merger) = Merger::new(&parts) else {
            return Absorbed::Passed(e, "unreadable");
        };
        grant.shrink(bound.saturating_sub(merger.held_bytes()));
        open.insert(
            key,
            Window {
                opened: now,
                merger,
                start_unix_nanos: e.start_unix_nanos,
                end_unix_nanos: e.end_unix_nanos,
                period: e.period,
                meta: meta.clone(),
                grant,
            },
        );
        Absorbed::Merged
    }

    /// Grows `grant` by `bytes` if the open windows would then hold at
    /// most half the in-flight budget (the other half stays for requests
    /// in flight) and the tenant's share allows it.
    fn room(&self, grant: &mut MemoryGrant, bytes: usize) -> bool {
        let half = self.memory.limit() / 2;
        self.memory.in_flight().saturating_add(bytes) <= half && grant.try_grow(bytes).is_ok()
    }
}

/// What a profile is merged from: its plain pprof bytes, or (for an OTLP
/// profile) its pprof form decoded.
enum Source {
    Plain(bytes::Bytes),
    Decoded(Arc<Profile>),
}

impl Source {
    fn of(payload: &Payload) -> Option<Source> {
        if payload.has(Format::Pprof) {
            return payload.plain().ok().map(Source::Plain);
        }
        let mut lost = Lost::default();
        let pprof = payload.with_form(Format::Pprof, &mut lost).ok()?;
        pprof.decoded().ok().map(Source::Decoded)
    }

    /// The most reading [`Source::parts`] holds: for plain bytes, what
    /// decoding them could (`MAX_DECODED_BYTES_PER_BYTE` a byte); a decoded
    /// profile's parts copy only its lines and strings' places.
    fn reading_bound(&self) -> usize {
        match self {
            Source::Plain(b) => b.len().saturating_mul(MAX_DECODED_BYTES_PER_BYTE),
            Source::Decoded(p) => {
                let lines: usize = p.location.iter().map(|l| l.line.len()).sum();
                (lines + p.string_table.len() + p.location.len()) * 64
            }
        }
    }

    fn parts(&self) -> Result<ProfileParts<'_>, proflow_model::pprof::DecodeError> {
        match self {
            Source::Plain(b) => ProfileParts::read(b),
            Source::Decoded(p) => Ok(ProfileParts::of(p)),
        }
    }
}

#[async_trait]
impl Processor for AggregateProcessor {
    async fn process(&self, batch: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope> {
        let meta = Arc::new(meta.clone());
        if batch_bytes(&batch) <= MERGE_INLINE_MAX {
            return self.0.absorb_all(batch, &meta);
        }
        let windows = self.0.clone();
        match tokio::task::spawn_blocking(move || windows.absorb_all(batch, &meta)).await {
            Ok(unmerged) => unmerged,
            Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
            // Cancelled only when the runtime stops: nothing goes on.
            Err(_) => Vec::new(),
        }
    }

    fn holds(&self) -> Option<StdDuration> {
        // Windows close at most a tenth of a window (and at most a second)
        // late.
        Some((self.0.window / 10).clamp(StdDuration::from_millis(100), StdDuration::from_secs(1)))
    }

    fn release(&self, all: bool) -> Vec<(Vec<Envelope>, Arc<BatchMeta>)> {
        let now = Instant::now();
        let due: Vec<(SeriesKey, Window)> = {
            let mut open = self.0.lock();
            let keys: Vec<SeriesKey> = open
                .iter()
                .filter(|(_, w)| all || now.duration_since(w.opened) >= self.0.window)
                .map(|(k, _)| k.clone())
                .collect();
            let due: Vec<(SeriesKey, Window)> = keys
                .into_iter()
                .filter_map(|k| open.remove_entry(&k))
                .collect();
            self.0.telemetry.open_series(open.len());
            due
        };
        self.0
            .telemetry
            .closed(if all { "stop" } else { "window" }, due.len() as u64);
        // One batch per sender meta: a window's profiles go on with the
        // meta of the profile that opened it.
        let mut out: Vec<(Vec<Envelope>, Arc<BatchMeta>)> = Vec::new();
        for (key, w) in due {
            let envelope = Envelope {
                labels: key.labels,
                start_unix_nanos: w.start_unix_nanos,
                end_unix_nanos: w.end_unix_nanos,
                sample_types: key.sample_types,
                period_type: key.period_type,
                period: w.period,
                payload: Payload::from_profile(w.merger.finish()),
            };
            // What the merged profile holds is the queue's to count now.
            drop(w.grant);
            match out.iter_mut().find(|(_, m)| **m == *w.meta) {
                Some((envelopes, _)) => envelopes.push(envelope),
                None => out.push((vec![envelope], w.meta)),
            }
        }
        out
    }
}

impl std::fmt::Debug for AggregateProcessor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggregateProcessor")
            .field("window", &self.0.window)
            .field("max_series", &self.0.max_series)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
