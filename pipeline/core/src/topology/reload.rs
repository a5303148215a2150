//! Applying a plan to a running collector (the first start is a reload
//! from nothing), in steps: [`diff`](super::diff) decides what each
//! component does; exporters are built; processors are built and wired
//! into pipelines; receivers start, switch to the new pipelines or are
//! replaced; what left drains in the background. Until receivers switch,
//! a failure stops what this reload built and leaves everything running
//! as it was.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use crate::component::{BuildContext, BuildError, Consumer, Processor, Resource};
use crate::queue::ExporterQueue;
use crate::telemetry::ProcessorTelemetry;
use proflow_model::model::Format;
use proflow_model::spans::SpanConsumer;

use super::diff::{self, Change, ExporterState, ReceiverState};
use super::fanout::{Fanout, PipelineRuntime, SpanFanout};
use super::hold::Holder;
use super::plan::building;
use super::running::{ReceiverStart, ReloadReport, Running, RunningExporter, SpanProcessorKey};
use super::shutdown::{retire, stop_built};
use super::{PipelinePlan, Plan, Signal};

/// A holding processor's task, to start once nothing can fail any more:
/// (pipeline id, processor, its telemetry, how often it releases, what it
/// releases into).
type HolderStart = (
    String,
    Arc<dyn Processor>,
    ProcessorTelemetry,
    Duration,
    Arc<dyn Consumer>,
);

/// Per receiver: (processor id, its span consumer).
type Feeds = Vec<(String, Arc<dyn SpanConsumer>)>;

/// The span-taking processors by id, with what each was built for.
type SharedProcessors = HashMap<String, (SpanProcessorKey, Arc<dyn Processor>)>;

/// What the new pipelines are made of, before any receiver feeds them.
#[derive(Default)]
struct Wiring {
    /// Span-taking processors, one instance each.
    shared: SharedProcessors,
    /// Each receiver's profiles pipelines.
    by_receiver: HashMap<String, Vec<Arc<PipelineRuntime>>>,
    /// Each receiver's span consumers.
    spans_by_receiver: HashMap<String, Feeds>,
    holders: Vec<HolderStart>,
}

/// What receivers ran into when they switched: the consumers replaced
/// (calls may still run on them) and the holders of the old pipelines.
struct Switched {
    replaced: Vec<Arc<dyn Consumer>>,
    old_holders: Vec<Holder>,
}

impl Plan {
    /// The config text of `<section>.<id>`, what a reload compares.
    fn fingerprint(&self, section: &str, id: &str) -> String {
        self.fingerprints
            .get(&format!("{section}.{id}"))
            .cloned()
            .unwrap_or_default()
    }

    /// The payload forms `p`'s exporters want.
    fn forms_of(&self, p: &PipelinePlan) -> Vec<Format> {
        let mut forms = Vec::new();
        for e in &p.exporters {
            if let Some(f) = self.exporters.get(e).and_then(|c| c.wants())
                && !forms.contains(&f)
            {
                forms.push(f);
            }
        }
        forms
    }

    /// The exporters pipelines use, as a reload compares them (the unused
    /// are warned about at plan time and never run).
    fn exporter_states(&self) -> BTreeMap<String, ExporterState> {
        let used: HashSet<&String> = self.pipelines.iter().flat_map(|p| &p.exporters).collect();
        self.exporters
            .iter()
            .filter(|(id, _)| used.contains(id))
            .map(|(id, config)| {
                let state = ExporterState {
                    fingerprint: self.fingerprint("exporters", id),
                    persistent: config.sending().sending_queue.storage.is_some(),
                    resources: config.resources(),
                };
                (id.clone(), state)
            })
            .collect()
    }

    /// What each span-taking processor would be built for.
    fn span_processor_keys(&self) -> BTreeMap<String, SpanProcessorKey> {
        let mut keys = BTreeMap::new();
        for (pid, config) in &self.processors {
            if !config.takes_spans() {
                continue;
            }
            let mut downstream = Vec::new();
            for p in self.pipelines.iter().filter(|p| p.processors.contains(pid)) {
                for f in self.forms_of(p) {
                    if !downstream.contains(&f) {
                        downstream.push(f);
                    }
                }
            }
            let fed = self
                .pipelines
                .iter()
                .any(|p| p.signal == Signal::Traces && p.processors.contains(pid));
            keys.insert(
                pid.clone(),
                (self.fingerprint("processors", pid), downstream, fed),
            );
        }
        keys
    }
}

