//! The running graph: starting a [`Plan`] and applying a new one (reload),
//! receivers bound and served, exporters built before the switch.

use super::*;

pub(super) struct RunningExporter {
    pub(super) id: String,
    /// Its config as text, to find it unchanged on a reload.
    pub(super) fingerprint: String,
    pub(super) queue: Arc<ExporterQueue>,
    pub(super) exporter: Arc<dyn Exporter>,
    pub(super) tasks: Vec<JoinHandle<()>>,
    /// Stops this exporter's consumers (a child of the collector's abort).
    pub(super) abort: CancellationToken,
    /// What it claims (its directory), so a reload never gives a directory
    /// two writers.
    pub(super) resources: Vec<Resource>,
}

/// A receiver that is serving.
pub(super) struct RunningReceiver {
    pub(super) config: Arc<dyn crate::component::ReceiverConfig>,
    pub(super) fingerprint: String,
    /// Which signals it was started for (a change restarts it).
    pub(super) signals: (bool, bool),
    pub(super) stop: CancellationToken,
    pub(super) task: JoinHandle<()>,
    pub(super) consumer: Arc<SwapConsumer>,
    pub(super) spans: Option<Arc<SwapSpans>>,
}

impl RunningReceiver {
    /// Stops it (a reload replaced or removed it), waiting at most
    /// [`RECEIVER_STOP_TIMEOUT`] for its calls in flight.
    pub(super) async fn stop(self, id: &str) {
        self.stop.cancel();
        if tokio::time::timeout(RECEIVER_STOP_TIMEOUT, self.task)
            .await
            .is_err()
        {
            tracing::warn!(receiver = %id, "receiver did not stop within {RECEIVER_STOP_TIMEOUT:?}");
        }
    }
}

/// A receiver to start: its config and what goes behind it.
pub(super) struct ReceiverStart {
    pub(super) id: String,
    pub(super) config: Arc<dyn crate::component::ReceiverConfig>,
    pub(super) fingerprint: String,
    pub(super) signals: (bool, bool),
    pub(super) fanout: Arc<dyn Consumer>,
    pub(super) spans: Option<Arc<dyn SpanConsumer>>,
}

/// A receiver bound to its address, not yet serving.
pub(super) struct Bound {
    pub(super) stop: CancellationToken,
    pub(super) serve: crate::component::ServeFuture,
    pub(super) consumer: Arc<SwapConsumer>,
    pub(super) spans: Option<Arc<SwapSpans>>,
}

/// A started collector.
pub struct Running {
    /// Parent of every receiver's own stop token.
    pub(super) receivers_stop: CancellationToken,
    pub(super) receiver_failed: CancellationToken,
    pub(super) receivers: BTreeMap<String, RunningReceiver>,
    pub(super) exporters: BTreeMap<String, RunningExporter>,
    /// Span-taking processors (one instance shared by pipelines), with what
    /// they were built for (config text, downstream forms, fed spans).
    pub(super) span_processors: HashMap<String, (SpanProcessorKey, Arc<dyn Processor>)>,
    /// Exporters a reload removed, draining their queues; each ends with
    /// its id and the profiles it could not send.
    pub(super) retired: Vec<JoinHandle<(String, usize)>>,
    /// The tasks that pass on what holding processors release, one per
    /// pipeline that has such a processor.
    pub(super) holders: Vec<Holder>,
    /// Holders of pipelines a reload replaced, releasing what they held.
    pub(super) retired_holders: Vec<JoinHandle<()>>,
    /// Whether the first start completed.
    pub(super) started: bool,
    /// The receivers' listening sockets, handed from a receiver to its
    /// replacement by a reload.
    pub(super) listeners: crate::server::Listeners,
    pub(super) abort: CancellationToken,
    pub(super) shutdown_timeout: Duration,
    pub(super) telemetry: Arc<Telemetry>,
    pub(super) memory: crate::memory::MemoryBudget,
}

/// What a span-taking processor was built for: kept by a reload only when
/// all of it is unchanged.
pub(super) type SpanProcessorKey = (String, Vec<Format>, bool);

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
            holders: Vec::new(),
            retired_holders: Vec::new(),
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

    pub(super) async fn apply(&mut self, plan: Plan) -> Result<ReloadReport, BuildError> {
        let telemetry = self.telemetry.clone();
        let memory = self.memory.clone();
        let ctx = |id: &str| BuildContext {
            id: id.to_owned(),
            telemetry: telemetry.clone(),
            memory: memory.clone(),
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
        // Holding processors, started once nothing can fail any more.
        let mut holders = Vec::new();
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
            let exporters: Vec<Arc<ExporterQueue>> =
                p.exporters.iter().filter_map(queue_of).collect();
            // A processor that holds profiles back ends what a receiver's
            // call runs; what it releases runs through the rest.
            let holding: Vec<usize> = (0..processors.len())
                .filter(|i| processors[*i].0.holds().is_some())
                .collect();
            if holding.len() > 1 {
                stop_built(next);
                return Err(BuildError::new(format!(
                    "pipeline `{}` lists {} processors that hold profiles back (aggregate); list one",
                    p.id,
                    holding.len()
                )));
            }
            if let Some(&h) = holding.first() {
                let rest = processors.split_off(h + 1);
                let (proc, telemetry) = processors[h].clone();
                let every = proc.holds().unwrap_or(Duration::from_secs(1));
                let tail: Arc<dyn Consumer> = Arc::new(Fanout {
                    pipelines: vec![Arc::new(PipelineRuntime {
                        processors: rest,
                        exporters: exporters.clone(),
                        forms: forms.clone(),
                    })],
                    telemetry: self.telemetry.clone(),
                    counts_tenants: false,
                });
                holders.push((p.id.clone(), proc, telemetry, every, tail));
            }
            let runtime = Arc::new(PipelineRuntime {
                processors,
                exporters,
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
                    counts_tenants: true,
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
        // Nothing fails from here on: the new pipelines' holders start
        // before any receiver feeds them.
        let old_holders = std::mem::take(&mut self.holders);
        for (pipeline, proc, telemetry, every, tail) in holders {
            self.holders
                .push(Holder::spawn(&pipeline, proc, telemetry, every, tail));
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
        // for them before it closes (in the background). The replaced
        // pipelines' holders release what they hold once those calls end,
        // and the leaving exporters wait for that too.
        let receivers_in_flight = Arc::new(replaced.clone());
        for h in old_holders {
            replaced.push(h.tail.clone());
            self.retired_holders.push(tokio::spawn(
                h.retire(receivers_in_flight.clone(), self.shutdown_timeout),
            ));
        }
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
    pub(super) async fn bind_receiver(&self, start: &ReceiverStart) -> Result<Bound, BuildError> {
        let c = BuildContext {
            id: start.id.clone(),
            telemetry: self.telemetry.clone(),
            memory: self.memory.clone(),
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
    pub(super) fn serve_receiver(&mut self, start: ReceiverStart, b: Bound) {
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
}

impl Running {
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
