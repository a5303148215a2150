//! Profiles through the OpenTelemetry Collector's own `kafka` receiver and
//! exporter and back: proflow's `kafka` exporter (otlp_proto) into the
//! Collector, the Collector's `kafka` exporter into proflow's receiver.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use super::{ARRIVAL_TIMEOUT, producer, push};
use crate::common::{self, IndexEntry, Proflow, read_index};
use crate::peer_env;

/// The OpenTelemetry Collector (the `otelcol` peer, built with the contrib
/// `kafka` receiver and exporter), run by the test between two topics, with
/// a `file` exporter beside its `kafka` exporter.
struct KafkaCollector {
    child: std::process::Child,
    log: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl KafkaCollector {
    /// Reads OTLP profiles from `from` (group `group`, from the earliest
    /// offset) and writes them to `to`, and to `file` as OTLP JSON lines.
    fn start(bin: &str, broker: &str, from: &str, to: &str, group: &str) -> KafkaCollector {
        let dir = tempfile::tempdir().expect("temporary directory");
        let config = dir.path().join("config.yaml");
        let log = dir.path().join("collector.log");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  kafka:\n    brokers: [\"{broker}\"]\n    group_id: {group}\n    initial_offset: earliest\n    profiles: {{topics: [{from}], encoding: otlp_proto}}\n\
                 exporters:\n  kafka:\n    brokers: [\"{broker}\"]\n    profiles: {{topic: {to}, encoding: otlp_proto}}\n  file:\n    path: {}\n    flush_interval: 100ms\n\
                 service:\n  telemetry:\n    logs: {{level: info}}\n    metrics: {{level: none}}\n  \
                 pipelines:\n    profiles:\n      receivers: [kafka]\n      exporters: [kafka, file]\n",
                dir.path().join("profiles.jsonl").display()
            ),
        )
        .expect("write the collector's config");
        let out = std::fs::File::create(&log).expect("create the collector's log");
        let child = std::process::Command::new(bin)
            .arg("--config")
            .arg(&config)
            .arg("--feature-gates=+service.profilesSupport")
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("could not run the collector {bin}: {e}"));
        KafkaCollector { child, log, dir }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Profiles its `file` exporter wrote (OTLP JSON, one `timeUnixNano`
    /// each).
    fn profiles_in_file(&self) -> usize {
        std::fs::read_to_string(self.dir.path().join("profiles.jsonl"))
            .unwrap_or_default()
            .matches("\"timeUnixNano\"")
            .count()
    }
}

impl Drop for KafkaCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::copy(
            self.dir.path().join("profiles.jsonl"),
            "/tmp/kh/otelcol-profiles.jsonl",
        );
        if std::thread::panicking() {
            eprintln!("---- collector log ----\n{}", self.log_text());
        }
    }
}

/// Interop with the Collector's own `kafka` components: proflow's `kafka`
/// exporter (`otlp_proto`) → the Collector's `kafka` receiver → its `file`
/// exporter, and its `kafka` exporter → proflow's `kafka` receiver (bare
/// OTLP records, no proflow headers) → files. Every profile arrives once at
/// each, and proflow's copies have each function's CPU time as pushed.
#[test]
fn the_collectors_kafka_receiver_and_exporter_carry_profiles_both_ways() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let Some(bin) = otelcol.get("BIN").map(str::to_owned) else {
        panic!("the otelcol peer did not report its binary (OTELCOL_BIN)");
    };
    let broker = kafka.endpoint();
    let to_collector = peer_env::unique("proflow-to-otelcol-");
    let from_collector = peer_env::unique("otelcol-to-proflow-");
    let first = producer(broker, &to_collector, "otlp_proto");
    const N: usize = 20;
    for i in 0..N {
        push(&first, "kafka-otelcol", i);
    }
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    while common::metric_sum(
        &first.metrics(),
        "proflow_exporter_sent_profiles_total",
        &[("exporter", "kafka")],
    ) < N as f64
    {
        assert!(
            Instant::now() < deadline,
            "the first proflow did not send {N} records\n{}",
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let collector = KafkaCollector::start(
        &bin,
        broker,
        &to_collector,
        &from_collector,
        &peer_env::unique("otelcol-g-"),
    );
    // The Collector creates its topic with its first record: the receiver
    // looks for it every second.
    let second = Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  kafka:\n    brokers: [\"{broker}\"]\n    topics: [{from_collector}]\n    group_id: {}\n    initial_offset: earliest\n    consumer: {{topic.metadata.refresh.interval.ms: \"1000\"}}\n\
             exporters:\n  file:\n    directory: {}\n    sending_queue: {{when_full: block}}\n\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [kafka]\n      exporters: [file]\n",
            peer_env::unique("g-"),
            profiles.display(),
            ports.telemetry
        )
    });
    let deadline = Instant::now() + ARRIVAL_TIMEOUT * 2;
    let entries = loop {
        let entries: Vec<IndexEntry> = read_index(&second.profiles)
            .into_iter()
            .filter(|e| e.path.is_file())
            .collect();
        if entries.len() >= N {
            break entries;
        }
        assert!(
            Instant::now() < deadline,
            "after {:?} {} of {N} profiles came back through the Collector\nreceiving log:\n{}\ncollector log:\n{}",
            ARRIVAL_TIMEOUT * 2,
            entries.len(),
            second.log_text(),
            collector.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    // Nothing more comes (a record read twice would).
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(
        collector.profiles_in_file(),
        N,
        "profiles the Collector's kafka receiver passed to its file exporter"
    );
    let entries_after = read_index(&second.profiles).len();
    let mut totals: BTreeMap<&str, i64> = BTreeMap::new();
    for e in &entries {
        // Not compared: the labels. The Collector's kafka receiver (v0.158)
        // keeps the resource attributes' values but drops their keys (its
        // own file exporter writes `{"value":{"stringValueStrindex":8}}`
        // without a key for proflow's `service.name`), so proflow reads
        // them as `_` and the service as `unknown_service`.
        let p = common::read_profile(&e.path);
        for (frames, s) in proflow_model::pprof::stacks_root_first(&p) {
            for f in ["kafka_hot", "kafka_warm"] {
                if frames.last() == Some(&f) {
                    *totals.entry(f).or_default() += s.value.iter().copied().max().unwrap_or(0);
                }
            }
        }
    }
    let hot: i64 = (0..N as i64).map(|i| (i + 1) * 1_000_000).sum();
    assert_eq!(
        (
            entries_after,
            totals.get("kafka_hot").copied(),
            totals.get("kafka_warm").copied()
        ),
        (N, Some(hot), Some(7_000_000 * N as i64)),
        "(profiles, kafka_hot ns, kafka_warm ns) after proflow → Collector → proflow"
    );
    eprintln!(
        "{N} profiles through the Collector's kafka receiver and exporter: totals {totals:?}"
    );
}
