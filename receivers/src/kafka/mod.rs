//! The `kafka` receiver: a consumer group member that reads profiles from
//! Kafka topics (what proflow's `kafka` exporter writes, or bare OTLP from the
//! OpenTelemetry Collector's) and commits a record's offset only once every
//! exporter it was sent to has delivered it.
//!
//! - **Records** ([`record`]): the encoding comes from proflow's
//!   `proflow.encoding` header, else `encoding`, else a sniff of the value
//!   (gzip → pprof, `{` → OTLP JSON, else OTLP protobuf). Labels, time range
//!   and tenant come from proflow's headers when there are any, so a profile
//!   leaves Kafka with the labels it entered with.
//! - **At least once**: each record's batch is handed to the pipeline with a
//!   tracked acknowledgement ([`proflow_model::delivery`]) and
//!   [`Admission::WaitAll`](proflow_core::component::Admission::WaitAll)
//!   (a full queue, `drop_newest` too, holds the consumer back until it has
//!   room; with `commit_dropped: true`,
//!   [`Admission::Wait`](proflow_core::component::Admission::Wait): a
//!   `drop_newest` queue that stays full for its `wait_when_full` drops its
//!   copy). When the acknowledgement resolves — every copy delivered,
//!   refused for good, dropped or filtered, all counted by the exporters —
//!   the record is resolved, and the partition's committable
//!   position moves past the longest resolved run ([`offsets`]).
//!   librdkafka commits the stored positions every `commit_interval`
//!   (`enable.auto.offset.store=false`), and once more when the receiver
//!   stops. A record whose profiles were abandoned (the collector stopped
//!   first) is never committed: it is read again after a restart, as is
//!   everything after it in its partition. So a `kill -9`, a broker restart
//!   or a rebalance may deliver a record twice, never lose one.
//! - **Bounded**: at most `max_unacknowledged` records are in the pipeline
//!   and unresolved at once; the consumer waits for acknowledgements beyond
//!   that, so a slow exporter slows the consumer instead of filling memory.
//!   By default nothing is dropped, so one stalled exporter stops the
//!   consumer for every exporter it feeds; `commit_dropped: true` trades
//!   that for drops (counted, and committed past).
//! - **Bad records** are counted (`proflow_receiver_refused_profiles_total`,
//!   reason `invalid_record`), logged with topic, partition and offset, and
//!   committed past: they never stop the consumer.

mod config;
mod offsets;
mod record;

pub use config::{InitialOffset, KafkaReceiverConfig, ReceiverEncoding};

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration as StdDuration;

use async_trait::async_trait;
use bytes::Bytes;
use proflow_core::component::{
    Admission, BuildError, ConsumeError, Receiver, ReceiverContext, ServeFuture,
};
use proflow_core::telemetry::ReceiverTelemetry;
use proflow_kafka::RecordHeaders;
use proflow_model::delivery::Delivery;
use proflow_model::memory::{self, MemoryBudget, MemoryGrant};
use proflow_model::model::{Batch, BatchMeta, batch_bytes};
use rdkafka::client::ClientContext;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, StreamConsumer,
};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use offsets::{Offsets, Slot};
use record::{Decoded, Reading, RecordError};

/// How long the receiver waits at shutdown for records in the pipeline to
/// resolve before the final commit (the collector gives receivers 5 s).
const SHUTDOWN_WAIT: StdDuration = StdDuration::from_secs(3);
/// Undecodable records logged at `warn` one by one; after that, every
/// power of two.
const LOG_EACH_INVALID: u64 = 10;
/// Consumer errors (a broker down, say) are logged at most this often.
const ERROR_LOG_EVERY: StdDuration = StdDuration::from_secs(10);

/// The built receiver, before it joins its group.
pub struct KafkaReceiver {
    properties: BTreeMap<String, String>,
    topics: Vec<String>,
    reading: Reading,
    max_unacknowledged: usize,
    /// How full queues hold the consumer back (`commit_dropped`).
    admission: Admission,
}

