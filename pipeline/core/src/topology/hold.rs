//! Pipelines with a processor that holds profiles back (`aggregate`): a
//! task per pipeline asks it for what is due and hands that to the rest of
//! the pipeline (the processors after it, then the exporter queues); when
//! the pipeline goes (shutdown, or a reload that replaces it), everything
//! it holds is passed on before the queues close.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::component::{Admission, Consumer, Processor};
use crate::telemetry::ProcessorTelemetry;
use proflow_model::model::Batch;

use super::RECEIVER_STOP_TIMEOUT;

/// The task that passes on what one pipeline's holding processor releases.
pub(super) struct Holder {
    /// The pipeline's id, for logs.
    pub(super) pipeline: String,
    /// Cancelled to release everything and end.
    stop: CancellationToken,
    /// Where released profiles go. The task holds a clone while it runs,
    /// so a reload that retires exporters waits for it as for a call in
    /// flight.
    pub(super) tail: Arc<dyn Consumer>,
    task: JoinHandle<()>,
}

impl Holder {
    /// Starts asking `proc` every `every` for what is due, handing it to
    /// `tail`.
    pub(super) fn spawn(
        pipeline: &str,
        proc: Arc<dyn Processor>,
        telemetry: ProcessorTelemetry,
        every: Duration,
        tail: Arc<dyn Consumer>,
    ) -> Holder {
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(
            pipeline.to_owned(),
            proc,
            telemetry,
            every,
            tail.clone(),
            stop.clone(),
        ));
        Holder {
            pipeline: pipeline.to_owned(),
            stop,
            tail,
            task,
        }
    }

    /// Releases everything held and waits, up to `until`, for it to be in
    /// the exporter queues. Past `until` the task is aborted, and what it
    /// still held is lost (counted by the processor as `shutdown`).
    pub(super) async fn finish(mut self, until: tokio::time::Instant) {
        self.stop.cancel();
        if tokio::time::timeout_at(until, &mut self.task)
            .await
            .is_err()
        {
            tracing::warn!(pipeline = %self.pipeline, "profiles held for aggregation were not all queued before the deadline");
            self.task.abort();
        }
    }

    /// [`Holder::finish`] for a pipeline a reload replaced: once the calls
    /// still running on the receivers' replaced pipelines (`in_flight`,
    /// one reference of each held there) have ended, as they may still
    /// hand the processor profiles, everything is released.
    pub(super) async fn retire(self, in_flight: Arc<Vec<Arc<dyn Consumer>>>, timeout: Duration) {
        let until = tokio::time::Instant::now() + timeout.max(RECEIVER_STOP_TIMEOUT);
        while in_flight.iter().any(|c| Arc::strong_count(c) > 1)
            && tokio::time::Instant::now() < until
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.finish(until).await;
    }
}

async fn run(
    pipeline: String,
    proc: Arc<dyn Processor>,
    telemetry: ProcessorTelemetry,
    every: Duration,
    tail: Arc<dyn Consumer>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let all = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.cancelled() => true,
        };
        for (envelopes, meta) in proc.release(all) {
            let n = envelopes.len() as u64;
            // Waits for room as a scrape does: a `block` queue is waited
            // for, a `drop_newest` one that stays full drops its copy.
            if let Err(e) = tail
                .consume(Batch::new(envelopes, meta), Admission::Wait)
                .await
            {
                telemetry.dropped("shutdown", n);
                tracing::warn!(pipeline = %pipeline, error = %e, profiles = n, "aggregated profiles could not be queued");
            }
        }
        if all {
            return;
        }
    }
}
