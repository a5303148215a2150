//! The `kafka` exporter: one record per profile into Apache Kafka (or any
//! broker that speaks its protocol), through librdkafka (`rdkafka`, built
//! from source into the binary).
//!
//! - **Records** follow proflow's record format ([`proflow_kafka`]):
//!   the value is the profile (`encoding: pprof`: gzip pprof, the bytes as
//!   they arrived when they arrived gzipped; `otlp_proto` / `otlp_json`: one
//!   `ExportProfilesServiceRequest` holding the one profile), the headers
//!   carry encoding, labels, time range and tenant, and the key is the
//!   series' stable hash, so a series stays on one partition and in order.
//! - **Topic**: `topic` may hold `{label}` placeholders
//!   (`profiles.{service_name}`).
//! - **Delivery**: a profile counts as delivered only when its delivery report
//!   says the broker has it. The producer is idempotent with `acks=all` by
//!   default, so librdkafka's own resends never duplicate a record.
//!   `timeout` bounds one record's delivery (librdkafka's
//!   `message.timeout.ms`); when it passes, the profile goes back to the
//!   queue's retry (`retry_on_failure`). As in the other exporters, a
//!   retryable failure fails the whole export only while nothing of it was
//!   delivered; after that the failed records are retried in place and, if
//!   that gives up, reported as refused by index, so no delivered profile is
//!   sent twice by proflow.
//! - **Refusals**: a record over `max_message_bytes` (librdkafka's
//!   `message.max.bytes`; the broker's own limit is `message.max.bytes` on
//!   the broker, 1 MiB by default) is refused at once, never retried; so are
//!   records the broker refuses for good (too large, invalid, not
//!   authorized). Each distinct reason is logged once.
//!
//! Payloads are never decoded for `pprof` and never copied by proflow;
//! librdkafka copies each value once into its send buffer (rdkafka's
//! produce call takes a borrowed slice).

mod config;
#[cfg(test)]
mod tests;

pub use config::{Compression, KafkaExporterConfig};

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration as StdDuration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use proflow_core::component::{ErrorClass, ExportError, Exporter};
use proflow_core::queue::RetrySettings;
use proflow_kafka::{self as kafka, Encoding, RecordHeaders, TopicTemplate};
use proflow_model::model::{Envelope, ExportBatch};
use proflow_model::otlp;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};

/// Distinct refusal messages remembered for log-once.
const MAX_REMEMBERED_MESSAGES: usize = 256;
/// How long to wait before trying again when librdkafka's own queue is full.
const LOCAL_QUEUE_FULL_WAIT: StdDuration = StdDuration::from_millis(5);

/// The running `kafka` exporter.
pub struct KafkaExporter {
    id: String,
    producer: FutureProducer,
    topic: TopicTemplate,
    encoding: Encoding,
    max_message_bytes: usize,
    timeout: StdDuration,
    retry: RetrySettings,
    /// Refusal reasons already logged.
    logged: Mutex<HashSet<String>>,
}

impl std::fmt::Debug for KafkaExporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaExporter")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .field("encoding", &self.encoding)
            .finish_non_exhaustive()
    }
}

/// One record ready to send, with the index of its profile in the batch.
struct Prepared {
    index: usize,
    topic: String,
    key: [u8; 16],
    headers: Vec<(String, String)>,
    value: Bytes,
}