impl Running {
    pub(super) async fn apply(&mut self, plan: Plan) -> Result<ReloadReport, BuildError> {
        let mut report = ReloadReport::default();
        let running: BTreeMap<String, ExporterState> = self
            .exporters
            .iter()
            .map(|(id, e)| {
                let state = ExporterState {
                    fingerprint: e.fingerprint.clone(),
                    persistent: e.queue.is_persistent(),
                    resources: e.resources.clone(),
                };
                (id.clone(), state)
            })
            .collect();
        let exporters =
            diff::exporters(&running, &plan.exporter_states()).map_err(BuildError::new)?;
        let built = self.build_exporters(&plan, &exporters)?;
        let wiring = match self.wire(&plan, &built, &exporters, &mut report) {
            Ok(w) => w,
            Err(e) => {
                stop_built(built);
                return Err(e);
            }
        };
        let shared = wiring.shared.clone();
        let switched = match self.switch_receivers(&plan, wiring, &mut report).await {
            Ok(s) => s,
            Err(e) => {
                stop_built(built);
                return Err(e);
            }
        };
        self.retire_replaced(switched, built, &exporters, &mut report);
        self.span_processors = shared;
        Ok(report)
    }

    fn context(&self, id: &str) -> BuildContext {
        BuildContext {
            id: id.to_owned(),
            telemetry: self.telemetry.clone(),
            memory: self.memory.clone(),
        }
    }

    /// Step 1: the exporters to start or replace, built with their queues
    /// and consumers running. A failure stops what this step built.
    fn build_exporters(
        &self,
        plan: &Plan,
        changes: &BTreeMap<String, Change>,
    ) -> Result<BTreeMap<String, RunningExporter>, BuildError> {
        let mut built: BTreeMap<String, RunningExporter> = BTreeMap::new();
        for (id, config) in &plan.exporters {
            if !changes.get(id).is_some_and(|c| c.builds()) {
                continue;
            }
            let c = self.context(id);
            let made = building(id, || config.build(&c))
                .map_err(|e| BuildError::new(format!("exporter `{id}`: {e}")))
                .and_then(|exporter| {
                    let queue = ExporterQueue::open(
                        id.clone(),
                        config.sending().sending_queue.clone(),
                        config.sending().retry_on_failure.clone(),
                        c.exporter_telemetry(),
                    )
                    .map_err(|e| {
                        BuildError::new(format!("exporter `{id}`: sending_queue.storage: {e}"))
                    })?;
                    Ok((exporter, queue))
                });
            let (exporter, queue) = match made {
                Ok(m) => m,
                Err(e) => {
                    stop_built(built);
                    return Err(e);
                }
            };
            let abort = self.abort.child_token();
            queue.spawn_storage(abort.clone());
            let tasks = queue.spawn_consumers(exporter.clone(), abort.clone());
            let exporter = RunningExporter {
                id: id.clone(),
                fingerprint: plan.fingerprint("exporters", id),
                queue,
                exporter,
                tasks,
                abort,
                resources: config.resources(),
            };
            built.insert(id.clone(), exporter);
        }
        Ok(built)
    }

    /// Step 2: processors built and wired into pipelines. Span-taking ones
    /// are one instance per collector, kept when unchanged (their span
    /// index survives); the others are built per pipeline, as the
    /// OpenTelemetry Collector does.
    fn wire(
        &self,
        plan: &Plan,
        built: &BTreeMap<String, RunningExporter>,
        exporters: &BTreeMap<String, Change>,
        report: &mut ReloadReport,
    ) -> Result<Wiring, BuildError> {
        let mut wiring = Wiring {
            shared: self.span_processors(plan, report)?,
            ..Wiring::default()
        };
        let queue_of = |id: &String| -> Option<Arc<ExporterQueue>> {
            let exporter = match exporters.get(id) {
                Some(Change::Keep) => self.exporters.get(id),
                _ => built.get(id),
            };
            exporter.map(|e| e.queue.clone())
        };
        let mut span_consumers: HashMap<String, Option<Arc<dyn SpanConsumer>>> = HashMap::new();
        for p in &plan.pipelines {
            if p.signal == Signal::Traces {
                for pid in &p.processors {
                    let consumer = span_consumers
                        .entry(pid.clone())
                        .or_insert_with(|| {
                            let shared = wiring.shared.get(pid);
                            shared.and_then(|(_, proc)| proc.span_consumer())
                        })
                        .clone();
                    let Some(consumer) = consumer else { continue };
                    for r in &p.receivers {
                        let list = wiring.spans_by_receiver.entry(r.clone()).or_default();
                        // A processor in two traces pipelines of one receiver gets each span once.
                        if !list.iter().any(|(id, _)| id == pid) {
                            list.push((pid.clone(), consumer.clone()));
                        }
                    }
                }
                continue;
            }
            let queues: Vec<Arc<ExporterQueue>> = p.exporters.iter().filter_map(queue_of).collect();
            let runtime = self.profiles_pipeline(plan, p, queues, &mut wiring)?;
            for r in &p.receivers {
                let pipelines = wiring.by_receiver.entry(r.clone()).or_default();
                pipelines.push(runtime.clone());
            }
        }
        Ok(wiring)
    }

