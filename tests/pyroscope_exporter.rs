//! The `pyroscope` exporter against the real Pyroscope server. A real
//! Pyroscope client (`pyroscope-io` for Python, `pyroscope-go`,
//! `@pyroscope/nodejs`) pushes to
//! proflow's `pprof_push` receiver; one pipeline fans out to a `file`
//! exporter (pprof, what proflow received) and to the `pyroscope` exporter,
//! which sends to the real Pyroscope over its push API
//! (`push.v1.PusherService/Push`) or `/ingest`. The profiles are queried back
//! per service with `SelectMergeStacktraces`: the client's hot and warm
//! functions must come back with the totals the `file` exporter wrote (within
//! 1%).

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::process::Command;
use std::time::Duration;

use common::Totals;

/// How long the client program burns CPU.
const RUN_SECONDS: &str = "3";
/// How long Pyroscope may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

fn through_pyroscope(api: &str) {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let python = match common::python_client() {
        Ok(p) => p,
        Err(why) => return common::missing_peer(&format!("pyroscope-io: {why}")).unwrap_or(()),
    };
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!(
            "endpoint: {}\napi: {api}\nexternal_labels: {{ via: proflow }}\n",
            pyroscope.http_base()
        ),
    );
    let app = common::unique_name(&format!("py-pyro-exp-{api}"));
    let run = common::run_python_client_through(&proflow, &python, &app, RUN_SECONDS, "pyroscope");
    // pprof in, pprof out: nothing was converted to OTLP on the way.
    let converted = common::metric_sum(&run.metrics, "proflow_conversions_total", &[]);
    assert_eq!(converted, 0.0, "metrics:\n{}", run.metrics);
    let want = run.totals;
    let http = common::http_client();
    let base = pyroscope.http_base();
    let selector = format!("{{service_name=\"{app}\", via=\"proflow\"}}");
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = readback::pyroscope_totals(&http, &base, &selector, &common::PY_FUNCTIONS, None);
        common::totals_close(&last.0, &want).then_some(())
    });
    assert!(
        same.is_some(),
        "Pyroscope has totals {:?} ({}) for service_name={app}, proflow received {want:?}\nlog:\n{}",
        last.0,
        last.1,
        proflow.log_text()
    );
    eprintln!(
        "pyroscope via {api} as {}: {want:?} -> {:?}",
        last.1, last.0
    );
}

#[test]
fn python_profiles_reach_pyroscope_over_the_push_api() {
    through_pyroscope("push");
}

#[test]
fn python_profiles_reach_pyroscope_over_ingest() {
    through_pyroscope("ingest");
}

/// How long the Go client program runs (uploading every second).
const GO_RUN: &str = "4s";

