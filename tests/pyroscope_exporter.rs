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
mod readback;

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
