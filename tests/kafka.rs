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

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
mod peer_env;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{IndexEntry, Proflow, gzip, read_index};

/// How long the second proflow may take to write everything.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(60);

/// A distinct CPU profile: its one sample's value is `i` ms, its hot
/// function names the test.
fn profile(i: usize) -> Vec<u8> {
    let mut b = proflow_pipeline::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "kafka_hot"], vec![(i as i64 + 1) * 1_000_000])
        .sample_root_first(["main", "kafka_warm"], vec![7_000_000]);
    gzip(&proflow_pipeline::pprof::encode(&b.build()))
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
        let total: i64 = proflow_pipeline::pprof::stacks_root_first(&p)
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
        panic!(
            "120 s after the producer sent everything, {} of {N} profiles arrived; the group's committed offset as the broker answers: {:?}\nconsumer log:\n{}\nbroker log (last 150 lines):\n{}",
            distinct.len(),
            committed_offset(&broker, &group, &topic),
            second.log_text(),
            kafka.log_tail(150)
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
    eprintln!(
        "{N} profiles across a 30 s broker outage: all arrived ({} records written, {:?})",
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

/// The codec of every record batch in a Kafka log segment file (the
/// record batch format, magic 2: the low three bits of the attributes,
/// 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd), in file order.
fn segment_codecs(segment: &std::path::Path) -> Vec<u8> {
    let bytes = std::fs::read(segment)
        .unwrap_or_else(|e| panic!("read the broker's segment {}: {e}", segment.display()));
    let mut codecs = Vec::new();
    let mut at = 0usize;
    // baseOffset (8), batchLength (4), then partitionLeaderEpoch (4),
    // magic (1), crc (4), attributes (2), ...
    while at + 23 <= bytes.len() {
        let length = i32::from_be_bytes(bytes[at + 8..at + 12].try_into().expect("4 bytes"));
        let Ok(length) = usize::try_from(length) else {
            break;
        };
        if length == 0 {
            break;
        }
        assert_eq!(bytes[at + 16], 2, "record batch magic at byte {at}");
        codecs.push(bytes[at + 22] & 0x07);
        at += 12 + length;
    }
    codecs
}

/// Every `compression` the exporter offers, each into a topic of its own on
/// a private broker (so the test knows where the broker stores it): the
/// broker's segment holds batches of that codec only (the broker keeps the
/// producer's batches), and the receiving proflow, reading all five topics,
/// writes every profile five times with the bytes the first proflow
/// received.
#[test]
fn every_compression_codec_reaches_the_broker_and_reads_back_byte_for_byte() {
    let Some(kafka) = peer_env::PrivatePeer::start("kafka") else {
        return;
    };
    let broker = kafka.endpoint().to_owned();
    const CODECS: [(&str, u8); 5] = [
        ("none", 0),
        ("gzip", 1),
        ("snappy", 2),
        ("lz4", 3),
        ("zstd", 4),
    ];
    let prefix = peer_env::unique("proflow-codec-");
    let topic = |codec: &str| format!("{prefix}-{codec}");
    let first = Proflow::start(|ports, profiles| {
        let mut exporters = String::new();
        for (codec, _) in CODECS {
            exporters += &format!(
                "  kafka/{codec}:\n    brokers: [\"{broker}\"]\n    topic: {}\n    encoding: pprof\n    compression: {codec}\n    timeout: 10s\n    sending_queue: {{when_full: block}}\n",
                topic(codec)
            );
        }
        let names: Vec<String> = CODECS.iter().map(|(c, _)| format!("kafka/{c}")).collect();
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             exporters:\n  file:\n    directory: {}\n{exporters}\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file, {}]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry,
            names.join(", ")
        )
    });
    const N: usize = 10;
    for i in 0..N {
        push(&first, "kafka-codec", i);
    }
    let sent = files_by_seq(&first.wait_for_files(N, |_| true));
    let topics: Vec<String> = CODECS.iter().map(|(c, _)| topic(c)).collect();
    let second = Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  kafka:\n    brokers: [\"{broker}\"]\n    topics: [{}]\n    group_id: {}\n    initial_offset: earliest\n\
             exporters:\n  file:\n    directory: {}\n    sending_queue: {{when_full: block}}\n\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [kafka]\n      exporters: [file]\n",
            topics.join(", "),
            peer_env::unique("g-"),
            profiles.display(),
            ports.telemetry
        )
    });
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    let got = loop {
        let entries: Vec<IndexEntry> = read_index(&second.profiles)
            .into_iter()
            .filter(|e| e.path.is_file())
            .collect();
        if entries.len() >= N * CODECS.len() {
            break files_by_seq(&entries);
        }
        assert!(
            Instant::now() < deadline,
            "after {ARRIVAL_TIMEOUT:?} {} of {} profiles arrived\nreceiving log:\n{}\nsending log:\n{}",
            entries.len(),
            N * CODECS.len(),
            second.log_text(),
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(got.len(), N, "{:?}", got.keys().collect::<Vec<_>>());
    for (seq, bytes) in &sent {
        let copies = &got[seq];
        assert_eq!(
            copies.len(),
            CODECS.len(),
            "profile seq={seq}: copies read back"
        );
        assert!(
            copies.iter().all(|c| c == &bytes[0]),
            "profile seq={seq}: a copy read back differs from the bytes pushed"
        );
    }
    let metrics = first.metrics();
    for (codec, _) in CODECS {
        let exporter = format!("kafka/{codec}");
        let sent_n = common::metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", exporter.as_str())],
        );
        assert_eq!(
            sent_n as usize, N,
            "{exporter} delivered by delivery report"
        );
    }
    // Where the broker keeps its topics, in its own words at startup.
    let log = kafka.log_tail(1_000_000);
    let log_dirs = log
        .lines()
        .find_map(|l| l.trim().strip_prefix("log.dirs = ["))
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or_else(|| panic!("the broker's log names no log.dirs:\n{log}"))
        .to_owned();
    let mut seen = Vec::new();
    for (codec, id) in CODECS {
        let segment = std::path::Path::new(&log_dirs)
            .join(format!("{}-0", topic(codec)))
            .join("00000000000000000000.log");
        let codecs: BTreeSet<u8> = segment_codecs(&segment).into_iter().collect();
        assert_eq!(
            codecs,
            BTreeSet::from([id]),
            "compression: {codec}: the codecs of the batches in {}",
            segment.display()
        );
        seen.push(format!("{codec}: {id}"));
    }
    eprintln!(
        "{N} profiles through each codec byte for byte; the broker's batches: {}",
        seen.join(", ")
    );
}

