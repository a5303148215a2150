//! Self-telemetry: the metrics every component reports, readiness, and the
//! pull receivers' targets (JSON in the shape of Prometheus's targets API).
//! The HTTP server that shows them is [`crate::admin`].
//!
//! Every component reports the metrics all of its kind share through a
//! handle ([`ReceiverTelemetry`], [`ProcessorTelemetry`],
//! [`ExporterTelemetry`]) whose methods update the core's families, so each
//! reports them under the same names. What only one component has it
//! declares itself, from a handle in its own folder, through
//! [`Telemetry::counters`], [`Telemetry::gauges`] and
//! [`Telemetry::histograms`] ([`families`] says how): the core names no
//! component.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use prometheus_client::metrics::gauge::Gauge;

mod families;
mod handles;
mod process;
mod service;
mod status;
mod tenants;
#[cfg(test)]
mod tests;

pub use tenants::{MAX_SHOWN_TENANTS, TenantBook, TenantRow};

use families::Families;
pub use families::{
    Counters, FloatGauges, Gauges, Histograms, LabelSet, new_histograms, with_label,
};
pub use handles::{ExporterTelemetry, ProcessorTelemetry, ReceiverTelemetry};
pub use service::ConfigSource;
use service::ServiceFamilies;
use status::StatusBook;
pub use status::{ConfigInfo, LastError, PipelineView};

/// All metric families of one running collector.
pub struct Telemetry {
    families: Families,
    receivers: ReceiverFamilies,
    processors: ProcessorFamilies,
    exporters: ExporterFamilies,
    service: ServiceFamilies,
    status: StatusBook,
    ready: AtomicBool,
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
    /// What `/targets` shows: each pull receiver's view, by receiver id.
    targets: std::sync::Mutex<Vec<(String, TargetsView)>>,
}

/// The families every receiver reports (`proflow_receiver_*`).
struct ReceiverFamilies {
    accepted_profiles: Counters,
    accepted_bytes: Counters,
    refused_profiles: Counters,
    refused_requests: Counters,
    accepted_spans: Counters,
    refused_spans: Counters,
    lost_samples: Counters,
    lost_parts: Counters,
    empty_requests: Counters,
    upgraded_requests: Counters,
    tenant_refused_requests: Counters,
}

impl ReceiverFamilies {
    fn declare(families: &Families) -> Self {
        ReceiverFamilies {
            accepted_profiles: families.family(
                "receiver_accepted_profiles",
                "Profiles a receiver accepted into the pipeline",
                Counters::default,
            ),
            accepted_bytes: families.family(
                "receiver_accepted_bytes",
                "Payload bytes a receiver accepted into the pipeline",
                Counters::default,
            ),
            refused_profiles: families.family(
                "receiver_refused_profiles",
                "Profiles a receiver refused, by reason",
                Counters::default,
            ),
            refused_requests: families.family(
                "receiver_refused_requests",
                "Requests a receiver refused, by reason",
                Counters::default,
            ),
            accepted_spans: families.family(
                "receiver_accepted_spans",
                "Spans a receiver took for the span index of its traces pipelines' processors",
                Counters::default,
            ),
            refused_spans: families.family(
                "receiver_refused_spans",
                "Spans a receiver refused (ids of the wrong length or all zero)",
                Counters::default,
            ),
            lost_samples: families.family(
                "receiver_lost_samples",
                "Samples that arrived in an accepted request but could not be carried by its conversion, by reason",
                Counters::default,
            ),
            lost_parts: families.family(
                "receiver_lost_parts",
                "Parts of accepted samples (a frame, a label) that a conversion could not carry, by part and reason; the sample itself arrives",
                Counters::default,
            ),
            empty_requests: families.family(
                "receiver_empty_requests",
                "Accepted requests whose non-empty body held no sample to store, by format",
                Counters::default,
            ),
            upgraded_requests: families.family(
                "receiver_upgraded_requests",
                "Requests of an older layout a receiver converted to the current one, by layout (otlp_1_9: OTLP profiles 1.9)",
                Counters::default,
            ),
            tenant_refused_requests: families.family(
                "receiver_tenant_refused_requests",
                "Requests a receiver refused for a per-tenant limit (limits), by tenant (the first 100 tenants refused by name, the rest as other) and reason",
                Counters::default,
            ),
        }
    }
}

