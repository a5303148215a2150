//! Stopping in reverse order: receivers, then queues drain up to
//! `shutdown_timeout`, then exporters; and what could not be delivered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::component::Consumer;

use super::running::{Running, RunningExporter};
use super::{EXPORTER_SHUTDOWN_MIN, RECEIVER_STOP_TIMEOUT};

/// What the collector could not deliver.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Profiles left in queues (or in flight) when the drain deadline passed, per exporter.
    pub undelivered: BTreeMap<String, usize>,
    /// Profiles each exporter dropped (full `drop_newest` queue) or gave up
    /// on (refused by its peer, retries ran out) while the collector ran,
    /// per exporter that lost any.
    pub lost: BTreeMap<String, crate::telemetry::Losses>,
}

impl ShutdownReport {
    pub fn total_undelivered(&self) -> usize {
        self.undelivered.values().sum()
    }

    /// Profiles dropped by full queues since the start, every exporter.
    pub fn total_dropped(&self) -> u64 {
        self.lost.values().map(|l| l.dropped).sum()
    }

    /// Profiles exporters gave up on since the start, every exporter.
    pub fn total_failed(&self) -> u64 {
        self.lost.values().map(|l| l.failed).sum()
    }

    /// True when every profile accepted reached every exporter it was for
    /// (or a persistent queue keeps it): nothing left, dropped or given up.
    pub fn all_delivered(&self) -> bool {
        self.total_undelivered() == 0 && self.total_dropped() == 0 && self.total_failed() == 0
    }
}

impl Running {
    /// Stops receivers, drains the queues within `shutdown_timeout`, then
    /// closes the exporters.
    pub async fn shutdown(self) -> ShutdownReport {
        self.telemetry.set_ready(false);
        self.receivers_stop.cancel();
        // Receivers finish in-flight requests under one shared bound, so a stuck
        // connection cannot eat the drain budget; what is left is then aborted
        // (a request still in flight gets no answer, so its sender retries).
        let receivers_deadline = tokio::time::Instant::now() + RECEIVER_STOP_TIMEOUT;
        for (id, mut r) in self.receivers {
            if tokio::time::timeout_at(receivers_deadline, &mut r.task)
                .await
                .is_err()
            {
                tracing::warn!(receiver = %id, "receiver did not stop within {RECEIVER_STOP_TIMEOUT:?}; aborting it");
                r.task.abort();
            }
        }
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
        // Profiles held for aggregation go into the queues before they
        // close, within the drain's deadline.
        futures_util::future::join_all(self.holders.into_iter().map(|h| h.finish(deadline))).await;
        let _ = tokio::time::timeout_at(
            deadline,
            futures_util::future::join_all(self.retired_holders),
        )
        .await;
        let exporters: Vec<RunningExporter> = self.exporters.into_values().collect();
        for e in &exporters {
            e.queue.close();
        }
        let mut report = ShutdownReport::default();
        let mut pending: Vec<JoinHandle<()>> = Vec::new();
        let mut exporters = exporters;
        for e in &mut exporters {
            pending.append(&mut e.tasks);
        }
        let drained =
            tokio::time::timeout_at(deadline, futures_util::future::join_all(&mut pending))
                .await
                .is_ok();
        if !drained {
            // Deadline passed: stop every consumer (an export attempt in
            // progress gets a short grace to end), so the counts below are final.
            self.abort.cancel();
            pending.retain(|t| !t.is_finished());
            let _ = tokio::time::timeout(
                crate::queue::ABORT_GRACE + Duration::from_millis(500),
                futures_util::future::join_all(&mut pending),
            )
            .await;
        }
        for e in &exporters {
            let left = e.queue.abandon();
            if left > 0 {
                report.undelivered.insert(e.id.clone(), left);
            }
        }
        // Exporters flush and close within what is left of the deadline (at
        // least a moment, so a drain that used it all still lets them close).
        let shutdown_until = deadline.max(tokio::time::Instant::now() + EXPORTER_SHUTDOWN_MIN);
        let closes = exporters.iter().map(|e| async move {
            if tokio::time::timeout_at(shutdown_until, e.exporter.shutdown())
                .await
                .is_err()
            {
                tracing::warn!(exporter = %e.id, "exporter did not shut down in time; leaving it");
            }
        });
        futures_util::future::join_all(closes).await;
        // Exporters a reload removed finish their own drain (bounded by the
        // timeout they were given) before anything is aborted.
        for done in futures_util::future::join_all(self.retired).await {
            if let Ok((id, left)) = done
                && left > 0
            {
                *report.undelivered.entry(id).or_default() += left;
            }
        }
        self.abort.cancel();
        report.lost = self.telemetry.losses();
        report
    }
}

/// Stops exporters a failed reload built (their queues are empty).
pub(super) fn stop_built(built: BTreeMap<String, RunningExporter>) {
    for e in built.into_values() {
        e.queue.close();
        e.abort.cancel();
    }
}

/// An exporter a reload removed: once the calls still running on the
/// pipelines it was in have ended (they may still put profiles in its
/// queue), its queue drains within `timeout` (a persistent queue keeps what
/// is left on disk), then it closes. Ends with its id and what it could not
/// send.
pub(super) async fn retire(
    mut e: RunningExporter,
    timeout: Duration,
    in_flight: Arc<Vec<Arc<dyn Consumer>>>,
) -> (String, usize) {
    let until = tokio::time::Instant::now() + timeout.max(RECEIVER_STOP_TIMEOUT);
    // `in_flight` holds one reference of each; any more is a call running.
    while in_flight.iter().any(|c| Arc::strong_count(c) > 1) && tokio::time::Instant::now() < until
    {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    e.queue.close();
    let drained = tokio::time::timeout(timeout, futures_util::future::join_all(&mut e.tasks))
        .await
        .is_ok();
    if !drained {
        e.abort.cancel();
        let _ = tokio::time::timeout(
            crate::queue::ABORT_GRACE + Duration::from_millis(500),
            futures_util::future::join_all(&mut e.tasks),
        )
        .await;
    }
    let left = e.queue.abandon();
    if left > 0 {
        tracing::warn!(exporter = %e.id, undelivered = left, "exporter removed by a reload could not send everything it held within shutdown_timeout");
    } else {
        tracing::info!(exporter = %e.id, "exporter removed by a reload drained its queue");
    }
    let _ = tokio::time::timeout(EXPORTER_SHUTDOWN_MIN, e.exporter.shutdown()).await;
    e.abort.cancel();
    (e.id, left)
}
