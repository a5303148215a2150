//! The handles components report through: one per component, each with the
//! methods for the metrics its kind has, all writing the shared families of
//! [`Telemetry`](super::Telemetry).

use super::*;

use super::families::with_label as with;

/// Most tenants named on the per-tenant metrics (the rest are `other`).
pub const MAX_TENANT_LABELS: usize = 100;

/// A sender's address for a log line (`unknown` when the receiver has none).
fn shown(sender: Option<std::net::IpAddr>) -> String {
    sender.map_or_else(|| "unknown".to_owned(), |s| s.to_string())
}

/// Metric handle of one receiver.
#[derive(Clone, Debug)]
pub struct ReceiverTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl ReceiverTelemetry {
    pub fn accepted(&self, profiles: u64, bytes: u64) {
        self.t
            .receivers
            .accepted_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
        self.t
            .receivers
            .accepted_bytes
            .get_or_create(&self.id)
            .inc_by(bytes);
    }

    /// Spans taken for span indexes, and spans refused.
    pub fn spans(&self, accepted: u64, refused: u64) {
        if accepted > 0 {
            self.t
                .receivers
                .accepted_spans
                .get_or_create(&self.id)
                .inc_by(accepted);
        }
        if refused > 0 {
            self.t
                .receivers
                .refused_spans
                .get_or_create(&self.id)
                .inc_by(refused);
        }
    }

    /// What one accepted request's conversion (from `format`, sent by
    /// `sender`) could not carry: counted per reason, and logged once per
    /// reason and sender with the numbers.
    pub fn lost(
        &self,
        format: &str,
        sender: Option<std::net::IpAddr>,
        lost: &proflow_model::lost::LostSamples,
    ) {
        for (reason, samples) in lost.iter() {
            self.t
                .receivers
                .lost_samples
                .get_or_create(&with(&self.id, "reason", reason))
                .inc_by(samples);
            if self.first_time(reason, sender) {
                tracing::warn!(
                    receiver = %self.id[0].1,
                    format,
                    reason,
                    samples,
                    sender = %shown(sender),
                    "samples of an accepted request could not be converted (logged once per reason and sender; counted in proflow_receiver_lost_samples_total)"
                );
            }
        }
        for (part, reason, count) in lost.parts() {
            self.lost_part(part, reason, count, format, sender);
        }
    }

    /// Parts of accepted samples (`part`: `frame` or `label`) that the
    /// conversion of a `format` body could not carry, by reason: counted,
    /// and logged once per reason and sender.
    pub fn lost_parts(
        &self,
        part: &'static str,
        format: &str,
        sender: Option<std::net::IpAddr>,
        lost: &proflow_model::lost::LostSamples,
    ) {
        for (reason, count) in lost.iter() {
            self.lost_part(part, reason, count, format, sender);
        }
    }

    fn lost_part(
        &self,
        part: &'static str,
        reason: &'static str,
        count: u64,
        format: &str,
        sender: Option<std::net::IpAddr>,
    ) {
        self.t
            .receivers
            .lost_parts
            .get_or_create(&with(&with(&self.id, "part", part), "reason", reason))
            .inc_by(count);
        if self.first_time(reason, sender) {
            tracing::warn!(
                receiver = %self.id[0].1,
                format,
                part,
                reason,
                count,
                sender = %shown(sender),
                "parts of accepted samples could not be converted (logged once per reason and sender; counted in proflow_receiver_lost_parts_total)"
            );
        }
    }

    /// A request of `tenant` (none: `anonymous`) refused for a per-tenant
    /// limit, `reason`: counted per tenant, the first
    /// [`MAX_TENANT_LABELS`] tenants by name and the rest as `other`, so
    /// the series stay bounded however many tenants there are.
    pub fn tenant_refused(&self, tenant: Option<&str>, reason: &'static str) {
        let tenant = tenant
            .filter(|t| !t.is_empty())
            .unwrap_or(proflow_model::model::ANONYMOUS_TENANT);
        let shown = {
            let mut named = self
                .t
                .tenants_named
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if named.contains(tenant) {
                tenant
            } else if named.len() < MAX_TENANT_LABELS {
                named.insert(tenant.to_owned());
                tenant
            } else {
                "other"
            }
        };
        self.t
            .receivers
            .tenant_refused_requests
            .get_or_create(&with(&with(&self.id, "tenant", shown), "reason", reason))
            .inc();
        self.t.tenants.refused(tenant, reason);
    }