/// Follows assignments into [`Offsets`] and routes librdkafka's logs.
struct GroupContext {
    id: String,
    offsets: Arc<Mutex<Offsets>>,
    /// librdkafka's client errors: when one was last logged, and how many
    /// came since (a broker down makes it report every failed connection
    /// of every thread, hundreds in half a minute).
    errors: Mutex<ErrorLog>,
}

#[derive(Default)]
struct ErrorLog {
    last: Option<std::time::Instant>,
    unlogged: u64,
}

impl ClientContext for GroupContext {
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        // At most one line every ERROR_LOG_EVERY, saying how many it stood for.
        let mut log = self.errors.lock().unwrap_or_else(PoisonError::into_inner);
        log.unlogged += 1;
        if log.last.is_some_and(|t| t.elapsed() < ERROR_LOG_EVERY) {
            return;
        }
        let errors = std::mem::take(&mut log.unlogged);
        log.last = Some(std::time::Instant::now());
        drop(log);
        tracing::warn!(receiver = %self.id, error = %error, reason, errors_since_last_line = errors, "Kafka client error; librdkafka retries by itself");
    }
}

impl ConsumerContext for GroupContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            let mut offsets = self.offsets.lock().unwrap_or_else(PoisonError::into_inner);
            for e in tpl.elements() {
                offsets.revoke(e.topic(), e.partition());
            }
            tracing::info!(receiver = %self.id, partitions = tpl.count(), "partitions revoked");
        }
    }

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Assign(tpl) => {
                let mut offsets = self.offsets.lock().unwrap_or_else(PoisonError::into_inner);
                for e in tpl.elements() {
                    offsets.assign(e.topic(), e.partition());
                }
                tracing::info!(receiver = %self.id, partitions = tpl.count(), "partitions assigned");
            }
            Rebalance::Error(e) => {
                tracing::warn!(receiver = %self.id, error = %e, "rebalance failed");
            }
            Rebalance::Revoke(_) => {}
        }
    }
}

type GroupConsumer = StreamConsumer<GroupContext>;

/// What the serving loop and its acknowledgement tasks share.
struct Shared {
    id: String,
    consumer: GroupConsumer,
    offsets: Arc<Mutex<Offsets>>,
    telemetry: ReceiverTelemetry,
}

impl Shared {
    /// Resolves a record and stores the partition's new position, if any.
    /// The position is stored while the lock is held: records resolve on
    /// many tasks at once, and a store made after the lock was let go could
    /// land after a later one and move the stored position back. librdkafka
    /// commits what was stored last, at its interval and when the partition
    /// is revoked (after the final commit too), so the group would resume
    /// from the older position and read those records again.
    fn resolve(&self, slot: &Slot) {
        let mut offsets = self.offsets.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(offset) = offsets.resolve(slot)
            && let Err(e) = self
                .consumer
                .store_offset(&slot.topic, slot.partition, offset)
        {
            // The partition was revoked meanwhile: its next owner reads
            // the record again.
            tracing::debug!(receiver = %self.id, topic = %slot.topic, partition = slot.partition, offset, error = %e, "position not stored");
        }
    }
}

#[async_trait]
impl Receiver for KafkaReceiver {
    async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError> {
        let fail = |m: String| BuildError::new(format!("receiver `{}`: {m}", ctx.id));
        let offsets = Arc::new(Mutex::new(Offsets::default()));
        let mut config = ClientConfig::new();
        for (k, v) in &self.properties {
            config.set(k, v);
        }
        let consumer: GroupConsumer = config
            .create_with_context(GroupContext {
                id: ctx.id.clone(),
                offsets: offsets.clone(),
                errors: Mutex::default(),
            })
            .map_err(|e| fail(format!("librdkafka refused the consumer settings: {e}")))?;
        let topics: Vec<&str> = self.topics.iter().map(String::as_str).collect();
        consumer
            .subscribe(&topics)
            .map_err(|e| fail(format!("cannot subscribe to {topics:?}: {e}")))?;
        let shared = Arc::new(Shared {
            id: ctx.id.clone(),
            consumer,
            offsets,
            telemetry: ctx.telemetry.clone(),
        });
        Ok(Box::pin(serve(shared, *self, ctx)))
    }
}