/// A profile whose gzip pprof is `size` bytes or a little more: samples
/// under function names the compressor cannot shorten much.
fn large_profile(size: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut n = 16;
    loop {
        let mut b = proflow_pipeline::pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(common::now_nanos() - 10_000_000_000, 10_000_000_000);
        for _ in 0..n {
            let name = format!("f{:016x}{:016x}", next(), next());
            b.sample_root_first(["main", name.as_str()], vec![10_000_000]);
        }
        let bytes = gzip(&proflow_pipeline::pprof::encode(&b.build()));
        if bytes.len() >= size {
            return bytes;
        }
        n *= 2;
    }
}

/// `max_message_bytes`: a profile whose record is larger is refused at
/// once (counted as failed with reason `too_large`, logged, never retried
/// nor sent); the profiles around it go. Its record fits under librdkafka's
/// own limit (max_message_bytes + 4096): only proflow's check keeps it out.
#[test]
fn a_record_over_max_message_bytes_is_refused_and_the_others_go() {
    let Some(kafka) = peer_env::peer("kafka") else {
        return;
    };
    let broker = kafka.endpoint();
    let topic = peer_env::unique("proflow-max-");
    const MAX: usize = 4096;
    let first = common::start_with_file_and(
        "kafka",
        &format!(
            "brokers: [\"{broker}\"]\ntopic: {topic}\nencoding: pprof\nmax_message_bytes: {MAX}\ntimeout: 10s\nsending_queue: {{when_full: block}}\nretry_on_failure: {{initial_interval: 100ms, max_interval: 100ms, max_elapsed_time: 0s}}"
        ),
    );
    let large = large_profile(MAX + 200);
    assert!(
        large.len() > MAX && large.len() + 1024 < MAX + 4096,
        "the large profile is {} bytes",
        large.len()
    );
    const SMALL: usize = 6;
    for i in 0..SMALL {
        push(&first, "kafka-max", i);
        if i == SMALL / 2 {
            first
                .post(
                    &common::ingest_query("kafka-max{seq=large}", Some("pprof")),
                    &[("content-type", "application/octet-stream")],
                    large.clone(),
                )
                .expect_status(200, "push the large profile");
        }
    }
    first.wait_for_files(SMALL + 1, |_| true);
    let deadline = Instant::now() + ARRIVAL_TIMEOUT;
    let metrics = loop {
        let metrics = first.metrics();
        let done = common::metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "kafka")],
        ) + common::metric_sum(
            &metrics,
            "proflow_exporter_failed_profiles_total",
            &[("exporter", "kafka")],
        );
        if done >= (SMALL + 1) as f64 {
            break metrics;
        }
        assert!(
            Instant::now() < deadline,
            "after {ARRIVAL_TIMEOUT:?} the exporter settled {done} of {} profiles\n{metrics}\nlog:\n{}",
            SMALL + 1,
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let count =
        |metric: &str, labels: &[(&str, &str)]| common::metric_sum(&metrics, metric, labels);
    assert_eq!(
        (
            count(
                "proflow_exporter_sent_profiles_total",
                &[("exporter", "kafka")]
            ),
            count(
                "proflow_exporter_failed_profiles_total",
                &[("exporter", "kafka"), ("reason", "too_large")]
            ),
            count("proflow_exporter_retries_total", &[("exporter", "kafka")]),
        ),
        (SMALL as f64, 1.0, 0.0),
        "(sent, failed too_large, retries)\n{metrics}"
    );
    let log = first.log_text();
    let why = log
        .lines()
        .find(|l| l.contains("more than max_message_bytes"))
        .unwrap_or_else(|| panic!("no refusal of the large profile in the log:\n{log}"));
    assert!(why.contains("seq=\"large\""), "{why}");
    // The topic holds the small ones only, in the order pushed.
    let headers = record_headers(broker, &topic, SMALL);
    let seqs: Vec<&str> = headers
        .iter()
        .map(|h| {
            h.split(',')
                .find_map(|kv| kv.strip_prefix("proflow.label.seq="))
                .unwrap_or("?")
        })
        .collect();
    let want: Vec<String> = (0..SMALL).map(|i| i.to_string()).collect();
    assert_eq!(seqs, want, "the records on {topic}");
    let all = std::process::Command::new("timeout")
        .args(["30", "kcat", "-q", "-b", broker, "-C", "-t", &topic])
        .args(["-o", "beginning", "-e", "-f", "%o\\n"])
        .output()
        .expect("run kcat");
    let records = String::from_utf8_lossy(&all.stdout).lines().count();
    assert_eq!(records, SMALL, "records on {topic} (kcat to the end)");
    eprintln!(
        "a {}-byte profile over max_message_bytes {MAX} refused ({why}); {SMALL} smaller ones sent",
        large.len()
    );
}

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
        for (frames, s) in proflow_pipeline::pprof::stacks_root_first(&p) {
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