impl Prepared {
    fn owned_headers(&self) -> OwnedHeaders {
        let mut h = OwnedHeaders::new_with_capacity(self.headers.len());
        for (k, v) in &self.headers {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        h
    }

    /// Bytes the record takes against `max_message_bytes`.
    fn size(&self) -> usize {
        self.value.len()
            + self.key.len()
            + self
                .headers
                .iter()
                .map(|(k, v)| k.len() + v.len())
                .sum::<usize>()
    }
}

/// How one record's send ended.
enum Sent {
    Delivered,
    Failed(ExportError),
}

impl KafkaExporter {
    /// The record of one profile, or why it cannot be made.
    fn prepare(
        &self,
        index: usize,
        e: &Envelope,
        tenant: Option<&str>,
    ) -> Result<Prepared, ExportError> {
        let no_form = |what: &str, err: &dyn std::fmt::Display| {
            ExportError::permanent(
                "encode",
                format!(
                    "profile {} has no {what} form ({err}); it was dropped",
                    e.labels.to_selector_string()
                ),
            )
        };
        let value = match self.encoding {
            Encoding::Pprof => e.payload.gzipped().map_err(|err| no_form("pprof", &err))?,
            Encoding::OtlpProto | Encoding::OtlpJson => {
                let profiles = e.payload.otlp().map_err(|err| no_form("OTLP", &err))?;
                let mut builder = otlp::RequestBuilder::new();
                builder.push(&e.labels, &profiles);
                let request = builder.build().map_err(|err| no_form("OTLP", &err))?;
                if self.encoding == Encoding::OtlpJson {
                    let message = request.to_message().map_err(|err| no_form("OTLP", &err))?;
                    Bytes::from(otlp::json::encode_request(&message))
                } else {
                    Bytes::from(request.encode())
                }
            }
        };
        let headers = RecordHeaders {
            encoding: Some(self.encoding),
            start_unix_nanos: Some(e.start_unix_nanos),
            end_unix_nanos: Some(e.end_unix_nanos),
            tenant: tenant.map(str::to_owned),
            labels: e.labels.clone(),
        }
        .to_pairs();
        let record = Prepared {
            index,
            topic: self.topic.render(&e.labels),
            key: kafka::series_key(&e.labels),
            headers,
            value,
        };
        if record.size() > self.max_message_bytes {
            return Err(ExportError::permanent(
                "too_large",
                format!(
                    "profile {} makes a {}-byte record, more than max_message_bytes ({}); it was dropped (raise max_message_bytes together with the broker's and topic's message.max.bytes)",
                    e.labels.to_selector_string(),
                    record.size(),
                    self.max_message_bytes
                ),
            ));
        }
        Ok(record)
    }

    /// Hands one record to librdkafka, waiting while its own queue is full
    /// (at most `timeout`).
    async fn enqueue(&self, r: &Prepared) -> Result<DeliveryFuture, ExportError> {
        let started = Instant::now();
        loop {
            let record = FutureRecord::to(&r.topic)
                .key(&r.key[..])
                .payload(&r.value[..])
                .headers(r.owned_headers());
            match self.producer.send_result(record) {
                Ok(f) => return Ok(f),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _))
                    if started.elapsed() < self.timeout =>
                {
                    tokio::time::sleep(LOCAL_QUEUE_FULL_WAIT).await;
                }
                Err((e, _)) => return Err(classify(&e)),
            }
        }
    }

    /// Sends `records` and waits for every delivery report.
    async fn send_all(&self, records: &[&Prepared]) -> Vec<Sent> {
        let mut pending = Vec::with_capacity(records.len());
        for r in records {
            pending.push(self.enqueue(r).await);
        }
        let mut out = Vec::with_capacity(records.len());
        for p in pending {
            out.push(match p {
                Err(e) => Sent::Failed(e),
                Ok(future) => match future.await {
                    Ok(Ok(_)) => Sent::Delivered,
                    Ok(Err((e, _))) => Sent::Failed(classify(&e)),
                    // The producer went away with the record (shutdown).
                    Err(_) => Sent::Failed(ExportError::retryable(
                        "cancelled",
                        "the producer stopped before the record's delivery report",
                    )),
                },
            });
        }
        out
    }

    /// Logs a refusal once per distinct reason and message shape.
    fn log_refusal(&self, e: &ExportError) {
        let first = {
            let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
            let key = format!(
                "{}: {}",
                e.reason,
                e.message.split(':').next().unwrap_or("")
            );
            logged.len() < MAX_REMEMBERED_MESSAGES && logged.insert(key)
        };
        if first {
            tracing::warn!(exporter = %self.id, reason = %e.reason, error = %e.message, "profiles refused; this reason is logged once");
        } else {
            tracing::debug!(exporter = %self.id, reason = %e.reason, error = %e.message, "profiles refused");
        }
    }

    /// Next wait of the in-place retry.
    fn next_wait(&self, wait: StdDuration) -> StdDuration {
        std::cmp::min(
            StdDuration::try_from_secs_f64(wait.as_secs_f64() * self.retry.multiplier.max(1.0))
                .unwrap_or(StdDuration::MAX),
            self.retry.max_interval.get(),
        )
    }
}

