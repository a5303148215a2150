//! Self-telemetry: the metrics every component reports, readiness, and the
//! pull receivers' targets (JSON in the shape of Prometheus's targets API).
//! The HTTP server that shows them is [`crate::admin`].
//!
//! Components never register metrics themselves: they get a handle
//! ([`ReceiverTelemetry`], [`ProcessorTelemetry`], [`ExporterTelemetry`]) whose
//! methods update the shared families, so every component reports the same core
//! metrics under the same names.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

type LabelSet = Vec<(&'static str, String)>;
type Counters = Family<LabelSet, Counter>;
type Gauges = Family<LabelSet, Gauge>;

fn new_histograms() -> Family<LabelSet, Histogram, fn() -> Histogram> {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16)))
}

/// All metric families of one running collector.
pub struct Telemetry {
    registry: Registry,
    ready: AtomicBool,
    receiver_accepted_profiles: Counters,
    receiver_accepted_bytes: Counters,
    receiver_refused_profiles: Counters,
    receiver_refused_requests: Counters,
    processor_received_profiles: Counters,
    processor_dropped_profiles: Counters,
    exporter_enqueued_profiles: Counters,
    exporter_sent_profiles: Counters,
    exporter_sent_bytes: Counters,
    exporter_failed_profiles: Counters,
    exporter_dropped_profiles: Counters,
    exporter_retries: Counters,
    exporter_queue_waits: Counters,
    exporter_queue_profiles: Gauges,
    exporter_queue_bytes: Gauges,
    exporter_send_duration: Family<LabelSet, Histogram, fn() -> Histogram>,
    exporter_queue_stored_bytes: Gauges,
    exporter_queue_stored_records: Gauges,
    exporter_queue_replayed_records: Counters,
    exporter_queue_corrupt: Counters,
    exporter_queue_storage_errors: Counters,
    exporter_queue_fsync_duration: Family<LabelSet, Histogram, fn() -> Histogram>,
    memory_in_flight_bytes: Gauge,
    memory_limit_bytes: Gauge,
    conversions: Counters,
    conversion_failures: Counters,
    conversion_lost: Counters,
    /// What conversions lost that was logged already (logged once each).
    lost_logged: std::sync::Mutex<std::collections::HashSet<&'static str>>,
    /// Profiles each exporter dropped or gave up on since the start, by
    /// exporter id (over reloads), for the shutdown report.
    losses: std::sync::Mutex<std::collections::BTreeMap<String, Losses>>,
    scrapes: Counters,
    scrape_failures: Counters,
    scrape_targets: Gauges,
    scrape_delta_state_bytes: Gauges,
    scrape_delta_series: Gauges,
    scrape_duration: Family<LabelSet, Histogram, fn() -> Histogram>,
    ebpf_samples: Counters,
    ebpf_sample_bytes: Counters,
    ebpf_user_stacks: Counters,
    ebpf_samples_lost: Counters,
    ebpf_samples_dropped: Counters,
    ebpf_processes: Gauges,
    ebpf_symbol_cache_entries: Gauges,
    symbolize_frames: Counters,
    symbolize_cache_hits: Counters,
    symbolize_debuginfod_fetches: Counters,
    symbolize_cache_entries: Gauges,
    symbolize_open_files: Gauges,
    symbolize_stuck_workers: Gauges,
    symbolize_skipped_profiles: Counters,
    receiver_accepted_spans: Counters,
    receiver_refused_spans: Counters,
    trace_link_samples: Counters,
    trace_link_spans_indexed: Counters,
    trace_link_spans_evicted: Counters,
    trace_link_waits: Counters,
    trace_link_index_spans: Gauges,
    trace_link_index_bytes: Gauges,
    /// What `/targets` shows: each pull receiver's view, by receiver id.
    targets: std::sync::Mutex<Vec<(String, TargetsView)>>,
}

/// A pull receiver's targets for `/targets`: `(active, dropped)` as JSON
/// objects, taken when the page is asked for.
pub type TargetsView =
    Arc<dyn Fn() -> (Vec<serde_json::Value>, Vec<serde_json::Value>) + Send + Sync>;

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Default for Telemetry {
    fn default() -> Self {
        Self::new()
    }
}

