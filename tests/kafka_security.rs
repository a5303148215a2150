//! The `kafka` exporter's and receiver's `sasl` and `tls` settings against a
//! real Apache Kafka broker: a private broker of each test's own
//! (`tests/peers/private`) with extra listeners (`PROFLOW_KAFKA_LISTENERS`,
//! see `tests/peers/kafka/peer.sh`), a first proflow pushing through the
//! `kafka` exporter, a second reading back with the `kafka` receiver and
//! writing files. Every profile must arrive byte for byte, and a client with
//! the wrong secret must be turned away with the reason in proflow's log and
//! nothing delivered.
//!
//! - SASL_PLAINTEXT with SCRAM: the exporter as a SCRAM-SHA-256 user (its
//!   password from `password_file`), the receiver as a SCRAM-SHA-512 user; the
//!   credentials are written into the KRaft metadata when the broker's
//!   storage is formatted. A wrong password: authentication failure logged,
//!   retries counted, nothing sent, the topic never created; and for the
//!   receiver, the failure logged and nothing read from a topic that holds
//!   records (the receiver has no metric of its client's errors).
//! - SSL with a CA and certificates made here with the openssl CLI (PEM files
//!   the broker reads with `ssl.keystore.type=PEM`): the exporter with
//!   `tls: {ca_file}` (the broker's certificate names 127.0.0.1, which
//!   librdkafka checks), the receiver with mutual TLS on a listener that
//!   requires a client certificate. Turned away: the system's CAs
//!   (`tls: {}`) against the test CA's certificate, and no client certificate
//!   where one is required.
//!
//! Debian's kcat (librdkafka 2.0) cannot authenticate with SCRAM to a Kafka
//! 4.x broker (a nonce bug librdkafka fixed in 2.6.1), so the tests inspect
//! the broker through its PLAINTEXT listener only.

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules).
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{IndexEntry, Proflow, gzip, read_index};

/// How long the second proflow may take to write everything.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a refused client may take to show why in its log.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(30);
/// Profiles per end-to-end run.
const N: usize = 20;

/// A distinct CPU profile: its one sample's value is `i` ms.
fn profile(i: usize) -> Vec<u8> {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "secure_hot"], vec![(i as i64 + 1) * 1_000_000]);
    gzip(&proflow_model::pprof::encode(&b.build()))
}

/// Pushes profile `i` as service `service`.
fn push(p: &Proflow, service: &str, i: usize) {
    p.post(
        &common::ingest_query(&format!("{service}{{seq={i}}}"), Some("pprof")),
        &[("content-type", "application/octet-stream")],
        profile(i),
    )
    .expect_status(200, "push");
}

/// The first proflow: `pprof_push` → `file` and `kafka` with `client` (YAML
/// lines such as `sasl: {...}`), retrying quickly.
fn producer(broker: &str, topic: &str, client: &str) -> Proflow {
    common::start_with_file_and(
        "kafka",
        &format!(
            "brokers: [\"{broker}\"]\ntopic: {topic}\nencoding: pprof\ntimeout: 5s\n{client}\nsending_queue: {{when_full: block}}\nretry_on_failure: {{initial_interval: 1s, max_interval: 2s, max_elapsed_time: 0s}}"
        ),
    )
}

