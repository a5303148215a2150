//! The graph against test components: fan-out, admission, conversion,
//! reload and shutdown. Here the test components and helpers; the tests, by
//! theme, in the files beside.

mod admission;
mod delivery;
mod forms;
mod hold;
mod plan;
mod shutdown;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use serde::Deserialize;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use proflow_config::Document;

use super::plan::conflicts;
use super::*;
use crate::component::{
    Admission, BuildContext, BuildError, ConsumeError, Consumer, ErrorClass, ExportError, Exporter,
    ExporterConfig, FieldError, Processor, ProcessorConfig, Receiver, ReceiverConfig,
    ReceiverContext, Resource, ServeFuture, Validate,
};
use crate::registry::Registry;
use crate::registry::{Factory, Stability};
use crate::telemetry::Telemetry;
use proflow_config::SendingSettings;
use proflow_model::delivery::DeliveryReport;
use proflow_model::model::{Batch, BatchMeta, Envelope, ExportBatch, Format, Labels, Payload};
use proflow_model::spans::{Span, SpanConsumer};

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

/// Holds every profile until the pipeline asks, every `every_ms`, and
/// then releases all of them (a window as long as the tick).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldConfig {
    every_ms: u64,
    /// Only there to make a reload see a changed config.
    #[serde(default)]
    #[allow(dead_code)]
    tag: u32,
}
impl Validate for HoldConfig {
    fn validate(&self) -> Vec<FieldError> {
        vec![]
    }
}
type Held = Mutex<Vec<(Vec<Envelope>, Arc<BatchMeta>)>>;
struct Hold(Duration, Held);
#[async_trait]
impl Processor for Hold {
    async fn process(&self, batch: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope> {
        self.1.lock().unwrap().push((batch, Arc::new(meta.clone())));
        Vec::new()
    }
    fn holds(&self) -> Option<Duration> {
        Some(self.0)
    }
    fn release(&self, _all: bool) -> Vec<(Vec<Envelope>, Arc<BatchMeta>)> {
        std::mem::take(&mut *self.1.lock().unwrap())
    }
}
impl ProcessorConfig for HoldConfig {
    fn build(&self, _: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        Ok(Arc::new(Hold(
            Duration::from_millis(self.every_ms),
            Mutex::new(Vec::new()),
        )))
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
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    sending: SendingSettings,
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
    fn sending(&self) -> &SendingSettings {
        &self.sending
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
        Factory::receiver::<TestReceiverConfig>("test", Stability::Development, "test receiver"),
        Factory::processor::<FilterConfig>("filter", Stability::Development, "test filter"),
        Factory::processor::<HoldConfig>("hold", Stability::Development, "test holder"),
        Factory::exporter::<TestExporterConfig>("test", Stability::Development, "test exporter"),
    ])
}

fn envelope(keep: &str) -> Envelope {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
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
            proflow_model::pprof::gzip(&proflow_model::pprof::encode(&b.build())),
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
