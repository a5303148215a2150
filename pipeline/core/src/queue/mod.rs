//! Exporter queues: bounded in profiles and bytes, `when_full: drop_newest |
//! block`, drained by `num_consumers` tasks that gather batches on dequeue
//! (`batch`: up to `max_profiles` / `max_bytes`, waiting up to `flush_timeout`
//! for more) and export them with exponential-backoff retry. One queue per
//! exporter, so a slow exporter never delays the others' sends.
//!
//! Every queued batch carries its share of the acknowledgement
//! ([`Ack`]); the consumer resolves it with the export's outcome, per profile
//! when the exporter reports a partial failure.
//!
//! With `storage` ([`storage`]) the queue is persistent: each admitted batch
//! is written to disk as one record and its share resolves as
//! [`Outcome::Stored`] once the record is durable; the queue then bounds the
//! records on disk (`storage.max_size`) instead of memory, keeps a batch's
//! decoded form in memory only while `queue_size` and `max_bytes` allow (the
//! rest is read back from disk when sent), and acknowledges the record on disk
//! once its export ended. Records left when the collector stopped are sent
//! first after the next start.
//!
//! Here: the queue's state and admission (reserve, push, waiting for room);
//! `consumers.rs`: gathering and sending; `retry.rs`: backoff; [`storage`]:
//! the disk half. The settings are `proflow_config`'s ([`QueueSettings`]).

mod consumers;
mod retry;
mod shares;
pub mod storage;

pub use proflow_config::{BatchSettings, QueueSettings, RetrySettings, WhenFull, queue_problems};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::component::{ErrorClass, ExportError, Exporter};
use crate::telemetry::ExporterTelemetry;
use proflow_model::delivery::{Ack, Outcome};
use proflow_model::model::{BatchMeta, Envelope, ExportBatch};
use storage::{Durable, RecordId, Store};

#[derive(Debug, Default)]
struct State {
    items: VecDeque<Item>,
    /// Profiles admitted and not yet finished (waiting, reserved or being sent).
    profiles: usize,
    /// Reservations taken and not yet pushed or released: consumers must not
    /// end while one is outstanding, or a batch the sender was told was
    /// accepted could land in a queue nobody drains.
    reservations: usize,
    /// Bytes admitted and not yet finished.
    bytes: usize,
    /// Profiles admitted and not yet finished that have a record on disk.
    stored: usize,
    /// Profiles and bytes of the waiting items of a persistent queue whose
    /// batch is kept in memory (bounded by `queue_size` / `max_bytes`).
    resident: (usize, usize),
    closed: bool,
    /// Profiles dropped since the queue last had room: a drop episode is
    /// logged once when it starts and once when it ends.
    dropping: Option<u64>,
    /// A wait for room ran out and no reservation succeeded since: senders
    /// do not wait again until the queue has room.
    stalled: bool,
    /// What each tenant holds of `profiles` and `bytes`.
    tenants: shares::TenantShares,
}

#[derive(Debug)]
struct Item {
    /// The batch; `None` for one only on disk (read back when sent).
    body: Option<(Vec<Envelope>, Arc<BatchMeta>)>,
    profiles: usize,
    ack: Ack,
    bytes: usize,
    /// Its record, in a persistent queue.
    record: Option<RecordId>,
    /// The tenant it counts for (none for a record from before a restart).
    tenant: Option<Arc<str>>,
}

/// One gathered item's part of a send.
struct Part {
    /// Profiles of it in the batch.
    len: usize,
    ack: Ack,
    record: Option<RecordId>,
}

/// What one consumer took from the queue for one send.
struct Taken {
    batch: ExportBatch,
    /// Each gathered item's part, in batch order.
    parts: Vec<Part>,
    /// Profiles taken (including any whose record could not be read).
    profiles: usize,
    bytes: usize,
    /// Profiles taken that had a record on disk.
    stored: usize,
    /// What each item taken counted for its tenant: (tenant, profiles, bytes).
    tenants: Vec<(Option<Arc<str>>, usize, usize)>,
}

impl Taken {
    fn new() -> Self {
        Taken {
            batch: ExportBatch::new(),
            parts: Vec::new(),
            profiles: 0,
            bytes: 0,
            stored: 0,
            tenants: Vec::new(),
        }
    }
}

/// A reservation of queue capacity, taken before any queue gets the batch so a
/// batch goes to all its exporters or to none.
#[derive(Debug)]
#[must_use = "a reservation must be pushed or released"]
pub struct Reservation {
    profiles: usize,
    bytes: usize,
    tenant: Option<Arc<str>>,
}

/// Why [`ExporterQueue::reserve`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Full,
    Closed,
    /// The queue is past half full and the tenant holds its share of it
    /// ([`ExporterQueue::reserve`]).
    OverShare,
}

