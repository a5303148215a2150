//! The handles components report through: one per component, each with the
//! methods for the metrics its kind has, all writing the shared families of
//! [`Telemetry`](super::Telemetry).

use super::*;

pub(super) fn with(id: &LabelSet, k: &'static str, v: &str) -> LabelSet {
    let mut l = id.clone();
    l.push((k, v.to_string()));
    l
}

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
            .receiver_accepted_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
        self.t
            .receiver_accepted_bytes
            .get_or_create(&self.id)
            .inc_by(bytes);
    }

    /// Spans taken for span indexes, and spans refused.
    pub fn spans(&self, accepted: u64, refused: u64) {
        if accepted > 0 {
            self.t
                .receiver_accepted_spans
                .get_or_create(&self.id)
                .inc_by(accepted);
        }
        if refused > 0 {
            self.t
                .receiver_refused_spans
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
        lost: &crate::lost::LostSamples,
    ) {
        for (reason, samples) in lost.iter() {
            self.t
                .receiver_lost_samples
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
        lost: &crate::lost::LostSamples,
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
            .receiver_lost_parts
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
            .unwrap_or(crate::model::ANONYMOUS_TENANT);
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
            .receiver_tenant_refused_requests
            .get_or_create(&with(&with(&self.id, "tenant", shown), "reason", reason))
            .inc();
        self.t.tenants.refused(tenant, reason);
    }

    /// An accepted request of `format` whose non-empty body (`bytes` long)
    /// held no sample to store: counted, and logged once per sender.
    pub fn empty_request(&self, format: &str, sender: Option<std::net::IpAddr>, bytes: usize) {
        self.t
            .receiver_empty_requests
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
            .receiver_upgraded_requests
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

    /// A request refused for `reason` (a short snake_case word such as `bad_request`,
    /// `too_large`, `backpressure`), with the profiles it carried if known.
    pub fn refused(&self, reason: &str, profiles: u64) {
        self.t
            .receiver_refused_requests
            .get_or_create(&with(&self.id, "reason", reason))
            .inc();
        if profiles > 0 {
            self.t
                .receiver_refused_profiles
                .get_or_create(&with(&self.id, "reason", reason))
                .inc_by(profiles);
        }
    }
}

/// Metric handle of a pull (scrape) receiver: scrapes and their failures by
/// job, target counts, delta state.
#[derive(Clone, Debug)]
pub struct ScrapeTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl ScrapeTelemetry {
    /// One scrape of `job` that took `seconds`.
    pub fn scraped(&self, job: &str, seconds: f64) {
        let labels = with(&self.id, "job", job);
        self.t.scrapes.get_or_create(&labels).inc();
        self.t
            .scrape_duration
            .get_or_create(&labels)
            .observe(seconds);
    }

    /// A scrape of `job` that gave no profile, for `reason`.
    pub fn failed(&self, job: &str, reason: &str) {
        let mut labels = with(&self.id, "job", job);
        labels.push(("reason", reason.to_owned()));
        self.t.scrape_failures.get_or_create(&labels).inc();
    }

    /// How many targets `job` has now, active and dropped.
    pub fn targets(&self, job: &str, active: usize, dropped: usize) {
        for (state, n) in [("active", active), ("dropped", dropped)] {
            let mut labels = with(&self.id, "job", job);
            labels.push(("state", state.to_owned()));
            self.t.scrape_targets.get_or_create(&labels).set(n as i64);
        }
    }

    /// What the delta state holds now.
    pub fn delta_state(&self, bytes: usize, series: usize) {
        self.t
            .scrape_delta_state_bytes
            .get_or_create(&self.id)
            .set(bytes as i64);
        self.t
            .scrape_delta_series
            .get_or_create(&self.id)
            .set(series as i64);
    }
}

/// Metric handle of an eBPF receiver.
#[derive(Clone, Debug)]
pub struct EbpfTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl EbpfTelemetry {
    /// `n` samples of `bytes` in all read from the kernel.
    pub fn samples(&self, n: u64, bytes: u64) {
        self.t.ebpf_samples.get_or_create(&self.id).inc_by(n);
        self.t
            .ebpf_sample_bytes
            .get_or_create(&self.id)
            .inc_by(bytes);
    }

    /// `n` more user stacks unwound as `how`.
    pub fn unwound(&self, how: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "unwound", how);
            self.t.ebpf_user_stacks.get_or_create(&labels).inc_by(n);
        }
    }

    /// `n` more samples the kernel could not hand over (ring buffer full).
    pub fn lost(&self, n: u64) {
        self.t.ebpf_samples_lost.get_or_create(&self.id).inc_by(n);
    }

    /// A sample read but not kept, for `reason`.
    pub fn dropped(&self, reason: &str) {
        self.dropped_n(reason, 1);
    }

    /// `n` samples not kept, for `reason`.
    pub fn dropped_n(&self, reason: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "reason", reason);
            self.t.ebpf_samples_dropped.get_or_create(&labels).inc_by(n);
        }
    }

    /// Processes held and symbol cache size now.
    pub fn state(&self, processes: usize, symbols: usize) {
        self.t
            .ebpf_processes
            .get_or_create(&self.id)
            .set(processes as i64);
        self.t
            .ebpf_symbol_cache_entries
            .get_or_create(&self.id)
            .set(symbols as i64);
    }

    /// What the state budget holds now.
    pub fn state_bytes(&self, bytes: usize) {
        self.t
            .ebpf_state_bytes
            .get_or_create(&self.id)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// `n` more refusals of the state budget for `what` (`perf_map`,
    /// `unwind_section`).
    pub fn state_refused(&self, what: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "use", what);
            self.t.ebpf_state_refusals.get_or_create(&labels).inc_by(n);
        }
    }
}

