//! The relabel engine and processor on typical series labels: the per-profile
//! cost on the hot path. Run: `cargo bench -p proflow-processors --bench relabel`

use std::hint::black_box;
use std::sync::Arc;

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use proflow_config::{Node, from_node};
use proflow_core::component::{BuildContext, ProcessorConfig};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload};
use proflow_processors::RelabelProcessorConfig;
use proflow_relabel::{RelabelConfig, Relabeler};

/// A rule set like a user's: a constant label, a filter, a copy, a rewrite
/// with groups, a shard and a cleanup.
const RULES: &str = r#"
- {target_label: team, replacement: core}
- {action: drop, source_labels: [env], regex: debug|test}
- {source_labels: [service_name], target_label: app}
- {source_labels: [pod], regex: "(.+)-[a-z0-9]{5}", target_label: workload}
- {action: hashmod, source_labels: [pod, namespace], modulus: 8, target_label: shard}
- {action: labeldrop, regex: "tmp_.*"}
"#;

fn typical_labels() -> Labels {
    Labels::from_pairs([
        ("__name__", "process_cpu"),
        ("env", "prod"),
        ("namespace", "shop"),
        ("pod", "checkout-7d9f8b6c4-x2k9p"),
        ("service_name", "checkout"),
        ("tmp_debug", "1"),
        ("zone", "eu-west-1a"),
    ])
}

fn relabel(c: &mut Criterion) {
    let node = Node::parse(RULES).expect("bench rules parse");
    let configs: Vec<RelabelConfig> =
        from_node(&node, "relabel_configs").expect("bench rules read");
    let relabeler = Relabeler::new(&configs).expect("bench rules valid");

    let mut g = c.benchmark_group("relabel");
    g.throughput(Throughput::Elements(1));
    g.bench_function("apply_6_rules", |b| {
        b.iter_batched_ref(
            typical_labels,
            |l| relabeler.apply(black_box(l)),
            BatchSize::SmallInput,
        )
    });

    let constant = Relabeler::new(&configs[..1]).expect("valid");
    g.bench_function("apply_constant_label", |b| {
        b.iter_batched_ref(
            typical_labels,
            |l| constant.apply(black_box(l)),
            BatchSize::SmallInput,
        )
    });

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    let config = RelabelProcessorConfig {
        relabel_configs: configs,
    };
    let processor = config
        .build(&BuildContext {
            id: "relabel/bench".to_owned(),
            telemetry: Arc::new(Telemetry::new()),
            memory: proflow_model::memory::MemoryBudget::new(1 << 30),
        })
        .expect("build");
    let envelope = Envelope {
        labels: typical_labels(),
        start_unix_nanos: 0,
        end_unix_nanos: 0,
        sample_types: Vec::new(),
        period_type: None,
        period: 0,
        payload: Payload::from_bytes(Bytes::from_static(b"\x1f\x8b not decoded"), 1 << 20),
    };
    g.throughput(Throughput::Elements(100));
    let meta = BatchMeta::default();
    g.bench_function("process_batch_of_100", |b| {
        b.iter_batched(
            || vec![envelope.clone(); 100],
            |batch| rt.block_on(processor.process(batch, &meta)).len(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, relabel);
criterion_main!(benches);
