//! The graph against test components: fan-out, admission, conversion,
//! reload and shutdown.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use serde::Deserialize;

use super::plan::conflicts;
use super::*;
use crate::component::{
    ErrorClass, ExportError, ExporterConfig, FieldError, ProcessorConfig, Receiver, ReceiverConfig,
    ServeFuture, Validate,
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
        Factory::receiver::<TestReceiverConfig>("test", Stability::Development, "test receiver"),
        Factory::processor::<FilterConfig>("filter", Stability::Development, "test filter"),
        Factory::exporter::<TestExporterConfig>("test", Stability::Development, "test exporter"),
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
        p.warnings
            .iter()
            .any(|w| w
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
    eventually("permanent failure counted", || {
        t.render().contains(
            r#"proflow_exporter_failed_profiles_total{exporter="test/perm",reason="rejected"} 2"#,
        )
    })
    .await;
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
        t.render()
            .contains(r#"proflow_exporter_failed_profiles_total{exporter="test",reason="panic"} 3"#)
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
    let e =
        ExportError::retryable("http_503", "unavailable").with_retry_after(Duration::from_secs(3));
    assert_eq!(
        e.class,
        ErrorClass::Retryable {
            retry_after: Some(Duration::from_secs(3))
        }
    );
}