    /// The span-taking processors: kept when unchanged, built otherwise.
    fn span_processors(
        &self,
        plan: &Plan,
        report: &mut ReloadReport,
    ) -> Result<SharedProcessors, BuildError> {
        let wanted = plan.span_processor_keys();
        let running: BTreeMap<String, SpanProcessorKey> = self
            .span_processors
            .iter()
            .map(|(id, (key, _))| (id.clone(), key.clone()))
            .collect();
        let mut shared = HashMap::new();
        for (pid, change) in diff::span_processors(&running, &wanted) {
            let (Some(key), Some(config)) = (wanted.get(&pid), plan.processors.get(&pid)) else {
                continue; // no longer configured: dropped with the old pipelines
            };
            let proc = match (change, self.span_processors.get(&pid)) {
                (Change::Keep, Some((_, proc))) => {
                    report.kept.push(format!("processors.{pid}"));
                    proc.clone()
                }
                _ => building(&pid, || config.build_for(&self.context(&pid), &key.1))
                    .map_err(|e| BuildError::new(format!("processor `{pid}`: {e}")))?,
            };
            shared.insert(pid, (key.clone(), proc));
        }
        Ok(shared)
    }

    /// One profiles pipeline: its processors (the shared span-taking ones,
    /// the others built for it) in order, then its exporters' queues. A
    /// processor that holds profiles back ends what a receiver's call runs;
    /// what it releases runs through the rest, from its own task.
    fn profiles_pipeline(
        &self,
        plan: &Plan,
        p: &PipelinePlan,
        exporters: Vec<Arc<ExporterQueue>>,
        wiring: &mut Wiring,
    ) -> Result<Arc<PipelineRuntime>, BuildError> {
        let forms = plan.forms_of(p);
        let mut processors = Vec::new();
        for pid in &p.processors {
            let Some(config) = plan.processors.get(pid) else {
                return Err(BuildError::new(format!("processor `{pid}` is not defined")));
            };
            let c = self.context(pid);
            let proc = match wiring.shared.get(pid) {
                Some((_, proc)) => proc.clone(),
                None => building(pid, || config.build_for(&c, &forms))
                    .map_err(|e| BuildError::new(format!("processor `{pid}`: {e}")))?,
            };
            processors.push((proc, c.processor_telemetry()));
        }
        let holding: Vec<usize> = (0..processors.len())
            .filter(|i| processors[*i].0.holds().is_some())
            .collect();
        if holding.len() > 1 {
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
            wiring
                .holders
                .push((p.id.clone(), proc, telemetry, every, tail));
        }
        Ok(Arc::new(PipelineRuntime {
            processors,
            exporters,
            forms,
        }))
    }

    /// Each receiver a pipeline lists, with what goes behind it now.
    fn receiver_starts(&self, plan: &Plan, wiring: &mut Wiring) -> Vec<ReceiverStart> {
        let mut starts = Vec::new();
        for (id, config) in &plan.receivers {
            let pipelines = wiring.by_receiver.remove(id);
            let spans =
                wiring
                    .spans_by_receiver
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
            starts.push(ReceiverStart {
                id: id.clone(),
                config: config.clone(),
                fingerprint: plan.fingerprint("receivers", id),
                signals: (pipelines.is_some(), spans.is_some()),
                fanout: Arc::new(Fanout {
                    pipelines: pipelines.unwrap_or_default(),
                    telemetry: self.telemetry.clone(),
                    counts_tenants: true,
                }),
                spans,
            });
        }
        starts
    }

