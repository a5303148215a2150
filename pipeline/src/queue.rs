//! Exporter queues: bounded in profiles and bytes, `when_full: block | drop_newest`,
//! drained by `num_consumers` tasks that export with exponential-backoff retry.
//! One queue per exporter, so a slow exporter never delays the others' sends.

use proflow_config::{ByteSize, Duration};
use serde::Deserialize;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use futures_util::FutureExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::component::{ErrorClass, Exporter, FieldError};
use crate::model::{Batch, batch_bytes};
use crate::telemetry::ExporterTelemetry;

/// What to do with a batch when an exporter's queue is full.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Refuse the batch everywhere (the receiver answers 429 / RESOURCE_EXHAUSTED)
    /// so the sender retries: no data loss, backpressure reaches the client.
    #[default]
    Block,
    /// Drop the batch for this exporter only, count it, and accept it elsewhere.
    DropNewest,
}

/// `sending_queue` of an exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    /// Most profiles waiting in the queue (including those being sent).
    pub queue_size: usize,
    /// Most payload bytes waiting in the queue (including those being sent).
    pub max_bytes: ByteSize,
    /// `block` (default) or `drop_newest`.
    pub when_full: WhenFull,
    /// How many sends run at once.
    pub num_consumers: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            queue_size: 1000,
            max_bytes: ByteSize::mib(256),
            when_full: WhenFull::Block,
            num_consumers: 4,
        }
    }
}

/// `retry_on_failure` of an exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    /// Retry retryable failures at all.
    pub enabled: bool,
    /// Wait before the first retry.
    pub initial_interval: Duration,
    /// Longest wait between retries.
    pub max_interval: Duration,
    /// Give up after this long since the first attempt; `0` retries forever.
    pub max_elapsed_time: Duration,
    /// Growth of the wait per retry.
    pub multiplier: f64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            enabled: true,
            initial_interval: Duration::from_secs(5),
            max_interval: Duration::from_secs(30),
            max_elapsed_time: Duration::from_secs(300),
            multiplier: 1.5,
        }
    }
}

/// Every problem in an exporter's queue and retry settings, with paths relative
/// to the exporter's body.
pub fn queue_problems(queue: &QueueSettings, retry: &RetrySettings) -> Vec<FieldError> {
    let mut problems = Vec::new();
    if queue.queue_size == 0 {
        problems.push(FieldError::new(
            "sending_queue.queue_size",
            "must be at least 1: a queue that holds nothing refuses every profile",
        ));
    }
    if queue.max_bytes.bytes() == 0 {
        problems.push(FieldError::new(
            "sending_queue.max_bytes",
            "must be more than 0: a queue that holds no bytes refuses every profile",
        ));
    }
    if queue.num_consumers == 0 {
        problems.push(FieldError::new(
            "sending_queue.num_consumers",
            "must be at least 1: with no consumer nothing is ever exported",
        ));
    }
    if !retry.multiplier.is_finite() || !(1.0..=10.0).contains(&retry.multiplier) {
        problems.push(FieldError::new(
            "retry_on_failure.multiplier",
            format!(
                "must be a number from 1 to 10 (got {}): the wait between retries must not shrink, nor jump past max_interval at once",
                retry.multiplier
            ),
        ));
    }
    if retry.enabled && retry.initial_interval.is_zero() {
        problems.push(FieldError::new(
            "retry_on_failure.initial_interval",
            "must be more than 0 when retries are enabled: retrying at once hammers a failing target",
        ));
    }
    if retry.initial_interval > retry.max_interval {
        problems.push(FieldError::new(
            "retry_on_failure.max_interval",
            format!(
                "must be at least initial_interval ({}), got {}",
                retry.initial_interval, retry.max_interval
            ),
        ));
    }
    problems
}

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
    closed: bool,
}

#[derive(Debug)]
struct Item {
    batch: Batch,
    bytes: usize,
}

