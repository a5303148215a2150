//! The `pyroscope` exporter against the real Pyroscope server. A real
//! Pyroscope client (`pyroscope-io`, Python) pushes to proflow's
//! `pprof_push` receiver; one pipeline fans out to a `file` exporter (pprof,
//! what proflow received) and to the `pyroscope` exporter, which sends to
//! the real Pyroscope over its push API (`push.v1.PusherService/Push`) or
//! `/ingest`. The profiles are queried back per service with
//! `SelectMergeStacktraces`: the client's hot and warm functions must come
//! back with the totals the `file` exporter wrote (within 1%).

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
mod peer_env;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::Proflow;
use proflow_pipeline::pprof;

const HOT: &str = "py_hot_loop";
const WARM: &str = "py_warm_loop";
const FUNCTIONS: [&str; 2] = [HOT, WARM];
/// How long the client program burns CPU.
const RUN_SECONDS: &str = "3";
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long Pyroscope may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// Per function, the sum of the first sample type's values of the samples
/// whose stack contains it.
type Totals = BTreeMap<String, i64>;

fn add_totals(totals: &mut Totals, profile: &pprof::Profile) {
    for (frames, sample) in pprof::stacks_root_first(profile) {
        let value = sample.value.first().copied().unwrap_or(0);
        for f in FUNCTIONS {
            if frames.contains(&f) {
                *totals.entry(f.to_owned()).or_default() += value;
            }
        }
    }
}

/// Proflow with `pprof_push` fanned out to `file` and to `pyroscope`
/// configured by `body` (YAML lines of the exporter's body).
fn start_proflow(body: &str) -> Proflow {
    let body: String = body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("    {l}\n"))
        .collect();
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             exporters:\n  file:\n    directory: {}\n  pyroscope:\n{body}\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file, pyroscope]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Runs the Python client against proflow as `app`; returns the totals of
/// what the `file` exporter wrote once the `pyroscope` exporter has sent as
/// many profiles, with none failed.
fn run_client(proflow: &Proflow, python: &PathBuf, app: &str) -> Totals {
    let log = proflow.dir.path().join("python-client.log");
    let (status, output) = common::run_bounded(
        Command::new(python)
            .arg(common::peers_dir().join("apps/python/main.py"))
            .args(["--server", &proflow.receiver_url("")])
            .args(["--app-name", app])
            .arg(RUN_SECONDS),
        &log,
        RUN_TIMEOUT,
    );
    assert!(
        status.success(),
        "python client failed ({status}):\n{output}"
    );
    // The client flushed before it exited; wait until the file count is stable.
    let mut entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app));
    for _ in 0..10 {
        std::thread::sleep(Duration::from_secs(1));
        let now = proflow.wait_for_files(entries.len(), |e| e.label("service_name") == Some(app));
        if now.len() == entries.len() {
            break;
        }
        entries = now;
    }
    let written = entries.len() as f64;
    let sent = peer_env::poll(Duration::from_secs(30), || {
        let metrics = proflow.metrics();
        let sent = common::metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "pyroscope")],
        );
        (sent >= written).then_some(metrics)
    });
    let metrics = sent.unwrap_or_else(|| {
        panic!(
            "the pyroscope exporter did not send the {written} profiles the file exporter wrote\nmetrics:\n{}\nlog:\n{}",
            proflow.metrics(),
            proflow.log_text()
        )
    });
    let failed = common::metric_sum(
        &metrics,
        "proflow_exporter_failed_profiles_total",
        &[("exporter", "pyroscope")],
    );
    assert_eq!(failed, 0.0, "log:\n{}", proflow.log_text());
    // pprof in, pprof out: nothing was converted to OTLP on the way.
    let converted = common::metric_sum(&metrics, "proflow_conversions_total", &[]);
    assert_eq!(converted, 0.0, "metrics:\n{metrics}");
    let mut totals = Totals::new();
    for e in &entries {
        add_totals(&mut totals, &common::read_profile(&e.path));
    }
    assert!(
        totals.get(HOT) > totals.get(WARM) && totals.get(WARM).is_some_and(|w| *w > 0),
        "the client's profiles should show {HOT} above {WARM} > 0: {totals:?}"
    );
    totals
}

/// A JSON integer that proto3 JSON may write as a string.
fn int(v: &serde_json::Value) -> i64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// Per function, the sum of the totals of its flamegraph nodes. A level's
/// `values` are groups of four: x offset (relative to the previous node's
/// end), total, self, name index.
fn flamegraph_totals(flamegraph: &serde_json::Value) -> Totals {
    let empty = Vec::new();
    let names: Vec<&str> = flamegraph["names"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|n| n.as_str().unwrap_or_default())
        .collect();
    let mut totals = Totals::new();
    for level in flamegraph["levels"].as_array().unwrap_or(&empty) {
        let values: Vec<i64> = level["values"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(int)
            .collect();
        for node in values.chunks_exact(4) {
            let name = names.get(node[3] as usize).copied().unwrap_or_default();
            if FUNCTIONS.contains(&name) {
                *totals.entry(name.to_owned()).or_default() += node[1];
            }
        }
    }
    totals
}

/// Pyroscope's merged stack traces of `service_name = app` for every
/// profile type it knows, the first with any of the functions, and its type.
fn pyroscope_totals(http: &reqwest::blocking::Client, base: &str, app: &str) -> (Totals, String) {
    let now_ms = peer_env::now_nanos() / 1_000_000;
    let (start, end) = (now_ms - 3_600_000, now_ms + 60_000);
    let post = |path: &str, body: serde_json::Value| -> Option<serde_json::Value> {
        let response = http
            .post(format!("{base}{path}"))
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send()
            .ok()?;
        if !response.status().is_success() {
            return None;
        }
        serde_json::from_str(&response.text().ok()?).ok()
    };
    let types = post(
        "/querier.v1.QuerierService/ProfileTypes",
        serde_json::json!({ "start": start, "end": end }),
    )
    .unwrap_or_default();
    let ids: Vec<String> = types["profileTypes"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|t| t["ID"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    for id in &ids {
        let Some(answer) = post(
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            serde_json::json!({
                "profileTypeID": id,
                "labelSelector": format!("{{service_name=\"{app}\", via=\"proflow\"}}"),
                "start": start,
                "end": end,
            }),
        ) else {
            continue;
        };
        let totals = flamegraph_totals(&answer["flamegraph"]);
        if !totals.is_empty() {
            return (totals, id.clone());
        }
    }
    (
        Totals::new(),
        format!("no profile type had them; types: {ids:?}"),
    )
}

/// Equal within 1% per function, with the same functions.
fn close(got: &Totals, want: &Totals) -> bool {
    got.len() == want.len()
        && want.iter().all(|(f, w)| {
            got.get(f)
                .is_some_and(|g| (g - w).abs() as f64 <= (*w as f64).abs() * 0.01)
        })
}

fn through_pyroscope(api: &str) {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let python = match common::python_client() {
        Ok(p) => p,
        Err(why) => return common::missing_peer(&format!("pyroscope-io: {why}")).unwrap_or(()),
    };
    let proflow = start_proflow(&format!(
        "endpoint: {}\napi: {api}\nexternal_labels: {{ via: proflow }}\n",
        pyroscope.http_base()
    ));
    let app = common::unique_name(&format!("py-pyro-exp-{api}"));
    let want = run_client(&proflow, &python, &app);
    let http = common::http_client();
    let base = pyroscope.http_base();
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = pyroscope_totals(&http, &base, &app);
        close(&last.0, &want).then_some(())
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
