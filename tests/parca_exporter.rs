//! The `parca` exporter against the real Parca. A real Pyroscope client
//! (`pyroscope-io`, Python) pushes to proflow's `pprof_push` receiver; one
//! pipeline fans out to a `file` exporter (pprof, what proflow received) and
//! to the `parca` exporter, which writes to Parca with gRPC `WriteRaw`. The
//! profiles are read back through Parca's REST gateway (`/api/profiles/query`,
//! a merge over the app's label and the last hour, as a pprof report) and
//! must hold the client's hot and warm functions with the totals the `file`
//! exporter wrote (±1%).

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::time::Duration;

use common::Totals;
use proflow_model::pprof;

/// How long the client program burns CPU.
const RUN_SECONDS: &str = "3";
/// How long Parca may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// The string of a pprof string-table index.
fn string(p: &pprof::Profile, i: i64) -> &str {
    p.string_table.get(i as usize).map_or("", String::as_str)
}

#[test]
fn python_profiles_reach_parca_with_the_totals_proflow_received() {
    let Some(parca) = peer_env::peer("parca") else {
        return;
    };
    let python = match common::python_client() {
        Ok(p) => p,
        Err(why) => {
            let _: Option<()> = common::missing_peer(&format!("pyroscope-io: {why}"));
            return;
        }
    };
    let proflow = common::start_with_file_and(
        "parca",
        &format!(
            "endpoint: {}\ntls: {{ insecure: true }}\nexternal_labels: {{ via: proflow }}\n",
            parca.endpoint()
        ),
    );
    let app = common::unique_name("py-parca");
    let run = common::run_python_client_through(&proflow, &python, &app, RUN_SECONDS, "parca");
    let want = run.totals;
    let first = run.first;

    // Parca files each sample type as its own profile type,
    // NAME:TYPE:UNIT:PERIOD_TYPE:PERIOD_UNIT[:delta]; the totals are of the
    // first sample type.
    let name = run
        .entry
        .label("__name__")
        .unwrap_or("process_cpu")
        .to_owned();
    let st = &first.sample_type[0];
    let (pt, pu) = first.period_type.as_ref().map_or(("", ""), |p| {
        (string(&first, p.r#type), string(&first, p.unit))
    });
    let delta = if first.duration_nanos != 0 {
        ":delta"
    } else {
        ""
    };
    let query = format!(
        "{name}:{}:{}:{pt}:{pu}{delta}{{service_name=\"{app}\",via=\"proflow\"}}",
        string(&first, st.r#type),
        string(&first, st.unit)
    );
    let http = common::http_client();
    let base = parca.http_base();
    let mut last = String::new();
    let mut got = Totals::new();
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        let merged = readback::parca_merge(&http, &base, &query, &mut last)?;
        got = Totals::new();
        common::add_totals(&mut got, &merged);
        common::totals_close(&got, &want).then_some(())
    });
    assert!(
        same.is_some(),
        "Parca's merge of {query} has totals {got:?}, proflow received {want:?}; last answer: {last}\nlog:\n{}",
        proflow.log_text()
    );
    eprintln!("parca as {query}: {got:?} (file exporter: {want:?})");
}