/// The second proflow: `kafka` with `client` (one YAML line) → `file`.
fn consumer(broker: &str, topic: &str, client: &str) -> Proflow {
    let group = peer_env::unique("g-");
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  kafka:\n    brokers: [\"{broker}\"]\n    topics: [{topic}]\n    group_id: {group}\n    initial_offset: earliest\n    commit_interval: 500ms\n    {client}\n\
             exporters:\n  file:\n    directory: {}\n    sending_queue: {{when_full: block}}\n\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [kafka]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    })
}

/// The bytes of every file an index lists, by `seq` label.
fn files_by_seq(entries: &[IndexEntry]) -> BTreeMap<String, Vec<u8>> {
    entries
        .iter()
        .map(|e| {
            let bytes = std::fs::read(&e.path)
                .unwrap_or_else(|err| panic!("read {}: {err}", e.path.display()));
            (e.label("seq").unwrap_or("?").to_owned(), bytes)
        })
        .collect()
}

/// Pushes `N` profiles into `first` and checks that `second` writes each of
/// them with the bytes `first` received.
fn all_arrive_byte_for_byte(first: &Proflow, second: &Proflow, service: &str) {
    for i in 0..N {
        push(first, service, i);
    }
    let sent = files_by_seq(&first.wait_for_files(N, |_| true));
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    let got = loop {
        let entries: Vec<IndexEntry> = read_index(&second.profiles)
            .into_iter()
            .filter(|e| e.path.is_file())
            .collect();
        let got = files_by_seq(&entries);
        if got.len() >= N {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "after {ARRIVAL_TIMEOUT:?} {} of {N} profiles arrived\nreceiving log:\n{}\nsending log:\n{}",
            got.len(),
            second.log_text(),
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        got.keys().collect::<BTreeSet<_>>(),
        sent.keys().collect::<BTreeSet<_>>()
    );
    for (seq, bytes) in &sent {
        assert!(
            &got[seq] == bytes,
            "profile seq={seq}: the bytes written after Kafka differ from the bytes pushed"
        );
    }
    let sent_n = common::metric_sum(
        &first.metrics(),
        "proflow_exporter_sent_profiles_total",
        &[("exporter", "kafka")],
    );
    assert_eq!(sent_n as usize, N, "delivered by delivery report");
}

/// Pushes two profiles into a producer that the broker turns away and waits
/// until its log holds `reason`; then checks that it retried, delivered
/// nothing, and that `topic` does not exist on the broker (read through the
/// PLAINTEXT listener at `plaintext`). Returns the log line that says why.
fn refused(p: &Proflow, plaintext: &str, topic: &str, reason: &str) -> String {
    push(p, "refused", 0);
    push(p, "refused", 1);
    p.wait_for_files(2, |_| true);
    let line = peer_env::poll(REFUSAL_TIMEOUT, || {
        let metrics = p.metrics();
        let retried = common::metric_sum(
            &metrics,
            "proflow_exporter_retries_total",
            &[("exporter", "kafka")],
        );
        let log = p.log_text();
        let line = log.lines().find(|l| l.contains(reason))?;
        (retried > 0.0).then(|| line.to_owned())
    })
    .unwrap_or_else(|| {
        panic!(
            "after {REFUSAL_TIMEOUT:?} no retry and no `{reason}` in the log\nlog:\n{}\nmetrics:\n{}",
            p.log_text(),
            p.metrics()
        )
    });
    let metrics = p.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "kafka")]
        ),
        0.0,
        "a refused client delivered profiles"
    );
    let listing = Command::new("kcat")
        .args(["-b", plaintext, "-L", "-m", "10"])
        .output()
        .expect("run kcat -L");
    assert!(
        listing.status.success(),
        "kcat -L: {}",
        String::from_utf8_lossy(&listing.stderr)
    );
    let listing = String::from_utf8_lossy(&listing.stdout);
    assert!(
        listing.contains("__consumer_offsets") || listing.contains("topics"),
        "kcat -L printed no topic list:\n{listing}"
    );
    assert!(
        !listing.contains(&format!("\"{topic}\"")),
        "topic {topic} exists although its producer was turned away:\n{listing}"
    );
    line
}

/// How long a refused consumer is watched after its log said why: nothing
/// may arrive meanwhile (an authenticated consumer of the same topic had
/// every record within a second or two).
const REFUSED_WATCH: Duration = Duration::from_secs(5);

/// Waits (at most [`REFUSAL_TIMEOUT`]) until the consuming proflow `p`'s
/// log holds `reason`, watches it for [`REFUSED_WATCH`] more, and checks
/// that it accepted and wrote nothing and that the reason was logged.
/// Returns the log line that says why.
fn consumer_refused(p: &Proflow, reason: &str) -> String {
    let line = peer_env::poll(REFUSAL_TIMEOUT, || {
        p.log_text()
            .lines()
            .find(|l| l.contains(reason))
            .map(str::to_owned)
    });
    std::thread::sleep(REFUSED_WATCH);
    let metrics = p.metrics();
    let accepted = common::metric_sum(
        &metrics,
        "proflow_receiver_accepted_profiles_total",
        &[("receiver", "kafka")],
    );
    let written = read_index(&p.profiles).len();
    assert!(
        accepted == 0.0 && written == 0,
        "a consumer that should be refused accepted {accepted} profiles and wrote {written}\nlog:\n{}",
        p.log_text()
    );
    line.unwrap_or_else(|| {
        panic!(
            "after {REFUSAL_TIMEOUT:?} no `{reason}` in the receiving log\nlog:\n{}",
            p.log_text()
        )
    })
}

