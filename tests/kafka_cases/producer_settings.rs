//! The `kafka` exporter's producer settings against private brokers:
//! `compression` (each codec seen in the broker's own segment files, bytes
//! identical after the receiver) and `max_message_bytes` (a larger profile
//! refused, the others sent).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use super::{ARRIVAL_TIMEOUT, files_by_seq, push, record_headers};
use crate::common::{self, IndexEntry, Proflow, gzip, read_index};
use crate::peer_env;

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
        let mut b = proflow_model::pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(common::now_nanos() - 10_000_000_000, 10_000_000_000);
        for _ in 0..n {
            let name = format!("f{:016x}{:016x}", next(), next());
            b.sample_root_first(["main", name.as_str()], vec![10_000_000]);
        }
        let bytes = gzip(&proflow_model::pprof::encode(&b.build()));
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
