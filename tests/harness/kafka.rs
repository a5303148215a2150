//! The real Kafka peer (KRaft, single node): produce a binary message (a
//! gzipped pprof) with a key through kcat, consume it back through the tests'
//! consumer helper, and compare bytes. A private broker
//! (`peer_env::PrivatePeer`) killed and started again comes back on the same
//! port with its records.

use std::process::{Command, Stdio};
use std::time::Duration;

use proflow_model::pprof::{self, ProfileBuilder};

use crate::peer_env;

/// Produces one message (`value`, with `key`) to `topic` with kcat.
///
/// The value goes through a file named on kcat's command line: kcat sends
/// each named file whole as one message, whereas stdin is split at every
/// newline byte, and a gzipped pprof holds 0x0a often enough to make a
/// stdin-fed test flaky.
fn produce(broker: &str, topic: &str, key: &str, value: &[u8]) {
    let dir = tempfile::tempdir().expect("temp dir for the kcat message");
    let file = dir.path().join("message");
    std::fs::write(&file, value).expect("write the kcat message file");
    let produced = Command::new("kcat")
        .args(["-b", broker, "-P", "-t", topic, "-k", key])
        .args(["-X", "message.timeout.ms=10000"])
        .arg(&file)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("could not run kcat (Debian package kcat): {e}"));
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
    let mut value = pprof::gzip(&pprof::encode(&b.build())).to_vec();
    // Three bytes after the gzip member make sure the message holds newlines,
    // which a stdin-fed kcat would split at; the decode below leaves them out.
    let decodable_len = value.len();
    value.extend_from_slice(b"\n\r\n");

    produce(broker, &topic, "smoke-key", &value);

    let records = peer_env::kafka_consume(broker, &topic, 1, Duration::from_secs(30));
    assert_eq!(records[0].key.as_deref(), Some(&b"smoke-key"[..]));
    assert_eq!(records[0].value.len(), value.len(), "value length");
    assert!(
        records[0].value == value,
        "consumed value differs from the produced one"
    );
    let profile = pprof::decode(
        &bytes::Bytes::copy_from_slice(&records[0].value[..decodable_len]),
        1 << 20,
    )
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
