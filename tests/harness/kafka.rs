//! The real Kafka peer (KRaft, single node): produce a binary message (a
//! gzipped pprof) with a key through kcat, consume it back through the tests'
//! consumer helper, and compare bytes.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use proflow_pipeline::pprof::{self, ProfileBuilder};

use crate::peer_env;

#[test]
fn produced_message_is_consumed_byte_for_byte() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-smoke-");

    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(peer_env::now_nanos(), 10_000_000_000)
        .sample_root_first(["main", "proflowSmokeHot"], vec![3_000_000_000]);
    let value = pprof::gzip(&pprof::encode(&b.build())).to_vec();

    // kcat -P with no delimiter reads all of stdin as one message.
    let mut producer = Command::new("kcat")
        .args([
            "-b",
            broker,
            "-P",
            "-t",
            &topic,
            "-k",
            "smoke-key",
            "-m",
            "10",
        ])
        .args(["-X", "message.timeout.ms=10000"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("could not run kcat (Debian package kcat): {e}"));
    producer
        .stdin
        .take()
        .expect("kcat stdin")
        .write_all(&value)
        .expect("write message to kcat");
    let produced = producer.wait_with_output().expect("kcat producer");
    assert!(
        produced.status.success(),
        "kcat produce to {topic} at {broker}: {}\n{}",
        produced.status,
        String::from_utf8_lossy(&produced.stderr)
    );

    let records = peer_env::kafka_consume(broker, &topic, 1, Duration::from_secs(30));
    assert_eq!(records[0].key.as_deref(), Some(&b"smoke-key"[..]));
    assert_eq!(records[0].value.len(), value.len(), "value length");
    assert!(
        records[0].value == value,
        "consumed value differs from the produced one"
    );
    let profile = pprof::decode(&bytes::Bytes::from(records[0].value.clone()), 1 << 20)
        .expect("consumed value decodes as pprof");
    assert_eq!(profile.sample.len(), 1);
}
