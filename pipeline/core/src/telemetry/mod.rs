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

mod handles;
mod tenants;
#[cfg(test)]
mod tests;

pub use tenants::{MAX_SHOWN_TENANTS, TenantBook, TenantRow};

pub use handles::{
    EbpfTelemetry, ExporterTelemetry, K8sAttributesTelemetry, ProcessorTelemetry,
    ReceiverTelemetry, ScrapeTelemetry, SymbolizeTelemetry, TraceLinkTelemetry,
};

type LabelSet = Vec<(&'static str, String)>;
type Counters = Family<LabelSet, Counter>;
type Gauges = Family<LabelSet, Gauge>;
type FloatGauges = Family<LabelSet, Gauge<f64, std::sync::atomic::AtomicU64>>;

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
    ebpf_state_bytes: Gauges,
    ebpf_state_refusals: Counters,
    symbolize_frames: Counters,
    symbolize_cache_hits: Counters,
    symbolize_debuginfod_fetches: Counters,
    symbolize_cache_entries: Gauges,
    symbolize_open_files: Gauges,
    symbolize_stuck_workers: Gauges,
    symbolize_skipped_profiles: Counters,
    receiver_accepted_spans: Counters,
    receiver_refused_spans: Counters,
    receiver_lost_samples: Counters,
    receiver_empty_requests: Counters,
    receiver_lost_parts: Counters,
    receiver_upgraded_requests: Counters,
    receiver_tenant_refused_requests: Counters,
    /// Tenants named on `receiver_tenant_refused_requests` so far (the
    /// rest are `other`).
    tenants_named: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Each tenant's volume and refusals (`/tenants`).
    tenants: TenantBook,
    tenant_profiles_per_second: FloatGauges,
    tenant_bytes_per_second: FloatGauges,
    /// (receiver, reason, sender) already logged for lost samples; bounded.
    lost_samples_logged:
        std::sync::Mutex<std::collections::HashSet<(String, &'static str, String)>>,
    trace_link_samples: Counters,
    trace_link_spans_indexed: Counters,
    trace_link_spans_evicted: Counters,
    trace_link_waits: Counters,
    trace_link_index_spans: Gauges,
    trace_link_index_bytes: Gauges,
    k8s_attributes_profiles: Counters,
    k8s_attributes_untrusted_labels_removed: Counters,
    k8s_attributes_cache_objects: Gauges,
    k8s_attributes_watch_failures: Gauges,
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
                "Samples (CPU ticks and off-CPU waits) an eBPF receiver did not keep, by reason (stacks_full, bad_record, filtered; off_cpu_rate, off_cpu_untracked and off_cpu_outside_syscall: waits the BPF program did not send)",
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
            ebpf_state_bytes: family!(
                "ebpf_state_bytes",
                "Memory an eBPF receiver keeps because of what the node's processes hold (perf map entries, unwind sections on the heap), bounded by max_state_size",
                Gauges::default()
            ),
            ebpf_state_refusals: family!(
                "ebpf_state_refusals",
                "What an eBPF receiver did not keep because max_state_size was used up, by use (perf_map: a map stopped at a line, at most once a second per process; unwind_section: a file's section left out)",
                Counters::default()
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
                "Debug files a symbolize processor fetched from debuginfod servers, by result (found, not_found: every server answered 404, error, over_budget: the in-flight budget had no room for the file, which is asked for again)",
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
            receiver_lost_samples: family!(
                "receiver_lost_samples",
                "Samples that arrived in an accepted request but could not be carried by its conversion, by reason",
                Counters::default()
            ),
            receiver_lost_parts: family!(
                "receiver_lost_parts",
                "Parts of accepted samples (a frame, a label) that a conversion could not carry, by part and reason; the sample itself arrives",
                Counters::default()
            ),
            receiver_empty_requests: family!(
                "receiver_empty_requests",
                "Accepted requests whose non-empty body held no sample to store, by format",
                Counters::default()
            ),
            receiver_upgraded_requests: family!(
                "receiver_upgraded_requests",
                "Requests of an older layout a receiver converted to the current one, by layout (otlp_1_9: OTLP profiles 1.9)",
                Counters::default()
            ),
            receiver_tenant_refused_requests: family!(
                "receiver_tenant_refused_requests",
                "Requests a receiver refused for a per-tenant limit (limits), by tenant (the first 100 tenants refused by name, the rest as other) and reason",
                Counters::default()
            ),
            tenants_named: Default::default(),
            tenants: TenantBook::default(),
            tenant_profiles_per_second: family!(
                "tenant_received_profiles_per_second",
                "Profiles a tenant brought into the pipelines, per second over the last minute (the 100 busiest tenants by name, the rest as other; /tenants lists them all)",
                FloatGauges::default()
            ),
            tenant_bytes_per_second: family!(
                "tenant_received_bytes_per_second",
                "Payload bytes a tenant brought into the pipelines, per second over the last minute (the 100 busiest tenants by name, the rest as other; /tenants lists them all)",
                FloatGauges::default()
            ),
            lost_samples_logged: Default::default(),
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
            k8s_attributes_profiles: family!(
                "k8s_attributes_profiles",
                "Profiles a k8s_attributes processor saw, by result (associated: a pod was found and its metadata added; not_found: an identifier named no known pod; no_identifier: the profile carried none of the pod_association sources)",
                Counters::default()
            ),
            k8s_attributes_untrusted_labels_removed: family!(
                "k8s_attributes_untrusted_labels_removed",
                "Identity labels (those the processor sets) a k8s_attributes processor removed from profiles pushed by senders outside its trusted_senders; the pod found by the connection sets them again",
                Counters::default()
            ),
            k8s_attributes_cache_objects: family!(
                "k8s_attributes_cache_objects",
                "Objects a k8s_attributes processor holds from its watches, by kind (pods, namespaces, nodes, replicasets)",
                Gauges::default()
            ),
            k8s_attributes_watch_failures: family!(
                "k8s_attributes_watch_failures",
                "Failed lists and watches of a k8s_attributes processor's caches so far, by kind (each is retried)",
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

    /// The metric handle of a `k8s_attributes` processor.
    pub fn k8s_attributes(self: &Arc<Self>, id: &str) -> K8sAttributesTelemetry {
        K8sAttributesTelemetry {
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

    /// `/targets` (and `/api/v1/targets`): every pull receiver's active and
    /// dropped targets, each object tagged with its `receiver`, in the
    /// envelope of Prometheus's targets API (`status`, `data`). `state` is
    /// Prometheus's filter: `active`, `dropped`, or `any`/unset for both;
    /// the list not asked for is empty.
    pub fn targets_json(&self, state: Option<&str>) -> serde_json::Value {
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
        let mut dropped_counts = serde_json::Map::new();
        for d in &dropped {
            let pool = d["scrapePool"].as_str().unwrap_or_default().to_owned();
            let n = dropped_counts.entry(pool).or_insert(0.into());
            *n = (n.as_u64().unwrap_or(0) + 1).into();
        }
        match state {
            Some("active") => dropped.clear(),
            Some("dropped") => active.clear(),
            _ => {}
        }
        serde_json::json!({
            "status": "success",
            "data": {
                "activeTargets": active,
                "droppedTargets": dropped,
                "droppedTargetCounts": dropped_counts,
            },
        })
    }

    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// `profiles` of `bytes` that `tenant` (`None`: `anonymous`) brought
    /// into a pipeline.
    pub fn tenant_accepted(&self, tenant: Option<&str>, profiles: u64, bytes: u64) {
        let tenant = tenant
            .filter(|t| !t.is_empty())
            .unwrap_or(crate::model::ANONYMOUS_TENANT);
        self.tenants.accepted(tenant, profiles, bytes);
    }

    /// `/tenants`: every tenant's volume, share of the last minute and
    /// refusals, the busiest first.
    pub fn tenants_json(&self) -> serde_json::Value {
        serde_json::json!({ "tenants": self.tenants.rows() })
    }

    /// The metrics in Prometheus text exposition format.
    pub fn render(&self) -> String {
        // The busiest tenants of the last minute, as they are now.
        self.tenant_profiles_per_second.clear();
        self.tenant_bytes_per_second.clear();
        for row in self.tenants.shown() {
            if row.profiles_total == 0 {
                // Refused only: listed on /tenants.
                continue;
            }
            let label = vec![("tenant", row.tenant)];
            self.tenant_profiles_per_second
                .get_or_create(&label)
                .set(row.profiles_per_second);
            self.tenant_bytes_per_second
                .get_or_create(&label)
                .set(row.bytes_per_second);
        }
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
