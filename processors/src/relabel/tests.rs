use std::sync::Arc;

use proflow_config::Node;
use proflow_core::component::{BuildContext, Processor};
use proflow_core::registry::{AnyConfig, Kind, Stability};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};

use crate::factories;

const CONFIG: &str = r#"
processors:
  relabel/team:
    relabel_configs:
      - {action: replace, target_label: team, replacement: core}
      - {action: drop, source_labels: [env], regex: debug}
      - source_labels: [service_name]
        regex: "(.*)-canary"
        target_label: service_name
"#;

const PATH: &str = "processors.relabel/team";

fn body(yaml: &str) -> Node {
    let root = Node::parse(yaml).unwrap();
    root.get("processors")
        .and_then(|p| p.get("relabel/team"))
        .cloned()
        .expect("the test config has processors.relabel/team")
}

fn parse(yaml: &str) -> Result<AnyConfig, Vec<proflow_config::Error>> {
    let factory = factories()
        .into_iter()
        .find(|f| f.kind == Kind::Processor && f.type_name == "relabel")
        .expect("relabel factory");
    factory.parse(&body(yaml), PATH)
}

fn build(yaml: &str, telemetry: &Arc<Telemetry>) -> Arc<dyn Processor> {
    let Ok(AnyConfig::Processor(config)) = parse(yaml) else {
        panic!("not a valid processor config: {yaml}");
    };
    config
        .build(&BuildContext {
            id: "relabel/team".to_owned(),
            telemetry: telemetry.clone(),
            memory: proflow_model::memory::MemoryBudget::new(1 << 30),
        })
        .unwrap()
}

/// An envelope whose payload is real gzipped pprof bytes, as a receiver makes it.
fn envelope(pairs: &[(&str, &str)]) -> Envelope {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    b.sample_root_first(["main", "work"], vec![10]);
    let bytes = pprof::gzip(&pprof::encode(&b.build()));
    Envelope {
        labels: Labels::from_pairs(pairs.iter().copied()),
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: None,
        period: 0,
        payload: Payload::from_bytes(bytes, 1 << 20),
    }
}

#[test]
fn factory_describes_the_processor() {
    let f = factories();
    let relabel = f
        .iter()
        .find(|f| f.type_name == "relabel")
        .expect("relabel is registered");
    assert_eq!(
        (relabel.kind, relabel.stability),
        (Kind::Processor, Stability::Beta)
    );
}

#[tokio::test]
async fn relabels_and_filters_a_batch_without_decoding() {
    let telemetry = Arc::new(Telemetry::new());
    let processor = build(CONFIG, &telemetry);
    let batch = vec![
        envelope(&[("__name__", "process_cpu"), ("service_name", "cart-canary")]),
        envelope(&[("env", "debug"), ("service_name", "cart")]),
        envelope(&[("env", "prod"), ("service_name", "shop")]),
    ];
    let payloads: Vec<Payload> = batch.iter().map(|e| e.payload.clone()).collect();

    let out = processor.process(batch, &BatchMeta::default()).await;

    let selectors: Vec<String> = out.iter().map(|e| e.labels.to_selector_string()).collect();
    assert_eq!(
        selectors,
        [
            r#"{__name__="process_cpu", service_name="cart", team="core"}"#,
            r#"{env="prod", service_name="shop", team="core"}"#,
        ]
    );
    assert!(
        payloads.iter().all(|p| !p.is_decoded()),
        "relabelling must never decode a payload"
    );
    assert_eq!(
        out[0].sample_types,
        vec![ValueType::new("cpu", "nanoseconds")]
    );
    let metrics = telemetry.render();
    assert!(
        metrics.contains(
            r#"proflow_processor_dropped_profiles_total{processor="relabel/team",reason="relabel_drop"} 1"#
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_batch_with_nothing_dropped_reports_no_drops() {
    let telemetry = Arc::new(Telemetry::new());
    let processor = build(CONFIG, &telemetry);
    let out = processor
        .process(vec![envelope(&[("env", "prod")])], &BatchMeta::default())
        .await;
    assert_eq!(out.len(), 1);
    assert!(!telemetry.render().contains("relabel_drop"));
}

#[test]
fn validation_errors_are_located() {
    let yaml = r#"
processors:
  relabel/team:
    relabel_configs:
      - {target_label: team, replacement: core}
      - action: hashmod
        source_labels: [pod]
        target_label: shard
      - {action: keep, regex: "(oops"}
"#;
    let Err(errors) = parse(yaml) else {
        panic!("invalid config accepted");
    };
    let found: Vec<(&str, usize)> = errors.iter().map(|e| (e.path.as_str(), e.line)).collect();
    assert_eq!(
        found,
        [
            ("processors.relabel/team.relabel_configs.1.modulus", 6),
            ("processors.relabel/team.relabel_configs.2.regex", 9),
        ]
    );
}

#[test]
fn unknown_and_missing_fields_are_refused() {
    for (yaml, needle) in [
        (
            "processors: {relabel/team: {relabel_configs: [], extra: 1}}",
            "extra",
        ),
        ("processors: {relabel/team: {}}", "relabel_configs"),
        (
            "processors: {relabel/team: {relabel_configs: [{target: x}]}}",
            "target",
        ),
    ] {
        let Err(errors) = parse(yaml) else {
            panic!("accepted: {yaml}");
        };
        let text = errors[0].to_string();
        assert!(text.contains(needle), "{yaml}: {text}");
    }
}