/// Whether a librdkafka error can pass by trying again.
fn classify(e: &KafkaError) -> ExportError {
    use RDKafkaErrorCode as C;
    let code = e.rdkafka_error_code();
    let permanent = matches!(
        code,
        Some(
            C::MessageSizeTooLarge
                | C::InvalidMessageSize
                | C::InvalidMessage
                | C::InvalidRecord
                | C::MessageBatchTooLarge
                | C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::InvalidTopic
                | C::InvalidArgument
                | C::UnsupportedForMessageFormat
        )
    );
    let reason = match code {
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::MessageBatchTooLarge) => {
            "too_large".to_owned()
        }
        Some(C::MessageTimedOut) => "timeout".to_owned(),
        Some(C::TopicAuthorizationFailed | C::ClusterAuthorizationFailed) => {
            "unauthorized".to_owned()
        }
        Some(c) => snake(&format!("{c:?}")),
        None => "kafka".to_owned(),
    };
    let message = format!("Kafka: {e}");
    if permanent {
        ExportError::permanent(reason, message)
    } else {
        ExportError::retryable(reason, message)
    }
}

/// `MessageTimedOut` → `message_timed_out`.
fn snake(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else if c.is_ascii_alphanumeric() {
            out.push(c);
        }
    }
    out
}

#[async_trait]
impl Exporter for KafkaExporter {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let total = batch.len();
        let mut refused: Vec<usize> = Vec::new();
        let mut first: Option<ExportError> = None;
        let mut refuse = |i: usize, e: ExportError, refused: &mut Vec<usize>| {
            self.log_refusal(&e);
            refused.push(i);
            first.get_or_insert(e);
        };
        let mut records = Vec::with_capacity(total);
        let mut index = 0;
        for (meta, envelopes) in batch.sources() {
            for e in envelopes {
                match self.prepare(index, e, meta.tenant_of(&e.labels)) {
                    Ok(r) => records.push(r),
                    Err(err) => refuse(index, err, &mut refused),
                }
                index += 1;
            }
        }

        let mut delivered = 0usize;
        let mut todo: Vec<&Prepared> = records.iter().collect();
        let started = Instant::now();
        let mut wait = self.retry.initial_interval.get();
        loop {
            let results = self.send_all(&todo).await;
            let mut again = Vec::new();
            let mut retryable: Option<ExportError> = None;
            for (r, sent) in todo.iter().zip(results) {
                match sent {
                    Sent::Delivered => delivered += 1,
                    Sent::Failed(e) if matches!(e.class, ErrorClass::Permanent) => {
                        refuse(r.index, e, &mut refused)
                    }
                    Sent::Failed(e) => {
                        again.push(*r);
                        retryable.get_or_insert(e);
                    }
                }
            }
            let Some(err) = retryable else { break };
            // Nothing delivered: the queue retries the whole batch.
            if delivered == 0 {
                return Err(err);
            }
            // Part delivered: retry the rest here, never resending the
            // delivered records, until `retry_on_failure` gives up.
            let max_elapsed = self.retry.max_elapsed_time.get();
            let past = started
                .elapsed()
                .checked_add(wait)
                .is_none_or(|end| end > max_elapsed);
            if !self.retry.enabled || (!max_elapsed.is_zero() && past) {
                let last = again.len() - 1;
                for (n, r) in again.into_iter().enumerate() {
                    // Logged once as a refusal; the first error stays first.
                    if n == last {
                        refuse(r.index, err.clone(), &mut refused);
                    } else {
                        refused.push(r.index);
                    }
                }
                break;
            }
            tracing::debug!(exporter = %self.id, error = %err, delay = ?wait, "part of the batch is delivered; retrying the rest in place");
            tokio::time::sleep(wait).await;
            wait = self.next_wait(wait);
            todo = again;
        }

        let Some(first) = first else {
            return Ok(());
        };
        if delivered == 0 {
            return Err(ExportError {
                class: ErrorClass::Permanent,
                refused: None,
                ..first
            });
        }
        refused.sort_unstable();
        refused.dedup();
        let message = format!(
            "{} of {total} profiles were not delivered: {}",
            refused.len(),
            first.message
        );
        Err(ExportError::partial(refused, first.reason, message))
    }

    async fn shutdown(&self) {
        // Everything exported was awaited already; flush whatever librdkafka
        // still holds (nothing, normally) without blocking a worker thread.
        let producer = self.producer.clone();
        let timeout = self.timeout.min(StdDuration::from_secs(5));
        let _ = tokio::task::spawn_blocking(move || producer.flush(timeout)).await;
    }
}
