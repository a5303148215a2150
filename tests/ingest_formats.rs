//! Every text and binary body of Pyroscope's `/ingest` (folded `groups`,
//! `lines`, the `tree` and `trie` of older agents, by `format` or by
//! `Content-Type`, and speedscope JSON, sampled, evented and several
//! profiles in one file), sent to the real Pyroscope directly under one service
//! name and through proflow's `pyroscope` exporter under another: both read
//! back with the same totals per function, in the profile type the app
//! name's suffix chose. Speedscope is the exception: Pyroscope truncates
//! each value before it scales it (and leaves some unscaled), so there
//! proflow's read back is checked against the file's own totals, and
//! Pyroscope's is only printed beside it.
//!
//! A body that converts to nothing, or loses samples on the way, is still
//! answered 200 (as Pyroscope answers it), and is counted and logged.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

#[path = "ingest_formats_cases/producers.rs"]
mod producers;

use std::time::Duration;

const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);
const FUNCTIONS: [&str; 4] = ["main", "foo", "bar", "idle"];

/// One node of a tree or trie body: name, value, child count.
fn node(out: &mut Vec<u8>, name: &str, value: u64, children: u64) {
    uvarint(out, name.len() as u64);
    out.extend_from_slice(name.as_bytes());
    uvarint(out, value);
    uvarint(out, children);
}

fn uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// main (1) → foo (300), bar (200); idle (40): as a tree.
fn tree() -> Vec<u8> {
    let mut b = Vec::new();
    node(&mut b, "", 0, 2);
    node(&mut b, "main", 1, 2);
    node(&mut b, "foo", 300, 0);
    node(&mut b, "bar", 200, 0);
    node(&mut b, "idle", 40, 0);
    b
}

/// The same stacks as a trie (pieces of `;`-joined keys).
fn trie() -> Vec<u8> {
    let mut b = Vec::new();
    node(&mut b, "", 0, 2);
    node(&mut b, "main", 1, 1);
    node(&mut b, ";", 0, 2);
    node(&mut b, "foo", 300, 0);
    node(&mut b, "bar", 200, 0);
    node(&mut b, "idle", 40, 0);
    b
}

const GROUPS: &str = "main 1\nmain;foo 300\nmain;bar 200\nidle 40\n";

fn lines() -> Vec<u8> {
    let mut out = String::new();
    for (stack, n) in [("main;foo", 30), ("main;bar", 20), ("idle", 4), ("main", 1)] {
        for _ in 0..n {
            out.push_str(stack);
            out.push('\n');
        }
    }
    out.into_bytes()
}

/// The same body sent to the real Pyroscope directly and through proflow
/// (a `pyroscope` exporter beside a `file` one), under two service names.
struct BothWays {
    proflow: common::Proflow,
    http: reqwest::blocking::Client,
    base: String,
    direct: String,
    through: String,
}

impl BothWays {
    /// Waits (up to [`READ_BACK_TIMEOUT`]) until Pyroscope reads `want` in
    /// `profile_type` of `functions` through proflow; returns whether it
    /// did, the last totals, what Pyroscope answered, and what it reads of
    /// the same body sent directly.
    fn read_back(
        &self,
        functions: &[&str],
        profile_type: &str,
        want: &common::Totals,
    ) -> (bool, common::Totals, String, common::Totals) {
        let selector = format!("{{service_name=\"{}\"}}", self.through);
        let (ok, got, answer) = readback::pyroscope_wait(
            &self.http,
            &self.base,
            (&selector, functions, profile_type),
            READ_BACK_TIMEOUT,
            |t| t == want,
        );
        let (direct, _) = readback::pyroscope_totals(
            &self.http,
            &self.base,
            &format!("{{service_name=\"{}\"}}", self.direct),
            functions,
            Some(profile_type),
        );
        (ok, got, answer, direct)
    }
}

