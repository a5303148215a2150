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

use std::time::Duration;

use common::Totals;

/// How long the client program burns CPU.
const RUN_SECONDS: &str = "3";
/// How long Pyroscope may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

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
            if common::PY_FUNCTIONS.contains(&name) {
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
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = pyroscope_totals(&http, &base, &app);
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
