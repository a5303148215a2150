//! The component traits. A component is a config struct (serde,
//! `deny_unknown_fields`, every field documented) implementing [`Validate`] and
//! one of [`ReceiverConfig`], [`ProcessorConfig`], [`ExporterConfig`], whose
//! `build` returns the running thing: a [`Receiver`], [`Processor`] or [`Exporter`].
//!
//! Components never talk to each other: receivers hand batches to a
//! [`Consumer`] (the pipeline's fan-out), exporters are driven by their queue.

use std::fmt::Debug;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio_util::sync::CancellationToken;

pub use proflow_config::{BuildError, FieldError, Validate, joined_problems, no_problems};
pub use proflow_net::error_chain;

use crate::telemetry::{ExporterTelemetry, ProcessorTelemetry, ReceiverTelemetry, Telemetry};
use proflow_config::SendingSettings;
use proflow_model::memory::MemoryBudget;
use proflow_model::model::{Batch, BatchMeta, Envelope, ExportBatch, Format};
use proflow_model::spans::SpanConsumer;

/// Something a component claims exclusively; two components claiming the same
/// resource fail validation instead of failing at bind time.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Resource {
    /// A TCP listening address.
    TcpListen(SocketAddr),
    /// A directory written by one component only.
    Directory(std::path::PathBuf),
}

/// What every `build` gets.
#[derive(Clone, Debug)]
pub struct BuildContext {
    /// The component id, such as `relabel/team`.
    pub id: String,
    pub telemetry: Arc<Telemetry>,
    /// The collector-wide in-flight budget (`service.limits.max_in_flight_bytes`),
    /// for components that hold memory on behalf of what they were sent
    /// outside a receiver's request (a debug file fetched because a pushed
    /// profile named its build id).
    pub memory: proflow_model::memory::MemoryBudget,
}

impl BuildContext {
    pub fn receiver_telemetry(&self) -> ReceiverTelemetry {
        self.telemetry.receiver(&self.id)
    }
    pub fn processor_telemetry(&self) -> ProcessorTelemetry {
        self.telemetry.processor(&self.id)
    }
    pub fn exporter_telemetry(&self) -> ExporterTelemetry {
        self.telemetry.exporter(&self.id)
    }
}

// ---------------------------------------------------------------- receivers

/// Why the pipeline did not take a batch.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConsumeError {
    /// Exporter queues are full: a `when_full: block` queue stayed full for
    /// its `wait_when_full`, or no exporter could queue any copy of the
    /// batch. Nothing was enqueued anywhere; the sender should retry later.
    #[error("exporter `{exporter}` is behind and its queue is full; retry after {retry_after:?}")]
    Backpressure {
        exporter: String,
        retry_after: Duration,
    },
    /// The tenant holds its share of a `block` queue past half full while
    /// other tenants have profiles in it (a push receiver's batch only).
    /// Nothing was enqueued anywhere; the sender should retry later.
    #[error(
        "tenant `{tenant}` holds its share of exporter `{exporter}`'s queue; retry after {retry_after:?}"
    )]
    OverShare {
        exporter: String,
        tenant: String,
        retry_after: Duration,
    },
    /// The collector is stopping and takes no new data.
    #[error("the collector is shutting down")]
    ShuttingDown,
    /// An exporter's persistent queue could not store the batch durably
    /// (a full or failing disk). The batch is still queued in memory, but the
    /// sender should retry, since it would not survive a restart.
    #[error("exporter `{exporter}` could not store the profiles on disk: {error}")]
    NotStored { exporter: String, error: String },
}

/// What a push receiver tells its client when the pipeline refused the
/// profiles of a request ([`hand_over`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushRefusal {
    /// Send again after `retry_after` (HTTP 429, gRPC `RESOURCE_EXHAUSTED`);
    /// `detail` says why, naming the exporter that is behind.
    RetryLater {
        retry_after: Duration,
        detail: String,
    },
    /// The collector is stopping (HTTP 503, gRPC `UNAVAILABLE`).
    ShuttingDown,
}

