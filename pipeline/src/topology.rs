//! The running graph: [`plan`] turns a parsed config [`Document`] into a
//! checked [`Plan`] (every problem reported at once), [`Plan::start`] builds
//! and starts exporters, processors and receivers in that order, and
//! [`Running::shutdown`] stops them in reverse: receivers, then queues drain
//! up to `shutdown_timeout`, then exporters.
//!
//! A receiver's batches go through each of its pipelines' processors in order,
//! then to every exporter queue of those pipelines. Admission is all or
//! nothing across `block` queues, so a refused batch (429) leaves no copies
//! behind and the sender's retry creates no duplicates.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proflow_config::{ComponentId, Document, Error, Errors, Located, TelemetryConfig};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::component::{
    Admission, BuildContext, BuildError, ConsumeError, Consumer, Exporter, Processor,
    ReceiverContext, Resource,
};
use crate::delivery::Outcome;
use crate::model::{Batch, Envelope, Format, Payload, batch_bytes};
use crate::otlp::Lost;
use crate::queue::{ExporterQueue, Refusal, Reservation, WhenFull};
use crate::registry::{AnyConfig, Kind, Registry};
use crate::spans::{Span, SpanConsumer};
use crate::telemetry::{ProcessorTelemetry, Telemetry};

/// How long a refused sender is told to wait before retrying.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long receivers get to finish in-flight requests at shutdown.
const RECEIVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The least time exporters get to close after the drain, even when the
/// drain used all of `shutdown_timeout`.
const EXPORTER_SHUTDOWN_MIN: Duration = Duration::from_secs(1);

/// What a pipeline carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `profiles`, `profiles/<name>`: receivers → processors → exporters.
    Profiles,
    /// `traces`, `traces/<name>`: receivers → span-taking processors (their
    /// span index); proflow exports no traces.
    Traces,
}

/// One pipeline by component ids.
#[derive(Debug, Clone)]
pub struct PipelinePlan {
    pub id: String,
    pub signal: Signal,
    pub receivers: Vec<String>,
    pub processors: Vec<String>,
    pub exporters: Vec<String>,
}

/// A checked configuration, ready to start.
#[derive(Debug)]
pub struct Plan {
    receivers: BTreeMap<String, Arc<dyn crate::component::ReceiverConfig>>,
    processors: BTreeMap<String, Arc<dyn crate::component::ProcessorConfig>>,
    exporters: BTreeMap<String, Arc<dyn crate::component::ExporterConfig>>,
    pub pipelines: Vec<PipelinePlan>,
    pub telemetry: TelemetryConfig,
    pub shutdown_timeout: Duration,
    /// `service.limits.max_in_flight_bytes`.
    pub max_in_flight_bytes: usize,
    /// Things worth saying that do not stop the collector (unused components).
    pub warnings: Vec<String>,
    /// Each component's config as text without positions, by
    /// `<section>.<id>`: what a reload compares.
    fingerprints: HashMap<String, String>,
}

struct Defined {
    kind: Kind,
    line: usize,
    column: usize,
    path: String,
}

/// Reads every component through the registry, validates it, and checks the
/// pipelines and claimed resources. Returns all problems at once.
pub fn plan(doc: &Document, registry: &Registry) -> Result<Plan, Errors> {
    let mut errors = Errors::default();
    let mut receivers = BTreeMap::new();
    let mut processors = BTreeMap::new();
    let mut exporters = BTreeMap::new();
    let mut defined: HashMap<(Kind, String), Defined> = HashMap::new();
    let mut claims: Vec<(Resource, String)> = Vec::new();
    let mut fingerprints: HashMap<String, String> = HashMap::new();

    if let Ok(Some(addr)) = doc.service.telemetry.socket_addr() {
        claims.push((Resource::TcpListen(addr), "service.telemetry".into()));
    }
    if let Some(tls) = &doc.service.telemetry.tls {
        use crate::server::ServerTlsFiles;
        for p in tls.problems("service.telemetry.tls") {
            errors.push(Error::new(&p.path, 0, 0, p.message));
        }
    }

    for (kind, entries) in [
        (Kind::Receiver, &doc.receivers),
        (Kind::Processor, &doc.processors),
        (Kind::Exporter, &doc.exporters),
    ] {
        for entry in entries {
            let id = entry.id.to_string();
            let Some(factory) = registry.get(kind, &entry.id.kind) else {
                errors.push(
                    Error::new(
                        &entry.path,
                        entry.line,
                        entry.column,
                        format!(
                            "unknown {kind} type `{}`; known types: {}",
                            entry.id.kind,
                            registry.names(kind).join(", ")
                        ),
                    )
                    .in_component(format!("{}::{id}", kind.section())),
                );
                continue;
            };
            fingerprints.insert(format!("{}.{id}", kind.section()), entry.body.fingerprint());
            defined.insert(
                (kind, id.clone()),
                Defined {
                    kind,
                    line: entry.line,
                    column: entry.column,
                    path: entry.path.clone(),
                },
            );
            match factory.parse(&entry.body, &entry.path) {
                Err(errs) => {
                    for e in errs {
                        errors.push(e.in_component(format!("{}::{id}", kind.section())));
                    }
                }
                Ok(config) => {
                    let resources = match &config {
                        AnyConfig::Receiver(c) => c.resources(),
                        AnyConfig::Exporter(c) => c.resources(),
                        AnyConfig::Processor(_) => Vec::new(),
                    };
                    for r in resources {
                        let owner = format!("{}::{id}", kind.section());
                        if let Some((_, other)) = claims.iter().find(|(c, _)| conflicts(c, &r)) {
                            errors.push(
                                Error::new(&entry.path, entry.line, entry.column, format!("{} is already used by {other}; give each component its own", describe(&r)))
                                    .in_component(owner.clone()),
                            );
                        } else {
                            claims.push((r, owner));
                        }
                    }
                    match config {
                        AnyConfig::Receiver(c) => {
                            receivers.insert(id, c);
                        }
                        AnyConfig::Processor(c) => {
                            processors.insert(id, c);
                        }
                        AnyConfig::Exporter(c) => {
                            exporters.insert(id, c);
                        }
                    }
                }
            }
        }
    }

    let mut used: HashSet<(Kind, String)> = HashSet::new();
    let mut pipelines = Vec::new();
    for (pid, p) in &doc.service.pipelines {
        let mut check =
            |kind: Kind, refs: &[Located<String>], errors: &mut Errors| -> Vec<String> {
                let mut seen = HashSet::new();
                let mut out = Vec::new();
                for r in refs {
                    if let Err(msg) = ComponentId::parse(&r.value) {
                        errors.push(Error::new(&r.path, r.line, r.column, msg));
                        continue;
                    }
                    if !defined.contains_key(&(kind, r.value.clone())) {
                        errors.push(Error::new(
                            &r.path,
                            r.line,
                            r.column,
                            format!(
                                "{kind} `{}` is not defined: add it under `{}:` or fix the name",
                                r.value,
                                kind.section()
                            ),
                        ));
                        continue;
                    }
                    if !seen.insert(r.value.clone()) {
                        errors.push(Error::new(
                            &r.path,
                            r.line,
                            r.column,
                            format!("{kind} `{}` is listed twice in this pipeline", r.value),
                        ));
                        continue;
                    }
                    used.insert((kind, r.value.clone()));
                    out.push(r.value.clone());
                }
                out
            };
        let receivers_ = check(Kind::Receiver, &p.receivers, &mut errors);
        let processors_ = check(Kind::Processor, &p.processors, &mut errors);
        let exporters_ = check(Kind::Exporter, &p.exporters, &mut errors);
        let signal = if pid.value == "traces" || pid.value.starts_with("traces/") {
            Signal::Traces
        } else {
            Signal::Profiles
        };
        let at = |errors: &mut Errors, message: String| {
            errors.push(Error::new(&pid.path, pid.line, pid.column, message));
        };
        match signal {
            Signal::Profiles => {
                for (what, list) in [("receiver", &p.receivers), ("exporter", &p.exporters)] {
                    if list.is_empty() {
                        at(
                            &mut errors,
                            format!("pipeline `{}` needs at least one {what}", pid.value),
                        );
                    }
                }
            }
            Signal::Traces => {
                if p.receivers.is_empty() {
                    at(
                        &mut errors,
                        format!(
                            "pipeline `{}` needs at least one receiver, such as otlp",
                            pid.value
                        ),
                    );
                }
                if p.processors.is_empty() {
                    at(
                        &mut errors,
                        format!(
                            "pipeline `{}` needs a processor to feed: a trace_link with a span_index",
                            pid.value
                        ),
                    );
                }
                if !p.exporters.is_empty() {
                    at(
                        &mut errors,
                        format!(
                            "pipeline `{}` lists exporters, but proflow exports no traces: a traces pipeline only feeds the span index of its trace_link processors; remove `exporters`",
                            pid.value
                        ),
                    );
                }
                for r in &p.receivers {
                    if receivers.get(&r.value).is_some_and(
                        |c: &Arc<dyn crate::component::ReceiverConfig>| !c.accepts_spans(),
                    ) {
                        errors.push(Error::new(&r.path, r.line, r.column, format!("receiver `{}` takes no traces; in a traces pipeline use an otlp receiver", r.value)));
                    }
                }
                for r in &p.processors {
                    if processors.get(&r.value).is_some_and(
                        |c: &Arc<dyn crate::component::ProcessorConfig>| !c.takes_spans(),
                    ) {
                        errors.push(Error::new(&r.path, r.line, r.column, format!("processor `{}` takes no spans; a traces pipeline feeds trace_link processors that have a span_index", r.value)));
                    }
                }
            }
        }
        pipelines.push(PipelinePlan {
            id: pid.value.clone(),
            signal,
            receivers: receivers_,
            processors: processors_,
            exporters: exporters_,
        });
    }

    let mut warnings = Vec::new();
    let mut unused: Vec<_> = defined.iter().filter(|(k, _)| !used.contains(k)).collect();
    unused.sort_by_key(|(_, d)| d.line);
    for ((_, id), d) in unused {
        warnings.push(format!(
            "line {}:{}: {} `{id}` is defined at `{}` but used by no pipeline",
            d.line, d.column, d.kind, d.path
        ));
    }

    for (id, config) in &processors {
        let listed = |signal: Signal| {
            pipelines
                .iter()
                .any(|p: &PipelinePlan| p.signal == signal && p.processors.contains(id))
        };
        if config.takes_spans() && listed(Signal::Profiles) && !listed(Signal::Traces) {
            warnings.push(format!(
                "processor `{id}` has a span index but no traces pipeline feeds it: samples that name a span only stay unlinked; add `traces: {{receivers: [otlp], processors: [{id}]}}`"
            ));
        }
        if listed(Signal::Traces) && !listed(Signal::Profiles) {
            warnings.push(format!(
                "processor `{id}` is fed spans but is in no profiles pipeline: its span index is never read; list it in the profiles pipeline whose samples it should link"
            ));
        }
    }

    let max_in_flight = doc.service.limits.max_in_flight_bytes.as_usize();
    let largest = receivers
        .iter()
        .map(|(id, c)| (id, c.max_request_memory()))
        .max_by_key(|(_, m)| *m);
    if max_in_flight == 0 {
        errors.push(Error::new(
            "service.limits.max_in_flight_bytes",
            0,
            0,
            "must be more than 0, such as 256MiB",
        ));
    } else if let Some((id, need)) =
        largest.filter(|(_, need)| *need > crate::memory::max_grant(max_in_flight))
    {
        errors.push(Error::new(
            "service.limits.max_in_flight_bytes",
            0,
            0,
            format!(
                "is {max_in_flight} bytes: one request may hold three quarters of it ({} bytes), less than one request of receiver `{id}` may need ({need} bytes: what it reads and decompresses); raise it to at least {} bytes or lower those limits",
                crate::memory::max_grant(max_in_flight),
                need.saturating_mul(4).div_ceil(3)
            ),
        ));
    }

    if !errors.is_empty() {
        return Err(errors.sorted());
    }
    Ok(Plan {
        receivers,
        processors,
        exporters,
        pipelines,
        telemetry: doc.service.telemetry.clone(),
        shutdown_timeout: doc.service.shutdown_timeout.get(),
        max_in_flight_bytes: max_in_flight,
        warnings,
        fingerprints,
    })
}