    /// Step 3: receivers. New ones bind first (a failure there changes
    /// nothing running); then the new pipelines' holders start; then the
    /// unchanged get the new pipelines behind them; then each changed one
    /// is replaced (on failure it keeps its previous config); the removed
    /// stop.
    async fn switch_receivers(
        &mut self,
        plan: &Plan,
        mut wiring: Wiring,
        report: &mut ReloadReport,
    ) -> Result<Switched, BuildError> {
        let starts = self.receiver_starts(plan, &mut wiring);
        let state = |fingerprint: &String, signals| ReceiverState {
            fingerprint: fingerprint.clone(),
            signals,
        };
        let running: BTreeMap<String, ReceiverState> = self
            .receivers
            .iter()
            .map(|(id, r)| (id.clone(), state(&r.fingerprint, r.signals)))
            .collect();
        let wanted: BTreeMap<String, ReceiverState> = starts
            .iter()
            .map(|s| (s.id.clone(), state(&s.fingerprint, s.signals)))
            .collect();
        let changes = diff::receivers(&running, &wanted);
        let (mut fresh, mut unchanged, mut changed) = (Vec::new(), Vec::new(), Vec::new());
        for start in starts {
            match changes[&start.id] {
                Change::Start => fresh.push(start),
                Change::Keep => unchanged.push(start),
                Change::Replace | Change::Stop => changed.push(start),
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
                    return Err(e);
                }
            }
        }
        // Nothing fails from here on: the new pipelines' holders start
        // before any receiver feeds them.
        let old_holders = std::mem::take(&mut self.holders);
        for (pipeline, proc, telemetry, every, tail) in wiring.holders {
            let holder = Holder::spawn(&pipeline, proc, telemetry, every, tail);
            self.holders.push(holder);
        }
        for (start, b) in bound {
            report.started.push(format!("receivers.{}", start.id));
            self.serve_receiver(start, b);
        }
        let mut replaced = self.rewire_receivers(unchanged, report);
        replaced.extend(self.replace_receivers(changed, report).await);
        for (id, change) in &changes {
            if *change == Change::Stop
                && let Some(r) = self.receivers.remove(id)
            {
                r.stop(id).await;
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
        Ok(Switched {
            replaced,
            old_holders,
        })
    }

    /// Unchanged receivers get the new pipelines behind them; returns the
    /// consumers they had.
    fn rewire_receivers(
        &mut self,
        unchanged: Vec<ReceiverStart>,
        report: &mut ReloadReport,
    ) -> Vec<Arc<dyn Consumer>> {
        let mut replaced = Vec::new();
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
        replaced
    }

    /// A changed receiver: its replacement binds first (on the same
    /// address it takes over the very socket, so no connection is
    /// refused), then the old one stops. If the replacement cannot start,
    /// the old one keeps running with the new pipelines behind it. Returns
    /// the consumers replaced that way.
    async fn replace_receivers(
        &mut self,
        changed: Vec<ReceiverStart>,
        report: &mut ReloadReport,
    ) -> Vec<Arc<dyn Consumer>> {
        let mut replaced = Vec::new();
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
                    if let Some(r) = self.receivers.get(&id) {
                        replaced.push(r.consumer.swap(start.fanout));
                    }
                    report.errors.push(format!(
                        "{e}; receiver `{id}` keeps running with its previous config"
                    ));
                }
            }
        }
        replaced
    }

    /// Steps 4 and 5: calls still running on the replaced pipelines may
    /// reserve in the queues of exporters leaving now, so each leaving
    /// exporter waits for them before it drains and closes, in the
    /// background. The replaced pipelines' holders release what they hold
    /// once those calls end, and the leaving exporters wait for that too.
    fn retire_replaced(
        &mut self,
        switched: Switched,
        mut built: BTreeMap<String, RunningExporter>,
        changes: &BTreeMap<String, Change>,
        report: &mut ReloadReport,
    ) {
        let Switched {
            mut replaced,
            old_holders,
        } = switched;
        let receivers_in_flight = Arc::new(replaced.clone());
        for h in old_holders {
            replaced.push(h.tail.clone());
            let timeout = self.shutdown_timeout;
            let retiring = h.retire(receivers_in_flight.clone(), timeout);
            self.retired_holders.push(tokio::spawn(retiring));
        }
        let in_flight = Arc::new(replaced);
        for (id, e) in std::mem::take(&mut self.exporters) {
            if changes.get(&id) == Some(&Change::Keep) {
                report.kept.push(format!("exporters.{id}"));
                built.insert(id, e);
                continue;
            }
            report.stopped.push(format!("exporters.{id}"));
            if built.contains_key(&id) {
                // Changed: the new queue reports the gauges of this id.
                e.queue.mute_gauges();
            }
            let retiring = retire(e, self.shutdown_timeout, in_flight.clone());
            self.retired.push(tokio::spawn(retiring));
        }
        for (id, change) in changes {
            if change.builds() {
                report.started.push(format!("exporters.{id}"));
            }
        }
        self.exporters = built;
    }
}