#[test]
fn scram_over_sasl_plaintext_end_to_end_and_a_wrong_password_is_refused() {
    let producer_password = peer_env::unique("p256-");
    let consumer_password = peer_env::unique("p512-");
    let scram = format!(
        "SCRAM-SHA-256=[name=proflow-producer,password={producer_password}]\n\
         SCRAM-SHA-512=[name=proflow-consumer,password={consumer_password}]"
    );
    let jaas = "org.apache.kafka.common.security.scram.ScramLoginModule required;";
    let properties = format!(
        "listener.name.sasl.sasl.enabled.mechanisms=SCRAM-SHA-256,SCRAM-SHA-512\n\
         listener.name.sasl.scram-sha-256.sasl.jaas.config={jaas}\n\
         listener.name.sasl.scram-sha-512.sasl.jaas.config={jaas}"
    );
    let Some(kafka) = peer_env::PrivatePeer::start_with(
        "kafka",
        &[
            ("PROFLOW_KAFKA_LISTENERS", "SASL:SASL_PLAINTEXT"),
            ("PROFLOW_KAFKA_SCRAM", &scram),
            ("PROFLOW_KAFKA_PROPERTIES", &properties),
        ],
    ) else {
        return;
    };
    let sasl = kafka.peer().var("SASL_ENDPOINT").to_owned();
    let secrets = tempfile::tempdir().expect("temporary directory");
    let password_file = secrets.path().join("producer-password");
    std::fs::write(&password_file, format!("{producer_password}\n")).expect("write password");

    let topic = peer_env::unique("proflow-scram-");
    let first = producer(
        &sasl,
        &topic,
        &format!(
            "sasl: {{mechanism: SCRAM-SHA-256, username: proflow-producer, password_file: {}, allow_plaintext: true}}",
            password_file.display()
        ),
    );
    let second = consumer(
        &sasl,
        &topic,
        &format!(
            "sasl: {{mechanism: SCRAM-SHA-512, username: proflow-consumer, password: {consumer_password}, allow_plaintext: true}}"
        ),
    );
    all_arrive_byte_for_byte(&first, &second, "kafka-scram");

    let wrong_topic = peer_env::unique("proflow-scram-wrong-");
    let wrong = producer(
        &sasl,
        &wrong_topic,
        "sasl: {mechanism: SCRAM-SHA-256, username: proflow-producer, password: not-the-password, allow_plaintext: true}",
    );
    let why = refused(
        &wrong,
        kafka.endpoint(),
        &wrong_topic,
        "invalid credentials",
    );
    assert!(why.contains("SCRAM-SHA-256"), "{why}");

    // The receiver with a wrong password, on the topic that holds N
    // records: turned away with librdkafka's reason, nothing read.
    let turned_away = consumer(
        &sasl,
        &topic,
        "sasl: {mechanism: SCRAM-SHA-512, username: proflow-consumer, password: not-the-password, allow_plaintext: true}",
    );
    let consumer_why = consumer_refused(&turned_away, "invalid credentials");
    assert!(consumer_why.contains("SCRAM-SHA-512"), "{consumer_why}");
    eprintln!(
        "SCRAM: {N} profiles byte for byte; wrong password refused: {why}; consumer with a wrong password refused: {consumer_why}"
    );
}