/// Sends `body` (as `content_type`) as `name.suffix` with `query` to
/// Pyroscope and through proflow; `None` when the peer is missing and
/// skipping is allowed.
fn both_ways(
    what: &str,
    suffix: &str,
    query: &str,
    content_type: &str,
    body: Vec<u8>,
) -> Option<BothWays> {
    let pyroscope = peer_env::peer("pyroscope")?;
    let base = pyroscope.http_base();
    let proflow = common::start_with_file_and("pyroscope", &format!("endpoint: {base}\n"));
    let direct = common::unique_name(&format!("fmt-{what}-direct"));
    let through = common::unique_name(&format!("fmt-{what}-proflow"));
    let http = common::http_client();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs();
    let (from, until) = (now - 10, now);
    for (to, name) in [(&base, &direct), (&proflow.receiver_url(""), &through)] {
        readback::post_ok(
            &http,
            &format!("{to}/ingest?name={name}{suffix}&from={from}&until={until}{query}"),
            content_type,
            body.clone(),
        );
    }
    Some(BothWays {
        proflow,
        http,
        base,
        direct,
        through,
    })
}

/// Sends `body` as `name.suffix` to Pyroscope and through proflow, and
/// compares what both read back in `profile_type`.
fn same_in_pyroscope(
    what: &str,
    suffix: &str,
    query: &str,
    content_type: &str,
    body: Vec<u8>,
    profile_type: &str,
) {
    let Some(b) = both_ways(what, suffix, query, content_type, body) else {
        return;
    };
    b.same_reads(what, &FUNCTIONS, profile_type);
}

impl BothWays {
    /// Waits until Pyroscope reads every one of `functions` in
    /// `profile_type` with the same totals directly and through proflow.
    fn same_reads(&self, what: &str, functions: &[&str], profile_type: &str) {
        match readback::same_service_totals(
            &self.http,
            &self.base,
            &self.direct,
            &self.through,
            functions,
            profile_type,
            READ_BACK_TIMEOUT,
            |t| t.len() == functions.len(),
        ) {
            Ok(totals) => eprintln!("{what}: {totals:?}"),
            Err((a, other)) => panic!(
                "{what}: Pyroscope directly {a:?}, through proflow {other:?}\nlog:\n{}",
                self.proflow.log_text()
            ),
        }
    }
}

/// Sends a speedscope `body` as `name.suffix` to Pyroscope and through
/// proflow, and checks that proflow's read back, in `profile_type`, is
/// `want` (the file's own totals in nanoseconds); Pyroscope's own reading
/// is printed.
fn file_totals_in_pyroscope(
    what: &str,
    suffix: &str,
    body: Vec<u8>,
    profile_type: &str,
    want: &[(&str, i64)],
) {
    let Some(b) = both_ways(what, suffix, "&format=speedscope", "application/json", body) else {
        return;
    };
    let want: common::Totals = want.iter().map(|(f, v)| ((*f).to_owned(), *v)).collect();
    let (ok, got, answer, pyroscope_reads) = b.read_back(&FUNCTIONS, profile_type, &want);
    eprintln!(
        "{what}: the file's totals {want:?}; through proflow {got:?}; Pyroscope directly {pyroscope_reads:?}"
    );
    assert!(
        ok,
        "{what}: through proflow Pyroscope read {got:?} ({answer}), the file holds {want:?}\nlog:\n{}",
        b.proflow.log_text()
    );
    assert_eq!(
        common::metric_sum(
            &b.proflow.metrics(),
            "proflow_receiver_lost_samples_total",
            &[]
        ),
        0.0,
        "{what}: nothing of the file is lost"
    );
}

const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
const OCTET: &str = "binary/octet-stream";

#[test]
fn tree_by_format() {
    same_in_pyroscope("tree", ".cpu", "&format=tree", OCTET, tree(), CPU);
}

#[test]
fn tree_by_content_type() {
    same_in_pyroscope(
        "tree-ct",
        "",
        "&sampleRate=50",
        "binary/octet-stream+tree",
        tree(),
        CPU,
    );
}

#[test]
fn trie_by_format() {
    same_in_pyroscope(
        "trie",
        ".alloc_objects",
        "&format=trie",
        OCTET,
        trie(),
        "memory:alloc_objects:count::",
    );
}