/// Reads records until shutdown, then waits a moment for what is in the
/// pipeline and commits the acknowledged positions.
async fn serve(shared: Arc<Shared>, receiver: KafkaReceiver, ctx: ReceiverContext) {
    let permits = Arc::new(Semaphore::new(receiver.max_unacknowledged));
    let serving = Serving {
        receiver_id: Arc::from(ctx.id.as_str()),
        shared,
        receiver,
        ctx,
    };
    let mut counts = Counts::default();
    loop {
        let permit = tokio::select! {
            _ = serving.ctx.shutdown.cancelled() => break,
            p = permits.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let message = tokio::select! {
            _ = serving.ctx.shutdown.cancelled() => break,
            m = serving.shared.consumer.recv() => m,
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                serving
                    .shared
                    .telemetry
                    .error(&format!("Kafka consumer: {e}"));
                counts.consumer_error(&serving.shared.id, &e);
                tokio::time::sleep(StdDuration::from_millis(100)).await;
                continue;
            }
        };
        let Some(copied) = serving.copy_record(message).await else {
            break;
        };
        let Some(slot) = serving
            .shared
            .offsets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .begin(&copied.topic, copied.partition, copied.offset)
        else {
            continue;
        };
        match serving.deliver(copied, &slot, &mut counts).await {
            // Stopping: left uncommitted, read again after the restart.
            Delivered::Stopping => break,
            // Resolved already (or left unresolved after an error).
            Delivered::Done => {}
            Delivered::Tracked(delivery) => serving.resolve_when_delivered(delivery, slot, permit),
        }
    }
    let Serving {
        shared, receiver, ..
    } = serving;
    finish(shared, permits, receiver.max_unacknowledged).await;
}

/// What the serving loop reads for every record.
struct Serving {
    shared: Arc<Shared>,
    receiver: KafkaReceiver,
    ctx: ReceiverContext,
    receiver_id: Arc<str>,
}

/// What the serving loop counts between records, for its logs.
#[derive(Default)]
struct Counts {
    /// Undecodable records so far.
    invalid: u64,
    /// Consumer errors so far.
    consumer_errors: u64,
    /// When a consumer error was last logged.
    last_error_log: Option<std::time::Instant>,
}

impl Counts {
    /// Counts a consumer error and logs it, at most every
    /// [`ERROR_LOG_EVERY`].
    fn consumer_error(&mut self, receiver: &str, e: &rdkafka::error::KafkaError) {
        // librdkafka reconnects by itself; say so at most every 10 s.
        self.consumer_errors += 1;
        if self
            .last_error_log
            .is_none_or(|t: std::time::Instant| t.elapsed() >= ERROR_LOG_EVERY)
        {
            tracing::warn!(receiver = %receiver, error = %e, errors_so_far = self.consumer_errors, "Kafka consumer error; retrying");
            self.last_error_log = Some(std::time::Instant::now());
        }
    }
}

/// One record, out of librdkafka's buffer.
struct CopiedRecord {
    topic: String,
    partition: i32,
    offset: i64,
    /// The headers, or why they are broken.
    headers: Result<RecordHeaders, String>,
    /// The value, or why the budget can never hold it.
    value: Result<Bytes, String>,
    /// What the value (and then its decoding) holds of the memory budget.
    grant: MemoryGrant,
}

/// How handing a record to the pipeline ended.
enum Delivered {
    /// The receiver is stopping: the record stays uncommitted.
    Stopping,
    /// Resolved already (or left unresolved after an error).
    Done,
    /// In the pipeline: resolved once every copy is delivered.
    Tracked(Delivery),
}