/// Runs `openssl ARGS` in `dir`; panics with its output if it fails.
fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("could not run openssl (Debian package openssl): {e}"));
    assert!(
        out.status.success(),
        "openssl {args:?} failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A CA, a broker certificate for 127.0.0.1 and a client certificate, all
/// signed by the CA, as PEM files in `dir`: `ca.pem`, `broker-keystore.pem`
/// (key and certificate, what the broker reads), `client.pem`, `client.key`.
fn make_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf, PathBuf) {
    let days = ["-days", "2"];
    openssl(
        dir,
        &[
            &["req", "-x509", "-newkey", "rsa:2048", "-nodes"][..],
            &[
                "-keyout",
                "ca.key",
                "-out",
                "ca.pem",
                "-subj",
                "/CN=proflow test CA",
            ],
            &days,
        ]
        .concat(),
    );
    std::fs::write(dir.join("broker.ext"), "subjectAltName=IP:127.0.0.1\n").expect("write ext");
    for (name, cn, ext) in [
        ("broker", "/CN=127.0.0.1", Some("broker.ext")),
        ("client", "/CN=proflow-client", None),
    ] {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj", cn,
            ],
        );
        let mut sign = vec![
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &pem,
            "-days",
            "2",
        ];
        if let Some(ext) = ext {
            sign.extend(["-extfile", ext]);
        }
        openssl(dir, &sign);
    }
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("read PEM");
    std::fs::write(
        dir.join("broker-keystore.pem"),
        read("broker.key") + &read("broker.pem"),
    )
    .expect("write keystore");
    (
        dir.join("ca.pem"),
        dir.join("broker-keystore.pem"),
        dir.join("client.pem"),
        dir.join("client.key"),
    )
}

#[test]
fn tls_with_a_test_ca_and_mutual_tls_end_to_end_and_untrusted_clients_are_refused() {
    let certs = tempfile::tempdir().expect("temporary directory");
    let (ca, keystore, client_cert, client_key) = make_certificates(certs.path());
    let (ca, keystore) = (ca.display(), keystore.display());
    // TLS: server authentication only; MTLS: a client certificate the CA
    // signed is required.
    let properties = format!(
        "listener.name.tls.ssl.keystore.type=PEM\n\
         listener.name.tls.ssl.keystore.location={keystore}\n\
         listener.name.mtls.ssl.keystore.type=PEM\n\
         listener.name.mtls.ssl.keystore.location={keystore}\n\
         listener.name.mtls.ssl.truststore.type=PEM\n\
         listener.name.mtls.ssl.truststore.location={ca}\n\
         listener.name.mtls.ssl.client.auth=required"
    );
    let Some(kafka) = peer_env::PrivatePeer::start_with(
        "kafka",
        &[
            ("PROFLOW_KAFKA_LISTENERS", "TLS:SSL MTLS:SSL"),
            ("PROFLOW_KAFKA_PROPERTIES", &properties),
        ],
    ) else {
        return;
    };
    let tls = kafka.peer().var("TLS_ENDPOINT").to_owned();
    let mtls = kafka.peer().var("MTLS_ENDPOINT").to_owned();

    let topic = peer_env::unique("proflow-tls-");
    let first = producer(&tls, &topic, &format!("tls: {{ca_file: {ca}}}"));
    let second = consumer(
        &mtls,
        &topic,
        &format!(
            "tls: {{ca_file: {ca}, cert_file: {}, key_file: {}}}",
            client_cert.display(),
            client_key.display()
        ),
    );
    all_arrive_byte_for_byte(&first, &second, "kafka-tls");

    // The system's CAs do not include the test CA: the broker is not trusted.
    let untrusted_topic = peer_env::unique("proflow-tls-untrusted-");
    let untrusted = producer(&tls, &untrusted_topic, "tls: {}");
    // No client certificate where the broker requires one.
    let anonymous_topic = peer_env::unique("proflow-tls-anonymous-");
    let anonymous = producer(&mtls, &anonymous_topic, &format!("tls: {{ca_file: {ca}}}"));
    let why_untrusted = refused(
        &untrusted,
        kafka.endpoint(),
        &untrusted_topic,
        "certificate verify failed",
    );
    let why_anonymous = refused(
        &anonymous,
        kafka.endpoint(),
        &anonymous_topic,
        "bad certificate",
    );
    eprintln!(
        "TLS: {N} profiles byte for byte (one-way TLS out, mutual TLS in); untrusted broker refused: {why_untrusted}; no client certificate refused: {why_anonymous}"
    );
}
