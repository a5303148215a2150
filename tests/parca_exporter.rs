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
mod peer_env;

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use common::Totals;
use proflow_pipeline::pprof;

/// How long the client program burns CPU.
const RUN_SECONDS: &str = "3";
/// How long Parca may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// The string of a pprof string-table index.
fn string(p: &pprof::Profile, i: i64) -> &str {
    p.string_table.get(i as usize).map_or("", String::as_str)
}

/// RFC 3339 UTC timestamp of Unix seconds (civil-from-days).
fn rfc3339(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Parca's merged pprof for `query` over the last hour, if it answers one.
fn parca_merge(
    http: &reqwest::blocking::Client,
    base: &str,
    query: &str,
    last: &mut String,
) -> Option<pprof::Profile> {
    let now = peer_env::now_nanos() / 1_000_000_000;
    let (start, end) = (rfc3339(now - 3600), rfc3339(now + 60));
    let url = reqwest::Url::parse_with_params(
        &format!("{base}/api/profiles/query"),
        &[
            ("mode", "MODE_MERGE"),
            ("merge.query", query),
            ("merge.start", start.as_str()),
            ("merge.end", end.as_str()),
            ("reportType", "REPORT_TYPE_PPROF"),
        ],
    )
    .ok()?;
    let response = http.get(url).send().ok()?;
    let status = response.status();
    let text = response.text().unwrap_or_default();
    *last = format!("{status} {}", text.chars().take(500).collect::<String>());
    let body: serde_json::Value = serde_json::from_str(&text).ok()?;
    let bytes = BASE64.decode(body["pprof"].as_str()?).ok()?;
    pprof::decode(&bytes::Bytes::from(bytes), 64 << 20).ok()
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
        let merged = parca_merge(&http, &base, &query, &mut last)?;
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

#[test]
fn rfc3339_formats_known_instants() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
}