/// How a send ended, for counting and acknowledging.
enum Sent {
    All,
    /// The whole batch failed, counted under this reason.
    Failed(String),
    /// These indexes failed (under this reason); the rest were delivered.
    Partial(Vec<usize>, String),
    /// Shutdown stopped the send before it ended.
    Abandoned,
}

/// How long an export attempt in progress may still take once shutdown's
/// deadline has passed.
pub const ABORT_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

/// One exporter's queue and the tasks that drain it.
pub struct ExporterQueue {
    id: String,
    settings: QueueSettings,
    retry: RetrySettings,
    state: Mutex<State>,
    /// Signalled when an item is pushed or the queue closes (consumers wait).
    available: Notify,
    /// Signalled when capacity is given back (waiting admissions wait).
    space: Notify,
    /// Only one consumer gathers a batch at a time, so a trickle of profiles
    /// fills one batch instead of being spread over every consumer, and the
    /// one that waits is the only one a push must wake.
    gathering: tokio::sync::Mutex<()>,
    telemetry: ExporterTelemetry,
    /// The disk half of a persistent queue.
    store: Option<Arc<Store>>,
}

/// What a receiver waits for before a batch pushed into a persistent queue
/// counts as accepted: its record being durable.
#[must_use = "the batch counts as stored only once this resolved"]
pub struct StoreWait {
    store: Arc<Store>,
    durable: Durable,
    share: Ack,
}

impl StoreWait {
    /// Waits until the record is durable and resolves the batch's share as
    /// stored; an error says why it is not (the batch is still queued in
    /// memory and sent if it can be, but not kept across a restart).
    pub async fn wait(self) -> Result<(), String> {
        let StoreWait {
            store,
            durable,
            share,
        } = self;
        let r = store.durable(durable).await;
        if r.is_ok() {
            share.resolve(Outcome::Stored);
        }
        r
    }
}