/// The Go client: `pyroscope-go` in `tests/peers/apps/gopush` pushes its CPU
/// and memory profiles to proflow's `/ingest` as multipart (the heap profiles
/// with a `sample_type_config`); proflow sends them on over the push API. Its
/// CPU profiles come back from Pyroscope as
/// `process_cpu:cpu:nanoseconds:cpu:nanoseconds` with the cpu-nanosecond
/// totals of `main.goHotLoop` and `main.goWarmLoop` that the `file` exporter
/// wrote (within 1%), where `goHotLoop` has 75% ± 10 points of the two (the
/// program does 3:1 work in them); no upload failed, and the memory profiles
/// went through proflow too.
#[test]
fn go_profiles_reach_pyroscope_over_the_push_api() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some(gopush) = peer_env::go_app("gopush") else {
        return;
    };
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!(
            "endpoint: {}\nexternal_labels: {{ via: proflow }}\n",
            pyroscope.http_base()
        ),
    );
    let app = common::unique_name("go-pyro-exp");
    let log = proflow.dir.path().join("go-client.log");
    let (status, output) = common::run_bounded(
        Command::new(&gopush)
            .args(["-server", &proflow.receiver_url("")])
            .args(["-app", &app])
            .args(["-upload-rate", "1s", "-duration", GO_RUN]),
        &log,
        Duration::from_secs(60),
    );
    // The client reports every failed upload on stderr, prefixed `gopush: `.
    assert!(
        status.success() && !output.contains("gopush: "),
        "the Go client failed ({status}) or reported upload errors:\n{output}"
    );
    let (entries, metrics) = common::wait_exported(&proflow, &app, "pyroscope");
    let converted = common::metric_sum(&metrics, "proflow_conversions_total", &[]);
    assert_eq!(converted, 0.0, "metrics:\n{metrics}");
    let names: Vec<&str> = entries.iter().filter_map(|e| e.label("__name__")).collect();
    assert!(
        names.contains(&"memory"),
        "the client's memory profiles should have come through too: {names:?}"
    );
    let mut want = Totals::new();
    for e in entries
        .iter()
        .filter(|e| e.label("__name__") == Some("process_cpu"))
    {
        common::add_function_totals(
            &mut want,
            &common::read_profile(&e.path),
            &common::GO_FUNCTIONS,
            Some("cpu"),
        );
    }
    let [hot, warm] = common::GO_FUNCTIONS;
    let (hot_cpu, warm_cpu) = (
        want.get(hot).copied().unwrap_or(0),
        want.get(warm).copied().unwrap_or(0),
    );
    let hot_share = 100.0 * hot_cpu as f64 / (hot_cpu + warm_cpu).max(1) as f64;
    assert!(
        (65.0..=85.0).contains(&hot_share),
        "{hot} has {hot_share:.1}% of the CPU of {hot} and {warm}, want 75% ± 10 (gopush does 3:1 work in them): {want:?} (profiles: {names:?})"
    );

    let http = common::http_client();
    let base = pyroscope.http_base();
    let selector = format!("{{service_name=\"{app}\", via=\"proflow\"}}");
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = readback::pyroscope_totals(
            &http,
            &base,
            &selector,
            &common::GO_FUNCTIONS,
            Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds"),
        );
        common::totals_close(&last.0, &want).then_some(())
    });
    assert!(
        same.is_some(),
        "Pyroscope has totals {:?} ({}) for service_name={app}, proflow received {want:?}\nlog:\n{}",
        last.0,
        last.1,
        proflow.log_text()
    );
    eprintln!(
        "pyroscope-go via push as {}: {want:?} ({hot_share:.1}% {hot}) -> {:?}",
        last.1, last.0
    );
}

/// The Node client: `@pyroscope/nodejs` pushes wall-clock profiles with CPU
/// time collected (sample types `samples`, `wall`, `cpu`) to proflow's
/// `/ingest`; proflow sends them on over the push API. Each of the three
/// comes back from Pyroscope as its own profile type with the totals of
/// `nodeHotLoop` and `nodeWarmLoop` that the client sent (the `file`
/// exporter writes its bytes as they arrived), within 1%.
#[test]
fn node_profiles_reach_pyroscope_with_every_sample_type() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let node_modules = match common::node_client() {
        Ok(m) => m,
        Err(why) => {
            return common::missing_peer(&format!("@pyroscope/nodejs: {why}")).unwrap_or(());
        }
    };
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!(
            "endpoint: {}\nexternal_labels: {{ via: proflow }}\n",
            pyroscope.http_base()
        ),
    );
    let app = common::unique_name("node-pyro-exp");
    common::run_node_client(&proflow, &node_modules, &app, RUN_SECONDS);
    let (entries, metrics) = common::wait_exported(&proflow, &app, "pyroscope");
    let converted = common::metric_sum(&metrics, "proflow_conversions_total", &[]);
    assert_eq!(converted, 0.0, "metrics:\n{metrics}");
    let profiles: Vec<_> = entries
        .iter()
        .map(|e| common::read_profile(&e.path))
        .collect();

    // The client names a function `<file>:<name>:<line>`.
    let functions: Vec<String> = NODE_FUNCTIONS
        .iter()
        .map(|f| {
            let part = format!(":{f}:");
            profiles
                .iter()
                .flat_map(|p| p.string_table.iter())
                .find(|s| s.contains(&part))
                .unwrap_or_else(|| {
                    panic!("no function named like *{part}* in the client's profiles")
                })
                .clone()
        })
        .collect();
    let functions: Vec<&str> = functions.iter().map(String::as_str).collect();

    let http = common::http_client();
    let base = pyroscope.http_base();
    let selector = format!("{{service_name=\"{app}\", via=\"proflow\"}}");
    for sample_type in ["samples", "wall", "cpu"] {
        let mut want = Totals::new();
        for p in &profiles {
            common::add_function_totals(&mut want, p, &functions, Some(sample_type));
        }
        assert!(
            functions
                .iter()
                .all(|f| want.get(*f).is_some_and(|v| *v > 0)),
            "the client's {sample_type} values should have both functions: {want:?}"
        );
        let unit = if sample_type == "samples" {
            "count"
        } else {
            "nanoseconds"
        };
        let id = format!("wall:{sample_type}:{unit}:wall:nanoseconds");
        let mut last = (Totals::new(), String::new());
        let same = peer_env::poll(READ_BACK_TIMEOUT, || {
            last = readback::pyroscope_totals(&http, &base, &selector, &functions, Some(&id));
            common::totals_close(&last.0, &want).then_some(())
        });
        assert!(
            same.is_some(),
            "Pyroscope has {id} totals {:?} ({}) for service_name={app}, the client sent {want:?}\nlog:\n{}",
            last.0,
            last.1,
            proflow.log_text()
        );
        eprintln!("@pyroscope/nodejs {id}: sent {want:?}, read {:?}", last.0);
    }
}