/// Two listeners conflict on the same port when their addresses are equal or
/// either is the unspecified address (`0.0.0.0`, `[::]`); two directories
/// conflict when one contains the other (one exporter's start-up clean-up
/// would delete the other's temporary files).
fn conflicts(a: &Resource, b: &Resource) -> bool {
    match (a, b) {
        (Resource::TcpListen(x), Resource::TcpListen(y)) => {
            x.port() == y.port()
                && x.port() != 0
                && (x.ip() == y.ip() || x.ip().is_unspecified() || y.ip().is_unspecified())
        }
        (Resource::Directory(x), Resource::Directory(y)) => x.starts_with(y) || y.starts_with(x),
        _ => false,
    }
}

fn describe(r: &Resource) -> String {
    match r {
        Resource::TcpListen(a) => format!("listen address {a}"),
        Resource::Directory(d) => format!("directory {}", d.display()),
    }
}

/// Runs a component's build inside a span naming it, so what the build
/// logs (a warning about its settings) says which component it is.
fn building<T>(id: &str, build: impl FnOnce() -> T) -> T {
    tracing::info_span!("build", component = %id).in_scope(build)
}

struct PipelineRuntime {
    processors: Vec<(Arc<dyn Processor>, ProcessorTelemetry)>,
    exporters: Vec<Arc<ExporterQueue>>,
    /// The payload forms this pipeline's exporters want.
    forms: Vec<Format>,
}

/// The consumer a receiver gets: runs each of its pipelines, then admits the
/// results to every exporter queue at once.
struct Fanout {
    pipelines: Vec<Arc<PipelineRuntime>>,
    telemetry: Arc<Telemetry>,
}

impl Fanout {
    /// Gives every profile the forms the pipeline's exporters want, before
    /// any queue counts it: each payload is converted once per consume call
    /// (`done` holds what other pipelines already converted) and shared by
    /// every exporter. A profile that cannot be converted keeps its form;
    /// the exporter that needs the other one reports it as failed.
    fn prepare(
        &self,
        forms: &[Format],
        envelopes: &mut [Envelope],
        done: &mut HashMap<(usize, Format), Payload>,
    ) {
        for form in forms {
            for e in envelopes.iter_mut() {
                if e.payload.has(*form) {
                    continue;
                }
                let key = (e.payload.identity(), *form);
                if let Some(p) = done.get(&key) {
                    e.payload = p.clone();
                    continue;
                }
                let mut lost = Lost::default();
                match e.payload.with_form(*form, &mut lost) {
                    Ok(p) => {
                        self.telemetry.converted(*form, &lost);
                        done.insert(key, p.clone());
                        e.payload = p;
                    }
                    Err(err) => {
                        self.telemetry.conversion_failed(*form);
                        tracing::debug!(error = %err, series = %e.labels.to_selector_string(), "profile not converted to {form}");
                    }
                }
            }
        }
    }
}

/// The span consumer of a receiver in several `traces` pipelines (or one
/// with several span-taking processors): every one gets every span.
struct SpanFanout(Vec<Arc<dyn SpanConsumer>>);

impl SpanConsumer for SpanFanout {
    fn consume_spans(&self, spans: &[Span]) {
        for c in &self.0 {
            c.consume_spans(spans);
        }
    }
}

/// One exporter queue's part of a fan-out.
struct Target {
    queue: Arc<ExporterQueue>,
    envelopes: Vec<Envelope>,
    bytes: usize,
}

impl Fanout {
    /// Reserves room for every target's copy, holding the batch back while
    /// a queue is full (see [`Admission`]): each full queue is waited for up
    /// to its `wait_when_full` (at once when it is stalled), then its
    /// `when_full` applies. Returns one reservation per target, `None` for a
    /// `drop_newest` copy given up on (the caller drops it), or the refusal.
    /// Nothing stays reserved while waiting or when refused.
    async fn reserve_all(
        targets: &[Target],
        admission: Admission,
    ) -> Result<Vec<Option<Reservation>>, ConsumeError> {
        // Made only once a queue is full: the usual call allocates none.
        let (mut given_up, mut waited) = (Vec::new(), Vec::new());
        // When each full queue was first waited for: its wait runs from then.
        let mut first_wait: Vec<Option<tokio::time::Instant>> = Vec::new();
        loop {
            let mut reserved: Vec<Option<Reservation>> = Vec::with_capacity(targets.len());
            let mut full = None;
            let mut closed = false;
            for (i, t) in targets.iter().enumerate() {
                if given_up.get(i) == Some(&true) {
                    reserved.push(None);
                    continue;
                }
                match t.queue.reserve(t.envelopes.len(), t.bytes) {
                    Ok(r) => reserved.push(Some(r)),
                    Err(refusal) => {
                        closed |= refusal == Refusal::Closed;
                        full.get_or_insert(i);
                        reserved.push(None);
                    }
                }
            }
            let Some(i) = full else {
                for (t, w) in targets.iter().zip(&waited) {
                    if *w {
                        t.queue.telemetry().held("room");
                    }
                }
                return Ok(reserved);
            };
            // Hold nothing while waiting, nor when refusing.
            for (t, r) in targets.iter().zip(reserved) {
                if let Some(r) = r {
                    t.queue.release(r);
                }
            }
            if closed {
                return Err(ConsumeError::ShuttingDown);
            }
            if given_up.is_empty() {
                given_up = vec![false; targets.len()];
                waited = vec![false; targets.len()];
                first_wait = vec![None; targets.len()];
            }
            let t = &targets[i];
            let policy = t.queue.when_full();
            let unbounded = match admission {
                Admission::WaitAll => true,
                Admission::Wait => policy == WhenFull::Block,
                Admission::Refuse => false,
            };
            waited[i] = true;
            if unbounded {
                t.queue.wait_for_space(t.envelopes.len(), t.bytes).await;
                continue;
            }
            let room = if t.queue.is_stalled() {
                t.queue.telemetry().held("stalled");
                false
            } else {
                let started = *first_wait[i].get_or_insert_with(tokio::time::Instant::now);
                let deadline = started + t.queue.wait_when_full();
                let room = t
                    .queue
                    .wait_for_space_until(t.envelopes.len(), t.bytes, deadline)
                    .await;
                if !room {
                    t.queue.telemetry().held("timeout");
                }
                room
            };
            if room {
                continue;
            }
            if policy == WhenFull::Block {
                return Err(ConsumeError::Backpressure {
                    exporter: t.queue.id().to_owned(),
                    retry_after: RETRY_AFTER,
                });
            }
            given_up[i] = true;
            waited[i] = false;
            if admission == Admission::Refuse && given_up.iter().all(|g| *g) {
                // No exporter could take any copy: a 200 would be a lie.
                return Err(ConsumeError::Backpressure {
                    exporter: t.queue.id().to_owned(),
                    retry_after: RETRY_AFTER,
                });
            }
        }
    }
}

#[async_trait]
impl Consumer for Fanout {
    /// Processors may read the bytes; exporters that want OTLP make the
    /// pipeline convert pprof payloads (a pipeline of pprof exporters alone
    /// passes the bytes through unread).
    fn reads_profiles(&self) -> bool {
        self.pipelines
            .iter()
            .any(|p| !p.processors.is_empty() || p.forms.contains(&Format::Otlp))
    }

    async fn consume(&self, batch: Batch, admission: Admission) -> Result<(), ConsumeError> {
        let Batch {
            envelopes,
            meta,
            ack,
        } = batch;
        let mut targets: Vec<Target> = Vec::new();
        let mut filtered = 0;
        let last = self.pipelines.len().saturating_sub(1);
        let mut envelopes = Some(envelopes);
        let mut converted = HashMap::new();
        for (i, p) in self.pipelines.iter().enumerate() {
            // Clone for all pipelines but the last: envelopes share payloads, so
            // a clone copies only labels and a few integers.
            let mut b = if i == last {
                envelopes.take().unwrap_or_default()
            } else {
                envelopes.clone().unwrap_or_default()
            };
            let before = b.len();
            for (proc, telemetry) in &p.processors {
                if b.is_empty() {
                    break;
                }
                telemetry.received(b.len() as u64);
                b = proc.process(b, &meta).await;
            }
            filtered += before.saturating_sub(b.len());
            if b.is_empty() {
                continue;
            }
            self.prepare(&p.forms, &mut b, &mut converted);
            // The plain bytes a receiver handed along served the processors
            // and the conversions: no queue keeps them.
            for e in &mut b {
                e.payload.drop_plain();
            }
            let n = p.exporters.len();
            for (j, q) in p.exporters.iter().enumerate() {
                let copy = if j + 1 == n {
                    std::mem::take(&mut b)
                } else {
                    b.clone()
                };
                // One reservation per queue: an exporter fed by two of these
                // pipelines gets both copies as one batch (two reservations
                // would count the first against the second and could refuse
                // an idle queue forever).
                match targets.iter_mut().find(|t| Arc::ptr_eq(&t.queue, q)) {
                    Some(t) => t.envelopes.extend(copy),
                    None => targets.push(Target {
                        queue: q.clone(),
                        envelopes: copy,
                        bytes: 0,
                    }),
                }
            }
        }
        for t in &mut targets {
            t.bytes = batch_bytes(&t.envelopes);
        }
        // `block` queues first: one that refuses is found before any wait
        // on a `drop_newest` one.
        targets.sort_by_key(|t| t.queue.when_full() == WhenFull::DropNewest);
        let reserved = Fanout::reserve_all(&targets, admission).await?;
        // Counted only now that the batch is accepted: a refused batch dropped nothing.
        let mut filtered_share = ack.share(filtered);
        filtered_share.report(Outcome::Filtered, filtered);
        let mut stores = Vec::new();
        for (t, r) in targets.into_iter().zip(reserved) {
            let share = ack.share(t.envelopes.len());
            match r {
                Some(r) => {
                    if let Some(wait) = t.queue.push(r, t.envelopes, meta.clone(), share) {
                        stores.push((t.queue.id().to_owned(), wait));
                    }
                }
                None => {
                    t.queue.dropped_full(t.envelopes.len());
                    share.resolve(Outcome::Dropped);
                }
            }
        }
        ack.retire();
        // Accepted only once every persistent queue holds it durably.
        let results = futures_util::future::join_all(
            stores
                .into_iter()
                .map(|(id, w)| async move { w.wait().await.map_err(|e| (id, e)) }),
        )
        .await;
        if let Some((exporter, error)) = results.into_iter().find_map(Result::err) {
            return Err(ConsumeError::NotStored { exporter, error });
        }
        Ok(())
    }
}

struct RunningExporter {
    id: String,
    /// Its config as text, to find it unchanged on a reload.
    fingerprint: String,
    queue: Arc<ExporterQueue>,
    exporter: Arc<dyn Exporter>,
    tasks: Vec<JoinHandle<()>>,
    /// Stops this exporter's consumers (a child of the collector's abort).
    abort: CancellationToken,
    /// What it claims (its directory), so a reload never gives a directory
    /// two writers.
    resources: Vec<Resource>,
}