    /// An accepted request of `format` whose non-empty body (`bytes` long)
    /// held no sample to store: counted, and logged once per sender.
    pub fn empty_request(&self, format: &str, sender: Option<std::net::IpAddr>, bytes: usize) {
        self.t
            .receivers
            .empty_requests
            .get_or_create(&with(&self.id, "format", format))
            .inc();
        if self.first_time("empty_request", sender) {
            tracing::warn!(
                receiver = %self.id[0].1,
                format,
                bytes,
                sender = %shown(sender),
                "a request was accepted but its body held no sample to store (logged once per sender; counted in proflow_receiver_empty_requests_total)"
            );
        }
    }

    /// A request of an older layout (`from`, e.g. `otlp_1_9`) that was
    /// converted to the current one: counted, and logged once per sender.
    pub fn upgraded(&self, from: &'static str, sender: Option<std::net::IpAddr>) {
        self.t
            .receivers
            .upgraded_requests
            .get_or_create(&with(&self.id, "from", from))
            .inc();
        if self.first_time(from, sender) {
            tracing::info!(
                receiver = %self.id[0].1,
                from,
                sender = %shown(sender),
                "a request of an older layout was converted (logged once per sender; counted in proflow_receiver_upgraded_requests_total)"
            );
        }
    }

    /// Whether `what` from `sender` is logged for the first time. The set of
    /// pairs logged is bounded: once it holds 10,000 it starts again.
    fn first_time(&self, what: &'static str, sender: Option<std::net::IpAddr>) -> bool {
        const MOST: usize = 10_000;
        let key = (
            self.id[0].1.clone(),
            what,
            sender.map(|s| s.to_string()).unwrap_or_default(),
        );
        let mut logged = self
            .t
            .lost_samples_logged
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if logged.contains(&key) {
            return false;
        }
        if logged.len() >= MOST {
            logged.clear();
        }
        logged.insert(key)
    }

    /// Something went wrong that the status page should show as this
    /// receiver's last error (a refused request is recorded already).
    pub fn error(&self, message: &str) {
        self.t.status.error("receiver", &self.id[0].1, message);
    }

    /// A request refused for `reason` (a short snake_case word such as `bad_request`,
    /// `too_large`, `backpressure`), with the profiles it carried if known.
    pub fn refused(&self, reason: &str, profiles: u64) {
        self.t.status.error(
            "receiver",
            &self.id[0].1,
            &format!("refused a request: {reason}"),
        );
        self.t
            .receivers
            .refused_requests
            .get_or_create(&with(&self.id, "reason", reason))
            .inc();
        if profiles > 0 {
            self.t
                .receivers
                .refused_profiles
                .get_or_create(&with(&self.id, "reason", reason))
                .inc_by(profiles);
        }
    }
}

/// Metric handle of one processor.
#[derive(Clone, Debug)]
pub struct ProcessorTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl ProcessorTelemetry {
    pub fn received(&self, profiles: u64) {
        self.t
            .processors
            .received_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
    }

    pub fn dropped(&self, reason: &str, profiles: u64) {
        self.t
            .processors
            .dropped_profiles
            .get_or_create(&with(&self.id, "reason", reason))
            .inc_by(profiles);
    }
}

/// Metric handle of one exporter (its queue reports through it too).
#[derive(Clone, Debug)]
pub struct ExporterTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
    /// Set for the queue of an exporter a reload replaced: its successor,
    /// under the same id, alone sets the queue gauges.
    pub(super) gauges_muted: Arc<AtomicBool>,
}

impl ExporterTelemetry {
    pub fn enqueued(&self, profiles: u64) {
        self.t
            .exporters
            .enqueued_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
    }

