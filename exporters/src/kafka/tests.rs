//! Unit tests of the `kafka` exporter: config validation and defaults, the
//! librdkafka properties, the record a profile becomes, classification of
//! librdkafka's errors, and a broker nobody answers. Sending to the real
//! Apache Kafka is tested end to end in tests/kafka.rs.

use std::sync::Arc;

use proflow_config::Node;
use proflow_core::component::{BuildContext, ErrorClass, Exporter};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, ExportBatch, Labels, Payload, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};

use super::*;
use proflow_core::component::{ExporterConfig, Validate};
use proflow_model::model::Format;

fn typed(yaml: &str) -> KafkaExporterConfig {
    let node = Node::parse(yaml).expect("test YAML parses");
    proflow_config::from_node(&node, "exporters.kafka").expect("test config deserializes")
}

fn ctx() -> BuildContext {
    BuildContext {
        id: "kafka".into(),
        telemetry: Arc::new(Telemetry::new()),
        memory: proflow_model::memory::MemoryBudget::new(1 << 30),
    }
}

fn envelope(service: &str) -> Envelope {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_700_000_000_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "hot"], vec![30_000_000]);
    let gz = pprof::gzip(&pprof::encode(&b.build()));
    Envelope {
        labels: Labels::from_pairs([("__name__", "process_cpu"), ("service_name", service)]),
        start_unix_nanos: 1_700_000_000_000_000_000,
        end_unix_nanos: 1_700_000_010_000_000_000,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: Some(ValueType::new("cpu", "nanoseconds")),
        period: 10_000_000,
        payload: Payload::from_bytes(gz, 1 << 20),
    }
}

#[test]
fn defaults_follow_the_collector_and_are_safe() {
    let c = typed("{}");
    assert_eq!(c.brokers, ["localhost:9092"]);
    assert_eq!(c.topic, "otlp_profiles");
    assert_eq!(c.encoding, Encoding::OtlpProto);
    assert_eq!(c.wants(), Some(Format::Otlp));
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    let p = c.properties().unwrap();
    assert_eq!(p["enable.idempotence"], "true");
    assert_eq!(p["acks"], "all");
    assert_eq!(p["compression.type"], "none");
    assert_eq!(p["message.timeout.ms"], "30000");
    assert_eq!(p["security.protocol"], "plaintext");

    let c = typed("encoding: pprof\nproducer: {acks: \"1\", linger.ms: \"20\"}\ncompression: zstd");
    assert_eq!(c.wants(), Some(Format::Pprof));
    let p = c.properties().unwrap();
    assert_eq!(p["acks"], "1", "producer passes through and wins");
    assert_eq!(p["linger.ms"], "20");
    assert_eq!(p["compression.type"], "zstd");
}

#[test]
fn every_problem_is_reported() {
    let c = typed(
        "brokers: [\"kafka://b:9092\"]\ntopic: \"p.{service name}\"\nmax_message_bytes: 10\ntimeout: 0s\nproducer: {bootstrap.servers: x, message.timeout.ms: \"5\", compression.type: gzip}\nsasl: {mechanism: PLAIN, username: u}",
    );
    let paths: Vec<String> = c.validate().into_iter().map(|p| p.path).collect();
    for want in [
        "brokers.0",
        "sasl",
        "topic",
        "max_message_bytes",
        "timeout",
        "producer.bootstrap.servers",
        "producer.message.timeout.ms",
        "producer.compression.type",
    ] {
        assert!(
            paths.iter().any(|p| p == want),
            "{want} missing from {paths:?}"
        );
    }
    let err = c.build_kafka(&ctx()).unwrap_err().to_string();
    assert!(
        err.contains("exporter `kafka`") && err.contains("topic"),
        "{err}"
    );
}

#[test]
fn unknown_fields_and_mechanisms_are_refused() {
    let node = Node::parse("brokers: [a:1]\nbroker: b").unwrap();
    let e = proflow_config::from_node::<KafkaExporterConfig>(&node, "exporters.kafka").unwrap_err();
    assert!(e.to_string().contains("broker"), "{e}");
    let node = Node::parse("sasl: {mechanism: GSSAPI, username: u, password: p}").unwrap();
    assert!(proflow_config::from_node::<KafkaExporterConfig>(&node, "exporters.kafka").is_err());
}