/// A receiver that is serving.
struct RunningReceiver {
    config: Arc<dyn crate::component::ReceiverConfig>,
    fingerprint: String,
    /// Which signals it was started for (a change restarts it).
    signals: (bool, bool),
    stop: CancellationToken,
    task: JoinHandle<()>,
    consumer: Arc<SwapConsumer>,
    spans: Option<Arc<SwapSpans>>,
}

impl RunningReceiver {
    /// Stops it (a reload replaced or removed it), waiting at most
    /// [`RECEIVER_STOP_TIMEOUT`] for its calls in flight.
    async fn stop(self, id: &str) {
        self.stop.cancel();
        if tokio::time::timeout(RECEIVER_STOP_TIMEOUT, self.task)
            .await
            .is_err()
        {
            tracing::warn!(receiver = %id, "receiver did not stop within {RECEIVER_STOP_TIMEOUT:?}");
        }
    }
}

/// The consumer a receiver holds: the pipelines behind it are replaced by a
/// reload while the receiver keeps serving.
struct SwapConsumer(std::sync::RwLock<Arc<dyn Consumer>>);

impl SwapConsumer {
    fn new(c: Arc<dyn Consumer>) -> Self {
        SwapConsumer(std::sync::RwLock::new(c))
    }

    fn current(&self) -> Arc<dyn Consumer> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Puts `c` in place and returns what was there.
    fn swap(&self, c: Arc<dyn Consumer>) -> Arc<dyn Consumer> {
        std::mem::replace(
            &mut *self
                .0
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
            c,
        )
    }
}

#[async_trait]
impl Consumer for SwapConsumer {
    async fn consume(&self, batch: Batch, admission: Admission) -> Result<(), ConsumeError> {
        // The Arc held for the call is how a reload sees calls in flight.
        let current = self.current();
        current.consume(batch, admission).await
    }

    fn reads_profiles(&self) -> bool {
        self.current().reads_profiles()
    }
}

/// The span side of [`SwapConsumer`].
struct SwapSpans(std::sync::RwLock<Arc<dyn SpanConsumer>>);

impl SpanConsumer for SwapSpans {
    fn consume_spans(&self, spans: &[Span]) {
        let current = self
            .0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        current.consume_spans(spans);
    }
}

/// A receiver to start: its config and what goes behind it.
struct ReceiverStart {
    id: String,
    config: Arc<dyn crate::component::ReceiverConfig>,
    fingerprint: String,
    signals: (bool, bool),
    fanout: Arc<dyn Consumer>,
    spans: Option<Arc<dyn SpanConsumer>>,
}

/// A receiver bound to its address, not yet serving.
struct Bound {
    stop: CancellationToken,
    serve: crate::component::ServeFuture,
    consumer: Arc<SwapConsumer>,
    spans: Option<Arc<SwapSpans>>,
}

/// A started collector.
pub struct Running {
    /// Parent of every receiver's own stop token.
    receivers_stop: CancellationToken,
    receiver_failed: CancellationToken,
    receivers: BTreeMap<String, RunningReceiver>,
    exporters: BTreeMap<String, RunningExporter>,
    /// Span-taking processors (one instance shared by pipelines), with what
    /// they were built for (config text, downstream forms, fed spans).
    span_processors: HashMap<String, (SpanProcessorKey, Arc<dyn Processor>)>,
    /// Exporters a reload removed, draining their queues; each ends with
    /// its id and the profiles it could not send.
    retired: Vec<JoinHandle<(String, usize)>>,
    /// Whether the first start completed.
    started: bool,
    /// The receivers' listening sockets, handed from a receiver to its
    /// replacement by a reload.
    listeners: crate::server::Listeners,
    abort: CancellationToken,
    shutdown_timeout: Duration,
    telemetry: Arc<Telemetry>,
    memory: crate::memory::MemoryBudget,
}

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

/// What a span-taking processor was built for: kept by a reload only when
/// all of it is unchanged.
type SpanProcessorKey = (String, Vec<Format>, bool);

/// What a reload changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReloadReport {
    /// Components built anew (`receivers.x`, `exporters.y`), changed or new.
    pub started: Vec<String>,
    /// Components that no longer run (removed or replaced).
    pub stopped: Vec<String>,
    /// Components that kept running untouched.
    pub kept: Vec<String>,
    /// What could not be applied (the rest was): a receiver that could not
    /// start with its new config runs with its previous one.
    pub errors: Vec<String>,
}

impl Plan {
    /// The ids of the configured exporters (for tests and tools).
    pub fn exporter_ids(&self) -> impl Iterator<Item = &String> {
        self.exporters.keys()
    }

    /// Builds and starts everything. Exporters first, receivers last, so nothing
    /// is accepted before there is somewhere to put it.
    pub async fn start(self, telemetry: Arc<Telemetry>) -> Result<Running, BuildError> {
        let mut running = Running {
            receivers_stop: CancellationToken::new(),
            receiver_failed: CancellationToken::new(),
            receivers: BTreeMap::new(),
            exporters: BTreeMap::new(),
            span_processors: HashMap::new(),
            retired: Vec::new(),
            started: false,
            listeners: crate::server::Listeners::default(),
            abort: CancellationToken::new(),
            shutdown_timeout: self.shutdown_timeout,
            memory: telemetry.memory_budget(self.max_in_flight_bytes),
            telemetry: telemetry.clone(),
        };
        if let Err(e) = running.apply(self).await {
            running.abort.cancel();
            running.receivers_stop.cancel();
            return Err(e);
        }
        running.started = true;
        telemetry.set_ready(true);
        Ok(running)
    }
}

impl Running {
    /// Reloads the collector onto `plan`: components whose config did not
    /// change keep running untouched (receivers keep their listeners and get
    /// the new pipelines behind them); changed and new ones are built and
    /// started, exporters before the pipelines switch to them; removed
    /// exporters drain their queues in the background (a persistent queue
    /// keeps what it holds on disk). A changed receiver is stopped before its
    /// replacement binds. Nothing running is touched when building a new
    /// exporter or processor fails.
    pub async fn reload(&mut self, plan: Plan) -> Result<ReloadReport, BuildError> {
        if plan.max_in_flight_bytes != self.memory.limit() {
            tracing::warn!("service.limits.max_in_flight_bytes changes only at a restart");
        }
        let timeout = plan.shutdown_timeout;
        let report = self.apply(plan).await?;
        self.shutdown_timeout = timeout;
        Ok(report)
    }

