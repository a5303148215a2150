//! Retry of one send (`retry_on_failure`): exponential backoff with jitter,
//! bounded by `max_elapsed_time`, cut short by an abort.

use super::*;

impl ExporterQueue {
    /// Exports with retry. Logs failures; the caller counts them. Once
    /// `abort` is cancelled, no new attempt starts and a retry wait ends at
    /// once; an attempt in progress gets [`ABORT_GRACE`] to finish, so its
    /// real outcome is counted (a file write, for one, completes anyway).
    pub(super) async fn send_with_retry(
        &self,
        exporter: &dyn Exporter,
        batch: &ExportBatch,
        abort: &CancellationToken,
    ) -> Sent {
        let started = Instant::now();
        let mut wait = self.retry.initial_interval.get();
        loop {
            if abort.is_cancelled() {
                return Sent::Abandoned;
            }
            let attempt = Instant::now();
            let grace_over = async {
                abort.cancelled().await;
                tokio::time::sleep(ABORT_GRACE).await;
            };
            let result = tokio::select! {
                result = exporter.export(batch) => result,
                _ = grace_over => return Sent::Abandoned,
            };
            self.telemetry
                .send_duration(attempt.elapsed().as_secs_f64());
            let err: ExportError = match result {
                Ok(()) => return Sent::All,
                Err(e) => e,
            };
            self.telemetry.attempt_failed(&err.to_string());
            let retry_after = match err.class {
                ErrorClass::Permanent => {
                    return match err.refused.clone() {
                        Some(refused) => {
                            tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, refused = refused.len(), profiles = batch.len(), "the peer refused some profiles permanently; the others were delivered");
                            Sent::Partial(refused, err.reason)
                        }
                        None => {
                            tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, profiles = batch.len(), "dropping profiles the peer refused permanently");
                            Sent::Failed(err.reason)
                        }
                    };
                }
                ErrorClass::Retryable { retry_after } => retry_after,
            };
            if !self.retry.enabled {
                tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, "export failed and retry_on_failure is disabled");
                return Sent::Failed(err.reason);
            }
            let delay = retry_after.unwrap_or_else(|| jitter(wait));
            let max_elapsed = self.retry.max_elapsed_time.get();
            let past_deadline = started
                .elapsed()
                .checked_add(delay)
                .is_none_or(|end| end > max_elapsed);
            if !max_elapsed.is_zero() && past_deadline {
                tracing::warn!(exporter = %self.id, reason = %err.reason, error = %err, elapsed = ?started.elapsed(), "giving up after max_elapsed_time");
                return Sent::Failed("retries_exhausted".to_owned());
            }
            tracing::debug!(exporter = %self.id, error = %err, ?delay, "export failed; retrying");
            self.telemetry.retried();
            tokio::select! {
                _ = tokio::time::sleep(delay) => {}
                _ = abort.cancelled() => return Sent::Abandoned,
            }
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
pub(super) fn jitter(d: std::time::Duration) -> std::time::Duration {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|t| t.subsec_nanos())
        .unwrap_or(0);
    let factor = 0.5 + f64::from(nanos % 1000) / 1000.0;
    std::time::Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(d)
}