    pub fn sent(&self, profiles: u64, bytes: u64) {
        self.t
            .exporters
            .sent_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
        self.t
            .exporters
            .sent_bytes
            .get_or_create(&self.id)
            .inc_by(bytes);
    }

    /// An export attempt failed with `message` (retried or not): the
    /// status page shows the last.
    pub fn attempt_failed(&self, message: &str) {
        self.t.status.error("exporter", &self.id[0].1, message);
    }

    pub fn failed(&self, reason: &str, profiles: u64) {
        self.t
            .exporters
            .failed_profiles
            .get_or_create(&with(&self.id, "reason", reason))
            .inc_by(profiles);
        if profiles > 0 {
            self.t.add_loss(&self.id, |l| l.failed += profiles);
        }
    }

    /// Profiles dropped for `reason`, also kept for the shutdown report:
    /// `queue_full` as dropped, a peer's refusal as failed (those of
    /// `shutdown` are in it as undelivered already).
    pub fn dropped(&self, reason: &str, profiles: u64) {
        self.t
            .exporters
            .dropped_profiles
            .get_or_create(&with(&self.id, "reason", reason))
            .inc_by(profiles);
        match reason {
            _ if profiles == 0 => {}
            "shutdown" => {}
            "queue_full" => self.t.add_loss(&self.id, |l| l.dropped += profiles),
            _ => self.t.add_loss(&self.id, |l| l.failed += profiles),
        }
    }

    pub fn retried(&self) {
        self.t.exporters.retries.get_or_create(&self.id).inc();
    }

    /// A batch waited for room in this exporter's full queue; `result`:
    /// `room`, `timeout` or `stalled`.
    pub fn held(&self, result: &str) {
        self.t
            .exporters
            .queue_waits
            .get_or_create(&with(&self.id, "result", result))
            .inc();
    }

    /// Stops this handle from setting the queue gauges (counters go on).
    pub fn mute_gauges(&self) {
        self.gauges_muted.store(true, Ordering::Relaxed);
    }

    /// What the queue holds at most (its `queue_size` and `max_bytes`).
    pub fn queue_capacity(&self, profiles: usize, bytes: u64) {
        if self.gauges_muted.load(Ordering::Relaxed) {
            return;
        }
        let e = &self.t.exporters;
        e.queue_capacity_profiles
            .get_or_create(&self.id)
            .set(i64::try_from(profiles).unwrap_or(i64::MAX));
        e.queue_capacity_bytes
            .get_or_create(&self.id)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    pub fn queue_level(&self, profiles: usize, bytes: usize) {
        if self.gauges_muted.load(Ordering::Relaxed) {
            return;
        }
        self.t
            .exporters
            .queue_profiles
            .get_or_create(&self.id)
            .set(profiles as i64);
        self.t
            .exporters
            .queue_bytes
            .get_or_create(&self.id)
            .set(bytes as i64);
    }

    /// A persistent queue's files: bytes, and records not yet finished.
    pub fn queue_stored(&self, bytes: u64, records: u64) {
        if self.gauges_muted.load(Ordering::Relaxed) {
            return;
        }
        self.t
            .exporters
            .queue_stored_bytes
            .get_or_create(&self.id)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.t
            .exporters
            .queue_stored_records
            .get_or_create(&self.id)
            .set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    pub fn queue_replayed(&self, records: u64) {
        self.t
            .exporters
            .queue_replayed_records
            .get_or_create(&self.id)
            .inc_by(records);
    }

    pub fn queue_corrupt(&self, n: u64) {
        self.t
            .exporters
            .queue_corrupt
            .get_or_create(&self.id)
            .inc_by(n);
    }

    pub fn queue_storage_error(&self) {
        self.t
            .exporters
            .queue_storage_errors
            .get_or_create(&self.id)
            .inc();
    }

    pub fn queue_fsync(&self, seconds: f64) {
        self.t
            .exporters
            .queue_fsync_duration
            .get_or_create(&self.id)
            .observe(seconds);
    }

    pub fn send_duration(&self, seconds: f64) {
        self.t
            .exporters
            .send_duration
            .get_or_create(&self.id)
            .observe(seconds);
    }
}