/// The Node program's hot and warm functions (part of the names its client
/// gives them).
const NODE_FUNCTIONS: [&str; 2] = ["nodeHotLoop", "nodeWarmLoop"];

/// What the real Pyroscope does with profiles of one series that share a
/// millisecond: it acknowledges and stores each, but its query counts one of
/// them (the querier deduplicates profiles by series and millisecond). Four
/// profiles of one series go through proflow's `pyroscope` exporter, two of
/// them 0.3 ms apart: proflow sends all four (each with the time it was
/// pushed with), Pyroscope answers 200 to each, and reads back three. Pinned
/// here because `tests/backend_outages.rs` once lost a profile this way (its
/// stream, held during the peer's stop, pushed two into one millisecond);
/// the exporter's README says it for users. If a Pyroscope upgrade counts
/// both, this fails: drop the note then.
#[test]
fn pyroscope_counts_one_profile_per_series_and_millisecond() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let proflow = common::start_with_file_and(
        "pyroscope",
        &format!("endpoint: {}\n", pyroscope.http_base()),
    );
    let app = common::unique_name("pyro-same-ms");
    // A and B in one millisecond; C and D 20 and 25 ms later.
    let ms = common::now_nanos() / 1_000_000 * 1_000_000 + 100_000;
    let shots = [
        ("proflowSameMsA", 1_000_000i64, ms),
        ("proflowSameMsB", 2_000_000, ms + 300_000),
        ("proflowSameMsC", 4_000_000, ms + 20_000_000),
        ("proflowSameMsD", 8_000_000, ms + 25_000_000),
    ];
    for (function, value, time) in shots {
        let mut b = proflow_model::pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(time, 10_000_000)
            .sample_root_first(["main", function], vec![value]);
        let body = proflow_model::pprof::encode(&b.build()).to_vec();
        let answer = common::http_client()
            .post(proflow.receiver_url(&format!(
                "/ingest?name={app}&format=pprof&spyName=e2e&sampleRate=100"
            )))
            .body(body)
            .send()
            .expect("push to proflow");
        assert_eq!(
            answer.status().as_u16(),
            200,
            "{function}: {:?}",
            answer.text()
        );
    }
    // All four written and sent, none failed: Pyroscope answered each 200.
    let (entries, metrics) = common::wait_exported(&proflow, &app, "pyroscope");
    assert_eq!(entries.len(), 4, "four profiles written");
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "pyroscope")]
        ),
        4.0,
        "four sent\n{metrics}"
    );
    // Acknowledged means stored: read once C and D are both there.
    let functions: Vec<&str> = shots.iter().map(|s| s.0).collect();
    let (seen, got, answer) = readback::pyroscope_wait(
        &common::http_client(),
        &pyroscope.http_base(),
        (
            &format!("{{service_name=\"{app}\"}}"),
            &functions,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        ),
        READ_BACK_TIMEOUT,
        |t| t.contains_key("proflowSameMsC") && t.contains_key("proflowSameMsD"),
    );
    assert!(seen, "C and D never read back: {got:?} ({answer})");
    let a = got.get("proflowSameMsA").copied();
    let b = got.get("proflowSameMsB").copied();
    assert!(
        matches!((a, b), (Some(1_000_000), None) | (None, Some(2_000_000))),
        "of the two profiles in one millisecond Pyroscope counts one, the other's value untouched: A {a:?}, B {b:?} (all: {got:?})"
    );
    assert_eq!(got.get("proflowSameMsC"), Some(&4_000_000));
    assert_eq!(got.get("proflowSameMsD"), Some(&8_000_000));
}