impl Serving {
    /// Copies a message's headers and value (granted first, waiting for the
    /// budget) out of librdkafka's buffer; `None` when the receiver stops.
    async fn copy_record(&self, message: BorrowedMessage<'_>) -> Option<CopiedRecord> {
        let topic = message.topic().to_owned();
        let (partition, offset) = (message.partition(), message.offset());
        let headers = match message.headers() {
            Some(h) => RecordHeaders::from_pairs(h.iter().map(|h| (h.key, h.value))),
            None => Ok(RecordHeaders::default()),
        };
        // The value is copied out of librdkafka's buffer: granted first.
        let payload = message.payload().unwrap_or_default();
        let mut grant = self.ctx.memory.grant();
        let value = match grow_waiting(&mut grant, payload.len(), &self.ctx.shutdown).await {
            Waited::Granted => Ok(Bytes::copy_from_slice(payload)),
            Waited::Stopped => return None,
            Waited::Never(why) => Err(why),
        };
        drop(message);
        Some(CopiedRecord {
            topic,
            partition,
            offset,
            headers,
            value,
            grant,
        })
    }

    /// Decodes a record and hands its profiles to the pipeline, resolving
    /// at once a record that is invalid or holds no profile.
    async fn deliver(
        &self,
        mut copied: CopiedRecord,
        slot: &Slot,
        counts: &mut Counts,
    ) -> Delivered {
        // Decoded under the grant; a grant the budget cannot give now is
        // waited for and the record decoded again.
        let value_bytes = copied.grant.held();
        // Decoded under the grant and handed to the pipeline; a grant the
        // budget cannot give now is waited for, and a pipeline a reload
        // replaced while the record waited in it takes it again from the
        // start (through the pipelines that replaced it).
        loop {
            copied
                .grant
                .shrink(copied.grant.held().saturating_sub(value_bytes));
            let decoded = match self.decode_waiting(&mut copied).await {
                None => return Delivered::Stopping,
                Some(Ok(d)) => d,
                Some(Err(why)) => {
                    self.skip_invalid(&copied, slot, &why, counts);
                    return Delivered::Done;
                }
            };
            self.count_decoded(&copied, &decoded);
            if decoded.envelopes.is_empty() {
                if decoded.rejected == 0 {
                    // A record that held no profile: committed, but counted.
                    self.shared
                        .telemetry
                        .empty_request("kafka_record", None, value_bytes);
                }
                self.shared.resolve(slot);
                return Delivered::Done;
            }
            if let Some(delivered) = self.hand_over(decoded, &copied).await {
                return delivered;
            }
        }
    }

    /// Decodes a record, waiting for the budget to have room for it; `None`
    /// when the receiver stops, `Some(Err)` for a record never decoded.
    async fn decode_waiting(&self, copied: &mut CopiedRecord) -> Option<Result<Decoded, String>> {
        loop {
            let attempt = match (&copied.value, &copied.headers) {
                (Err(why), _) | (_, Err(why)) => Err(RecordError::Invalid(why.clone())),
                (Ok(value), Ok(h)) => record::decode(
                    value.clone(),
                    h.clone(),
                    &self.receiver.reading,
                    &mut copied.grant,
                ),
            };
            match attempt {
                Err(RecordError::Memory(e)) => {
                    match room_waiting(&copied.grant, e.wanted, &self.ctx.shutdown).await {
                        Waited::Granted => continue,
                        Waited::Stopped => return None,
                        Waited::Never(why) => return Some(Err(why)),
                    }
                }
                Err(RecordError::Invalid(why)) => return Some(Err(why)),
                Ok(d) => return Some(Ok(d)),
            }
        }
    }

    /// Counts and logs an undecodable record, and resolves it.
    fn skip_invalid(&self, copied: &CopiedRecord, slot: &Slot, why: &str, counts: &mut Counts) {
        counts.invalid += 1;
        let invalid = counts.invalid;
        self.shared.telemetry.refused("invalid_record", 1);
        if invalid <= LOG_EACH_INVALID || invalid.is_power_of_two() {
            tracing::warn!(receiver = %self.shared.id, topic = %copied.topic, partition = copied.partition, offset = copied.offset, invalid_so_far = invalid, error = %why, "undecodable record skipped");
        }
        self.shared.resolve(slot);
    }