#[test]
fn trie_by_content_type() {
    same_in_pyroscope(
        "trie-ct",
        ".cpu",
        "&spyName=gospy",
        "binary/octet-stream+trie",
        trie(),
        CPU,
    );
}

#[test]
fn groups_without_a_format() {
    same_in_pyroscope(
        "groups",
        ".wall",
        "",
        OCTET,
        GROUPS.as_bytes().to_vec(),
        "wall:wall:nanoseconds:cpu:nanoseconds",
    );
}

#[test]
fn lines_by_format() {
    same_in_pyroscope("lines", ".cpu", "&format=lines", OCTET, lines(), CPU);
}

/// Empty frames and stacks that end in `;`: Pyroscope keeps an empty
/// frame as a frame with an empty name and ends a stack at one `;` at its
/// end; proflow reads the same, empty frames included.
#[test]
fn folded_with_empty_frames() {
    let body = b"main;;foo 3\nmain;bar; 2\n;idle 4\nmain;foo;; 1\n; 5\n".to_vec();
    let Some(b) = both_ways("empty-frames", ".cpu", "&format=folded", OCTET, body) else {
        return;
    };
    b.same_reads("empty frames", &["main", "foo", "bar", "idle", ""], CPU);
}

const SPEEDSCOPE_FRAMES: &str = r#""shared": {"frames": [{"name": "main"}, {"name": "foo"}, {"name": "bar"}, {"name": "idle"}]}"#;

fn speedscope(profiles: &str) -> Vec<u8> {
    format!(
        r#"{{"$schema": "https://www.speedscope.app/file-format-schema.json", {SPEEDSCOPE_FRAMES}, "profiles": [{profiles}], "name": "t", "exporter": "test"}}"#
    )
    .into_bytes()
}

const SAMPLED: &str = r#"{"type": "sampled", "name": "first", "unit": "milliseconds", "startValue": 0, "endValue": 7,
    "samples": [[0, 1], [0, 2], [3], [0]], "weights": [3, 2, 1.5, 1]}"#;
const EVENTED: &str = r#"{"type": "evented", "name": "second", "unit": "milliseconds", "startValue": 0, "endValue": 8,
    "events": [{"type": "O", "at": 0, "frame": 0}, {"type": "O", "at": 1, "frame": 1}, {"type": "C", "at": 4, "frame": 1},
               {"type": "O", "at": 4, "frame": 2}, {"type": "C", "at": 6.5, "frame": 2}, {"type": "C", "at": 7, "frame": 0},
               {"type": "O", "at": 7, "frame": 3}, {"type": "C", "at": 8, "frame": 3}]}"#;

/// SAMPLED's totals in nanoseconds (idle's 1.5 ms is 1 ms in Pyroscope).
const SAMPLED_TOTALS: [(&str, i64); 4] = [
    ("main", 6_000_000),
    ("foo", 3_000_000),
    ("bar", 2_000_000),
    ("idle", 1_500_000),
];
/// EVENTED's: main 1 ms before foo opens (Pyroscope leaves it unscaled),
/// foo 3, bar 2.5 (2 in Pyroscope), main 0.5 (0 in Pyroscope), idle 1.
const EVENTED_TOTALS: [(&str, i64); 4] = [
    ("main", 7_000_000),
    ("foo", 3_000_000),
    ("bar", 2_500_000),
    ("idle", 1_000_000),
];

#[test]
fn speedscope_sampled() {
    file_totals_in_pyroscope(
        "speedscope-sampled",
        "",
        speedscope(SAMPLED),
        CPU,
        &SAMPLED_TOTALS,
    );
}

#[test]
fn speedscope_evented() {
    file_totals_in_pyroscope(
        "speedscope-evented",
        ".cpu",
        speedscope(EVENTED),
        CPU,
        &EVENTED_TOTALS,
    );
}