/// How long a client whose profiles a persistent queue could not store is
/// asked to wait: the disk is full or failing, which takes a while to fix.
const NOT_STORED_RETRY_AFTER: Duration = Duration::from_secs(5);

impl From<ConsumeError> for PushRefusal {
    fn from(error: ConsumeError) -> Self {
        match error {
            ConsumeError::Backpressure {
                exporter,
                retry_after,
            } => PushRefusal::RetryLater {
                retry_after,
                detail: format!(
                    "the collector is busy: exporter `{exporter}` is behind and its queue is full"
                ),
            },
            ConsumeError::OverShare {
                exporter,
                tenant,
                retry_after,
            } => PushRefusal::RetryLater {
                retry_after,
                detail: format!(
                    "the collector is busy: exporter `{exporter}` is behind and tenant `{tenant}` holds its share of its queue while other tenants wait"
                ),
            },
            ConsumeError::ShuttingDown => PushRefusal::ShuttingDown,
            // The batch is queued in memory but would not survive a restart:
            // retried like a full queue.
            ConsumeError::NotStored { exporter, error } => PushRefusal::RetryLater {
                retry_after: NOT_STORED_RETRY_AFTER,
                detail: format!(
                    "exporter `{exporter}` could not store the profiles on disk ({error}); retry later"
                ),
            },
        }
    }
}

/// Hands the profiles of one pushed request to the pipeline, once: refused
/// rather than dropped while exporter queues are full ([`Admission::Refuse`]),
/// and counted as accepted when taken. An empty request is taken as is.
pub async fn hand_over(
    consumer: &dyn Consumer,
    telemetry: &ReceiverTelemetry,
    envelopes: Vec<Envelope>,
    meta: BatchMeta,
) -> Result<(), PushRefusal> {
    if envelopes.is_empty() {
        return Ok(());
    }
    let profiles = envelopes.len() as u64;
    let bytes = proflow_model::model::batch_bytes(&envelopes) as u64;
    consumer
        .consume(Batch::new(envelopes, Arc::new(meta)), Admission::Refuse)
        .await?;
    telemetry.accepted(profiles, bytes);
    Ok(())
}

/// How a receiver is held back by full exporter queues. A full queue first
/// holds the batch for up to its `sending_queue.wait_when_full` while it
/// drains (at once, without waiting, when its last wait ran out and it had
/// no room since); what happens then depends on the receiver:
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// For push receivers, whose clients retry a refusal (429 /
    /// `RESOURCE_EXHAUSTED`): a `block` queue that stays full refuses the
    /// batch everywhere ([`ConsumeError::Backpressure`]); a `drop_newest`
    /// queue drops its copy, unless no queue could take any copy: then the
    /// batch is refused too, so success always means some exporter has it.
    Refuse,
    /// For receivers that set their own pace and cannot send again (scrape,
    /// eBPF): a `block` queue is waited for until it has room; a
    /// `drop_newest` queue that stays full drops its copy. Only shutdown
    /// ends the wait.
    Wait,
    /// For receivers that can hold their source and read it again (Kafka):
    /// every full queue, `drop_newest` too, is waited for until it has room,
    /// so no copy is ever dropped. Only shutdown ends the wait.
    WaitAll,
}

/// Where a receiver hands what it accepted. `Ok` means the batch is in every
/// target exporter's queue (or was dropped there by a `drop_newest` policy
/// while another queue took it, or filtered out by a processor): the
/// receiver may acknowledge its sender.
/// What then became of it is reported through the batch's
/// [`Ack`](proflow_model::delivery::Ack), if the receiver made a tracked one.
#[async_trait]
pub trait Consumer: Send + Sync {
    async fn consume(&self, batch: Batch, admission: Admission) -> Result<(), ConsumeError>;

