//! The real Kafka peer (KRaft, single node): produce a binary message (a
//! gzipped pprof) with a key through kcat, consume it back through the tests'
//! consumer helper, and compare bytes. A private broker
//! (`peer_env::PrivatePeer`) killed and started again comes back on the same
//! port with its records.

use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use proflow_pipeline::pprof::{self, ProfileBuilder};

use crate::peer_env;

/// Produces one message (`value`, with `key`) to `topic` with kcat.
fn produce(broker: &str, topic: &str, key: &str, value: &[u8]) {
    // kcat -P with no delimiter reads all of stdin as one message.
    let mut producer = Command::new("kcat")
        .args(["-b", broker, "-P", "-t", topic, "-k", key, "-m", "10"])
        .args(["-X", "message.timeout.ms=10000"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("could not run kcat (Debian package kcat): {e}"));
    producer
        .stdin
        .take()
        .expect("kcat stdin")
        .write_all(value)
        .expect("write message to kcat");
    let produced = producer.wait_with_output().expect("kcat producer");
    assert!(
        produced.status.success(),
        "kcat produce to {topic} at {broker}: {}\n{}",
        produced.status,
        String::from_utf8_lossy(&produced.stderr)
    );
}

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

    produce(broker, &topic, "smoke-key", &value);

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

/// What a broker-restart test builds on: a private broker killed with
/// SIGKILL (no clean shutdown) and started again is back on the same port
/// with the same KRaft log dir, so a record produced before the kill is still
/// there, and it takes new records.
#[test]
fn private_broker_killed_and_restarted_keeps_its_records() {
    let Some(mut kafka) = peer_env::PrivatePeer::start("kafka") else {
        return;
    };
    let broker = kafka.endpoint().to_owned();
    let topic = peer_env::unique("proflow-restart-");
    produce(&broker, &topic, "before", b"produced before the kill");
    kafka.kill();
    kafka.start_again();
    assert_eq!(kafka.endpoint(), broker, "the broker came back elsewhere");
    produce(&broker, &topic, "after", b"produced after the restart");
    let records = peer_env::kafka_consume(&broker, &topic, 2, Duration::from_secs(30));
    let got: Vec<(Option<&[u8]>, &[u8])> = records
        .iter()
        .map(|r| (r.key.as_deref(), r.value.as_slice()))
        .collect();
    assert_eq!(
        got,
        [
            (Some(&b"before"[..]), &b"produced before the kill"[..]),
            (Some(&b"after"[..]), &b"produced after the restart"[..]),
        ]
    );
}