    async fn apply(&mut self, plan: Plan) -> Result<ReloadReport, BuildError> {
        let telemetry = self.telemetry.clone();
        let ctx = |id: &str| BuildContext {
            id: id.to_owned(),
            telemetry: telemetry.clone(),
        };
        let fingerprint = |section: &str, id: &str| {
            plan.fingerprints
                .get(&format!("{section}.{id}"))
                .cloned()
                .unwrap_or_default()
        };
        let mut report = ReloadReport::default();

        // 1. Exporters: the unchanged kept, the others built now. A failure
        // stops what this step built and leaves everything running as it was.
        let used: HashSet<&String> = plan.pipelines.iter().flat_map(|p| &p.exporters).collect();
        let mut next: BTreeMap<String, RunningExporter> = BTreeMap::new();
        let mut keep: HashSet<String> = HashSet::new();
        for (id, config) in &plan.exporters {
            if !used.contains(id) {
                continue; // unused: warned about at plan time; never built or run
            }
            let print = fingerprint("exporters", id);
            if let Some(old) = self.exporters.get(id) {
                if old.fingerprint == print {
                    keep.insert(id.clone());
                    continue;
                }
                if config.queue().storage.is_some() || old.queue.is_persistent() {
                    stop_built(next);
                    return Err(BuildError::new(format!(
                        "exporter `{id}` has a persistent queue (sending_queue.storage); changing it needs a restart, so its files have one owner at a time"
                    )));
                }
            }
            // A directory an exporter leaving with this reload still writes
            // while it drains cannot get a second writer.
            let claims = config.resources();
            let leaving = self.exporters.values().filter(|e| {
                !plan.exporters.contains_key(&e.id)
                    || fingerprint("exporters", &e.id) != e.fingerprint
                    || !used.contains(&e.id)
            });
            for e in leaving {
                if let Some(r) = claims.iter().find(|r| e.resources.contains(r)) {
                    stop_built(next);
                    return Err(BuildError::new(format!(
                        "exporter `{id}` would write to {} while exporter `{}` (changed or removed by this reload) still writes there until it drains; apply this change with a restart",
                        describe(r),
                        e.id
                    )));
                }
            }
            let built = (|| {
                let c = ctx(id);
                let exporter = building(id, || config.build(&c))
                    .map_err(|e| BuildError::new(format!("exporter `{id}`: {e}")))?;
                let queue = ExporterQueue::open(
                    id.clone(),
                    config.queue(),
                    config.retry(),
                    c.exporter_telemetry(),
                )
                .map_err(|e| {
                    BuildError::new(format!("exporter `{id}`: sending_queue.storage: {e}"))
                })?;
                Ok::<_, BuildError>((exporter, queue))
            })();
            let (exporter, queue) = match built {
                Ok(b) => b,
                Err(e) => {
                    stop_built(next);
                    return Err(e);
                }
            };
            let abort = self.abort.child_token();
            queue.spawn_storage(abort.clone());
            let tasks = queue.spawn_consumers(exporter.clone(), abort.clone());
            next.insert(
                id.clone(),
                RunningExporter {
                    id: id.clone(),
                    fingerprint: print,
                    queue,
                    exporter,
                    tasks,
                    abort,
                    resources: claims,
                },
            );
        }
        let queue_of = |id: &String| -> Option<Arc<ExporterQueue>> {
            next.get(id)
                .or_else(|| keep.contains(id).then(|| self.exporters.get(id)).flatten())
                .map(|e| e.queue.clone())
        };

        // 2. Processors. Span-taking ones are one instance per collector,
        // kept when unchanged (their span index survives); the others are
        // built per pipeline, as the OpenTelemetry Collector does.
        let forms_of = |p: &PipelinePlan| {
            let mut forms = Vec::new();
            for e in &p.exporters {
                if let Some(f) = plan.exporters.get(e).and_then(|c| c.wants())
                    && !forms.contains(&f)
                {
                    forms.push(f);
                }
            }
            forms
        };
        let mut shared: HashMap<String, (SpanProcessorKey, Arc<dyn Processor>)> = HashMap::new();
        for (pid, config) in &plan.processors {
            if !config.takes_spans() {
                continue;
            }
            let mut downstream = Vec::new();
            for p in plan.pipelines.iter().filter(|p| p.processors.contains(pid)) {
                for f in forms_of(p) {
                    if !downstream.contains(&f) {
                        downstream.push(f);
                    }
                }
            }
            let fed = plan
                .pipelines
                .iter()
                .any(|p| p.signal == Signal::Traces && p.processors.contains(pid));
            let key: SpanProcessorKey = (fingerprint("processors", pid), downstream.clone(), fed);
            if let Some((old, proc)) = self.span_processors.get(pid)
                && *old == key
            {
                shared.insert(pid.clone(), (key, proc.clone()));
                report.kept.push(format!("processors.{pid}"));
                continue;
            }
            match building(pid, || config.build_for(&ctx(pid), &downstream)) {
                Ok(proc) => {
                    shared.insert(pid.clone(), (key, proc));
                }
                Err(e) => {
                    stop_built(next);
                    return Err(BuildError::new(format!("processor `{pid}`: {e}")));
                }
            }
        }
        let mut by_receiver: HashMap<String, Vec<Arc<PipelineRuntime>>> = HashMap::new();
        // Per receiver: (processor id, its span consumer).
        type Feeds = Vec<(String, Arc<dyn SpanConsumer>)>;
        let mut spans_by_receiver: HashMap<String, Feeds> = HashMap::new();
        let mut span_consumers: HashMap<String, Option<Arc<dyn SpanConsumer>>> = HashMap::new();
        for p in &plan.pipelines {
            if p.signal == Signal::Traces {
                for pid in &p.processors {
                    let consumer = span_consumers
                        .entry(pid.clone())
                        .or_insert_with(|| {
                            shared.get(pid).and_then(|(_, proc)| proc.span_consumer())
                        })
                        .clone();
                    let Some(consumer) = consumer else { continue };
                    for r in &p.receivers {
                        let list = spans_by_receiver.entry(r.clone()).or_default();
                        // A processor in two traces pipelines of one receiver gets each span once.
                        if !list.iter().any(|(id, _)| id == pid) {
                            list.push((pid.clone(), consumer.clone()));
                        }
                    }
                }
                continue;
            }
            let forms = forms_of(p);
            let mut processors = Vec::new();
            for pid in &p.processors {
                let Some(config) = plan.processors.get(pid) else {
                    stop_built(next);
                    return Err(BuildError::new(format!("processor `{pid}` is not defined")));
                };
                let c = ctx(pid);
                let proc = match shared.get(pid) {
                    Some((_, proc)) => proc.clone(),
                    None => match building(pid, || config.build_for(&c, &forms)) {
                        Ok(proc) => proc,
                        Err(e) => {
                            stop_built(next);
                            return Err(BuildError::new(format!("processor `{pid}`: {e}")));
                        }
                    },
                };
                processors.push((proc, c.processor_telemetry()));
            }
            let runtime = Arc::new(PipelineRuntime {
                processors,
                exporters: p.exporters.iter().filter_map(queue_of).collect(),
                forms,
            });
            for r in &p.receivers {
                by_receiver
                    .entry(r.clone())
                    .or_default()
                    .push(runtime.clone());
            }
        }

        // 3. Receivers. New ones bind first (a failure there changes
        // nothing running); then the unchanged get the new pipelines behind
        // them; then each changed one is stopped and started again with its
        // new config (on failure, with its previous one).
        let mut fresh = Vec::new();
        let mut changed = Vec::new();
        let mut unchanged = Vec::new();
        let mut wanted: HashSet<String> = HashSet::new();
        for (id, config) in &plan.receivers {
            let pipelines = by_receiver.remove(id);
            let spans = spans_by_receiver
                .remove(id)
                .map(|consumers| -> Arc<dyn SpanConsumer> {
                    let mut consumers: Vec<_> = consumers.into_iter().map(|(_, c)| c).collect();
                    if consumers.len() == 1 {
                        consumers.remove(0)
                    } else {
                        Arc::new(SpanFanout(consumers))
                    }
                });
            if pipelines.is_none() && spans.is_none() {
                continue; // unused: warned about at plan time
            }
            wanted.insert(id.clone());
            let start = ReceiverStart {
                id: id.clone(),
                config: config.clone(),
                fingerprint: fingerprint("receivers", id),
                signals: (pipelines.is_some(), spans.is_some()),
                fanout: Arc::new(Fanout {
                    pipelines: pipelines.unwrap_or_default(),
                    telemetry: self.telemetry.clone(),
                }),
                spans,
            };
            match self.receivers.get(id) {
                None => fresh.push(start),
                Some(r) if r.fingerprint == start.fingerprint && r.signals == start.signals => {
                    unchanged.push(start)
                }
                Some(_) => changed.push(start),
            }
        }
        // New receivers: every one binds before any serves.
        let mut bound = Vec::new();
        for start in fresh {
            match self.bind_receiver(&start).await {
                Ok(b) => bound.push((start, b)),
                Err(e) => {
                    for (_, b) in &bound {
                        b.stop.cancel();
                    }
                    stop_built(next);
                    return Err(e);
                }
            }
        }
        for (start, b) in bound {
            report.started.push(format!("receivers.{}", start.id));
            self.serve_receiver(start, b);
        }
        let mut replaced: Vec<Arc<dyn Consumer>> = Vec::new();
        for start in unchanged {
            if let Some(r) = self.receivers.get(&start.id) {
                replaced.push(r.consumer.swap(start.fanout));
                if let (Some(swap), Some(spans)) = (&r.spans, start.spans) {
                    *swap
                        .0
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = spans;
                }
                report.kept.push(format!("receivers.{}", start.id));
            }
        }
        // A changed receiver: its replacement binds first (on the same
        // address it takes over the very socket, so no connection is
        // refused), then the old one stops. If the replacement cannot
        // start, the old one keeps running.
        for start in changed {
            let id = start.id.clone();
            match self.bind_receiver(&start).await {
                Ok(b) => {
                    if let Some(old) = self.receivers.remove(&id) {
                        old.stop(&id).await;
                    }
                    report.stopped.push(format!("receivers.{id}"));
                    report.started.push(format!("receivers.{id}"));
                    self.serve_receiver(start, b);
                }
                Err(e) => {
                    // It keeps its previous config and gets the new pipelines.
                    if let Some(r) = self.receivers.get(&id) {
                        replaced.push(r.consumer.swap(start.fanout));
                    }
                    report.errors.push(format!(
                        "{e}; receiver `{id}` keeps running with its previous config"
                    ));
                }
            }
        }
        let going: Vec<String> = self
            .receivers
            .keys()
            .filter(|id| !wanted.contains(*id))
            .cloned()
            .collect();
        for id in going {
            if let Some(r) = self.receivers.remove(&id) {
                r.stop(&id).await;
                report.stopped.push(format!("receivers.{id}"));
            }
        }

        // Sockets no running receiver listens on any more are closed.
        let listening: HashSet<std::net::SocketAddr> = self
            .receivers
            .values()
            .flat_map(|r| r.config.resources())
            .filter_map(|r| match r {
                Resource::TcpListen(addr) => Some(addr),
                Resource::Directory(_) => None,
            })
            .collect();
        self.listeners.retain(&listening);

        // 4. Calls still running on the replaced pipelines may reserve in
        // the queues of exporters leaving now: each leaving exporter waits
        // for them before it closes (in the background).
        let in_flight = Arc::new(replaced);

        // 5. Exporters no longer used drain in the background.
        let old = std::mem::take(&mut self.exporters);
        for (id, e) in old {
            if keep.contains(&id) {
                report.kept.push(format!("exporters.{id}"));
                next.insert(id, e);
                continue;
            }
            report.stopped.push(format!("exporters.{id}"));
            if next.contains_key(&id) {
                // Changed: the new queue reports the gauges of this id.
                e.queue.mute_gauges();
            }
            self.retired.push(tokio::spawn(retire(
                e,
                self.shutdown_timeout,
                in_flight.clone(),
            )));
        }
        for id in next.keys() {
            let name = format!("exporters.{id}");
            if !report.kept.contains(&name) {
                report.started.push(name);
            }
        }
        self.exporters = next;
        self.span_processors = shared;
        Ok(report)
    }

    /// Builds and starts (binds) a receiver; it serves once
    /// [`Running::serve_receiver`] spawns it.
    async fn bind_receiver(&self, start: &ReceiverStart) -> Result<Bound, BuildError> {
        let c = BuildContext {
            id: start.id.clone(),
            telemetry: self.telemetry.clone(),
        };
        let consumer = Arc::new(SwapConsumer::new(start.fanout.clone()));
        let spans = start
            .spans
            .clone()
            .map(|s| Arc::new(SwapSpans(std::sync::RwLock::new(s))));
        let stop = self.receivers_stop.child_token();
        let receiver = building(&start.id, || start.config.build(&c))
            .map_err(|e| BuildError::new(format!("receiver `{}`: {e}", start.id)))?;
        let serve = receiver
            .start(ReceiverContext {
                id: start.id.clone(),
                consumer: consumer.clone(),
                telemetry: c.receiver_telemetry(),
                shutdown: stop.clone(),
                memory: self.memory.clone(),
                takes_profiles: start.signals.0,
                spans: spans.clone().map(|s| s as Arc<dyn SpanConsumer>),
                listeners: self.listeners.clone(),
            })
            .await
            .map_err(|e| BuildError::new(format!("receiver `{}`: {e}", start.id)))?;
        Ok(Bound {
            stop,
            serve,
            consumer,
            spans,
        })
    }

    /// Spawns a bound receiver's serving and records it.
    fn serve_receiver(&mut self, start: ReceiverStart, b: Bound) {
        let (failed, name, parent, own) = (
            self.receiver_failed.clone(),
            start.id.clone(),
            self.receivers_stop.clone(),
            b.stop.clone(),
        );
        let serve = b.serve;
        let task = tokio::spawn(async move {
            serve.await;
            // A receiver that ends before it was told to can no longer
            // accept anything: say so, so the collector stops rather than
            // running deaf while /readyz says ready.
            if !parent.is_cancelled() && !own.is_cancelled() {
                tracing::error!(receiver = %name, "receiver stopped on its own");
                failed.cancel();
            }
        });
        self.receivers.insert(
            start.id,
            RunningReceiver {
                config: start.config,
                fingerprint: start.fingerprint,
                signals: start.signals,
                stop: b.stop,
                task,
                consumer: b.consumer,
                spans: b.spans,
            },
        );
    }

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
        let exporters: Vec<RunningExporter> = self.exporters.into_values().collect();
        for e in &exporters {
            e.queue.close();
        }
        let deadline = tokio::time::Instant::now() + self.shutdown_timeout;
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

    /// Completes when a receiver stopped before shutdown was asked for.
    pub async fn receiver_failed(&self) {
        self.receiver_failed.cancelled().await
    }

    /// Cancelled when a receiver stopped before shutdown was asked for.
    pub fn failed_token(&self) -> CancellationToken {
        self.receiver_failed.clone()
    }

    /// Profiles waiting per exporter (for tests).
    pub fn queue_levels(&self) -> Vec<(String, usize, usize)> {
        self.exporters
            .values()
            .map(|e| {
                let (p, b) = e.queue.level();
                (e.id.clone(), p, b)
            })
            .collect()
    }
}

