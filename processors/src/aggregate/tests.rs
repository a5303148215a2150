use std::sync::Arc;
use std::time::Duration;

use proflow_config::Node;
use proflow_core::component::{BuildContext, Processor, Validate};
use proflow_core::registry::{AnyConfig, Kind};
use proflow_core::telemetry::Telemetry;
use proflow_model::memory::MemoryBudget;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};

use super::AggregateProcessorConfig;
use crate::factories;

fn parse(yaml: &str) -> Result<AnyConfig, Vec<proflow_config::Error>> {
    let root = Node::parse(yaml).unwrap();
    let body = root
        .get("processors")
        .and_then(|p| p.get("aggregate"))
        .cloned()
        .expect("the test config has processors.aggregate");
    factories()
        .into_iter()
        .find(|f| f.kind == Kind::Processor && f.type_name == "aggregate")
        .expect("aggregate factory")
        .parse(&body, "processors.aggregate")
}

fn build(config: &AggregateProcessorConfig, memory: &MemoryBudget) -> Arc<dyn Processor> {
    build_with(config, memory, &Arc::new(Telemetry::new()))
}

fn build_with(
    config: &AggregateProcessorConfig,
    memory: &MemoryBudget,
    telemetry: &Arc<Telemetry>,
) -> Arc<dyn Processor> {
    use proflow_core::component::ProcessorConfig;
    config
        .build(&BuildContext {
            id: "aggregate".to_owned(),
            telemetry: telemetry.clone(),
            memory: memory.clone(),
        })
        .unwrap()
}

/// The value of the series `line` (name and labels as rendered) in `/metrics`.
fn metric(telemetry: &Telemetry, line: &str) -> Option<f64> {
    telemetry
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(line)?.strip_prefix(' ')?.parse().ok())
}

/// A CPU profile of `service` at second `at`, as a receiver hands it
/// (gzipped pprof bytes), with folded stacks and their values.
fn profile(service: &str, at: i64, stacks: &[(&str, i64)]) -> Envelope {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(at * 1_000_000_000, 1_000_000_000);
    for (stack, v) in stacks {
        b.sample_root_first(stack.split(';'), vec![*v]);
    }
    Envelope {
        labels: Labels::from_pairs([("__name__", "process_cpu"), ("service_name", service)]),
        start_unix_nanos: at * 1_000_000_000,
        end_unix_nanos: (at + 1) * 1_000_000_000,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: Some(ValueType::new("cpu", "nanoseconds")),
        period: 10_000_000,
        payload: Payload::from_bytes(pprof::gzip(&pprof::encode(&b.build())), 1 << 20),
    }
}

/// Each stack of a decoded payload (root first) with its value.
fn stacks(e: &Envelope) -> std::collections::BTreeMap<String, i64> {
    proflow_model::testdata::folded_totals(&e.payload.decoded().expect("decodes"))
}

fn meta(tenant: Option<&str>) -> BatchMeta {
    BatchMeta {
        receiver: "pprof_push".into(),
        tenant: tenant.map(str::to_owned),
        ..BatchMeta::default()
    }
}

#[test]
fn config_defaults_and_problems() {
    let Ok(AnyConfig::Processor(_)) = parse("processors:\n  aggregate: {}\n") else {
        panic!("an empty aggregate config is valid");
    };
    let c = AggregateProcessorConfig::default();
    assert_eq!(
        (c.window.get(), c.max_series),
        (Duration::from_secs(15), 100_000)
    );
    let Err(errors) = parse("processors:\n  aggregate: {window: 100ms, max_series: 0}\n") else {
        panic!("a 100ms window is refused");
    };
    let text = format!("{errors:?}");
    assert!(
        text.contains("window") && text.contains("between 1s and 10m"),
        "{text}"
    );
    assert!(text.contains("max_series"), "{text}");
    let bad = AggregateProcessorConfig {
        window: proflow_config::Duration::from_secs(3600),
        ..AggregateProcessorConfig::default()
    };
    assert_eq!(bad.validate().len(), 1);
    assert!(parse("processors:\n  aggregate: {windw: 15s}\n").is_err());
}

#[tokio::test]
async fn a_series_profiles_become_one_with_the_same_totals() {
    let memory = MemoryBudget::new(64 << 20);
    let p = build(&AggregateProcessorConfig::default(), &memory);
    assert_eq!(p.holds(), Some(Duration::from_secs(1)));
    let m = meta(None);
    let batch = vec![
        profile("cart", 100, &[("main;work", 30), ("main;idle", 10)]),
        profile("shop", 100, &[("main;serve", 7)]),
    ];
    assert!(p.process(batch, &m).await.is_empty());
    let batch = vec![profile("cart", 101, &[("main;work", 20), ("main;gc", 5)])];
    assert!(p.process(batch, &m).await.is_empty());
    assert!(memory.in_flight() > 0, "open windows are charged");
    // Not due yet: nothing goes on before the window closes.
    assert!(p.release(false).is_empty());
    let released = p.release(true);
    assert_eq!(released.len(), 1, "one batch per sender meta");
    let (envelopes, meta) = &released[0];
    assert_eq!(**meta, m);
    assert_eq!(envelopes.len(), 2);
    let cart = envelopes
        .iter()
        .find(|e| e.labels.get("service_name") == Some("cart"))
        .unwrap();
    assert_eq!(
        stacks(cart),
        [
            ("main;gc".to_owned(), 5),
            ("main;idle".to_owned(), 10),
            ("main;work".to_owned(), 50)
        ]
        .into()
    );
    assert_eq!(
        (cart.start_unix_nanos, cart.end_unix_nanos),
        (100_000_000_000, 102_000_000_000)
    );
    let decoded = cart.payload.decoded().unwrap();
    assert_eq!(
        (decoded.time_nanos, decoded.duration_nanos),
        (100_000_000_000, 2_000_000_000)
    );
    drop(released);
    assert_eq!(
        memory.in_flight(),
        0,
        "released windows give their memory back"
    );
    assert!(p.release(true).is_empty());
}