impl std::fmt::Debug for ExporterQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExporterQueue")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExporterQueue {
    /// A queue in memory (`settings.storage` is not looked at; see
    /// [`ExporterQueue::open`]).
    pub fn new(
        id: impl Into<String>,
        settings: QueueSettings,
        retry: RetrySettings,
        telemetry: ExporterTelemetry,
    ) -> Arc<Self> {
        telemetry.queue_capacity(settings.queue_size, settings.max_bytes.bytes());
        telemetry.queue_level(0, 0);
        Arc::new(ExporterQueue {
            id: id.into(),
            settings,
            retry,
            state: Mutex::new(State::default()),
            available: Notify::new(),
            space: Notify::new(),
            gathering: tokio::sync::Mutex::new(()),
            telemetry,
            store: None,
        })
    }

    /// The queue `settings` describe: in memory, or persistent with its
    /// unfinished records (from before a restart) queued first.
    pub fn open(
        id: impl Into<String>,
        settings: QueueSettings,
        retry: RetrySettings,
        telemetry: ExporterTelemetry,
    ) -> Result<Arc<Self>, String> {
        let id = id.into();
        let Some(storage) = &settings.storage else {
            return Ok(ExporterQueue::new(id, settings, retry, telemetry));
        };
        let (store, replay) = Store::open(storage, &id, telemetry.clone())?;
        let mut state = State::default();
        for r in replay {
            let bytes = r.id.len as usize;
            state.profiles += r.profiles;
            state.bytes += bytes;
            state.stored += r.profiles;
            state.items.push_back(Item {
                body: None,
                profiles: r.profiles,
                ack: Ack::none(),
                bytes,
                record: Some(r.id),
                tenant: None,
            });
        }
        telemetry.queue_capacity(settings.queue_size, settings.max_bytes.bytes());
        telemetry.queue_level(state.profiles, state.bytes);
        Ok(Arc::new(ExporterQueue {
            id,
            settings,
            retry,
            state: Mutex::new(state),
            available: Notify::new(),
            space: Notify::new(),
            gathering: tokio::sync::Mutex::new(()),
            telemetry,
            store: Some(store),
        }))
    }

    /// Leaves the queue gauges to the queue that replaced this one under
    /// the same exporter id (a reload).
    pub fn mute_gauges(&self) {
        self.telemetry.mute_gauges();
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    /// True for a queue kept on disk (`storage`).
    pub fn is_persistent(&self) -> bool {
        self.store.is_some()
    }

    pub fn when_full(&self) -> WhenFull {
        self.settings.when_full
    }

    pub fn telemetry(&self) -> &ExporterTelemetry {
        &self.telemetry
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding this lock cannot leave the counters half-updated
        // (every update is a single statement), so a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes capacity for a batch of `profiles` profiles and `bytes` bytes,
    /// counted for `tenant`. A batch larger than the whole queue is admitted
    /// when nothing is waiting (sends may be in flight), so an outsized
    /// profile is delivered alone rather than refused forever under steady
    /// load. With `share`, a tenant over its share of a queue past half full
    /// is refused ([`Refusal::OverShare`], see `shares.rs`).
    pub fn reserve(
        &self,
        profiles: usize,
        bytes: usize,
        tenant: Option<Arc<str>>,
        share: bool,
    ) -> Result<Reservation, Refusal> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refusal::Closed);
        }
        if !self.admits(&s, profiles, bytes) {
            return Err(Refusal::Full);
        }
        if share
            && let Some(t) = &tenant
            && !s.tenants.allows(t, profiles, bytes, &self.fill(&s))
        {
            return Err(Refusal::OverShare);
        }
        s.tenants.add(tenant.as_ref(), profiles, bytes);
        s.profiles += profiles;
        s.bytes += bytes;
        s.reservations += 1;
        s.stalled = false;
        if let Some(dropped) = s.dropping.take() {
            tracing::info!(exporter = %self.id, dropped, "exporter queue has room again; the profiles dropped while it was full are lost for this exporter");
        }
        Ok(Reservation {
            profiles,
            bytes,
            tenant,
        })
    }

    /// How full the queue is, for the tenants' shares.
    fn fill(&self, s: &State) -> shares::Fill {
        match &self.settings.storage {
            Some(storage) => shares::Fill {
                profiles: (s.profiles, usize::MAX),
                bytes: (
                    s.bytes,
                    usize::try_from(storage.max_size.bytes()).unwrap_or(usize::MAX),
                ),
            },
            None => shares::Fill {
                profiles: (s.profiles, self.settings.queue_size),
                bytes: (s.bytes, self.settings.max_bytes.as_usize()),
            },
        }
    }

    /// Whether a batch of `profiles` and `bytes` may be admitted now: it fits,
    /// or it is larger than the whole queue and nothing is waiting.
    fn admits(&self, s: &State, profiles: usize, bytes: usize) -> bool {
        let (fits, oversized) = match &self.settings.storage {
            // On disk only the bytes of the records are bounded.
            Some(storage) => {
                let max = usize::try_from(storage.max_size.bytes()).unwrap_or(usize::MAX);
                (s.bytes + bytes <= max, bytes > max)
            }
            None => (
                s.profiles + profiles <= self.settings.queue_size
                    && s.bytes + bytes <= self.settings.max_bytes.as_usize(),
                profiles > self.settings.queue_size || bytes > self.settings.max_bytes.as_usize(),
            ),
        };
        fits || (oversized && s.items.is_empty() && s.reservations == 0)
    }

    /// Counts `profiles` dropped because the queue was full (`drop_newest`),
    /// logging once per episode.
    pub fn dropped_full(&self, profiles: usize) {
        self.telemetry.dropped("queue_full", profiles as u64);
        let mut s = self.lock();
        match &mut s.dropping {
            Some(n) => *n += profiles as u64,
            None => {
                s.dropping = Some(profiles as u64);
                tracing::warn!(exporter = %self.id, queue_profiles = s.profiles, queue_bytes = s.bytes, "exporter queue is full: dropping new profiles for this exporter until it catches up (counted in proflow_exporter_dropped_profiles_total{{reason=\"queue_full\"}})");
            }
        }
    }

    /// Gives back a reservation that will not be used.
    pub fn release(&self, r: Reservation) {
        {
            let mut s = self.lock();
            s.profiles -= r.profiles;
            s.bytes -= r.bytes;
            s.tenants.sub(r.tenant.as_ref(), r.profiles, r.bytes);
            s.reservations -= 1;
        }
        // A closed queue's consumer may be waiting for this last reservation.
        self.available.notify_one();
        self.space.notify_waiters();
    }

    /// Puts a batch into the queue under its reservation. A persistent
    /// queue writes its record first and returns what to wait for before the
    /// batch counts as stored (`ack` resolves then).
    pub fn push(
        &self,
        r: Reservation,
        envelopes: Vec<Envelope>,
        meta: Arc<BatchMeta>,
        ack: Ack,
    ) -> Option<StoreWait> {
        let n = envelopes.len();
        // Sizes are counted by the reservation; the batch must be the one reserved for.
        debug_assert_eq!(r.profiles, n);
        let (record, wait, ack) = match &self.store {
            None => (None, None, ack),
            Some(store) => match storage::record::encode(&envelopes, &meta) {
                Ok(bytes) => {
                    let (record, durable) = store.append(&bytes);
                    match record {
                        // Stored (or about to be): the share waits for durability.
                        Some(id) => (
                            Some(id),
                            Some(StoreWait {
                                store: store.clone(),
                                durable,
                                share: ack,
                            }),
                            Ack::none(),
                        ),
                        // Not written: kept in memory like a memory queue's batch,
                        // and the sender is told it is not stored.
                        None => (
                            None,
                            Some(StoreWait {
                                store: store.clone(),
                                durable,
                                share: Ack::none(),
                            }),
                            ack,
                        ),
                    }
                }
                Err(e) => {
                    tracing::warn!(exporter = %self.id, error = %e, "a batch that cannot be written to the persistent queue is kept in memory only");
                    (None, None, ack)
                }
            },
        };
        {
            let mut s = self.lock();
            s.reservations -= 1;
            let resident = record.is_none()
                || (s.resident.0 + n <= self.settings.queue_size
                    && s.resident.1 + r.bytes <= self.settings.max_bytes.as_usize());
            if record.is_some() {
                s.stored += n;
                if resident {
                    s.resident.0 += n;
                    s.resident.1 += r.bytes;
                }
            }
            s.items.push_back(Item {
                body: resident.then_some((envelopes, meta)),
                profiles: n,
                ack,
                bytes: r.bytes,
                record,
                tenant: r.tenant,
            });
            self.telemetry.queue_level(s.profiles, s.bytes);
        }
        self.telemetry.enqueued(n as u64);
        // Only the gathering consumer waits here (see `gathering`), so one
        // permit always reaches the consumer that needs it.
        self.available.notify_one();
        wait
    }

    /// Waits until `profiles`/`bytes` might fit: returns after capacity was
    /// given back or the queue closed (the caller tries `reserve` again).
    pub async fn wait_for_space(&self, profiles: usize, bytes: usize) {
        let notified = self.space.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        {
            let s = self.lock();
            if s.closed || self.admits(&s, profiles, bytes) {
                return;
            }
        }
        notified.await;
    }

    /// Waits for room as [`ExporterQueue::wait_for_space`] does, until
    /// `deadline` at most: `true` when the batch might fit now (the caller
    /// tries `reserve` again), `false` when the wait ran out (the queue is
    /// then stalled until a reservation succeeds: see
    /// [`ExporterQueue::is_stalled`]).
    pub async fn wait_for_space_until(
        &self,
        profiles: usize,
        bytes: usize,
        deadline: tokio::time::Instant,
    ) -> bool {
        let waited = tokio::time::timeout_at(deadline, self.wait_for_space(profiles, bytes)).await;
        if waited.is_ok() {
            return true;
        }
        self.lock().stalled = true;
        false
    }

    /// True when the last wait for room ran out and the queue has not had
    /// room since: `when_full` applies without waiting.
    pub fn is_stalled(&self) -> bool {
        self.lock().stalled
    }

    /// How long a full queue holds senders back (`wait_when_full`).
    pub fn wait_when_full(&self) -> std::time::Duration {
        self.settings.wait_when_full.get()
    }

    /// Profiles and bytes admitted and not finished.
    pub fn level(&self) -> (usize, usize) {
        let s = self.lock();
        (s.profiles, s.bytes)
    }

    /// Stops admitting; consumers drain what is queued and then end.
    pub fn close(&self) {
        self.lock().closed = true;
        self.available.notify_one();
        self.space.notify_waiters();
    }

    /// Removes what is still queued after the consumers stopped; each item's
    /// ack reports it abandoned. Returns the profiles removed.
    fn abandon_queued(&self) -> usize {
        let items: Vec<Item> = {
            let mut s = self.lock();
            s.tenants.clear();
            s.items.drain(..).collect()
        };
        let n = items.iter().map(|i| i.profiles).sum();
        for item in items {
            item.ack.resolve(Outcome::Abandoned);
        }
        n
    }
}

/// The shutdown half of a queue, for the topology: what could not be sent.
impl ExporterQueue {
    /// After the consumers ended (drained or aborted): removes what is left,
    /// reports it abandoned and counted, and returns how many profiles were not
    /// delivered (queued, or in flight when the consumers were aborted).
    pub fn abandon(&self) -> usize {
        self.abandon_queued();
        let (left, stored) = {
            let s = self.lock();
            (s.profiles, s.stored)
        };
        if stored > 0 {
            tracing::info!(exporter = %self.id, profiles = stored, "profiles not yet sent stay in the persistent queue; they are sent after the next start");
        }
        let lost = left - stored;
        if lost > 0 {
            self.telemetry.dropped("shutdown", lost as u64);
        }
        lost
    }

    /// Starts the group commit of a persistent queue with `fsync: batch`
    /// (it ends with `stop`).
    pub fn spawn_storage(&self, stop: CancellationToken) {
        if let Some(store) = &self.store {
            tokio::spawn(store.clone().group_commit(stop));
        }
    }
}