    /// Counts what decoding a record refused, upgraded or lost.
    fn count_decoded(&self, copied: &CopiedRecord, decoded: &Decoded) {
        let telemetry = &self.shared.telemetry;
        if decoded.rejected > 0 {
            telemetry.refused("invalid_profile", decoded.rejected);
            tracing::warn!(receiver = %self.shared.id, topic = %copied.topic, partition = copied.partition, offset = copied.offset, rejected = decoded.rejected, error = %decoded.rejected_message, "profiles of a record refused");
        }
        if decoded.from_1_9 {
            telemetry.upgraded("otlp_1_9", None);
        }
        telemetry.lost_parts("label", "kafka_record", None, &decoded.lost_labels);
    }

    /// Hands a record's profiles to the pipeline; `None` when a reload
    /// replaced one of its pipelines and the record is to be handed over
    /// again.
    async fn hand_over(&self, decoded: Decoded, copied: &CopiedRecord) -> Option<Delivered> {
        let profiles = decoded.envelopes.len() as u64;
        let bytes = batch_bytes(&decoded.envelopes) as u64;
        let meta = Arc::new(BatchMeta {
            receiver: self.receiver_id.clone(),
            tenant: decoded.tenant,
            tenant_bound: false,
            client: None,
            this_host: false,
        });
        let (batch, delivery) = Batch::tracked(decoded.envelopes, meta);
        match self
            .ctx
            .consumer
            .consume(batch, self.receiver.admission)
            .await
        {
            Ok(()) => {
                self.shared.telemetry.accepted(profiles, bytes);
                Some(Delivered::Tracked(delivery))
            }
            // A queue closed under the record while the receiver runs:
            // a reload retired its exporter. Again, through the
            // pipelines that replaced it.
            Err(ConsumeError::ShuttingDown) if !self.ctx.shutdown.is_cancelled() => {
                tracing::debug!(receiver = %self.shared.id, topic = %copied.topic, partition = copied.partition, offset = copied.offset, "an exporter of the record's pipelines was replaced; handing it over again");
                tokio::time::sleep(StdDuration::from_millis(50)).await;
                None
            }
            Err(ConsumeError::ShuttingDown) => Some(Delivered::Stopping),
            Err(e) => {
                // Waiting admissions never refuse; should one, the record
                // stays uncommitted and is read again after a restart.
                tracing::error!(receiver = %self.shared.id, error = %e, "the pipeline refused a record");
                Some(Delivered::Done)
            }
        }
    }

    /// Resolves a record once every copy of it is delivered (not one
    /// abandoned at shutdown), then gives its permit back.
    fn resolve_when_delivered(&self, delivery: Delivery, slot: Slot, permit: OwnedSemaphorePermit) {
        let shared = self.shared.clone();
        tokio::spawn(async move {
            let report = delivery.wait().await;
            if report.abandoned > 0 {
                // The collector stopped before sending them: left
                // uncommitted, read again after the restart.
                tracing::debug!(receiver = %shared.id, topic = %slot.topic, partition = slot.partition, offset = slot.offset, "record abandoned at shutdown; not committed");
            } else {
                shared.resolve(&slot);
            }
            drop(permit);
        });
    }
}

/// How a wait for memory ended.
enum Waited {
    Granted,
    /// The receiver is stopping.
    Stopped,
    /// The budget can never give that much to one grant.
    Never(String),
}

/// Why a record can never be granted.
fn never(bytes: usize, memory: &MemoryBudget) -> Waited {
    Waited::Never(format!(
        "the record needs {bytes} bytes of memory at once, more than service.limits.max_in_flight_bytes ({} bytes) gives one record; raise it or write smaller records",
        memory.limit()
    ))
}

/// Grows `grant` by `bytes`, waiting as long as it takes: a Kafka consumer
/// can hold back its source, so a full budget slows it down instead of
/// losing a record.
async fn grow_waiting(grant: &mut MemoryGrant, bytes: usize, stop: &CancellationToken) -> Waited {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Waited::Stopped,
            grown = grant.grow(bytes, memory::DEFAULT_WAIT) => match grown {
                Ok(()) => return Waited::Granted,
                Err(e) if e.never => return never(grant.held() + bytes, grant.budget()),
                // The wait ran out, or too many wait already (then it ends
                // at once): again, after a moment.
                Err(_) => tokio::time::sleep(StdDuration::from_millis(50)).await,
            },
        }
    }
}