#[test]
fn a_pprof_record_carries_the_bytes_as_they_arrived() {
    let x = typed("encoding: pprof\ntopic: \"profiles.{service_name}\"")
        .build_kafka(&ctx())
        .unwrap();
    let e = envelope("checkout");
    let arrived = e.payload.gzipped().unwrap();
    let r = x.prepare(7, &e, Some("team-a")).unwrap();
    assert_eq!(r.index, 7);
    assert_eq!(r.topic, "profiles.checkout");
    assert_eq!(r.value, arrived);
    assert_eq!(
        r.value.as_ptr(),
        arrived.as_ptr(),
        "the value shares the payload's bytes"
    );
    assert!(!e.payload.is_decoded(), "pprof is never decoded");
    assert_eq!(r.key, kafka::series_key(&e.labels));
    let read = RecordHeaders::from_pairs(
        r.headers
            .iter()
            .map(|(k, v)| (k.as_str(), Some(v.as_bytes()))),
    )
    .unwrap();
    assert_eq!(read.encoding, Some(Encoding::Pprof));
    assert_eq!(read.labels, e.labels);
    assert_eq!(read.tenant.as_deref(), Some("team-a"));
    assert_eq!(read.start_unix_nanos, Some(e.start_unix_nanos));
    assert_eq!(read.end_unix_nanos, Some(e.end_unix_nanos));
}

#[test]
fn an_otlp_record_is_one_request_with_the_profile() {
    for (encoding, json) in [("otlp_proto", false), ("otlp_json", true)] {
        let x = typed(&format!("encoding: {encoding}"))
            .build_kafka(&ctx())
            .unwrap();
        let mut e = envelope("checkout");
        let mut lost = Default::default();
        e.payload = e.payload.with_form(Format::Otlp, &mut lost).unwrap();
        let r = x.prepare(0, &e, None).unwrap();
        let request = if json {
            otlp::json::decode_request(&r.value).unwrap()
        } else {
            use prost::Message;
            otlp::collector::ExportProfilesServiceRequest::decode(&r.value[..]).unwrap()
        };
        let n: usize = request
            .resource_profiles
            .iter()
            .flat_map(|rp| &rp.scope_profiles)
            .map(|sp| sp.profiles.len())
            .sum();
        assert_eq!(n, 1, "{encoding}");
        assert!(request.dictionary.is_some(), "{encoding}");
    }
}

#[test]
fn a_record_over_max_message_bytes_is_refused_for_good() {
    let x = typed("encoding: pprof\nmax_message_bytes: 1024")
        .build_kafka(&ctx())
        .unwrap();
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    for i in 0..400 {
        let name = format!("f{i}-{}", "x".repeat(i % 37));
        b.sample_root_first([name.as_str()], vec![i as i64]);
    }
    let mut e = envelope("big");
    e.payload = Payload::from_bytes(pprof::gzip(&pprof::encode(&b.build())), 1 << 20);
    let err = x.prepare(0, &e, None).err().expect("too large");
    assert_eq!(err.class, ErrorClass::Permanent);
    assert_eq!(err.reason, "too_large");
    assert!(
        err.message.contains("max_message_bytes (1024)"),
        "{}",
        err.message
    );
}

#[test]
fn librdkafka_errors_are_classified() {
    let e = classify(&KafkaError::MessageProduction(
        RDKafkaErrorCode::MessageSizeTooLarge,
    ));
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "too_large")
    );
    let e = classify(&KafkaError::MessageProduction(
        RDKafkaErrorCode::MessageTimedOut,
    ));
    assert!(matches!(e.class, ErrorClass::Retryable { .. }));
    assert_eq!(e.reason, "timeout");
    let e = classify(&KafkaError::MessageProduction(
        RDKafkaErrorCode::NotEnoughReplicas,
    ));
    assert!(matches!(e.class, ErrorClass::Retryable { .. }));
    assert_eq!(e.reason, "not_enough_replicas");
    let e = classify(&KafkaError::MessageProduction(
        RDKafkaErrorCode::TopicAuthorizationFailed,
    ));
    assert_eq!(
        (e.class, e.reason.as_str()),
        (ErrorClass::Permanent, "unauthorized")
    );
}

/// Nothing listens on the broker's port: every record times out and the
/// whole batch goes back to the queue as retryable (a real broker that is
/// down looks the same; the end-to-end tests stop a real one).
#[tokio::test]
async fn a_broker_nobody_answers_makes_the_batch_retryable() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let x = typed(&format!(
        "brokers: [\"127.0.0.1:{port}\"]\nencoding: pprof\ntimeout: 1s"
    ))
    .build_kafka(&ctx())
    .unwrap();
    let mut batch = ExportBatch::new();
    batch.push(
        vec![envelope("a"), envelope("b")],
        Arc::new(BatchMeta::default()),
    );
    let err = x.export(&batch).await.unwrap_err();
    assert!(matches!(err.class, ErrorClass::Retryable { .. }), "{err:?}");
    assert!(err.refused.is_none());
}