#[tokio::test]
async fn a_window_closes_after_its_length() {
    let memory = MemoryBudget::new(64 << 20);
    let config = AggregateProcessorConfig {
        window: proflow_config::Duration::from_secs(1),
        ..AggregateProcessorConfig::default()
    };
    let telemetry = Arc::new(Telemetry::new());
    let p = build_with(&config, &memory, &telemetry);
    assert_eq!(p.holds(), Some(Duration::from_millis(100)));
    assert!(
        p.process(vec![profile("cart", 1, &[("a", 1)])], &meta(None))
            .await
            .is_empty()
    );
    assert!(p.release(false).is_empty());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let open = r#"proflow_aggregate_open_series{processor="aggregate"}"#;
    assert_eq!(metric(&telemetry, open), Some(1.0));
    let released = p.release(false);
    assert_eq!(released.len(), 1);
    assert_eq!(released[0].0.len(), 1);
    assert_eq!(metric(&telemetry, open), Some(0.0));
    let closed = r#"proflow_aggregate_windows_closed_total{processor="aggregate",why="window"}"#;
    assert_eq!(metric(&telemetry, closed), Some(1.0));
}

#[tokio::test]
async fn tenants_and_value_types_keep_windows_apart() {
    let memory = MemoryBudget::new(64 << 20);
    let p = build(&AggregateProcessorConfig::default(), &memory);
    assert!(
        p.process(vec![profile("cart", 1, &[("a", 1)])], &meta(Some("red")))
            .await
            .is_empty()
    );
    assert!(
        p.process(vec![profile("cart", 1, &[("a", 2)])], &meta(Some("blue")))
            .await
            .is_empty()
    );
    let mut other = profile("cart", 1, &[("a", 4)]);
    other.sample_types = vec![ValueType::new("samples", "count")];
    assert!(p.process(vec![other], &meta(Some("red"))).await.is_empty());
    let released = p.release(true);
    let mut by_tenant: Vec<(Option<String>, usize)> = released
        .iter()
        .map(|(e, m)| (m.tenant.clone(), e.len()))
        .collect();
    by_tenant.sort();
    assert_eq!(
        by_tenant,
        vec![(Some("blue".to_owned()), 1), (Some("red".to_owned()), 2)]
    );
}

#[tokio::test]
async fn without_room_profiles_go_on_unmerged() {
    // Past max_series.
    let memory = MemoryBudget::new(64 << 20);
    let config = AggregateProcessorConfig {
        max_series: 1,
        ..AggregateProcessorConfig::default()
    };
    let telemetry = Arc::new(Telemetry::new());
    let p = build_with(&config, &memory, &telemetry);
    let m = meta(None);
    assert!(
        p.process(vec![profile("cart", 1, &[("a", 1)])], &m)
            .await
            .is_empty()
    );
    let passed = p.process(vec![profile("shop", 1, &[("a", 1)])], &m).await;
    assert_eq!(passed.len(), 1);
    assert_eq!(passed[0].labels.get("service_name"), Some("shop"));
    // A budget too small for half of it to hold a window.
    let tiny = MemoryBudget::new(1024);
    let p = build_with(&AggregateProcessorConfig::default(), &tiny, &telemetry);
    let passed = p.process(vec![profile("cart", 1, &[("a", 1)])], &m).await;
    assert_eq!(passed.len(), 1);
    assert_eq!(tiny.in_flight(), 0);
    // What cannot be read as a profile goes on as it came.
    let mut junk = profile("cart", 1, &[("a", 1)]);
    junk.payload = Payload::from_bytes(bytes::Bytes::from_static(b"not a profile"), 1 << 20);
    let p = build_with(&AggregateProcessorConfig::default(), &memory, &telemetry);
    assert_eq!(p.process(vec![junk], &m).await.len(), 1);
    // Each counted by why, under the processor's id.
    let profiles = |result: &str| {
        metric(
            &telemetry,
            &format!(
                r#"proflow_aggregate_profiles_total{{processor="aggregate",result="{result}"}}"#
            ),
        )
    };
    assert_eq!(profiles("merged"), Some(1.0));
    assert_eq!(profiles("max_series"), Some(1.0));
    assert_eq!(profiles("no_room"), Some(1.0));
    assert_eq!(profiles("unreadable"), Some(1.0));
}