/// A reservation of queue capacity, taken before any queue gets the batch so a
/// batch goes to all its exporters or to none.
#[derive(Debug)]
#[must_use = "a reservation must be pushed or released"]
pub struct Reservation {
    profiles: usize,
    bytes: usize,
}

/// Why [`ExporterQueue::reserve`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    Full,
    Closed,
}

/// One exporter's queue and the tasks that drain it.
pub struct ExporterQueue {
    id: String,
    settings: QueueSettings,
    retry: RetrySettings,
    state: Mutex<State>,
    available: Notify,
    telemetry: ExporterTelemetry,
}

impl std::fmt::Debug for ExporterQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExporterQueue")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ExporterQueue {
    pub fn new(
        id: impl Into<String>,
        settings: QueueSettings,
        retry: RetrySettings,
        telemetry: ExporterTelemetry,
    ) -> Arc<Self> {
        Arc::new(ExporterQueue {
            id: id.into(),
            settings,
            retry,
            state: Mutex::new(State::default()),
            available: Notify::new(),
            telemetry,
        })
    }

    pub fn id(&self) -> &str {
        &self.id
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

    /// Takes capacity for a batch of `profiles` profiles and `bytes` bytes. A
    /// batch larger than the whole queue is admitted when nothing is waiting
    /// (sends may be in flight), so an outsized profile is delivered alone
    /// rather than refused forever under steady load.
    pub fn reserve(&self, profiles: usize, bytes: usize) -> Result<Reservation, Refusal> {
        let mut s = self.lock();
        if s.closed {
            return Err(Refusal::Closed);
        }
        let fits = s.profiles + profiles <= self.settings.queue_size
            && s.bytes + bytes <= self.settings.max_bytes.as_usize();
        let oversized =
            profiles > self.settings.queue_size || bytes > self.settings.max_bytes.as_usize();
        let nothing_waiting = s.items.is_empty() && s.reservations == 0;
        let admit = fits || (oversized && nothing_waiting);
        if !admit {
            return Err(Refusal::Full);
        }
        s.profiles += profiles;
        s.bytes += bytes;
        s.reservations += 1;
        Ok(Reservation { profiles, bytes })
    }

    /// Gives back a reservation that will not be used.
    pub fn release(&self, r: Reservation) {
        {
            let mut s = self.lock();
            s.profiles -= r.profiles;
            s.bytes -= r.bytes;
            s.reservations -= 1;
        }
        // A closed queue's consumers may be waiting for this last reservation.
        self.available.notify_waiters();
    }

    /// Puts a batch into the queue under its reservation.
    pub fn push(&self, r: Reservation, batch: Batch) {
        let n = batch.len() as u64;
        {
            let mut s = self.lock();
            // Sizes are counted by the reservation; the batch must be the one reserved for.
            debug_assert_eq!(r.profiles, batch.len());
            s.reservations -= 1;
            s.items.push_back(Item {
                batch,
                bytes: r.bytes,
            });
            self.telemetry.queue_level(s.profiles, s.bytes);
        }
        self.telemetry.enqueued(n);
        self.available.notify_one();
    }

    /// Profiles and bytes admitted and not finished.
    pub fn level(&self) -> (usize, usize) {
        let s = self.lock();
        (s.profiles, s.bytes)
    }

    /// Stops admitting; consumers drain what is queued and then end.
    pub fn close(&self) {
        self.lock().closed = true;
        self.available.notify_waiters();
    }

    async fn next(&self) -> Option<Item> {
        loop {
            let notified = self.available.notified();
            {
                let mut s = self.lock();
                if let Some(item) = s.items.pop_front() {
                    return Some(item);
                }
                if s.closed && s.reservations == 0 {
                    return None;
                }
            }
            notified.await;
        }
    }

    fn finish(&self, profiles: usize, bytes: usize) {
        let mut s = self.lock();
        s.profiles -= profiles;
        s.bytes -= bytes;
        self.telemetry.queue_level(s.profiles, s.bytes);
    }

    /// Starts `num_consumers` tasks that export until the queue is closed and
    /// drained, or `abort` is cancelled (then in-flight retries stop).
    pub fn spawn_consumers(
        self: &Arc<Self>,
        exporter: Arc<dyn Exporter>,
        abort: CancellationToken,
    ) -> Vec<tokio::task::JoinHandle<()>> {
        (0..self.settings.num_consumers.max(1))
            .map(|_| {
                let q = self.clone();
                let exporter = exporter.clone();
                let abort = abort.clone();
                tokio::spawn(async move {
                    loop {
                        let item = tokio::select! {
                            item = q.next() => item,
                            _ = abort.cancelled() => None,
                        };
                        let Some(item) = item else { break };
                        let (profiles, bytes) = (item.batch.len(), item.bytes);
                        // A panicking exporter must not kill the consumer without
                        // finishing the item: its queue would stay full forever.
                        let send = std::panic::AssertUnwindSafe(
                            q.send_with_retry(exporter.as_ref(), &item.batch),
                        )
                        .catch_unwind();
                        let delivered = tokio::select! {
                            r = send => r.unwrap_or_else(|_| {
                                tracing::error!(exporter = %q.id, profiles = profiles, "the exporter panicked; dropping the batch");
                                q.telemetry.failed("panic", profiles as u64);
                                false
                            }),
                            _ = abort.cancelled() => {
                                // Leave the counters as they are: the shutdown report
                                // counts this batch as not delivered.
                                break;
                            }
                        };
                        if delivered {
                            q.telemetry.sent(profiles as u64, bytes as u64);
                        }
                        q.finish(profiles, bytes);
                    }
                })
            })
            .collect()
    }

    /// Exports with retry; true when delivered. Failures are counted here.
    async fn send_with_retry(&self, exporter: &dyn Exporter, batch: &Batch) -> bool {
        let started = Instant::now();
        let mut wait = self.retry.initial_interval.get();
        loop {
            let attempt = Instant::now();
            let result = exporter.export(batch).await;
            self.telemetry
                .send_duration(attempt.elapsed().as_secs_f64());
            let err = match result {
                Ok(()) => return true,
                Err(e) => e,
            };
            let retry_after = match err.class {
                ErrorClass::Permanent => {
                    tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, profiles = batch.len(), "dropping profiles the peer refused permanently");
                    self.telemetry.failed(&err.reason, batch.len() as u64);
                    return false;
                }
                ErrorClass::Retryable { retry_after } => retry_after,
            };
            if !self.retry.enabled {
                tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, "export failed and retry_on_failure is disabled");
                self.telemetry.failed(&err.reason, batch.len() as u64);
                return false;
            }
            let delay = retry_after.unwrap_or_else(|| jitter(wait));
            let max_elapsed = self.retry.max_elapsed_time.get();
            let past_deadline = started
                .elapsed()
                .checked_add(delay)
                .is_none_or(|end| end > max_elapsed);
            if !max_elapsed.is_zero() && past_deadline {
                tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, elapsed = ?started.elapsed(), "giving up after max_elapsed_time");
                self.telemetry
                    .failed("retries_exhausted", batch.len() as u64);
                return false;
            }
            tracing::debug!(exporter = %self.id, error = %err, ?delay, "export failed; retrying");
            self.telemetry.retried();
            tokio::time::sleep(delay).await;
            wait = std::cmp::min(
                std::time::Duration::try_from_secs_f64(
                    wait.as_secs_f64() * self.retry.multiplier.max(1.0),
                )
                .unwrap_or(std::time::Duration::MAX),
                self.retry.max_interval.get(),
            );
        }
    }
}

/// Spreads retries: a wait in [0.5, 1.5) × `d`, from the clock's low bits
/// (good enough to de-synchronise senders; no RNG dependency needed).
fn jitter(d: std::time::Duration) -> std::time::Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let factor = 0.5 + f64::from(nanos % 1000) / 1000.0;
    std::time::Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(d)
}

/// Profiles and bytes of a batch, as queues count them.
pub fn batch_size(batch: &Batch) -> (usize, usize) {
    (batch.len(), batch_bytes(batch))
}