    /// True when something behind this consumer reads the profiles' bytes
    /// before they are queued (a processor, or a conversion to another
    /// form): a receiver that inflated a profile to check it then hands the
    /// plain bytes along ([`Payload::with_plain`](proflow_model::model::Payload::with_plain))
    /// instead of letting them go.
    fn reads_profiles(&self) -> bool {
        true
    }
}

/// What a running receiver gets.
pub struct ReceiverContext {
    pub id: String,
    /// The fan-out into every pipeline this receiver feeds.
    pub consumer: Arc<dyn Consumer>,
    pub telemetry: ReceiverTelemetry,
    /// Cancelled when the receiver must stop accepting.
    pub shutdown: CancellationToken,
    /// The collector-wide budget for request bodies and what is decompressed
    /// from them: take a grant before reading, grow it before allocating.
    pub memory: MemoryBudget,
    /// False when the receiver is in no `profiles` pipeline (only in
    /// `traces` ones): it should refuse profiles rather than take them to
    /// nowhere.
    pub takes_profiles: bool,
    /// For a receiver in a `traces` pipeline ([`ReceiverConfig::accepts_spans`]):
    /// where its spans go (every span-taking processor of those pipelines).
    /// `None`: it should refuse traces.
    pub spans: Option<Arc<dyn SpanConsumer>>,
    /// Where listening receivers get their sockets ([`Listeners::bind`]), so a
    /// reload hands a socket over instead of closing and binding it again.
    ///
    /// [`Listeners::bind`]: proflow_net::server::Listeners::bind
    pub listeners: proflow_net::server::Listeners,
}

/// The future a started receiver serves with.
pub type ServeFuture = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A running receiver.
#[async_trait]
pub trait Receiver: Send {
    /// Claims resources (binds listeners) and returns the future that serves
    /// until `ctx.shutdown` is cancelled. Returning `Ok` means it is ready.
    async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError>;
}

/// A receiver's config.
pub trait ReceiverConfig: Validate + Debug + Send + Sync {
    fn resources(&self) -> Vec<Resource> {
        Vec::new()
    }
    /// The most memory one request may need (its body plus what it may
    /// decompress), so the plan can check `service.limits.max_in_flight_bytes`
    /// leaves room for it. `0` for receivers that take no requests.
    fn max_request_memory(&self) -> usize {
        0
    }
    /// True for receivers that can take traces (to feed a `traces`
    /// pipeline's processors; proflow exports no traces).
    fn accepts_spans(&self) -> bool {
        false
    }
    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Receiver>, BuildError>;
}

// --------------------------------------------------------------- processors

/// A running processor. It returns the profiles to pass on; profiles it drops
/// it counts through its [`ProcessorTelemetry`] (the pipeline reports them as
/// filtered to the batch's acknowledgement).
#[async_trait]
pub trait Processor: Send + Sync {
    /// The profiles of one batch, with where the batch came from (a
    /// processor that reads this host's files decides by
    /// [`BatchMeta::this_host`] whether it may).
    async fn process(&self, envelopes: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope>;

    /// For a processor that takes spans ([`ProcessorConfig::takes_spans`]):
    /// where a `traces` pipeline's receivers hand them.
    fn span_consumer(&self) -> Option<Arc<dyn SpanConsumer>> {
        None
    }

    /// For a processor that holds profiles back to pass them on later (the
    /// `aggregate` processor): how often the pipeline asks it for what is
    /// due ([`Processor::release`]). `None`, the default, for a processor
    /// that passes on everything from [`Processor::process`]. A pipeline
    /// may list one processor that holds.
    fn holds(&self) -> Option<Duration> {
        None
    }

    /// What a holding processor passes on now: the profiles whose time has
    /// come, or everything it holds when `all` (the collector stops, or a
    /// reload replaces the pipeline), in groups with the batch meta each
    /// goes on with. The pipeline runs them through the processors listed
    /// after it and into the exporter queues, waiting for room as a
    /// scrape does ([`Admission::Wait`]).
    fn release(&self, all: bool) -> Vec<(Vec<Envelope>, Arc<BatchMeta>)> {
        let _ = all;
        Vec::new()
    }
}

/// A processor's config.
pub trait ProcessorConfig: Validate + Debug + Send + Sync {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError>;