/// The families every processor reports (`proflow_processor_*`).
struct ProcessorFamilies {
    received_profiles: Counters,
    dropped_profiles: Counters,
}

impl ProcessorFamilies {
    fn declare(families: &Families) -> Self {
        ProcessorFamilies {
            received_profiles: families.family(
                "processor_received_profiles",
                "Profiles a processor was given",
                Counters::default,
            ),
            dropped_profiles: families.family(
                "processor_dropped_profiles",
                "Profiles a processor dropped, by reason",
                Counters::default,
            ),
        }
    }
}

/// The families every exporter and its queue report (`proflow_exporter_*`).
struct ExporterFamilies {
    queue_capacity_profiles: Gauges,
    queue_capacity_bytes: Gauges,
    enqueued_profiles: Counters,
    sent_profiles: Counters,
    sent_bytes: Counters,
    failed_profiles: Counters,
    dropped_profiles: Counters,
    retries: Counters,
    queue_waits: Counters,
    queue_profiles: Gauges,
    queue_bytes: Gauges,
    send_duration: Histograms,
    queue_stored_bytes: Gauges,
    queue_stored_records: Gauges,
    queue_replayed_records: Counters,
    queue_corrupt: Counters,
    queue_storage_errors: Counters,
    queue_fsync_duration: Histograms,
}