/// Stops exporters a failed reload built (their queues are empty).
fn stop_built(built: BTreeMap<String, RunningExporter>) {
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
async fn retire(
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Mutex, OnceLock};

    use serde::Deserialize;

    use super::*;
    use crate::component::{
        ErrorClass, ExportError, ExporterConfig, FieldError, ProcessorConfig, Receiver,
        ReceiverConfig, ServeFuture, Validate,
    };
    use crate::delivery::DeliveryReport;
    use crate::model::{BatchMeta, Envelope, ExportBatch, Format, Labels, Payload};
    use crate::queue::{QueueSettings, RetrySettings};
    use crate::registry::{Factory, Stability};

    type SpanConsumers = Mutex<HashMap<String, (bool, Option<Arc<dyn SpanConsumer>>)>>;
    fn span_consumers() -> &'static SpanConsumers {
        static C: OnceLock<SpanConsumers> = OnceLock::new();
        C.get_or_init(Default::default)
    }
    type Consumers = Mutex<HashMap<String, Arc<dyn Consumer>>>;
    fn consumers() -> &'static Consumers {
        static C: OnceLock<Consumers> = OnceLock::new();
        C.get_or_init(Default::default)
    }

    #[derive(Default)]
    struct Record {
        delivered: AtomicUsize,
        attempts: AtomicUsize,
        batches: AtomicUsize,
        /// For `behaviour: down`: fail (retryably) while this is 0.
        up: AtomicUsize,
        built: AtomicUsize,
        /// Every payload exported, as the exporter got it.
        payloads: Mutex<Vec<Payload>>,
    }
    fn records() -> &'static Mutex<HashMap<String, Arc<Record>>> {
        static R: OnceLock<Mutex<HashMap<String, Arc<Record>>>> = OnceLock::new();
        R.get_or_init(Default::default)
    }
    fn record(key: &str) -> Arc<Record> {
        records()
            .lock()
            .unwrap()
            .entry(key.to_owned())
            .or_default()
            .clone()
    }

    /// A receiver that publishes its consumer under `key` so the test can push.
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TestReceiverConfig {
        key: String,
        #[serde(default)]
        endpoint: Option<String>,
        /// Stop serving at once (a receiver that fails on its own).
        #[serde(default)]
        die: bool,
        /// Takes traces (publishes its span consumer under `key`).
        #[serde(default)]
        spans: bool,
    }
    impl Validate for TestReceiverConfig {
        fn validate(&self) -> Vec<FieldError> {
            match self.endpoint.as_deref() {
                Some(e) if e.parse::<std::net::SocketAddr>().is_err() => {
                    vec![FieldError::new("endpoint", "not host:port")]
                }
                _ => vec![],
            }
        }
    }
    struct TestReceiver(String, bool);
    #[async_trait]
    impl Receiver for TestReceiver {
        async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError> {
            consumers()
                .lock()
                .unwrap()
                .insert(self.0.clone(), ctx.consumer);
            span_consumers()
                .lock()
                .unwrap()
                .insert(self.0.clone(), (ctx.takes_profiles, ctx.spans));
            let die = self.1;
            Ok(Box::pin(async move {
                if !die {
                    ctx.shutdown.cancelled().await
                }
            }))
        }
    }
    impl ReceiverConfig for TestReceiverConfig {
        fn resources(&self) -> Vec<Resource> {
            self.endpoint
                .iter()
                .filter_map(|e| e.parse().ok())
                .map(Resource::TcpListen)
                .collect()
        }
        fn build(&self, _: &BuildContext) -> Result<Box<dyn Receiver>, BuildError> {
            Ok(Box::new(TestReceiver(self.key.clone(), self.die)))
        }
        fn accepts_spans(&self) -> bool {
            self.spans
        }
    }

    /// Keeps profiles whose `keep` label is not "no".
    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct FilterConfig {
        /// Takes spans, counting them under this key.
        #[serde(default)]
        spans: Option<String>,
    }
    struct SpanCount(String);
    impl SpanConsumer for SpanCount {
        fn consume_spans(&self, spans: &[Span]) {
            record(&self.0)
                .delivered
                .fetch_add(spans.len(), Ordering::SeqCst);
        }
    }
    impl Validate for FilterConfig {
        fn validate(&self) -> Vec<FieldError> {
            vec![]
        }
    }
    struct Filter(Option<String>);
    #[async_trait]
    impl Processor for Filter {
        async fn process(&self, mut batch: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope> {
            batch.retain(|e| e.labels.get("keep") != Some("no"));
            // Profiles labelled keep=plain count whether they came with
            // their receiver's plain bytes.
            let plain = batch
                .iter()
                .filter(|e| e.labels.get("keep") == Some("plain") && e.payload.has_plain())
                .count();
            record("plain-seen")
                .delivered
                .fetch_add(plain, Ordering::SeqCst);
            // Profiles labelled keep=meta count the batches they came in as
            // the receiver made them, under `meta-<receiver>-<this_host>`.
            if batch.iter().any(|e| e.labels.get("keep") == Some("meta")) {
                record(&format!("meta-{}-{}", meta.receiver, meta.this_host))
                    .delivered
                    .fetch_add(1, Ordering::SeqCst);
            }
            batch
        }
        fn span_consumer(&self) -> Option<Arc<dyn SpanConsumer>> {
            let key = self.0.clone()?;
            record(&key).built.fetch_add(1, Ordering::SeqCst);
            Some(Arc::new(SpanCount(key)))
        }
    }
    impl ProcessorConfig for FilterConfig {
        fn build(&self, _: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
            if let Some(key) = &self.spans {
                record(&format!("{key}-processor"))
                    .built
                    .fetch_add(1, Ordering::SeqCst);
            }
            Ok(Arc::new(Filter(self.spans.clone())))
        }
        fn takes_spans(&self) -> bool {
            self.spans.is_some()
        }
    }

    #[derive(Debug, Deserialize, Clone, Copy, PartialEq)]
    #[serde(rename_all = "snake_case")]
    enum Behaviour {
        Ok,
        Hang,
        FailTwice,
        Permanent,
        Panic,
        /// Retryable failures until the test sets `up`.
        Down,
        /// Refuses every second profile of a batch (a partial failure).
        RefuseOdd,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct TestExporterConfig {
        key: String,
        behaviour: Behaviour,
        #[serde(default)]
        sending_queue: QueueSettings,
        #[serde(default)]
        retry_on_failure: RetrySettings,
        /// `shutdown` never returns.
        #[serde(default)]
        hang_on_shutdown: bool,
        /// The payload form the exporter declares it wants.
        #[serde(default)]
        wants: Option<String>,
    }
    impl Validate for TestExporterConfig {
        fn validate(&self) -> Vec<FieldError> {
            vec![]
        }
    }
    struct TestExporter(Behaviour, Arc<Record>, bool);
    #[async_trait]
    impl Exporter for TestExporter {
        async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
            let attempt = self.1.attempts.fetch_add(1, Ordering::SeqCst);
            self.1.batches.fetch_add(1, Ordering::SeqCst);
            self.1
                .payloads
                .lock()
                .unwrap()
                .extend(batch.envelopes().iter().map(|e| e.payload.clone()));
            match self.0 {
                Behaviour::Ok => {}
                Behaviour::Hang => std::future::pending::<()>().await,
                Behaviour::FailTwice if attempt < 2 => {
                    return Err(ExportError::retryable("flaky", "try again"));
                }
                Behaviour::FailTwice => {}
                Behaviour::Permanent => return Err(ExportError::permanent("rejected", "no")),
                Behaviour::Panic => panic!("test exporter panics"),
                Behaviour::Down if self.1.up.load(Ordering::SeqCst) == 0 => {
                    return Err(ExportError::retryable("unavailable", "the backend is down"));
                }
                Behaviour::Down => {}
                Behaviour::RefuseOdd => {
                    let refused: Vec<usize> = (0..batch.len()).filter(|i| i % 2 == 1).collect();
                    let n = batch.len() - refused.len();
                    self.1.delivered.fetch_add(n, Ordering::SeqCst);
                    if refused.is_empty() {
                        return Ok(());
                    }
                    return Err(ExportError::partial(refused, "invalid", "odd ones refused"));
                }
            }
            self.1.delivered.fetch_add(batch.len(), Ordering::SeqCst);
            Ok(())
        }

        async fn shutdown(&self) {
            if self.2 {
                std::future::pending::<()>().await
            }
        }
    }
    impl ExporterConfig for TestExporterConfig {
        fn queue(&self) -> QueueSettings {
            self.sending_queue.clone()
        }
        fn retry(&self) -> RetrySettings {
            self.retry_on_failure.clone()
        }
        fn wants(&self) -> Option<Format> {
            match self.wants.as_deref() {
                Some("otlp") => Some(Format::Otlp),
                Some("pprof") => Some(Format::Pprof),
                _ => None,
            }
        }
        fn build(&self, _: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
            let r = record(&self.key);
            r.built.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(TestExporter(
                self.behaviour,
                r,
                self.hang_on_shutdown,
            )))
        }
    }

    fn registry() -> Registry {
        Registry::new([
            Factory::receiver::<TestReceiverConfig>(
                "test",
                Stability::Development,
                "test receiver",
            ),
            Factory::processor::<FilterConfig>("filter", Stability::Development, "test filter"),
            Factory::exporter::<TestExporterConfig>(
                "test",
                Stability::Development,
                "test exporter",
            ),
        ])
    }

    fn envelope(keep: &str) -> Envelope {
        let mut b = crate::pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds");
        b.sample_root_first(["main"], vec![1]);
        Envelope {
            labels: Labels::from_pairs([("service_name", "svc"), ("keep", keep)]),
            start_unix_nanos: 0,
            end_unix_nanos: 0,
            sample_types: vec![],
            period_type: None,
            period: 0,
            payload: Payload::from_bytes(
                crate::pprof::gzip(&crate::pprof::encode(&b.build())),
                1 << 20,
            ),
        }
    }

    fn batch(envelopes: Vec<Envelope>) -> Batch {
        Batch::new(envelopes, Arc::new(BatchMeta::default()))
    }

    async fn start(yaml: &str) -> (Running, Arc<Telemetry>) {
        let doc = Document::parse_with_env(yaml, &|_| None).unwrap();
        let plan = plan(&doc, &registry()).unwrap();
        let t = Arc::new(Telemetry::new());
        (plan.start(t.clone()).await.unwrap(), t)
    }

    fn consumer(key: &str) -> Arc<dyn Consumer> {
        consumers().lock().unwrap().get(key).cloned().unwrap()
    }

    async fn eventually(what: &str, f: impl Fn() -> bool) {
        for _ in 0..500 {
            if f() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting for {what}");
    }

    #[test]
    fn traces_pipelines_feed_span_taking_processors_and_export_nothing() {
        let yaml = "receivers:\n  test: {key: tp}\n  test/spans: {key: tp-s, spans: true}\nprocessors:\n  filter: {}\n  filter/idx: {spans: tp}\nexporters:\n  test: {key: tp-x, behaviour: ok}\nservice:\n  pipelines:\n    traces:\n      receivers: [test, test/spans]\n      processors: [filter, filter/idx]\n      exporters: [test]\n    traces/none: {receivers: [test/spans]}\n    profiles: {receivers: [test], exporters: [test]}\n";
        let doc = Document::parse_with_env(yaml, &|_| None).unwrap();
        let text = plan(&doc, &registry()).unwrap_err().to_string();
        for want in [
            "receiver `test` takes no traces; in a traces pipeline use an otlp receiver",
            "processor `filter` takes no spans",
            "pipeline `traces` lists exporters, but proflow exports no traces",
            "pipeline `traces/none` needs a processor to feed",
        ] {
            assert!(text.contains(want), "{want}: {text}");
        }
        let bad_id = Document::parse_with_env(
            "receivers:\n  test: {key: a}\nexporters:\n  test: {key: b}\nservice:\n  pipelines:\n    logs: {receivers: [test], exporters: [test]}\n",
            &|_| None,
        )
        .unwrap_err()
        .to_string();
        assert!(
            bad_id.contains("write `profiles` or `profiles/<name>` (or `traces`"),
            "{bad_id}"
        );
        let fed_only = "receivers:\n  test: {key: a}\n  test/spans: {key: b, spans: true}\nprocessors:\n  filter/idx: {spans: w}\nexporters:\n  test: {key: c, behaviour: ok}\nservice:\n  pipelines:\n    traces: {receivers: [test/spans], processors: [filter/idx]}\n    profiles: {receivers: [test], exporters: [test]}\n";
        let p = plan(
            &Document::parse_with_env(fed_only, &|_| None).unwrap(),
            &registry(),
        )
        .unwrap();
        assert!(
            p.warnings.iter().any(|w| w
                .contains("processor `filter/idx` is fed spans but is in no profiles pipeline")),
            "{:?}",
            p.warnings
        );
    }

    #[tokio::test]
    async fn one_span_taking_processor_serves_its_traces_and_profiles_pipelines() {
        let yaml = "receivers:\n  test: {key: sp-p}\n  test/spans: {key: sp-s, spans: true}\nprocessors:\n  filter: {spans: sp}\nexporters:\n  test: {key: sp-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles/a: {receivers: [test], processors: [filter], exporters: [test]}\n    profiles/b: {receivers: [test], processors: [filter], exporters: [test]}\n    traces: {receivers: [test/spans], processors: [filter]}\n    traces/2: {receivers: [test/spans], processors: [filter]}\n";
        let (running, _) = start(yaml).await;
        // Built once for all four pipelines.
        assert_eq!(record("sp-processor").built.load(Ordering::SeqCst), 1);
        let (takes_profiles, spans) = span_consumers()
            .lock()
            .unwrap()
            .get("sp-s")
            .cloned()
            .unwrap();
        assert!(!takes_profiles, "only in traces pipelines");
        let spans = spans.expect("a span consumer");
        let (takes_profiles, none) = span_consumers()
            .lock()
            .unwrap()
            .get("sp-p")
            .cloned()
            .unwrap();
        assert!(takes_profiles && none.is_none());
        let span = Span {
            trace_id: [1; 16],
            span_id: [2; 8],
            parent_span_id: [0; 8],
            name: "x".into(),
            service: Arc::from("s"),
            start_unix_nanos: 0,
            end_unix_nanos: 0,
        };
        spans.consume_spans(&[span.clone(), span]);
        // Two traces pipelines, one processor: each span reaches it once.
        assert_eq!(record("sp").delivered.load(Ordering::SeqCst), 2);
        running.shutdown().await;
    }

    #[test]
    fn plan_reports_every_problem_with_lines_and_warns_unused() {
        let yaml = "receivers:\n  test: {key: a, endpoint: '127.0.0.1:9'}\n  test/2: {key: b, endpoint: '127.0.0.1:9'}\n  test/3: {key: c, endpoint: nowhere}\n  nosuch: {}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: d, behaviour: ok}\nservice:\n  pipelines:\n    profiles:\n      receivers: [test, test/2, test/3]\n      exporters: [test, missing]\n";
        let doc = Document::parse_with_env(yaml, &|_| None).unwrap();
        let errs = plan(&doc, &registry()).unwrap_err();
        let text = errs.to_string();
        assert!(text.contains("line 3:3: receivers::test/2: at `receivers.test/2`: listen address 127.0.0.1:9 is already used by receivers::test"), "{text}");
        assert!(
            text.contains(
                "line 4:30: receivers::test/3: at `receivers.test/3.endpoint`: not host:port"
            ),
            "{text}"
        );
        assert!(
            text.contains("unknown receiver type `nosuch`; known types: test"),
            "{text}"
        );
        assert!(text.contains("line 14:25: at `service.pipelines.profiles.exporters.1`: exporter `missing` is not defined"), "{text}");
        assert_eq!(errs.len(), 4, "{text}");

        let ok = "receivers:\n  test: {key: a}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: d, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let p = plan(
            &Document::parse_with_env(ok, &|_| None).unwrap(),
            &registry(),
        )
        .unwrap();
        assert_eq!(p.warnings.len(), 1);
        assert!(
            p.warnings[0].contains(
                "processor `filter` is defined at `processors.filter` but used by no pipeline"
            ),
            "{:?}",
            p.warnings
        );
    }

    #[tokio::test]
    async fn block_backpressure_is_all_or_nothing_and_drop_newest_only_drops_there() {
        let yaml = "receivers:\n  test: {key: bp}\nexporters:\n  test/hang: {key: bp-hang, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\n  test/dropper: {key: bp-drop, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: drop_newest}}\n  test/ok: {key: bp-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 100ms\n  pipelines:\n    profiles/a: {receivers: [test], exporters: [test/hang, test/ok]}\n    profiles/b: {receivers: [test], exporters: [test/dropper, test/ok]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("bp");
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        eventually("first batch delivered twice (two pipelines)", || {
            record("bp-ok").delivered.load(Ordering::SeqCst) == 2
        })
        .await;
        // The hanging block queue is full now: the whole batch is refused and nobody gets a copy.
        let err = c
            .consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConsumeError::Backpressure { ref exporter, .. } if exporter == "test/hang"),
            "{err:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(
            record("bp-ok").delivered.load(Ordering::SeqCst),
            2,
            "a refused batch must leave no copies"
        );
        let levels = running.queue_levels();
        assert!(levels.contains(&(
            "test/dropper".to_string(),
            1,
            levels.iter().find(|l| l.0 == "test/dropper").unwrap().2
        )));
        let report = running.shutdown().await;
        assert_eq!(report.undelivered.get("test/hang"), Some(&1));
        assert_eq!(report.undelivered.get("test/dropper"), Some(&1));
        assert!(t.render().contains(
            r#"proflow_exporter_dropped_profiles_total{exporter="test/hang",reason="shutdown"} 1"#
        ));
    }

    #[tokio::test]
    async fn drop_newest_exporter_never_stalls_the_others() {
        let yaml = "receivers:\n  test: {key: dn}\nprocessors:\n  filter: {}\nexporters:\n  test/slow: {key: dn-slow, behaviour: hang, sending_queue: {queue_size: 2, num_consumers: 1, when_full: drop_newest}}\n  test/ok: {key: dn-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 100ms\n  pipelines:\n    profiles: {receivers: [test], processors: [filter], exporters: [test/slow, test/ok]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("dn");
        for i in 0..20 {
            c.consume(
                batch(vec![envelope(if i % 5 == 0 { "no" } else { "yes" })]),
                Admission::Refuse,
            )
            .await
            .unwrap();
        }
        eventually("16 kept profiles at the healthy exporter", || {
            record("dn-ok").delivered.load(Ordering::SeqCst) == 16
        })
        .await;
        let text = t.render();
        assert!(text.contains(r#"proflow_exporter_dropped_profiles_total{exporter="test/slow",reason="queue_full"} 14"#), "{text}");
        assert!(
            text.contains(r#"proflow_processor_received_profiles_total{processor="filter"} 20"#),
            "{text}"
        );
        running.shutdown().await;
    }

    #[tokio::test]
    async fn retryable_failures_are_retried_and_permanent_ones_are_not() {
        let yaml = "receivers:\n  test: {key: rt}\nexporters:\n  test/flaky: {key: rt-flaky, behaviour: fail_twice, retry_on_failure: {initial_interval: 5ms, max_interval: 10ms}}\n  test/perm: {key: rt-perm, behaviour: permanent}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/flaky, test/perm]}\n";
        let (running, t) = start(yaml).await;
        consumer("rt")
            .consume(
                batch(vec![envelope("yes"), envelope("yes")]),
                Admission::Refuse,
            )
            .await
            .unwrap();
        eventually("flaky delivery", || {
            record("rt-flaky").delivered.load(Ordering::SeqCst) == 2
        })
        .await;
        eventually("permanent failure counted", || t.render().contains(r#"proflow_exporter_failed_profiles_total{exporter="test/perm",reason="rejected"} 2"#)).await;
        assert_eq!(record("rt-flaky").attempts.load(Ordering::SeqCst), 3);
        assert_eq!(
            record("rt-perm").attempts.load(Ordering::SeqCst),
            1,
            "permanent errors are not retried"
        );
        let text = t.render();
        assert!(
            text.contains(r#"proflow_exporter_retries_total{exporter="test/flaky"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(r#"proflow_exporter_sent_profiles_total{exporter="test/flaky"} 2"#),
            "{text}"
        );
        let report = running.shutdown().await;
        assert_eq!(report.total_undelivered(), 0);
    }

    #[tokio::test]
    async fn retries_give_up_after_max_elapsed_time() {
        let yaml = "receivers:\n  test: {key: me}\nexporters:\n  test: {key: me-x, behaviour: fail_twice, retry_on_failure: {initial_interval: 50ms, max_elapsed_time: 20ms}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, t) = start(yaml).await;
        consumer("me")
            .consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        eventually("retries exhausted", || {
            t.render().contains(r#"reason="retries_exhausted"} 1"#)
        })
        .await;
        assert_eq!(record("me-x").delivered.load(Ordering::SeqCst), 0);
        running.shutdown().await;
    }

    #[tokio::test]
    async fn shutdown_drains_queues_before_stopping() {
        let yaml = "receivers:\n  test: {key: sd}\nexporters:\n  test: {key: sd-ok, behaviour: fail_twice, retry_on_failure: {initial_interval: 20ms}}\nservice:\n  shutdown_timeout: 5s\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("sd");
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        let report = running.shutdown().await;
        assert_eq!(report.total_undelivered(), 0);
        assert_eq!(
            record("sd-ok").delivered.load(Ordering::SeqCst),
            1,
            "the retried batch was delivered during the drain"
        );
        assert_eq!(
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await,
            Err(ConsumeError::ShuttingDown)
        );
    }

    #[tokio::test]
    async fn an_exporter_fed_by_two_pipelines_gets_both_copies_in_one_admission() {
        let yaml = "receivers:\n  test: {key: tw}\nexporters:\n  test: {key: tw-x, behaviour: ok, sending_queue: {queue_size: 3}}\nservice:\n  pipelines:\n    profiles/a: {receivers: [test], exporters: [test]}\n    profiles/b: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        // 2 profiles × 2 pipelines = 4 > queue_size 3, but the queue is idle: admitted whole.
        consumer("tw")
            .consume(
                batch(vec![envelope("yes"), envelope("yes")]),
                Admission::Refuse,
            )
            .await
            .unwrap();
        eventually("both copies delivered", || {
            record("tw-x").delivered.load(Ordering::SeqCst) == 4
        })
        .await;
        running.shutdown().await;
    }

    fn otlp_envelope() -> Envelope {
        let mut e = envelope("yes");
        let o = e.payload.otlp().unwrap();
        e.payload = Payload::from_otlp(crate::otlp::OtlpProfiles::new(
            o.dictionary.clone(),
            None,
            o.profiles.clone(),
            0,
        ));
        e
    }

    #[tokio::test]
    async fn exporters_get_the_form_they_want_converted_once_and_counted() {
        // Two pipelines, three exporters: two want OTLP, one takes any form.
        let yaml = "receivers:\n  test: {key: fm}\nexporters:\n  test/o1: {key: fm-o1, behaviour: ok, wants: otlp}\n  test/o2: {key: fm-o2, behaviour: ok, wants: otlp}\n  test/any: {key: fm-any, behaviour: ok}\nservice:\n  pipelines:\n    profiles/a: {receivers: [test], exporters: [test/o1, test/any]}\n    profiles/b: {receivers: [test], exporters: [test/o2]}\n";
        let (running, t) = start(yaml).await;
        let e = envelope("yes");
        let arrived = e.payload.clone();
        consumer("fm")
            .consume(batch(vec![e]), Admission::Refuse)
            .await
            .unwrap();
        eventually("all three delivered", || {
            ["fm-o1", "fm-o2", "fm-any"]
                .iter()
                .all(|k| record(k).delivered.load(Ordering::SeqCst) == 1)
        })
        .await;
        let got = |k: &str| record(k).payloads.lock().unwrap()[0].clone();
        let (o1, o2, any) = (got("fm-o1"), got("fm-o2"), got("fm-any"));
        assert!(o1.has(Format::Otlp) && o2.has(Format::Otlp));
        assert!(
            Arc::ptr_eq(&o1.otlp().unwrap(), &o2.otlp().unwrap()),
            "one conversion shared by both pipelines"
        );
        assert_eq!(
            any.identity(),
            o1.identity(),
            "the converted payload goes to every exporter of the pipeline"
        );
        assert!(
            o1.size_bytes() > arrived.size_bytes(),
            "the queue counted both forms"
        );
        assert_eq!(
            o1.gzipped().unwrap().as_ptr(),
            arrived.gzipped().unwrap().as_ptr(),
            "the pprof bytes are the ones that arrived"
        );
        let text = t.render();
        assert!(
            text.contains("proflow_conversions_total{to=\"otlp\"} 1"),
            "{text}"
        );
        running.shutdown().await;
    }

    #[tokio::test]
    async fn otlp_to_otlp_never_converts_and_pprof_to_pprof_never_decodes() {
        for (key, wants, e) in [
            ("pt-o", "otlp", otlp_envelope()),
            ("pt-p", "pprof", envelope("yes")),
        ] {
            let yaml = format!(
                "receivers:\n  test: {{key: {key}}}\nprocessors:\n  filter: {{}}\nexporters:\n  test: {{key: {key}-x, behaviour: ok, wants: {wants}}}\nservice:\n  pipelines:\n    profiles: {{receivers: [test], processors: [filter], exporters: [test]}}\n"
            );
            let (running, t) = start(&yaml).await;
            let arrived = e.payload.clone();
            consumer(key)
                .consume(batch(vec![e]), Admission::Refuse)
                .await
                .unwrap();
            eventually("delivered", || {
                record(&format!("{key}-x")).delivered.load(Ordering::SeqCst) == 1
            })
            .await;
            let got = record(&format!("{key}-x")).payloads.lock().unwrap()[0].clone();
            assert_eq!(
                got.identity(),
                arrived.identity(),
                "{wants}: the payload as it arrived"
            );
            assert!(!arrived.is_converted(), "{wants}: never converted");
            assert!(!arrived.is_decoded(), "{wants}: never decoded");
            assert!(
                !t.render().contains("proflow_conversions_total{"),
                "{wants}"
            );
            running.shutdown().await;
        }
    }

    #[tokio::test]
    async fn processors_get_the_batch_meta_as_the_receiver_made_it() {
        let yaml = "receivers:\n  test: {key: meta}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: meta-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], processors: [filter], exporters: [test]}\n";
        let (running, _t) = start(yaml).await;
        for this_host in [true, false] {
            let meta = Arc::new(BatchMeta {
                receiver: "ebpf/x".into(),
                this_host,
                ..Default::default()
            });
            consumer("meta")
                .consume(Batch::new(vec![envelope("meta")], meta), Admission::Refuse)
                .await
                .unwrap();
        }
        eventually("delivered", || {
            record("meta-x").delivered.load(Ordering::SeqCst) == 2
        })
        .await;
        for key in ["meta-ebpf/x-true", "meta-ebpf/x-false"] {
            assert_eq!(record(key).delivered.load(Ordering::SeqCst), 1, "{key}");
        }
        running.shutdown().await;
    }

    #[tokio::test]
    async fn a_receivers_plain_bytes_reach_processors_and_no_queue() {
        let yaml = "receivers:\n  test: {key: pl}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: pl-p, behaviour: ok, wants: pprof}\n  test/o: {key: pl-o, behaviour: ok, wants: otlp}\nservice:\n  pipelines:\n    profiles: {receivers: [test], processors: [filter], exporters: [test, test/o]}\n";
        let (running, _t) = start(yaml).await;
        assert!(consumer("pl").reads_profiles(), "a processor reads them");
        let mut e = envelope("plain");
        let gzipped = e.payload.encoded().unwrap().bytes;
        let plain = crate::pprof::decompress(&gzipped, 1 << 20).unwrap();
        e.payload = e.payload.with_plain(plain.clone());
        assert!(e.payload.has_plain());
        assert_eq!(e.payload.plain().unwrap(), plain);
        consumer("pl")
            .consume(batch(vec![e]), Admission::Refuse)
            .await
            .unwrap();
        for key in ["pl-p", "pl-o"] {
            eventually("delivered", || {
                record(key).delivered.load(Ordering::SeqCst) == 1
            })
            .await;
            let got = record(key).payloads.lock().unwrap()[0].clone();
            assert!(!got.has_plain(), "{key}: no queue keeps the plain bytes");
        }
        let pprof = record("pl-p").payloads.lock().unwrap()[0].clone();
        assert_eq!(
            pprof.encoded().unwrap().bytes,
            gzipped,
            "the bytes as they came"
        );
        assert_eq!(pprof.plain().unwrap(), plain, "inflated again when asked");
        assert_eq!(record("plain-seen").delivered.load(Ordering::SeqCst), 1);
        running.shutdown().await;
        // pprof exporters alone read nothing: receivers keep no plain bytes
        // for them; an OTLP exporter makes the pipeline convert (read) them.
        for (key, wants, reads) in [("pl2", "pprof", false), ("pl3", "otlp", true)] {
            let yaml = format!(
                "receivers:\n  test: {{key: {key}}}\nexporters:\n  test: {{key: {key}-x, behaviour: ok, wants: {wants}}}\nservice:\n  pipelines:\n    profiles: {{receivers: [test], exporters: [test]}}\n"
            );
            let (running, _t) = start(&yaml).await;
            assert_eq!(consumer(key).reads_profiles(), reads, "{wants}");
            running.shutdown().await;
        }
    }

    #[tokio::test]
    async fn a_refused_batch_counts_no_drops() {
        let yaml = "receivers:\n  test: {key: rd}\nexporters:\n  test/drop: {key: rd-d, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: drop_newest}}\n  test/block: {key: rd-b, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/drop, test/block]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("rd");
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        for _ in 0..3 {
            assert!(matches!(
                c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                    .await,
                Err(ConsumeError::Backpressure { .. })
            ));
        }
        let text = t.render();
        assert!(
            !text.contains("queue_full"),
            "refused batches must not count as dropped: {text}"
        );
        running.shutdown().await;
    }

    #[tokio::test]
    async fn a_panicking_exporter_fails_the_batch_and_keeps_its_queue_moving() {
        let yaml = "receivers:\n  test: {key: pn}\nexporters:\n  test: {key: pn-x, behaviour: panic, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("pn");
        for i in 1..=3 {
            // Each batch fits only once the previous one was finished.
            let mut accepted = false;
            for _ in 0..200 {
                if c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                    .await
                    .is_ok()
                {
                    accepted = true;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            assert!(accepted, "batch {i} was never admitted: the queue is stuck");
        }
        eventually("three panics counted", || {
            t.render().contains(
                r#"proflow_exporter_failed_profiles_total{exporter="test",reason="panic"} 3"#,
            )
        })
        .await;
        assert_eq!(running.shutdown().await.total_undelivered(), 0);
    }

    #[tokio::test]
    async fn a_receiver_that_stops_on_its_own_is_reported() {
        let yaml = "receivers:\n  test: {key: die, die: true}\nexporters:\n  test: {key: die-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        tokio::time::timeout(Duration::from_secs(5), running.receiver_failed())
            .await
            .expect("receiver_failed completes when a receiver ends by itself");
        running.shutdown().await;
    }

    fn tracked(envelopes: Vec<Envelope>) -> (Batch, crate::delivery::Delivery) {
        Batch::tracked(envelopes, Arc::new(BatchMeta::default()))
    }

    #[tokio::test]
    async fn acks_report_delivered_filtered_failed_and_dropped_copies() {
        let yaml = "receivers:\n  test: {key: ack}\nprocessors:\n  filter: {}\nexporters:\n  test/ok: {key: ack-ok, behaviour: ok}\n  test/perm: {key: ack-perm, behaviour: permanent}\n  test/hang: {key: ack-hang, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles/a: {receivers: [test], processors: [filter], exporters: [test/ok, test/perm]}\n    profiles/b: {receivers: [test], exporters: [test/hang]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("ack");
        // Fills test/hang's queue (1 profile), so the next batch is dropped there.
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        let (b, delivery) = tracked(vec![envelope("yes"), envelope("no"), envelope("yes")]);
        c.consume(b, Admission::Refuse).await.unwrap();
        let report = tokio::time::timeout(Duration::from_secs(5), delivery.wait())
            .await
            .expect("the delivery resolves");
        assert_eq!(
            report,
            DeliveryReport {
                delivered: 2,
                stored: 0,
                failed: 2,
                dropped: 3,
                filtered: 1,
                abandoned: 0
            },
            "pipeline a: 1 filtered, 2 to ok and 2 to perm; pipeline b: 3 dropped"
        );
        running.shutdown().await;
    }

    #[tokio::test]
    async fn acks_of_profiles_left_at_shutdown_report_abandoned() {
        let yaml = "receivers:\n  test: {key: ab}\nexporters:\n  test: {key: ab-x, behaviour: hang, sending_queue: {num_consumers: 1}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("ab");
        let (in_flight, d1) = tracked(vec![envelope("yes")]);
        c.consume(in_flight, Admission::Refuse).await.unwrap();
        eventually("the first batch is being sent", || {
            record("ab-x").attempts.load(Ordering::SeqCst) == 1
        })
        .await;
        let (queued, d2) = tracked(vec![envelope("yes"), envelope("yes")]);
        c.consume(queued, Admission::Refuse).await.unwrap();
        let report = running.shutdown().await;
        assert_eq!(report.undelivered.get("test"), Some(&3));
        assert_eq!(d1.wait().await.abandoned, 1, "in flight when aborted");
        assert_eq!(d2.wait().await.abandoned, 2, "still queued");
    }

    #[tokio::test]
    async fn a_partial_failure_counts_each_profile_once() {
        let yaml = "receivers:\n  test: {key: pf}\nexporters:\n  test: {key: pf-x, behaviour: refuse_odd}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, t) = start(yaml).await;
        let (b, delivery) = tracked(vec![envelope("yes"), envelope("yes"), envelope("yes")]);
        consumer("pf").consume(b, Admission::Refuse).await.unwrap();
        let report = delivery.wait().await;
        assert_eq!((report.delivered, report.failed), (2, 1));
        let text = t.render();
        assert!(
            text.contains(r#"proflow_exporter_sent_profiles_total{exporter="test"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"proflow_exporter_failed_profiles_total{exporter="test",reason="invalid"} 1"#
            ),
            "{text}"
        );
        assert_eq!(
            record("pf-x").attempts.load(Ordering::SeqCst),
            1,
            "never retried"
        );
        running.shutdown().await;
    }

    #[tokio::test]
    async fn consumers_gather_batches_up_to_the_limits() {
        let yaml = "receivers:\n  test: {key: bt}\nexporters:\n  test: {key: bt-x, behaviour: ok, sending_queue: {num_consumers: 2, batch: {flush_timeout: 200ms, max_profiles: 10}}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("bt");
        for _ in 0..25 {
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await
                .unwrap();
        }
        eventually("all 25 delivered", || {
            record("bt-x").delivered.load(Ordering::SeqCst) == 25
        })
        .await;
        let batches = record("bt-x").batches.load(Ordering::SeqCst);
        assert!(
            (3..=6).contains(&batches),
            "25 profiles pushed at once go out in a few batches of at most 10, not one by one: {batches}"
        );
        running.shutdown().await;
    }

    #[tokio::test]
    async fn one_dead_backend_does_not_stop_the_healthy_one_by_default() {
        let yaml = "receivers:\n  test: {key: dd}\nexporters:\n  test/down: {key: dd-down, behaviour: down, sending_queue: {queue_size: 5, num_consumers: 1}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\n  test/ok: {key: dd-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/down, test/ok]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("dd");
        for _ in 0..50 {
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await
                .expect("a full drop_newest queue never refuses the sender");
        }
        eventually("the healthy exporter got every profile", || {
            record("dd-ok").delivered.load(Ordering::SeqCst) == 50
        })
        .await;
        // The dead one kept 5 (its queue) and dropped the rest, counted.
        let text = t.render();
        assert!(text.contains(r#"proflow_exporter_dropped_profiles_total{exporter="test/down",reason="queue_full"} 45"#), "{text}");
        // It comes back: what it kept is delivered.
        record("dd-down").up.store(1, Ordering::SeqCst);
        eventually("the recovered exporter sent its queue", || {
            record("dd-down").delivered.load(Ordering::SeqCst) == 5
        })
        .await;
        assert_eq!(running.shutdown().await.total_undelivered(), 0);
    }

    #[tokio::test]
    async fn a_waiting_receiver_waits_for_room_instead_of_being_refused() {
        let yaml = "receivers:\n  test: {key: wa}\nexporters:\n  test: {key: wa-x, behaviour: down, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("wa");
        c.consume(batch(vec![envelope("yes")]), Admission::Wait)
            .await
            .unwrap();
        assert!(matches!(
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await,
            Err(ConsumeError::Backpressure { .. })
        ));
        let waiting = tokio::spawn({
            let c = c.clone();
            async move {
                c.consume(batch(vec![envelope("yes")]), Admission::Wait)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            !waiting.is_finished(),
            "the queue is full: the sender waits"
        );
        record("wa-x").up.store(1, Ordering::SeqCst);
        tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("admitted once the backend recovered")
            .unwrap()
            .unwrap();
        eventually("both delivered", || {
            record("wa-x").delivered.load(Ordering::SeqCst) == 2
        })
        .await;
        assert_eq!(running.shutdown().await.total_undelivered(), 0);
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_released_by_shutdown() {
        let yaml = "receivers:\n  test: {key: ws}\nexporters:\n  test: {key: ws-x, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("ws");
        c.consume(batch(vec![envelope("yes")]), Admission::Wait)
            .await
            .unwrap();
        let waiting = tokio::spawn({
            let c = c.clone();
            async move {
                c.consume(batch(vec![envelope("yes")]), Admission::Wait)
                    .await
            }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        running.shutdown().await;
        let result = tokio::time::timeout(Duration::from_secs(5), waiting)
            .await
            .expect("shutdown ends the wait")
            .unwrap();
        assert_eq!(result, Err(ConsumeError::ShuttingDown));
    }

    #[tokio::test]
    async fn shutdown_ends_idle_consumers_at_once() {
        // Four idle consumers must all end when the queue closes: a lost
        // wakeup would leave three asleep until the 30 s deadline.
        let yaml = "receivers:\n  test: {key: sh}\nexporters:\n  test: {key: sh-x, behaviour: ok, sending_queue: {num_consumers: 4}}\nservice:\n  shutdown_timeout: 30s\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let c = consumer("sh");
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        let report = tokio::time::timeout(Duration::from_secs(10), running.shutdown())
            .await
            .expect("idle consumers end when the queue closes, not at the deadline");
        assert_eq!(report.total_undelivered(), 0);
        assert_eq!(record("sh-x").delivered.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_hanging_exporter_shutdown_is_bounded_by_the_deadline() {
        let yaml = "receivers:\n  test: {key: hs}\nexporters:\n  test: {key: hs-x, behaviour: ok, hang_on_shutdown: true}\nservice:\n  shutdown_timeout: 1500ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, _) = start(yaml).await;
        let shutdown = tokio::spawn(running.shutdown());
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(
            !shutdown.is_finished(),
            "the exporter's shutdown is given what is left of the deadline"
        );
        tokio::time::timeout(Duration::from_secs(10), shutdown)
            .await
            .expect("a hanging exporter shutdown is left after shutdown_timeout")
            .unwrap();
    }

    #[tokio::test]
    async fn exporters_no_pipeline_uses_are_never_built() {
        let yaml = "receivers:\n  test: {key: un}\nexporters:\n  test/used: {key: un-used, behaviour: ok}\n  test/unused: {key: un-unused, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/used]}\n";
        let (running, _) = start(yaml).await;
        assert_eq!(record("un-used").built.load(Ordering::SeqCst), 1);
        assert_eq!(record("un-unused").built.load(Ordering::SeqCst), 0);
        assert_eq!(running.queue_levels().len(), 1);
        running.shutdown().await;
    }

    #[test]
    fn listeners_conflict_by_port_and_directories_by_nesting() {
        let l = |s: &str| Resource::TcpListen(s.parse().unwrap());
        let d = |s: &str| Resource::Directory(s.into());
        assert!(conflicts(&l("0.0.0.0:4040"), &l("127.0.0.1:4040")));
        assert!(conflicts(&l("127.0.0.1:4040"), &l("127.0.0.1:4040")));
        assert!(conflicts(&l("[::]:4040"), &l("0.0.0.0:4040")));
        assert!(!conflicts(&l("127.0.0.1:4040"), &l("127.0.0.2:4040")));
        assert!(
            !conflicts(&l("127.0.0.1:0"), &l("127.0.0.1:0")),
            "port 0 never collides"
        );
        assert!(conflicts(&d("/data"), &d("/data/svc")));
        assert!(!conflicts(&d("/data/a"), &d("/data/ab")));
    }

    #[test]
    fn the_in_flight_budget_must_be_positive() {
        let yaml = "receivers:\n  test: {key: lim}\nexporters:\n  test: {key: lim, behaviour: ok}\nservice:\n  limits: {max_in_flight_bytes: 0}\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let errs = plan(
            &Document::parse_with_env(yaml, &|_| None).unwrap(),
            &registry(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            errs.contains("service.limits.max_in_flight_bytes"),
            "{errs}"
        );
        let ok = yaml.replace("max_in_flight_bytes: 0", "max_in_flight_bytes: 1MiB");
        let p = plan(
            &Document::parse_with_env(&ok, &|_| None).unwrap(),
            &registry(),
        )
        .unwrap();
        assert_eq!(p.max_in_flight_bytes, 1 << 20);
    }

    #[test]
    fn queue_and_retry_blocks_are_validated_for_every_exporter() {
        let yaml = "receivers:\n  test: {key: v}\nexporters:\n  test: {key: v, behaviour: ok, sending_queue: {num_consumers: 0}, retry_on_failure: {multiplier: 1e19}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let errs = plan(
            &Document::parse_with_env(yaml, &|_| None).unwrap(),
            &registry(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            errs.contains("exporters.test.sending_queue.num_consumers"),
            "{errs}"
        );
        assert!(
            errs.contains("exporters.test.retry_on_failure.multiplier"),
            "{errs}"
        );
    }

    #[tokio::test]
    async fn a_full_queue_holds_the_sender_until_it_has_room_instead_of_dropping() {
        let yaml = "receivers:\n  test: {key: hold}\nexporters:\n  test: {key: hold-x, behaviour: down, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 30s}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("hold");
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        // The queue (1) is full and its exporter failing: the next batch waits.
        let second = tokio::spawn({
            let c = c.clone();
            async move {
                c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                    .await
            }
        });
        eventually("the exporter tried the first batch twice", || {
            record("hold-x").attempts.load(Ordering::SeqCst) >= 2
        })
        .await;
        assert!(!second.is_finished(), "held back while the queue is full");
        record("hold-x").up.store(1, Ordering::SeqCst);
        second
            .await
            .unwrap()
            .expect("queued once the exporter made room");
        eventually("both delivered", || {
            record("hold-x").delivered.load(Ordering::SeqCst) == 2
        })
        .await;
        let text = t.render();
        assert!(
            text.contains(r#"proflow_exporter_queue_waits_total{exporter="test",result="room"} 1"#),
            "{text}"
        );
        assert!(
            !text.contains("proflow_exporter_dropped_profiles_total"),
            "{text}"
        );
        let report = running.shutdown().await;
        assert!(report.all_delivered(), "{report:?}");
    }

    #[tokio::test]
    async fn a_stalled_queue_costs_one_wait_then_drops_and_a_batch_nobody_took_is_refused() {
        let yaml = "receivers:\n  test: {key: stall}\nexporters:\n  test/dead: {key: stall-dead, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 50ms}}\n  test/ok: {key: stall-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles/both: {receivers: [test], exporters: [test/dead, test/ok]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("stall");
        for _ in 0..4 {
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await
                .expect("the healthy exporter takes every batch");
        }
        eventually("the healthy exporter got all four", || {
            record("stall-ok").delivered.load(Ordering::SeqCst) == 4
        })
        .await;
        let text = t.render();
        for want in [
            r#"proflow_exporter_queue_waits_total{exporter="test/dead",result="timeout"} 1"#,
            r#"proflow_exporter_queue_waits_total{exporter="test/dead",result="stalled"} 2"#,
            r#"proflow_exporter_dropped_profiles_total{exporter="test/dead",reason="queue_full"} 3"#,
        ] {
            assert!(text.contains(want), "{want}\n{text}");
        }
        let report = running.shutdown().await;
        assert_eq!(report.total_dropped(), 3, "{report:?}");
        assert_eq!(report.total_undelivered(), 1, "the hanging send");
        assert!(!report.all_delivered());

        // Alone, the dead exporter takes nothing: refused, not dropped.
        let yaml = "receivers:\n  test: {key: alone}\nexporters:\n  test: {key: alone-x, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 20ms}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("alone");
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
        for _ in 0..2 {
            let err = c
                .consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await
                .unwrap_err();
            assert!(
                matches!(err, ConsumeError::Backpressure { ref exporter, .. } if exporter == "test"),
                "{err:?}"
            );
        }
        assert!(
            !t.render()
                .contains("proflow_exporter_dropped_profiles_total")
        );
        // A receiver that cannot be refused (scrape, eBPF) drops, counted.
        c.consume(batch(vec![envelope("yes")]), Admission::Wait)
            .await
            .unwrap();
        let text = t.render();
        assert!(
            text.contains(
                r#"proflow_exporter_dropped_profiles_total{exporter="test",reason="queue_full"} 1"#
            ),
            "{text}"
        );
        assert_eq!(running.shutdown().await.total_dropped(), 1);
    }

    #[tokio::test]
    async fn wait_all_waits_for_drop_newest_queues_too() {
        let yaml = "receivers:\n  test: {key: wall}\nexporters:\n  test: {key: wall-x, behaviour: down, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 10ms}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
        let (running, t) = start(yaml).await;
        let c = consumer("wall");
        c.consume(batch(vec![envelope("yes")]), Admission::WaitAll)
            .await
            .unwrap();
        let second = tokio::spawn({
            let c = c.clone();
            async move {
                c.consume(batch(vec![envelope("yes")]), Admission::WaitAll)
                    .await
            }
        });
        // Far past wait_when_full, it still waits: nothing is dropped.
        eventually("the exporter retried a few times", || {
            record("wall-x").attempts.load(Ordering::SeqCst) >= 5
        })
        .await;
        assert!(!second.is_finished());
        record("wall-x").up.store(1, Ordering::SeqCst);
        second.await.unwrap().unwrap();
        eventually("both delivered", || {
            record("wall-x").delivered.load(Ordering::SeqCst) == 2
        })
        .await;
        assert!(
            !t.render()
                .contains("proflow_exporter_dropped_profiles_total")
        );
        assert!(running.shutdown().await.all_delivered());
    }

    #[test]
    fn error_class_helpers() {
        let e = ExportError::retryable("http_503", "unavailable")
            .with_retry_after(Duration::from_secs(3));
        assert_eq!(
            e.class,
            ErrorClass::Retryable {
                retry_after: Some(Duration::from_secs(3))
            }
        );
    }
}