/// Metric handle of a `trace_link` processor.
#[derive(Clone, Debug)]
pub struct TraceLinkTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl TraceLinkTelemetry {
    /// `n` more samples with `result` (`linked`, `no_trace_id`, `malformed`).
    pub fn samples(&self, result: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "result", result);
            self.t.trace_link_samples.get_or_create(&labels).inc_by(n);
        }
    }

    /// Spans indexed and let go.
    pub fn indexed(&self, n: u64, evicted_window: u64, evicted_max: u64) {
        if n > 0 {
            self.t
                .trace_link_spans_indexed
                .get_or_create(&self.id)
                .inc_by(n);
        }
        for (reason, n) in [("window", evicted_window), ("max_spans", evicted_max)] {
            if n > 0 {
                let labels = with(&self.id, "reason", reason);
                self.t
                    .trace_link_spans_evicted
                    .get_or_create(&labels)
                    .inc_by(n);
            }
        }
    }

    /// One batch held for spans, ended with `result` (`found`, `timed_out`).
    pub fn waited(&self, result: &str) {
        let labels = with(&self.id, "result", result);
        self.t.trace_link_waits.get_or_create(&labels).inc();
    }

    /// The index's size now.
    pub fn index(&self, spans: usize, bytes: usize) {
        self.t
            .trace_link_index_spans
            .get_or_create(&self.id)
            .set(spans as i64);
        self.t
            .trace_link_index_bytes
            .get_or_create(&self.id)
            .set(bytes as i64);
    }
}

/// Metric handle of a `symbolize` processor.
#[derive(Clone, Debug)]
pub struct SymbolizeTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl SymbolizeTelemetry {
    /// `n` more frames with `result` (`symbolized` or the reason they were not).
    pub fn frames(&self, result: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "result", result);
            self.t.symbolize_frames.get_or_create(&labels).inc_by(n);
        }
    }

    /// `n` more addresses named from the cache.
    pub fn cache_hits(&self, n: u64) {
        if n > 0 {
            self.t
                .symbolize_cache_hits
                .get_or_create(&self.id)
                .inc_by(n);
        }
    }

    /// One more fetch from debuginfod servers ended with `result`.
    pub fn debuginfod_fetch(&self, result: &str) {
        let labels = with(&self.id, "result", result);
        self.t
            .symbolize_debuginfod_fetches
            .get_or_create(&labels)
            .inc();
    }

    /// `n` more profiles passed on unnamed, for `reason`.
    pub fn skipped(&self, reason: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "reason", reason);
            self.t
                .symbolize_skipped_profiles
                .get_or_create(&labels)
                .inc_by(n);
        }
    }

    /// Worker threads given up on and not yet returned, now.
    pub fn stuck_workers(&self, n: usize) {
        self.t
            .symbolize_stuck_workers
            .get_or_create(&self.id)
            .set(n as i64);
    }

    /// Cache entries and open files now.
    pub fn state(&self, entries: usize, open_files: usize) {
        self.t
            .symbolize_cache_entries
            .get_or_create(&self.id)
            .set(entries as i64);
        self.t
            .symbolize_open_files
            .get_or_create(&self.id)
            .set(open_files as i64);
    }
}