    /// Builds it knowing the payload forms the exporters after it want
    /// (over every pipeline it is in), for a processor that can make a form
    /// itself more cheaply than the pipeline's conversion would.
    fn build_for(
        &self,
        ctx: &BuildContext,
        downstream: &[Format],
    ) -> Result<Arc<dyn Processor>, BuildError> {
        let _ = downstream;
        self.build(ctx)
    }

    /// True for a processor that takes spans, and so may be listed in a
    /// `traces` pipeline. Such a processor is built once and shared by every
    /// pipeline that lists it, so the spans one pipeline feeds it serve the
    /// profiles of another.
    fn takes_spans(&self) -> bool {
        false
    }
}

// ---------------------------------------------------------------- exporters

/// Whether a failed export may succeed when tried again.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorClass {
    /// Try again after backoff (or after `retry_after` when the peer said so).
    Retryable { retry_after: Option<Duration> },
    /// The peer refused the data itself; retrying cannot help.
    Permanent,
}

/// Why an export failed. `reason` is a short snake_case word for metrics.
///
/// A partial failure ([`ExportError::partial`]) names the profiles the peer
/// refused for good; the others of the batch count as delivered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ExportError {
    pub class: ErrorClass,
    pub reason: String,
    pub message: String,
    /// For a partial failure: indexes into the exported batch of the profiles
    /// that failed; `None` when the whole batch failed.
    pub refused: Option<Vec<usize>>,
}

impl ExportError {
    pub fn retryable(reason: impl Into<String>, message: impl Into<String>) -> Self {
        ExportError {
            class: ErrorClass::Retryable { retry_after: None },
            reason: reason.into(),
            message: message.into(),
            refused: None,
        }
    }
    pub fn permanent(reason: impl Into<String>, message: impl Into<String>) -> Self {
        ExportError {
            class: ErrorClass::Permanent,
            reason: reason.into(),
            message: message.into(),
            refused: None,
        }
    }
    /// Some profiles were refused for good (indexes into the batch); the rest
    /// were delivered. Partial failures are never retried.
    pub fn partial(
        refused: Vec<usize>,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ExportError {
            refused: Some(refused),
            ..ExportError::permanent(reason, message)
        }
    }
    pub fn with_retry_after(mut self, d: Duration) -> Self {
        if let ErrorClass::Retryable { retry_after } = &mut self.class {
            *retry_after = Some(d);
        }
        self
    }
}

/// A running exporter. Its queue calls `export` from `num_consumers` tasks at
/// once, so it must be safe to call concurrently. Each call gets what the
/// queue gathered (see `sending_queue.batch`): the profiles of one or more
/// received batches, in arrival order.
///
/// `Ok` means every profile was delivered. A retryable error retries the
/// whole batch, so an exporter must not leave part of a failed batch
/// delivered (or must report it as a partial failure, which is not retried).
#[async_trait]
pub trait Exporter: Send + Sync {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError>;

    /// Called once after the queue has drained, before the process exits,
    /// bounded by what is left of `service.shutdown_timeout`.
    async fn shutdown(&self) {}
}

/// An exporter's config. Queue and retry settings come from its
/// `sending_queue` and `retry_on_failure` blocks, which every exporter
/// embeds as one [`SendingSettings`].
pub trait ExporterConfig: Validate + Debug + Send + Sync {
    /// The queue and retry in front of this exporter.
    fn sending(&self) -> &SendingSettings;
    fn resources(&self) -> Vec<Resource> {
        Vec::new()
    }
    /// The payload form this exporter sends, if it needs one. The pipeline
    /// gives every profile this form before it enters the exporter's queue
    /// (converting once, shared with every other exporter that wants it, and
    /// counted in the queue's bytes). `None`: the exporter takes either form
    /// as it is.
    fn wants(&self) -> Option<Format> {
        None
    }
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError>;
}
