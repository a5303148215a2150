//! The `kafka` exporter and receiver against the real Apache Kafka broker
//! (`tests/peers/up kafka`): a first proflow takes pushes and produces one
//! record per profile; a second reads the topic as a consumer group member
//! and writes files. Every profile must arrive:
//!
//! - `encoding: pprof`: the bytes the second proflow writes are the bytes
//!   the first received, labels carried in record headers; the
//!   records' keys are the series hash, read back raw with kcat.
//! - `encoding: otlp_proto`: converted once on the way in, back to pprof on
//!   the way out, the same totals per function.
//! - The tenant a push names travels in the `proflow.tenant` header and
//!   reaches the second proflow's exporters.
//! - The receiving proflow killed with SIGKILL mid-stream and started again
//!   in the same group: every profile arrives (compared by content), and no
//!   more arrive twice than the killed one wrote at or past the offset its
//!   group had committed (read from the broker right before the kill).
//! - `compression`: each codec, on a private broker whose segment files show
//!   the codec of every batch; bytes identical after the receiver.
//! - `max_message_bytes`: a larger profile is refused (failed, `too_large`,
//!   not retried), the others go.
//!
//! The producer settings are in `kafka_cases/producer_settings.rs`, the
//! round trip through the Collector's own kafka receiver and exporter in
//! `kafka_cases/collector.rs`.

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;

#[path = "kafka_cases/collector.rs"]
mod collector;
#[path = "kafka_cases/producer_settings.rs"]
mod producer_settings;

use std::collections::{BTreeMap, BTreeSet};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{IndexEntry, Proflow, gzip, read_index};

/// How long the second proflow may take to write everything.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// A distinct CPU profile: its one sample's value is `i` ms, its hot
/// function names the test.
fn profile(i: usize) -> Vec<u8> {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "kafka_hot"], vec![(i as i64 + 1) * 1_000_000])
        .sample_root_first(["main", "kafka_warm"], vec![7_000_000]);
    gzip(&proflow_model::pprof::encode(&b.build()))
}

/// The first proflow: `pprof_push` → `file` and `kafka` (`exporter_body`).
fn producer(broker: &str, topic: &str, encoding: &str) -> Proflow {
    common::start_with_file_and(
        "kafka",
        &format!(
            "brokers: [\"{broker}\"]\ntopic: {topic}\nencoding: {encoding}\ntimeout: 10s\nsending_queue: {{when_full: block}}"
        ),
    )
}

/// The second proflow: `kafka` (group `group`) → `file`.
fn consumer(broker: &str, topic: &str, group: &str) -> Proflow {
    consumer_logging(broker, topic, group, "", "info")
}