/// Metric handle of a `k8s_attributes` processor.
#[derive(Clone, Debug)]
pub struct K8sAttributesTelemetry {
    pub(super) t: Arc<Telemetry>,
    pub(super) id: LabelSet,
}

impl K8sAttributesTelemetry {
    /// `n` more profiles with `result` (`associated`, `not_found`,
    /// `no_identifier`).
    pub fn profiles(&self, result: &str, n: u64) {
        if n > 0 {
            let labels = with(&self.id, "result", result);
            self.t
                .k8s_attributes_profiles
                .get_or_create(&labels)
                .inc_by(n);
        }
    }

    /// `n` more identity labels removed from profiles of untrusted senders.
    pub fn untrusted_labels_removed(&self, n: u64) {
        if n > 0 {
            self.t
                .k8s_attributes_untrusted_labels_removed
                .get_or_create(&self.id)
                .inc_by(n);
        }
    }

    /// A cache's objects and failed lists or watches so far, now.
    pub fn cache(&self, kind: &str, objects: usize, failures: u64) {
        let labels = with(&self.id, "kind", kind);
        self.t
            .k8s_attributes_cache_objects
            .get_or_create(&labels)
            .set(objects as i64);
        self.t
            .k8s_attributes_watch_failures
            .get_or_create(&labels)
            .set(i64::try_from(failures).unwrap_or(i64::MAX));
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
            .processor_received_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
    }

    pub fn dropped(&self, reason: &str, profiles: u64) {
        self.t
            .processor_dropped_profiles
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
            .exporter_enqueued_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
    }

    pub fn sent(&self, profiles: u64, bytes: u64) {
        self.t
            .exporter_sent_profiles
            .get_or_create(&self.id)
            .inc_by(profiles);
        self.t
            .exporter_sent_bytes
            .get_or_create(&self.id)
            .inc_by(bytes);
    }

    pub fn failed(&self, reason: &str, profiles: u64) {
        self.t
            .exporter_failed_profiles
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
            .exporter_dropped_profiles
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
        self.t.exporter_retries.get_or_create(&self.id).inc();
    }

    /// A batch waited for room in this exporter's full queue; `result`:
    /// `room`, `timeout` or `stalled`.
    pub fn held(&self, result: &str) {
        self.t
            .exporter_queue_waits
            .get_or_create(&with(&self.id, "result", result))
            .inc();
    }

    /// Stops this handle from setting the queue gauges (counters go on).
    pub fn mute_gauges(&self) {
        self.gauges_muted.store(true, Ordering::Relaxed);
    }

    pub fn queue_level(&self, profiles: usize, bytes: usize) {
        if self.gauges_muted.load(Ordering::Relaxed) {
            return;
        }
        self.t
            .exporter_queue_profiles
            .get_or_create(&self.id)
            .set(profiles as i64);
        self.t
            .exporter_queue_bytes
            .get_or_create(&self.id)
            .set(bytes as i64);
    }

    /// A persistent queue's files: bytes, and records not yet finished.
    pub fn queue_stored(&self, bytes: u64, records: u64) {
        if self.gauges_muted.load(Ordering::Relaxed) {
            return;
        }
        self.t
            .exporter_queue_stored_bytes
            .get_or_create(&self.id)
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        self.t
            .exporter_queue_stored_records
            .get_or_create(&self.id)
            .set(i64::try_from(records).unwrap_or(i64::MAX));
    }

    pub fn queue_replayed(&self, records: u64) {
        self.t
            .exporter_queue_replayed_records
            .get_or_create(&self.id)
            .inc_by(records);
    }

    pub fn queue_corrupt(&self, n: u64) {
        self.t
            .exporter_queue_corrupt
            .get_or_create(&self.id)
            .inc_by(n);
    }

    pub fn queue_storage_error(&self) {
        self.t
            .exporter_queue_storage_errors
            .get_or_create(&self.id)
            .inc();
    }

    pub fn queue_fsync(&self, seconds: f64) {
        self.t
            .exporter_queue_fsync_duration
            .get_or_create(&self.id)
            .observe(seconds);
    }

    pub fn send_duration(&self, seconds: f64) {
        self.t
            .exporter_send_duration
            .get_or_create(&self.id)
            .observe(seconds);
    }
}