impl ExporterFamilies {
    fn declare(families: &Families) -> Self {
        ExporterFamilies {
            enqueued_profiles: families.family(
                "exporter_enqueued_profiles",
                "Profiles put into an exporter's queue",
                Counters::default,
            ),
            sent_profiles: families.family(
                "exporter_sent_profiles",
                "Profiles an exporter delivered",
                Counters::default,
            ),
            sent_bytes: families.family(
                "exporter_sent_bytes",
                "Payload bytes an exporter delivered",
                Counters::default,
            ),
            failed_profiles: families.family(
                "exporter_failed_profiles",
                "Profiles an exporter failed to deliver and gave up on, by reason",
                Counters::default,
            ),
            dropped_profiles: families.family(
                "exporter_dropped_profiles",
                "Profiles dropped before an exporter's queue or left in it at shutdown, by reason",
                Counters::default,
            ),
            retries: families.family(
                "exporter_retries",
                "Send attempts an exporter retried after a retryable failure",
                Counters::default,
            ),
            queue_waits: families.family(
                "exporter_queue_waits",
                "Batches held back by an exporter's full queue, by how the wait ended (room, timeout: when_full applied after wait_when_full, stalled: applied at once after an earlier timeout)",
                Counters::default,
            ),
            queue_profiles: families.family(
                "exporter_queue_profiles",
                "Profiles waiting in an exporter's queue",
                Gauges::default,
            ),
            queue_bytes: families.family(
                "exporter_queue_bytes",
                "Payload bytes waiting in an exporter's queue",
                Gauges::default,
            ),
            queue_capacity_profiles: families.family(
                "exporter_queue_capacity_profiles",
                "Most profiles an exporter's queue holds (sending_queue.queue_size)",
                Gauges::default,
            ),
            queue_capacity_bytes: families.family(
                "exporter_queue_capacity_bytes",
                "Most payload bytes an exporter's queue holds (sending_queue.max_bytes)",
                Gauges::default,
            ),
            send_duration: families.family(
                "exporter_send_duration_seconds",
                "Time one export attempt took",
                new_histograms,
            ),
            queue_stored_bytes: families.family(
                "exporter_queue_stored_bytes",
                "Bytes of an exporter's persistent queue files (sending_queue.storage)",
                Gauges::default,
            ),
            queue_stored_records: families.family(
                "exporter_queue_stored_records",
                "Records in an exporter's persistent queue not yet finished",
                Gauges::default,
            ),
            queue_replayed_records: families.family(
                "exporter_queue_replayed_records",
                "Records a persistent queue found unfinished when it opened, sent again",
                Counters::default,
            ),
            queue_corrupt: families.family(
                "exporter_queue_corrupt",
                "Damaged stretches of a persistent queue's files found when it opened and skipped",
                Counters::default,
            ),
            queue_storage_errors: families.family(
                "exporter_queue_storage_errors",
                "Writes or syncs of a persistent queue that failed",
                Counters::default,
            ),
            queue_fsync_duration: families.family(
                "exporter_queue_fsync_duration_seconds",
                "Time one sync of a persistent queue took",
                new_histograms,
            ),
        }
    }
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
        let families = Families::new();
        // Help texts end without a period: the encoder adds one.
        macro_rules! family {
            ($name:literal, $help:literal, $ty:expr) => {
                families.family($name, $help, || $ty)
            };
        }
        Telemetry {
            receivers: ReceiverFamilies::declare(&families),
            processors: ProcessorFamilies::declare(&families),
            exporters: ExporterFamilies::declare(&families),
            service: ServiceFamilies::declare(&families),
            status: StatusBook::new(),
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
            targets: Default::default(),
            lost_logged: Default::default(),
            losses: Default::default(),
            families,
            ready: AtomicBool::new(false),
        }
    }

    /// Counts one conversion to `to` and what it lost; each kind of loss is
    /// logged once.
    pub fn converted(&self, to: proflow_model::model::Format, lost: &proflow_model::otlp::Lost) {
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
    pub fn conversion_failed(&self, to: proflow_model::model::Format) {
        self.conversion_failures
            .get_or_create(&vec![("to", to.to_string())])
            .inc();
    }

    /// Counts a config reload from `source` and whether it applied in full.
    pub fn config_reloaded(&self, source: ConfigSource, ok: bool) {
        self.service.reloaded(source, ok);
    }

    /// The config running from now on (the status page shows it).
    pub fn config_applied(&self, info: ConfigInfo) {
        self.status.set_config(info);
    }

    /// The config running now, if one was reported.
    pub fn config(&self) -> Option<ConfigInfo> {
        self.status.config()
    }

    /// The pipelines running from now on.
    pub fn set_pipelines(&self, pipelines: Vec<PipelineView>) {
        self.status.set_pipelines(pipelines);
    }

    pub fn pipelines(&self) -> Vec<PipelineView> {
        self.status.pipelines()
    }

    /// How long the collector has run, and since when.
    pub fn uptime(&self) -> (std::time::Duration, std::time::SystemTime) {
        (self.status.started.elapsed(), self.status.started_at)
    }

    /// The last error of the `kind` (`receiver`, `processor`, `exporter`)
    /// `id`, if it had one.
    pub fn last_error(&self, kind: &'static str, id: &str) -> Option<LastError> {
        self.status.last_error(kind, id)
    }

    /// The collector's in-flight memory budget, reporting through
    /// `proflow_memory_in_flight_bytes` and `proflow_memory_limit_bytes`.
    pub fn memory_budget(&self, limit: usize) -> proflow_model::memory::MemoryBudget {
        self.memory_limit_bytes.set(limit as i64);
        proflow_model::memory::MemoryBudget::with_gauge(limit, self.memory_in_flight_bytes.clone())
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

    /// A counter family a component declares for itself, `proflow_<name>_total`
    /// (the one already declared, if any: see [`families`]).
    pub fn counters(&self, name: &'static str, help: &'static str) -> Counters {
        self.families.family(name, help, Counters::default)
    }

    /// A gauge family a component declares for itself, `proflow_<name>`.
    pub fn gauges(&self, name: &'static str, help: &'static str) -> Gauges {
        self.families.family(name, help, Gauges::default)
    }

    /// A histogram family a component declares for itself, `proflow_<name>`
    /// (name it `..._seconds` for times).
    pub fn histograms(&self, name: &'static str, help: &'static str) -> Histograms {
        self.families.family(name, help, new_histograms)
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
            .unwrap_or(proflow_model::model::ANONYMOUS_TENANT);
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
        self.families.render(&mut out, &process::render());
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