/// [`consumer`] with more librdkafka consumer properties (`extra`, YAML
/// flow-map entries after a comma) and `log_level`.
fn consumer_logging(
    broker: &str,
    topic: &str,
    group: &str,
    extra: &str,
    log_level: &str,
) -> Proflow {
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  kafka:\n    brokers: [\"{broker}\"]\n    topics: [{topic}]\n    group_id: {group}\n    initial_offset: earliest\n    commit_interval: 500ms\n    consumer: {{session.timeout.ms: \"6000\", heartbeat.interval.ms: \"1000\"{extra}}}\n\
             exporters:\n  file:\n    directory: {}\n    sending_queue: {{when_full: block}}\n\
             service:\n  telemetry:\n    address: {}\n    log_level: \"{log_level}\"\n  \
             pipelines:\n    profiles:\n      receivers: [kafka]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    })
}

/// The tenant every push names.
const TENANT: &str = "team-k";

/// Pushes profile `i` as service `service` with tenant [`TENANT`].
fn push(p: &Proflow, service: &str, i: usize) {
    p.post(
        &common::ingest_query(&format!("{service}{{seq={i}}}"), Some("pprof")),
        &[
            ("content-type", "application/octet-stream"),
            ("x-scope-orgid", TENANT),
        ],
        profile(i),
    )
    .expect_status(200, "push");
}

/// The bytes of every file an index lists, by `seq` label.
fn files_by_seq(entries: &[IndexEntry]) -> BTreeMap<String, Vec<Vec<u8>>> {
    let mut out: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for e in entries {
        let seq = e.label("seq").unwrap_or("?").to_owned();
        let bytes =
            std::fs::read(&e.path).unwrap_or_else(|err| panic!("read {}: {err}", e.path.display()));
        out.entry(seq).or_default().push(bytes);
    }
    out
}

/// Waits until `p`'s log contains `text`.
fn wait_log(p: &Proflow, text: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !p.log_text().contains(text) {
        assert!(
            Instant::now() < deadline,
            "after {timeout:?} the log has no {text:?}\nlog:\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Waits until `p` wrote files for at least `n` distinct `seq` labels.
fn wait_distinct(p: &Proflow, n: usize, timeout: Duration) -> Vec<IndexEntry> {
    let deadline = Instant::now() + timeout;
    loop {
        let entries: Vec<IndexEntry> = read_index(&p.profiles)
            .into_iter()
            .filter(|e| e.path.is_file())
            .collect();
        let distinct: BTreeSet<&str> = entries.iter().filter_map(|e| e.label("seq")).collect();
        if distinct.len() >= n {
            return entries;
        }
        if Instant::now() >= deadline {
            panic!(
                "after {timeout:?} {} of {n} profiles arrived\nlog:\n{}",
                distinct.len(),
                p.log_text()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The headers of the first `count` records of `topic`, as kcat prints
/// them: one line per record, `name=value` pairs separated by commas.
fn record_headers(broker: &str, topic: &str, count: usize) -> Vec<String> {
    let out = std::process::Command::new("timeout")
        .args(["30", "kcat", "-q", "-b", broker, "-C", "-t", topic])
        .args(["-o", "beginning", "-c", &count.to_string(), "-f", "%h\\n"])
        .output()
        .unwrap_or_else(|e| panic!("could not run kcat (Debian package kcat): {e}"));
    assert!(
        out.status.success(),
        "kcat reading the headers of {topic}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines.len(), count, "header lines of {topic}: {lines:?}");
    lines
}

/// The offset group `group` has committed for partition 0 of `topic`
/// (-1: none), as the broker at `broker` (a single node, so the group's
/// coordinator) answers an OffsetFetch request, version 1: what a member
/// asks when it is given a partition. Asking does not join the group.
fn committed_offset(broker: &str, group: &str, topic: &str) -> Result<i64, String> {
    use std::io::{Read, Write};
    fn string(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&i16::try_from(s.len()).expect("short string").to_be_bytes());
        out.extend_from_slice(s.as_bytes());
    }
    const OFFSET_FETCH: i16 = 9;
    const CORRELATION: i32 = 0x7072_6f66;
    let mut request = Vec::new();
    request.extend_from_slice(&OFFSET_FETCH.to_be_bytes());
    request.extend_from_slice(&1i16.to_be_bytes());
    request.extend_from_slice(&CORRELATION.to_be_bytes());
    string(&mut request, "proflow-test");
    string(&mut request, group);
    request.extend_from_slice(&1i32.to_be_bytes()); // one topic
    string(&mut request, topic);
    request.extend_from_slice(&1i32.to_be_bytes()); // one partition
    request.extend_from_slice(&0i32.to_be_bytes()); // partition 0
    let mut conn = std::net::TcpStream::connect(broker).map_err(|e| format!("connect: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    let mut framed = (request.len() as i32).to_be_bytes().to_vec();
    framed.extend_from_slice(&request);
    conn.write_all(&framed).map_err(|e| format!("send: {e}"))?;
    let mut len = [0u8; 4];
    conn.read_exact(&mut len)
        .map_err(|e| format!("read: {e}"))?;
    let len = usize::try_from(i32::from_be_bytes(len)).map_err(|_| "negative length")?;
    let mut body = vec![0u8; len.min(1 << 20)];
    conn.read_exact(&mut body)
        .map_err(|e| format!("read: {e}"))?;
    // correlation id, topics [name, partitions [index, offset, metadata, error]]
    let mut at = 0usize;
    let mut take = |n: usize| -> Result<&[u8], String> {
        let field = body
            .get(at..at + n)
            .ok_or_else(|| format!("the answer ends at byte {at}: {body:?}"))?;
        at += n;
        Ok(field)
    };
    let int = |b: &[u8]| b.iter().fold(0i64, |acc, &x| (acc << 8) | i64::from(x));
    let correlation = int(take(4)?);
    if correlation != i64::from(CORRELATION) {
        return Err(format!("correlation id {correlation}"));
    }
    if int(take(4)?) != 1 {
        return Err("not one topic in the answer".into());
    }
    let name_len = int(take(2)?) as usize;
    take(name_len)?;
    if int(take(4)?) != 1 {
        return Err("not one partition in the answer".into());
    }
    take(4)?; // partition index
    let offset = take(8)?;
    let offset = i64::from_be_bytes(offset.try_into().expect("8 bytes"));
    let metadata_len = i16::from_be_bytes(take(2)?.try_into().expect("2 bytes"));
    take(usize::try_from(metadata_len).unwrap_or(0))?;
    let error = i16::from_be_bytes(take(2)?.try_into().expect("2 bytes"));
    if error != 0 {
        return Err(format!("Kafka error code {error}"));
    }
    Ok(offset)
}

#[test]
fn pprof_records_arrive_byte_for_byte_with_labels_and_keys() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-pprof-");
    let first = producer(broker, &topic, "pprof");
    const N: usize = 60;
    for i in 0..N {
        push(&first, "kafka-e2e", i);
    }
    let second = consumer(broker, &topic, &peer_env::unique("g-"));
    let sent = files_by_seq(&first.wait_for_files(N, |_| true));
    let got_entries = wait_distinct(&second, N, ARRIVAL_TIMEOUT);
    let got = files_by_seq(&got_entries);
    assert_eq!(got.len(), N);
    for (seq, bytes) in &sent {
        let arrived = &got[seq];
        assert!(
            arrived.iter().all(|b| b == &bytes[0]),
            "profile seq={seq}: the bytes written after Kafka differ from the bytes received"
        );
    }
    let e = &got_entries[0];
    assert_eq!(e.label("service_name"), Some("kafka-e2e"));
    assert_eq!(e.label("__name__"), Some("process_cpu"));
    // The records as kcat reads them: the key is the series' stable hash.
    let records = peer_env::kafka_consume(broker, &topic, N, Duration::from_secs(30));
    let keys: BTreeSet<Vec<u8>> = records.iter().filter_map(|r| r.key.clone()).collect();
    assert_eq!(keys.len(), N, "one key per series (every seq is a series)");
    assert!(
        keys.iter()
            .all(|k| k.len() == 16 && k.iter().all(u8::is_ascii_hexdigit))
    );
    // The tenant each push named (`X-Scope-OrgID`) travels in a record
    // header ...
    let headers = record_headers(broker, &topic, N);
    let tenant_header = format!("proflow.tenant={TENANT}");
    let without: Vec<&String> = headers
        .iter()
        .filter(|h| !h.split(',').any(|kv| kv == tenant_header))
        .collect();
    assert!(
        without.is_empty(),
        "{} of {N} records without the header {tenant_header}, the first: {:?}",
        without.len(),
        &without[..without.len().min(3)]
    );
    // ... and the second proflow carries it to its exporters.
    let tenant_of = |e: &IndexEntry| {
        e.raw
            .get("tenant")
            .and_then(|t| t.as_str())
            .map(str::to_owned)
    };
    let untenanted: Vec<(Option<&str>, Option<String>)> = got_entries
        .iter()
        .map(|e| (e.label("seq"), tenant_of(e)))
        .filter(|(_, t)| t.as_deref() != Some(TENANT))
        .collect();
    assert!(
        untenanted.is_empty(),
        "{} of {N} profiles written after Kafka without tenant {TENANT}, the first (seq, tenant): {:?}",
        untenanted.len(),
        &untenanted[..untenanted.len().min(3)]
    );

    let metrics = first.metrics();
    let sent_n = common::metric_sum(
        &metrics,
        "proflow_exporter_sent_profiles_total",
        &[("exporter", "kafka")],
    );
    assert_eq!(sent_n as usize, N, "delivered by delivery report");
}

#[test]
fn otlp_records_arrive_with_the_same_totals() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-otlp-");
    let first = producer(broker, &topic, "otlp_proto");
    let second = consumer(broker, &topic, &peer_env::unique("g-"));
    const N: usize = 20;
    for i in 0..N {
        push(&first, "kafka-otlp", i);
    }
    let got = wait_distinct(&second, N, ARRIVAL_TIMEOUT);
    let mut hot = BTreeMap::new();
    for e in &got {
        let p = common::read_profile(&e.path);
        let total: i64 = proflow_model::pprof::stacks_root_first(&p)
            .filter(|(frames, _)| frames.contains(&"kafka_hot"))
            .map(|(_, s)| s.value.iter().copied().max().unwrap_or(0))
            .sum();
        hot.insert(e.label("seq").unwrap_or("?").to_owned(), total);
        assert_eq!(e.label("service_name"), Some("kafka-otlp"));
    }
    for i in 0..N {
        assert_eq!(
            hot.get(&i.to_string()).copied(),
            Some((i as i64 + 1) * 1_000_000),
            "profile seq={i}: kafka_hot's CPU time after pprof → OTLP → Kafka → pprof"
        );
    }
}

#[test]
fn a_consumer_killed_mid_stream_loses_nothing() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-kill-");
    let group = peer_env::unique("g-");
    let first = producer(broker, &topic, "pprof");
    const N: usize = 400;
    // The first record creates the topic; a consumer subscribed before that
    // would see it only at its next metadata refresh, then read half the
    // stream in one burst and be killed before its first commit. So the
    // consumer starts once the topic exists, and the rest is pushed once it
    // owns the partition: it reads along with the pushes and commits every
    // 500 ms on the way.
    push(&first, "kafka-kill", 0);
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    while common::metric_sum(
        &first.metrics(),
        "proflow_exporter_sent_profiles_total",
        &[("exporter", "kafka")],
    ) < 1.0
    {
        assert!(
            Instant::now() < deadline,
            "the first record was never produced\n{}",
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut second = consumer(broker, &topic, &group);
    wait_log(&second, "partitions assigned", ARRIVAL_TIMEOUT);
    let committed_before_kill = {
        let url_first = &first;
        std::thread::scope(|s| {
            let h = s.spawn(move || {
                for i in 1..N {
                    push(url_first, "kafka-kill", i);
                    std::thread::sleep(Duration::from_millis(10));
                }
            });
            // Kill the consumer once it has written part of the stream and
            // the broker holds a commit of its group past the first record:
            // the position a restarted member resumes from, read from the
            // broker right before the kill.
            wait_distinct(&second, N / 2, ARRIVAL_TIMEOUT);
            let committed = peer_env::poll(ARRIVAL_TIMEOUT, || {
                committed_offset(broker, &group, &topic)
                    .ok()
                    .filter(|&c| c > 0)
            });
            let Some(committed) = committed else {
                panic!(
                    "in {ARRIVAL_TIMEOUT:?} the broker held no commit of group {group} past the first record, while the consumer wrote {} profiles (committed: {:?})\nlog:\n{}",
                    read_index(&second.profiles).len(),
                    committed_offset(broker, &group, &topic),
                    second.log_text()
                );
            };
            second.sigkill();
            h.join().expect("pushing thread");
            committed
        })
    };
    // What the killed consumer wrote (read before its directory goes).
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let written_before_kill = read_index(&second.profiles).len();
    for e in read_index(&second.profiles) {
        if let Some(seq) = e.label("seq") {
            *seen.entry(seq.to_owned()).or_default() += 1;
        }
    }
    assert!(
        seen.len() >= N / 2,
        "the killed consumer wrote {} distinct profiles",
        seen.len()
    );
    drop(second);
    let third = consumer(broker, &topic, &group);
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    let (lost, duplicates) = loop {
        let mut all = seen.clone();
        let mut duplicates = 0;
        for e in read_index(&third.profiles)
            .iter()
            .filter(|e| e.path.is_file())
        {
            if let Some(seq) = e.label("seq") {
                let n = all.entry(seq.to_owned()).or_default();
                *n += 1;
                if *n > 1 {
                    duplicates += 1;
                }
            }
        }
        let lost: Vec<usize> = (0..N)
            .filter(|i| !all.contains_key(&i.to_string()))
            .collect();
        if lost.is_empty() || Instant::now() >= deadline {
            break (lost, duplicates);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        lost.is_empty(),
        "profiles lost across the SIGKILL: {lost:?}\nlog of the restarted consumer:\n{}",
        third.log_text()
    );
    // The topic's one partition holds one record per profile from offset 0,
    // and the group's commits only move forward. Every record below the
    // offset committed before the kill was written by the killed consumer
    // (a record is committed only once delivered), and the restarted one
    // resumes at that offset or later: it can deliver again only what the
    // killed one wrote at or past it.
    let committed = usize::try_from(committed_before_kill).expect("a committed offset is positive");
    assert!(
        committed <= seen.len(),
        "the group committed offset {committed}, past the {} profiles its consumer had written",
        seen.len()
    );
    let may_repeat = seen.len().saturating_sub(committed);
    assert!(
        duplicates <= may_repeat,
        "{duplicates} profiles delivered twice, more than the {may_repeat} the killed consumer wrote at or past its group's committed offset {committed} ({} distinct written before the kill)\nlog of the restarted consumer:\n{}",
        seen.len(),
        third.log_text()
    );
    eprintln!(
        "{N} profiles across a SIGKILL of the consumer: none lost, {duplicates} delivered twice (offset {committed} committed before the kill, {written_before_kill} written)"
    );
}

/// SIGTERM: the receiver waits for what is in the pipeline and commits it,
/// so the next member of the group starts exactly after it.
#[test]
fn a_consumer_stopped_gracefully_commits_what_it_delivered() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-stop-");
    let group = peer_env::unique("g-");
    let first = producer(broker, &topic, "pprof");
    const N: usize = 30;
    for i in 0..N {
        push(&first, "kafka-stop", i);
    }
    let mut second = consumer(broker, &topic, &group);
    wait_distinct(&second, N, ARRIVAL_TIMEOUT);
    assert_eq!(second.terminate(Duration::from_secs(20)), Some(0));
    assert_eq!(
        read_index(&second.profiles).len(),
        N,
        "no duplicates in one run"
    );
    for i in N..2 * N {
        push(&first, "kafka-stop", i);
    }
    let third = consumer(broker, &topic, &group);
    // The topic's one partition is read in order: once the last record is
    // written, and everything the receiver accepted is, a re-read of the
    // first half would be among what was written.
    let last = (2 * N - 1).to_string();
    let has_last = peer_env::poll(ARRIVAL_TIMEOUT, || {
        read_index(&third.profiles)
            .iter()
            .any(|e| e.label("seq") == Some(last.as_str()))
            .then_some(())
    });
    assert!(
        has_last.is_some(),
        "the next member did not write the last record in {ARRIVAL_TIMEOUT:?}\nlog:\n{}",
        third.log_text()
    );
    common::wait_all_written(&third, ARRIVAL_TIMEOUT);
    let after: Vec<IndexEntry> = read_index(&third.profiles);
    let early: Vec<&str> = after
        .iter()
        .filter_map(|e| e.label("seq"))
        .filter(|s| s.parse::<usize>().is_ok_and(|i| i < N))
        .collect();
    assert!(
        early.is_empty(),
        "the next member read again what the stopped one had committed: {early:?}"
    );
    assert_eq!(after.len(), N);
}

/// The broker stopped for 30 s mid-stream and started again (a private
/// broker of this test's own, so the shared one stays up for the others):
/// the producing proflow's exporter retries, its queue holds what came in
/// meanwhile, and every profile arrives at the consuming proflow.
#[test]
fn a_broker_stopped_for_30s_mid_stream_loses_nothing() {
    let Some(mut kafka) = peer_env::PrivatePeer::start("kafka") else {
        return;
    };
    let broker = kafka.endpoint().to_owned();
    let topic = peer_env::unique("proflow-outage-");
    let first = common::start_with_file_and(
        "kafka",
        &format!(
            "brokers: [\"{broker}\"]\ntopic: {topic}\nencoding: pprof\ntimeout: 5s\nsending_queue: {{when_full: block, queue_size: 5000}}\nretry_on_failure: {{initial_interval: 1s, max_interval: 3s, max_elapsed_time: 0s}}"
        ),
    );
    // The consumer logs librdkafka's group protocol (join, sync, session
    // timeouts, assignments): if it does not get its partition back, its
    // log says where it stopped.
    let group = peer_env::unique("g-");
    let second = consumer_logging(
        &broker,
        &topic,
        &group,
        ", debug: cgrp",
        "info,librdkafka=debug",
    );
    const N: usize = 200;
    let started = Instant::now();
    std::thread::scope(|s| {
        let pushing = s.spawn(|| {
            // About 45 s of pushes, 30 s of them while the broker is down.
            for i in 0..N {
                push(&first, "kafka-outage", i);
                std::thread::sleep(Duration::from_millis(225));
            }
        });
        wait_distinct(&second, 10, ARRIVAL_TIMEOUT);
        kafka.stop();
        let down_at = Instant::now();
        std::thread::sleep(Duration::from_secs(30));
        let metrics = first.metrics();
        let queued = common::metric_sum(
            &metrics,
            "proflow_exporter_queue_profiles",
            &[("exporter", "kafka")],
        );
        let retries = common::metric_sum(
            &metrics,
            "proflow_exporter_retries_total",
            &[("exporter", "kafka")],
        );
        assert!(
            queued > 0.0 && retries > 0.0,
            "while the broker was down for {:?}: queue {queued}, retries {retries}",
            down_at.elapsed()
        );
        kafka.start_again();
        pushing.join().expect("pushing thread");
    });
    // The producing side first: everything it took is sent to the broker
    // started again (else the failure is there, not in the consumer).
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let metrics = first.metrics();
        let sent = common::metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "kafka")],
        );
        if sent >= N as f64 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the producing proflow sent {sent} of {N} profiles in 120 s after the broker came back\nmetrics:\n{metrics}\nlog:\n{}",
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let arrived = peer_env::poll(Duration::from_secs(120), || {
        let entries: Vec<IndexEntry> = read_index(&second.profiles)
            .into_iter()
            .filter(|e| e.path.is_file())
            .collect();
        let distinct: BTreeSet<&str> = entries.iter().filter_map(|e| e.label("seq")).collect();
        (distinct.len() >= N).then_some(entries)
    });
    let Some(got) = arrived else {
        let distinct: BTreeSet<String> = read_index(&second.profiles)
            .iter()
            .filter_map(|e| e.label("seq").map(str::to_owned))
            .collect();
        // The consumer's group protocol last: a CI log shows the end of
        // what a failure printed, and that is where the answer is.
        let consumer_log = second.log_text();
        let lines: Vec<&str> = consumer_log.lines().collect();
        panic!(
            "120 s after the producer sent everything, {} of {N} profiles arrived; the group's committed offset as the broker answers: {:?}\nbroker log (last 60 lines):\n{}\nconsumer log (last 200 of {} lines):\n{}",
            distinct.len(),
            committed_offset(&broker, &group, &topic),
            kafka.log_tail(60),
            lines.len(),
            lines[lines.len().saturating_sub(200)..].join("\n"),
        );
    };
    let distinct: BTreeSet<&str> = got.iter().filter_map(|e| e.label("seq")).collect();
    assert_eq!(distinct.len(), N, "every profile arrived");
    let metrics = first.metrics();
    for (metric, want) in [
        ("proflow_exporter_failed_profiles_total", 0.0),
        ("proflow_exporter_dropped_profiles_total", 0.0),
        ("proflow_exporter_queue_profiles", 0.0),
    ] {
        assert_eq!(
            common::metric_sum(&metrics, metric, &[("exporter", "kafka")]),
            want,
            "{metric} after the outage"
        );
    }
    // librdkafka reports every failed connection of each of its threads
    // while the broker is down (251 lines in one 30 s outage): the consumer
    // says so at most once every 10 s, with how many errors a line stands for.
    let log = second.log_text();
    let client_errors = log.matches("Kafka client error").count();
    assert!(
        (1..=8).contains(&client_errors),
        "{client_errors} client error lines over the outage, want 1 to 8 (one per 10 s):\n{log}"
    );
    eprintln!(
        "{N} profiles across a 30 s broker outage: all arrived ({} records written, {:?}); {client_errors} client error lines",
        got.len(),
        started.elapsed()
    );
}

/// The consumer's only exporter stalls with the default `drop_newest`
/// queue (a file stands where it must create the service's directory, a
/// retryable failure) while more records arrive than its queue holds: by
/// default the full queue holds the consumer back instead of dropping the
/// copies (and committing past them), so once the exporter recovers every
/// record is written and nothing was dropped.
#[test]
fn a_stalled_exporter_holds_the_consumer_back_instead_of_dropping() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-stall-");
    let first = producer(broker, &topic, "pprof");
    const N: usize = 40;
    const SERVICE: &str = "kafka-stall";
    for i in 0..N {
        push(&first, SERVICE, i);
    }
    let second = Proflow::start(|ports, profiles| {
        std::fs::create_dir_all(profiles).unwrap();
        std::fs::write(profiles.join(SERVICE), b"in the way").unwrap();
        format!(
            "receivers:\n  kafka:\n    brokers: [\"{broker}\"]\n    topics: [{topic}]\n    group_id: {}\n    initial_offset: earliest\n    commit_interval: 500ms\n\
             exporters:\n  file:\n    directory: {}\n    sending_queue: {{queue_size: 5, num_consumers: 1, wait_when_full: 200ms}}\n    retry_on_failure: {{initial_interval: 100ms, max_interval: 100ms, max_elapsed_time: 0s}}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [kafka], exporters: [file]}}\n",
            peer_env::unique("g-"),
            profiles.display(),
            ports.telemetry
        )
    });
    // The queue fills and the consumer is held back, far past wait_when_full.
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    loop {
        let metrics = second.metrics();
        let queued = common::metric_sum(&metrics, "proflow_exporter_queue_profiles", &[]);
        if queued >= 5.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the stalled exporter's queue never filled\n{metrics}\nlog:\n{}",
            second.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // Held back far past wait_when_full (200ms), as the exporter counts it:
    // twenty more of its retries, one every 100ms.
    let retries =
        |m: &str| common::metric_sum(m, "proflow_exporter_retries_total", &[("exporter", "file")]);
    let from = retries(&second.metrics());
    let held = peer_env::poll(ARRIVAL_TIMEOUT, || {
        (retries(&second.metrics()) >= from + 20.0).then_some(())
    });
    assert!(
        held.is_some(),
        "the stalled exporter stopped retrying\n{}",
        second.metrics()
    );
    let metrics = second.metrics();
    assert_eq!(
        common::metric_sum(&metrics, "proflow_exporter_dropped_profiles_total", &[]),
        0.0,
        "nothing dropped while the exporter is stalled\n{metrics}"
    );
    std::fs::remove_file(second.profiles.join(SERVICE)).unwrap();
    let got = wait_distinct(&second, N, ARRIVAL_TIMEOUT);
    let distinct: BTreeSet<&str> = got.iter().filter_map(|e| e.label("seq")).collect();
    assert_eq!(
        distinct.len(),
        N,
        "every record written once the exporter recovered"
    );
    let metrics = second.metrics();
    assert_eq!(
        common::metric_sum(&metrics, "proflow_exporter_dropped_profiles_total", &[]),
        0.0,
        "{metrics}"
    );
}

/// A record that holds no profile (an OTLP request of a resource and no
/// profile, as a producer with nothing to send may write) is committed,
/// and counted and logged, not passed over in silence.
#[test]
fn a_record_of_no_profile_is_counted() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint().to_owned();
    let topic = peer_env::unique("proflow-empty-record-");
    let c = consumer(&broker, &topic, &peer_env::unique("proflow-g-"));
    let dir = tempfile::tempdir().expect("tempdir");
    let value = dir.path().join("no-profile.otlp");
    // ExportProfilesServiceRequest { resource_profiles: [{ resource: {} }] }
    std::fs::write(&value, [0x0a, 0x02, 0x0a, 0x00]).expect("write the value");
    let out = Command::new("timeout")
        .args(["30", "kcat", "-q", "-b", &broker, "-P", "-t", &topic])
        .args(["-H", "proflow.encoding=otlp_proto"])
        .arg(&value)
        .output()
        .unwrap_or_else(|e| panic!("could not run kcat (Debian package kcat): {e}"));
    assert!(
        out.status.success(),
        "kcat producing to {topic}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let counted = peer_env::poll(Duration::from_secs(60), || {
        let n = common::metric_sum(
            &c.metrics(),
            "proflow_receiver_empty_requests_total",
            &[("receiver", "kafka"), ("format", "kafka_record")],
        );
        (n >= 1.0).then_some(n)
    });
    assert_eq!(
        counted,
        Some(1.0),
        "the record of no profile is counted once\nlog:\n{}",
        c.log_text()
    );
    assert!(
        c.log_text().contains("held no sample to store"),
        "and logged:\n{}",
        c.log_text()
    );
}