#[test]
fn speedscope_of_two_profiles() {
    // Each is named after its unit, which makes it a wall profile; both
    // are milliseconds, so they sum.
    let two: Vec<(&str, i64)> = SAMPLED_TOTALS
        .iter()
        .zip(EVENTED_TOTALS)
        .map(|((f, a), (_, b))| (*f, a + b))
        .collect();
    file_totals_in_pyroscope(
        "speedscope-two",
        "",
        speedscope(&format!("{SAMPLED}, {EVENTED}")),
        "wall:wall:nanoseconds:cpu:nanoseconds",
        &two,
    );
}

/// A 100 Hz sampler writing seconds: each weight is 0.01 (Pyroscope stores
/// nothing of it).
#[test]
fn speedscope_in_fractions_of_a_second() {
    let samples = [("[0, 1]", 3), ("[0, 2]", 2), ("[3]", 1), ("[0]", 1)];
    let (stacks, weights): (Vec<&str>, Vec<&str>) = samples
        .iter()
        .flat_map(|(s, n)| std::iter::repeat_n((*s, "0.01"), *n))
        .unzip();
    let profile = format!(
        r#"{{"type": "sampled", "name": "py", "unit": "seconds", "startValue": 0, "endValue": 0.07,
            "samples": [{}], "weights": [{}]}}"#,
        stacks.join(", "),
        weights.join(", ")
    );
    file_totals_in_pyroscope(
        "speedscope-seconds",
        ".cpu",
        speedscope(&profile),
        CPU,
        &[
            ("main", 60_000_000),
            ("foo", 30_000_000),
            ("bar", 20_000_000),
            ("idle", 10_000_000),
        ],
    );
}

/// Bodies that keep only part of what they carry, or nothing, are answered
/// 200 as Pyroscope answers them, and counted and logged (once per reason
/// and sender).
#[test]
fn what_a_body_loses_is_counted_and_logged() {
    let proflow = common::Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file]}}\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    // Folded: a line with no count, a count with no frame, and one stack.
    for _ in 0..2 {
        proflow
            .post(
                "/ingest?name=partly.cpu&format=folded",
                &[],
                b"main;foo 3\nmain;foo\n 2\n".to_vec(),
            )
            .expect_status(200, "a folded body that keeps one stack of three");
    }
    // Only lines with no count: nothing to store.
    proflow
        .post(
            "/ingest?name=nothing.cpu&format=folded",
            &[],
            b"main;foo\nmain;bar\n".to_vec(),
        )
        .expect_status(200, "a folded body with nothing in it");
    // A speedscope weight too small for a nanosecond.
    let tiny = speedscope(
        r#"{"type": "sampled", "name": "t", "unit": "seconds", "startValue": 0, "endValue": 1,
            "samples": [[0], [0, 1]], "weights": [1e-12, 0.5]}"#,
    );
    proflow
        .post("/ingest?name=tiny&format=speedscope", &[], tiny)
        .expect_status(200, "a speedscope body with one weight under a nanosecond");
    let files = proflow.wait_for_files(3, |_| true);
    let metrics = proflow.metrics();
    let lost = |reason: &str| {
        common::metric_sum(
            &metrics,
            "proflow_receiver_lost_samples_total",
            &[("receiver", "pprof_push"), ("reason", reason)],
        )
    };
    assert_eq!(
        (
            lost("no_count"),
            lost("empty_stack"),
            lost("rounded_to_zero")
        ),
        (4.0, 2.0, 1.0),
        "lost samples by reason\n{metrics}"
    );
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_empty_requests_total",
            &[("format", "folded")]
        ),
        1.0,
        "the folded body with nothing to store\n{metrics}"
    );
    // Two partly lost folded bodies and one speedscope body were written.
    assert_eq!(files.len(), 3, "{files:?}");
    let log = proflow.log_text();
    let said = |what: &[&str]| {
        log.lines()
            .filter(|l| what.iter().all(|w| l.contains(w)))
            .count()
    };
    let lost_line = "could not be converted";
    assert_eq!(
        (
            said(&[lost_line, "no_count"]),
            said(&[lost_line, "empty_stack"]),
            said(&[lost_line, "rounded_to_zero"]),
            said(&["held no sample to store"]),
        ),
        (1, 1, 1, 1),
        "each reason logged once for this sender\nlog:\n{log}"
    );
}