impl Telemetry {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("proflow");
        // Help texts end without a period: the encoder adds one.
        macro_rules! family {
            ($name:literal, $help:literal, $ty:expr) => {{
                let f = $ty;
                registry.register($name, $help, f.clone());
                f
            }};
        }
        Telemetry {
            receiver_accepted_profiles: family!(
                "receiver_accepted_profiles",
                "Profiles a receiver accepted into the pipeline",
                Counters::default()
            ),
            receiver_accepted_bytes: family!(
                "receiver_accepted_bytes",
                "Payload bytes a receiver accepted into the pipeline",
                Counters::default()
            ),
            receiver_refused_profiles: family!(
                "receiver_refused_profiles",
                "Profiles a receiver refused, by reason",
                Counters::default()
            ),
            receiver_refused_requests: family!(
                "receiver_refused_requests",
                "Requests a receiver refused, by reason",
                Counters::default()
            ),
            processor_received_profiles: family!(
                "processor_received_profiles",
                "Profiles a processor was given",
                Counters::default()
            ),
            processor_dropped_profiles: family!(
                "processor_dropped_profiles",
                "Profiles a processor dropped, by reason",
                Counters::default()
            ),
            exporter_enqueued_profiles: family!(
                "exporter_enqueued_profiles",
                "Profiles put into an exporter's queue",
                Counters::default()
            ),
            exporter_sent_profiles: family!(
                "exporter_sent_profiles",
                "Profiles an exporter delivered",
                Counters::default()
            ),
            exporter_sent_bytes: family!(
                "exporter_sent_bytes",
                "Payload bytes an exporter delivered",
                Counters::default()
            ),
            exporter_failed_profiles: family!(
                "exporter_failed_profiles",
                "Profiles an exporter failed to deliver and gave up on, by reason",
                Counters::default()
            ),
            exporter_dropped_profiles: family!(
                "exporter_dropped_profiles",
                "Profiles dropped before an exporter's queue or left in it at shutdown, by reason",
                Counters::default()
            ),
            exporter_retries: family!(
                "exporter_retries",
                "Send attempts an exporter retried after a retryable failure",
                Counters::default()
            ),
            exporter_queue_waits: family!(
                "exporter_queue_waits",
                "Batches held back by an exporter's full queue, by how the wait ended (room, timeout: when_full applied after wait_when_full, stalled: applied at once after an earlier timeout)",
                Counters::default()
            ),
            exporter_queue_profiles: family!(
                "exporter_queue_profiles",
                "Profiles waiting in an exporter's queue",
                Gauges::default()
            ),
            exporter_queue_bytes: family!(
                "exporter_queue_bytes",
                "Payload bytes waiting in an exporter's queue",
                Gauges::default()
            ),
            exporter_send_duration: family!(
                "exporter_send_duration_seconds",
                "Time one export attempt took",
                new_histograms()
            ),
            exporter_queue_stored_bytes: family!(
                "exporter_queue_stored_bytes",
                "Bytes of an exporter's persistent queue files (sending_queue.storage)",
                Gauges::default()
            ),
            exporter_queue_stored_records: family!(
                "exporter_queue_stored_records",
                "Records in an exporter's persistent queue not yet finished",
                Gauges::default()
            ),
            exporter_queue_replayed_records: family!(
                "exporter_queue_replayed_records",
                "Records a persistent queue found unfinished when it opened, sent again",
                Counters::default()
            ),
            exporter_queue_corrupt: family!(
                "exporter_queue_corrupt",
                "Damaged stretches of a persistent queue's files found when it opened and skipped",
                Counters::default()
            ),
            exporter_queue_storage_errors: family!(
                "exporter_queue_storage_errors",
                "Writes or syncs of a persistent queue that failed",
                Counters::default()
            ),
            exporter_queue_fsync_duration: family!(
                "exporter_queue_fsync_duration_seconds",
                "Time one sync of a persistent queue took",
                new_histograms()
            ),
            memory_in_flight_bytes: family!(
                "memory_in_flight_bytes",
                "Bytes of request bodies and decompressed data receivers hold now (bounded by service.limits.max_in_flight_bytes)",
                Gauge::default()
            ),
            memory_limit_bytes: family!(
                "memory_limit_bytes",
                "service.limits.max_in_flight_bytes",
                Gauge::default()
            ),
            conversions: family!(
                "conversions",
                "Profiles converted between pprof and OTLP for the exporters that need the other form, by target format",
                Counters::default()
            ),
            conversion_failures: family!(
                "conversion_failures",
                "Profiles that could not be converted to the form an exporter needs, by target format",
                Counters::default()
            ),
            conversion_lost: family!(
                "conversion_lost",
                "Things a conversion between pprof and OTLP could not carry over, by what they were",
                Counters::default()
            ),
            scrapes: family!(
                "scrape_attempts",
                "Scrapes a pull receiver attempted, by job",
                Counters::default()
            ),
            scrape_failures: family!(
                "scrape_failures",
                "Scrapes that gave no profile, by job and reason (per target: /targets)",
                Counters::default()
            ),
            scrape_targets: family!(
                "scrape_targets",
                "Targets of a pull receiver, by job and state (active: scraped; dropped: by relabelling)",
                Gauges::default()
            ),
            scrape_delta_state_bytes: family!(
                "scrape_delta_state_bytes",
                "Memory held for client-side deltas of cumulative profiles (bounded by max_delta_state)",
                Gauges::default()
            ),
            scrape_delta_series: family!(
                "scrape_delta_series",
                "Target profiles whose previous values are held for client-side deltas",
                Gauges::default()
            ),
            scrape_duration: family!(
                "scrape_duration_seconds",
                "Time one scrape took, by job (CPU profiles last the interval minus one second)",
                new_histograms()
            ),
            ebpf_samples: family!(
                "ebpf_samples",
                "CPU samples an eBPF receiver took in user space (kernel threads and every process, idle excluded)",
                Counters::default()
            ),
            ebpf_sample_bytes: family!(
                "ebpf_sample_bytes",
                "Bytes of sample records read from the kernel (stacks and the copied user stack)",
                Counters::default()
            ),
            ebpf_user_stacks: family!(
                "ebpf_user_stacks",
                "User stacks by how they were unwound (complete: .eh_frame to the outermost frame; frame_pointers: the kernel's walk went further; truncated; none)",
                Counters::default()
            ),
            ebpf_samples_lost: family!(
                "ebpf_samples_lost",
                "CPU samples lost in the kernel because the ring buffer was full (raise ring_buffer_size)",
                Counters::default()
            ),
            ebpf_samples_dropped: family!(
                "ebpf_samples_dropped",
                "CPU samples an eBPF receiver read but did not keep, by reason (stacks_full, bad_record, filtered)",
                Counters::default()
            ),
            ebpf_processes: family!(
                "ebpf_processes",
                "Processes an eBPF receiver holds state for (mappings, labels, unwind tables)",
                Gauges::default()
            ),
            ebpf_symbol_cache_entries: family!(
                "ebpf_symbol_cache_entries",
                "Symbolized addresses an eBPF receiver keeps (bounded by symbol_cache_entries)",
                Gauges::default()
            ),
            symbolize_frames: family!(
                "symbolize_frames",
                "Frames a symbolize processor was asked to name, by result (symbolized, or why not: no_mapping, no_build_id, not_found, kernel_disabled, kernel_not_this_host, local_not_this_host, debuginfod_timeout)",
                Counters::default()
            ),
            symbolize_cache_hits: family!(
                "symbolize_cache_hits",
                "Addresses a symbolize processor named from its cache",
                Counters::default()
            ),
            symbolize_debuginfod_fetches: family!(
                "symbolize_debuginfod_fetches",
                "Debug files a symbolize processor fetched from debuginfod servers, by result (found, not_found: every server answered 404, error)",
                Counters::default()
            ),
            symbolize_cache_entries: family!(
                "symbolize_cache_entries",
                "Symbolized addresses a symbolize processor keeps (bounded by symbol_cache_entries)",
                Gauges::default()
            ),
            symbolize_open_files: family!(
                "symbolize_open_files",
                "Files a symbolize processor holds open: up to open_binaries binaries or debug files, each with the debug file its .gnu_debuglink names, and the dwz files they need",
                Gauges::default()
            ),
            symbolize_stuck_workers: family!(
                "symbolize_stuck_workers",
                "Worker threads a symbolize processor gave up on (a batch took longer than 30s: a file system that does not answer) that have not returned yet; at most 2",
                Gauges::default()
            ),
            symbolize_skipped_profiles: family!(
                "symbolize_skipped_profiles",
                "Profiles a symbolize processor passed on as they came without naming them, by reason (worker_timeout: their batch took longer than 30s; workers_stuck: the most workers that may be stuck are; worker_failed: the worker stopped)",
                Counters::default()
            ),
            receiver_accepted_spans: family!(
                "receiver_accepted_spans",
                "Spans a receiver took for the span index of its traces pipelines' processors",
                Counters::default()
            ),
            receiver_refused_spans: family!(
                "receiver_refused_spans",
                "Spans a receiver refused (ids of the wrong length or all zero)",
                Counters::default()
            ),
            trace_link_samples: family!(
                "trace_link_samples",
                "Samples a trace_link processor read a span from, by result (linked; no_trace_id: the span's trace is unknown; malformed: an id that is not one)",
                Counters::default()
            ),
            trace_link_spans_indexed: family!(
                "trace_link_spans_indexed",
                "Spans a trace_link processor put in its span index",
                Counters::default()
            ),
            trace_link_spans_evicted: family!(
                "trace_link_spans_evicted",
                "Spans a trace_link processor's index let go, by reason (window, max_spans)",
                Counters::default()
            ),
            trace_link_waits: family!(
                "trace_link_waits",
                "Batches a trace_link processor held for spans not yet indexed, by result (found: every span arrived; timed_out: went on after `wait` with some unlinked)",
                Counters::default()
            ),
            trace_link_index_spans: family!(
                "trace_link_index_spans",
                "Spans in a trace_link processor's index (bounded by max_spans)",
                Gauges::default()
            ),
            trace_link_index_bytes: family!(
                "trace_link_index_bytes",
                "Memory a trace_link processor's span index holds",
                Gauges::default()
            ),
            targets: Default::default(),
            lost_logged: Default::default(),
            losses: Default::default(),
            registry,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts one conversion to `to` and what it lost; each kind of loss is
    /// logged once.
    pub fn converted(&self, to: crate::model::Format, lost: &crate::otlp::Lost) {
        self.conversions
            .get_or_create(&vec![("to", to.to_string())])
            .inc();
        for (what, n) in &lost.counts {
            self.conversion_lost
                .get_or_create(&vec![("what", (*what).to_owned())])
                .inc_by(*n as u64);
            let first = self
                .lost_logged
                .lock()
                .map(|mut l| l.insert(*what))
                .unwrap_or(false);
            if first {
                tracing::warn!(
                    what,
                    to = %to,
                    "converting profiles to {to} loses {what}: the other format has no place for them (counted in proflow_conversion_lost_total; logged once)"
                );
            }
        }
    }

    /// Counts a profile that could not be converted to `to`.
    pub fn conversion_failed(&self, to: crate::model::Format) {
        self.conversion_failures
            .get_or_create(&vec![("to", to.to_string())])
            .inc();
    }

    /// The collector's in-flight memory budget, reporting through
    /// `proflow_memory_in_flight_bytes` and `proflow_memory_limit_bytes`.
    pub fn memory_budget(&self, limit: usize) -> crate::memory::MemoryBudget {
        self.memory_limit_bytes.set(limit as i64);
        crate::memory::MemoryBudget::with_gauge(limit, self.memory_in_flight_bytes.clone())
    }

    pub fn receiver(self: &Arc<Self>, id: &str) -> ReceiverTelemetry {
        ReceiverTelemetry {
            t: self.clone(),
            id: vec![("receiver", id.to_string())],
        }
    }

    pub fn processor(self: &Arc<Self>, id: &str) -> ProcessorTelemetry {
        ProcessorTelemetry {
            t: self.clone(),
            id: vec![("processor", id.to_string())],
        }
    }

    pub fn exporter(self: &Arc<Self>, id: &str) -> ExporterTelemetry {
        ExporterTelemetry {
            t: self.clone(),
            id: vec![("exporter", id.to_string())],
            gauges_muted: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Metric handle of a pull (scrape) receiver.
    pub fn scrape(self: &Arc<Self>, id: &str) -> ScrapeTelemetry {
        ScrapeTelemetry {
            t: self.clone(),
            id: vec![("receiver", id.to_string())],
        }
    }

    /// Metric handle of an eBPF receiver.
    pub fn ebpf(self: &Arc<Self>, id: &str) -> EbpfTelemetry {
        EbpfTelemetry {
            t: self.clone(),
            id: vec![("receiver", id.to_string())],
        }
    }

    /// The metric handle of a `symbolize` processor.
    pub fn symbolize(self: &Arc<Self>, id: &str) -> SymbolizeTelemetry {
        SymbolizeTelemetry {
            t: self.clone(),
            id: vec![("processor", id.to_string())],
        }
    }

    /// The metric handle of a `trace_link` processor.
    pub fn trace_link(self: &Arc<Self>, id: &str) -> TraceLinkTelemetry {
        TraceLinkTelemetry {
            t: self.clone(),
            id: vec![("processor", id.to_string())],
        }
    }

    /// Adds a pull receiver's targets to `/targets`.
    pub fn register_targets(&self, receiver: &str, view: TargetsView) {
        if let Ok(mut targets) = self.targets.lock() {
            targets.retain(|(id, _)| id != receiver);
            targets.push((receiver.to_owned(), view));
        }
    }

    /// Takes a pull receiver's targets off `/targets` when it stops, if
    /// `view` is still the one registered under its id (a receiver replaced
    /// by a reload leaves its successor's).
    pub fn unregister_targets(&self, receiver: &str, view: &TargetsView) {
        if let Ok(mut targets) = self.targets.lock() {
            targets.retain(|(id, v)| !(id == receiver && Arc::ptr_eq(v, view)));
        }
    }

    /// `/targets`: every pull receiver's active and dropped targets, each
    /// object tagged with its `receiver`.
    pub fn targets_json(&self) -> serde_json::Value {
        let views: Vec<(String, TargetsView)> =
            self.targets.lock().map(|t| t.clone()).unwrap_or_default();
        let mut active = Vec::new();
        let mut dropped = Vec::new();
        for (receiver, view) in views {
            let (a, d) = view();
            let tag = |mut v: serde_json::Value| {
                if let Some(o) = v.as_object_mut() {
                    o.insert("receiver".to_owned(), receiver.clone().into());
                }
                v
            };
            active.extend(a.into_iter().map(tag));
            dropped.extend(d.into_iter().map(tag));
        }
        serde_json::json!({"activeTargets": active, "droppedTargets": dropped})
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// The metrics in Prometheus text exposition format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}

/// RFC 3339 UTC timestamp (`2000-02-29T00:00:00Z`) of Unix seconds, for
/// `/targets` and peers that want one (civil-from-days; no calendar crate).
pub fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn with(id: &LabelSet, k: &'static str, v: &str) -> LabelSet {
    let mut l = id.clone();
    l.push((k, v.to_string()));
    l
}

/// Metric handle of one receiver.
#[derive(Clone, Debug)]
pub struct ReceiverTelemetry {
    t: Arc<Telemetry>,
    id: LabelSet,
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
    t: Arc<Telemetry>,
    id: LabelSet,
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
    t: Arc<Telemetry>,
    id: LabelSet,
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
        let labels = with(&self.id, "reason", reason);
        self.t.ebpf_samples_dropped.get_or_create(&labels).inc();
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
}

/// Metric handle of a `trace_link` processor.
#[derive(Clone, Debug)]
pub struct TraceLinkTelemetry {
    t: Arc<Telemetry>,
    id: LabelSet,
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
    t: Arc<Telemetry>,
    id: LabelSet,
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

/// Metric handle of one processor.
#[derive(Clone, Debug)]
pub struct ProcessorTelemetry {
    t: Arc<Telemetry>,
    id: LabelSet,
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

/// What one exporter lost since the collector started (its metrics say the
/// same by reason): what the shutdown report adds to what was left queued.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Losses {
    /// Dropped by a full `drop_newest` queue.
    pub dropped: u64,
    /// Given up on: refused for good by the peer, retries ran out, or the
    /// exporter failed.
    pub failed: u64,
}

impl Telemetry {
    /// Each exporter's losses since the start, by id (only exporters that lost any).
    pub fn losses(&self) -> std::collections::BTreeMap<String, Losses> {
        self.losses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn add_loss(&self, id: &LabelSet, add: impl FnOnce(&mut Losses)) {
        let Some((_, name)) = id.first() else { return };
        let mut losses = self
            .losses
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match losses.get_mut(name) {
            Some(l) => add(l),
            None => {
                let mut l = Losses::default();
                add(&mut l);
                losses.insert(name.clone(), l);
            }
        }
    }
}

/// Metric handle of one exporter (its queue reports through it too).
#[derive(Clone, Debug)]
pub struct ExporterTelemetry {
    t: Arc<Telemetry>,
    id: LabelSet,
    /// Set for the queue of an exporter a reload replaced: its successor,
    /// under the same id, alone sets the queue gauges.
    gauges_muted: Arc<AtomicBool>,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
    }

    #[test]
    fn targets_page_tags_each_receivers_targets() {
        let t = Arc::new(Telemetry::new());
        t.register_targets(
            "scrape",
            Arc::new(|| {
                (
                    vec![serde_json::json!({"scrapeUrl": "http://h:1/x"})],
                    Vec::new(),
                )
            }),
        );
        let page = t.targets_json();
        assert_eq!(page["activeTargets"][0]["receiver"], "scrape");
        assert_eq!(page["activeTargets"][0]["scrapeUrl"], "http://h:1/x");
        assert_eq!(page["droppedTargets"].as_array().map(Vec::len), Some(0));
        t.scrape("scrape").failed("job", "connection");
        assert!(t.render().contains(
            "proflow_scrape_failures_total{receiver=\"scrape\",job=\"job\",reason=\"connection\"} 1"
        ));
        // A reload replaces the receiver: the new one registers, then the
        // old one stops, leaving the new one's targets; stopping for good
        // takes them off.
        let view = |url: &'static str| -> TargetsView {
            Arc::new(move || (vec![serde_json::json!({ "scrapeUrl": url })], Vec::new()))
        };
        let (old, new) = (view("http://old"), view("http://new"));
        t.register_targets("scrape", old.clone());
        t.register_targets("scrape", new.clone());
        t.unregister_targets("scrape", &old);
        assert_eq!(
            t.targets_json()["activeTargets"][0]["scrapeUrl"],
            "http://new"
        );
        t.unregister_targets("scrape", &new);
        assert_eq!(
            t.targets_json()["activeTargets"].as_array().map(Vec::len),
            Some(0)
        );
    }

    #[test]
    fn a_replaced_queue_leaves_the_gauges_to_its_successor() {
        let t = Arc::new(Telemetry::new());
        let (old, new) = (t.exporter("file"), t.exporter("file"));
        old.mute_gauges();
        new.queue_level(1, 100);
        old.queue_level(7, 700);
        old.queue_stored(9, 9);
        old.enqueued(3);
        let text = t.render();
        assert!(
            text.contains(r#"proflow_exporter_queue_profiles{exporter="file"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"proflow_exporter_queue_bytes{exporter="file"} 100"#),
            "{text}"
        );
        assert!(
            !text.contains("proflow_exporter_queue_stored_records{"),
            "{text}"
        );
        assert!(
            text.contains(r#"proflow_exporter_enqueued_profiles_total{exporter="file"} 3"#),
            "counters go on: {text}"
        );
    }

    #[test]
    fn renders_component_metrics() {
        let t = Arc::new(Telemetry::new());
        t.receiver("pprof_push").accepted(2, 100);
        t.receiver("pprof_push").refused("bad_request", 0);
        t.exporter("file").queue_level(3, 300);
        let text = t.render();
        assert!(
            text.contains(r#"proflow_receiver_accepted_profiles_total{receiver="pprof_push"} 2"#),
            "{text}"
        );
        assert!(text.contains(r#"proflow_receiver_refused_requests_total{receiver="pprof_push",reason="bad_request"} 1"#), "{text}");
        assert!(
            text.contains(r#"proflow_exporter_queue_bytes{exporter="file"} 300"#),
            "{text}"
        );
        let help: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP")).collect();
        assert!(!help.is_empty(), "{text}");
        for line in help {
            assert!(
                line.ends_with('.') && !line.ends_with(".."),
                "one period per help text: {line}"
            );
        }
    }
}
