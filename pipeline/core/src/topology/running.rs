//! The running graph: starting a [`Plan`] and applying a new one (reload),
//! receivers bound and served, exporters built before the switch.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::component::{
    BuildContext, BuildError, Consumer, Exporter, Processor, ReceiverContext, Resource,
};
use crate::queue::ExporterQueue;
use crate::telemetry::Telemetry;
use proflow_model::model::Format;
use proflow_model::spans::SpanConsumer;

use super::hold::Holder;
use super::plan::building;
use super::swap::{SwapConsumer, SwapSpans};
use super::{Plan, RECEIVER_STOP_TIMEOUT};

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
    pub(super) listeners: proflow_net::server::Listeners,
    pub(super) abort: CancellationToken,
    pub(super) shutdown_timeout: Duration,
    pub(super) telemetry: Arc<Telemetry>,
    pub(super) memory: proflow_model::memory::MemoryBudget,
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
            listeners: proflow_net::server::Listeners::default(),
            abort: CancellationToken::new(),
            shutdown_timeout: self.shutdown_timeout,
            memory: telemetry.memory_budget(self.max_in_flight_bytes),
            telemetry: telemetry.clone(),
        };
        let pipelines = pipeline_views(&self.pipelines);
        if let Err(e) = running.apply(self).await {
            running.abort.cancel();
            running.receivers_stop.cancel();
            return Err(e);
        }
        telemetry.set_pipelines(pipelines);
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
        let pipelines = pipeline_views(&plan.pipelines);
        let report = self.apply(plan).await?;
        self.shutdown_timeout = timeout;
        self.telemetry.set_pipelines(pipelines);
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

/// The pipelines as the status page lists them.
fn pipeline_views(pipelines: &[super::PipelinePlan]) -> Vec<crate::telemetry::PipelineView> {
    pipelines
        .iter()
        .map(|p| crate::telemetry::PipelineView {
            id: p.id.clone(),
            receivers: p.receivers.clone(),
            processors: p.processors.clone(),
            exporters: p.exporters.clone(),
        })
        .collect()
}