/// Waits until `grant` could grow by `bytes` (taking nothing); a record
/// whose grant never could is [`Waited::Never`].
async fn room_waiting(grant: &MemoryGrant, bytes: usize, stop: &CancellationToken) -> Waited {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Waited::Stopped,
            room = grant.room_to_grow(bytes, memory::DEFAULT_WAIT) => match room {
                // Another grant may take it first: look again in a moment
                // rather than spin.
                Ok(()) => {
                    tokio::time::sleep(StdDuration::from_millis(10)).await;
                    return Waited::Granted;
                }
                Err(e) if e.never => return never(grant.held() + bytes, grant.budget()),
                Err(_) => tokio::time::sleep(StdDuration::from_millis(50)).await,
            },
        }
    }
}

/// Waits (bounded) for records still in the pipeline, then commits the
/// acknowledged positions and leaves the group.
async fn finish(shared: Arc<Shared>, permits: Arc<Semaphore>, all: usize) {
    let n = u32::try_from(all).unwrap_or(u32::MAX);
    if tokio::time::timeout(SHUTDOWN_WAIT, permits.acquire_many(n))
        .await
        .is_err()
    {
        let pending = shared
            .offsets
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pending();
        tracing::info!(receiver = %shared.id, pending, "records still in the pipeline at shutdown stay uncommitted; they are read again after a restart");
    }
    let positions = shared
        .offsets
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .committable();
    // Committing and closing block on the network: off the async workers.
    let _ = tokio::task::spawn_blocking(move || {
        if !positions.is_empty() {
            let mut tpl = TopicPartitionList::new();
            for (topic, partition, next) in &positions {
                let _ = tpl.add_partition_offset(topic, *partition, Offset::Offset(*next));
            }
            if let Err(e) = shared.consumer.commit(&tpl, CommitMode::Sync) {
                tracing::warn!(receiver = %shared.id, error = %e, "final commit failed; the records since the last commit are read again after a restart");
            }
        }
        shared.consumer.unsubscribe();
        drop(shared);
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_config::Node;
    use proflow_core::component::{BuildContext, ReceiverConfig, Validate};

    fn typed(yaml: &str) -> KafkaReceiverConfig {
        let node = Node::parse(yaml).expect("test YAML parses");
        proflow_config::from_node(&node, "receivers.kafka").expect("test config deserializes")
    }

    #[test]
    fn defaults_follow_the_collector_and_keep_offsets_manual() {
        let c = typed("{}");
        assert_eq!(c.topics, ["otlp_profiles"]);
        assert_eq!(c.group_id, "proflow");
        assert_eq!(c.initial_offset, InitialOffset::Latest);
        assert!(c.validate().is_empty(), "{:?}", c.validate());
        let p = c.properties().unwrap();
        assert_eq!(p["enable.auto.offset.store"], "false");
        assert_eq!(p["enable.auto.commit"], "true");
        assert_eq!(p["auto.commit.interval.ms"], "1000");
        assert_eq!(p["auto.offset.reset"], "latest");
    }

    #[test]
    fn every_problem_is_reported() {
        let c = typed(
            "brokers: []\ntopics: [\"a b\"]\ngroup_id: \"\"\nmax_unacknowledged: 0\ncommit_interval: 0s\nconsumer: {enable.auto.offset.store: \"true\", session.timeout.ms: \"6000\"}",
        );
        let paths: Vec<String> = c.validate().into_iter().map(|p| p.path).collect();
        assert_eq!(
            paths,
            [
                "brokers",
                "topics.0",
                "group_id",
                "max_unacknowledged",
                "commit_interval",
                "consumer.enable.auto.offset.store"
            ]
        );
        let ctx = BuildContext {
            id: "kafka".into(),
            telemetry: Arc::new(proflow_core::telemetry::Telemetry::new()),
            memory: proflow_model::memory::MemoryBudget::new(1 << 30),
        };
        let err = c.build(&ctx).err().expect("invalid").to_string();
        assert!(err.starts_with("receiver `kafka`: brokers:"), "{err}");
    }
}
