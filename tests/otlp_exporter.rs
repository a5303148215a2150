//! The `otlp` exporter against real peers. A real Pyroscope client
//! (`pyroscope-io`, Python) pushes to proflow's `pprof_push` receiver; one
//! pipeline fans out to a `file` exporter (pprof, what proflow received) and
//! to the `otlp` exporter, which sends to:
//! - the real OpenTelemetry Collector's OTLP receiver (gRPC and HTTP); its
//!   file exporter's output (OTLP JSON, attributes by reference) is read back
//!   with proflow's decoder and converted to pprof;
//! - the real Pyroscope server's OTLP ingest (gRPC as h2c on its HTTP port,
//!   and `POST /v1development/profiles`); the profiles are queried back with
//!   `SelectMergeProfile`.
//!
//! In each case the client's hot and warm functions must come back with
//! exactly the totals the `file` exporter wrote, and the app as
//! `service.name` / `service_name`.

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
mod peer_env;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::Totals;
use proflow_pipeline::otlp::{self, Lost, common as otlp_common, json, proto};

/// How long the client program burns CPU.
const RUN_SECONDS: &str = "3";
/// How long the peer may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs the Python client against proflow as `app`; returns the totals of
/// what the `file` exporter wrote once the `otlp` exporter has sent as many
/// profiles, with none failed and none rejected by the peer.
fn run_client(proflow: &common::Proflow, python: &std::path::Path, app: &str) -> Totals {
    let run = common::run_python_client_through(proflow, python, app, RUN_SECONDS, "otlp");
    // A partial success (the peer took a request but rejected profiles of it).
    let rejected = common::metric_sum(
        &run.metrics,
        "proflow_exporter_dropped_profiles_total",
        &[("exporter", "otlp"), ("reason", "rejected_by_peer")],
    );
    assert_eq!(rejected, 0.0, "log:\n{}", proflow.log_text());
    run.totals
}

fn python() -> Option<PathBuf> {
    match common::python_client() {
        Ok(p) => Some(p),
        Err(why) => common::missing_peer(&format!("pyroscope-io: {why}")),
    }
}

// ------------------------------------------------------------ the collector

/// A key's or string value's text, inline or by reference into the strings.
fn text(inline: &str, strindex: i32, strings: &[String]) -> String {
    if inline.is_empty() {
        strings.get(strindex as usize).cloned().unwrap_or_default()
    } else {
        inline.to_owned()
    }
}

fn service_name(rp: &proto::ResourceProfiles, strings: &[String]) -> Option<String> {
    rp.resource.as_ref()?.attributes.iter().find_map(|kv| {
        (text(&kv.key, kv.key_strindex, strings) == "service.name").then(|| {
            match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(otlp_common::any_value::Value::StringValue(s)) => s.clone(),
                Some(otlp_common::any_value::Value::StringValueStrindex(i)) => {
                    text("", *i, strings)
                }
                _ => String::new(),
            }
        })
    })
}

/// The totals of every profile of `service.name = app` in the collector's
/// file output so far.
fn collector_totals(file: &str, app: &str) -> Totals {
    let mut totals = Totals::new();
    let Ok(all) = std::fs::read_to_string(file) else {
        return totals;
    };
    for line in all.lines().filter(|l| l.contains(app)) {
        let request =
            json::decode_request(line.as_bytes()).expect("proflow reads the collector's OTLP JSON");
        let dict = request.dictionary.as_ref().expect("a dictionary");
        for rp in &request.resource_profiles {
            if service_name(rp, &dict.string_table).as_deref() != Some(app) {
                continue;
            }
            let profiles: Vec<proto::Profile> = rp
                .scope_profiles
                .iter()
                .flat_map(|sp| sp.profiles.iter().cloned())
                .collect();
            let mut lost = Lost::default();
            for p in otlp::otlp_to_pprof(dict, &profiles, &mut lost).expect("converts back") {
                common::add_totals(&mut totals, &p);
            }
        }
    }
    totals
}

fn through_the_collector(protocol: &str) {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let Some(python) = python() else {
        return;
    };
    let exporter = match protocol {
        "grpc" => format!(
            "protocol: grpc\nendpoint: {}\ntls: {{ insecure: true }}\n",
            otelcol.var("ENDPOINT")
        ),
        _ => format!(
            "protocol: http\nendpoint: http://{}\n",
            otelcol.var("HTTP_ENDPOINT")
        ),
    };
    let proflow = common::start_with_file_and("otlp", &exporter);
    let app = common::unique_name(&format!("py-otlp-{protocol}"));
    let want = run_client(&proflow, &python, &app);
    let file = otelcol.var("FILE_PATH").to_owned();
    let mut last = Totals::new();
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = collector_totals(&file, &app);
        (last == want).then_some(())
    });
    assert!(
        same.is_some(),
        "the collector's file output for service.name={app} has totals {last:?}, proflow received {want:?}\nlog:\n{}",
        proflow.log_text()
    );
    eprintln!("collector via {protocol}: {want:?}");
}

#[test]
fn python_profiles_reach_the_collector_over_grpc() {
    through_the_collector("grpc");
}

#[test]
fn python_profiles_reach_the_collector_over_http() {
    through_the_collector("http");
}

// ------------------------------------------------------------ Pyroscope

/// A JSON integer that proto3 JSON may write as a string.
fn int(v: &serde_json::Value) -> i64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// The totals of a `SelectMergeProfile` answer (a pprof `Profile` in proto3
/// JSON).
fn json_pprof_totals(profile: &serde_json::Value) -> Totals {
    let empty = Vec::new();
    let array = |v: &serde_json::Value| v.as_array().unwrap_or(&empty).clone();
    let strings: Vec<String> = array(&profile["stringTable"])
        .iter()
        .map(|s| s.as_str().unwrap_or_default().to_owned())
        .collect();
    let functions: BTreeMap<i64, String> = array(&profile["function"])
        .iter()
        .map(|f| {
            let name = strings
                .get(int(&f["name"]) as usize)
                .cloned()
                .unwrap_or_default();
            (int(&f["id"]), name)
        })
        .collect();
    let locations: BTreeMap<i64, Vec<String>> = array(&profile["location"])
        .iter()
        .map(|l| {
            let names = array(&l["line"])
                .iter()
                .filter_map(|line| functions.get(&int(&line["functionId"])).cloned())
                .collect();
            (int(&l["id"]), names)
        })
        .collect();
    let mut totals = Totals::new();
    for sample in array(&profile["sample"]) {
        let names: Vec<&String> = array(&sample["locationId"])
            .iter()
            .filter_map(|id| locations.get(&int(id)))
            .flatten()
            .collect();
        let value = array(&sample["value"]).first().map_or(0, int);
        for f in common::PY_FUNCTIONS {
            if names.iter().any(|n| n.as_str() == f) {
                *totals.entry(f.to_owned()).or_default() += value;
            }
        }
    }
    totals
}

/// Pyroscope's merged profile of `service_name = app` for every CPU profile
/// type it knows, the first with any of the functions.
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
                .filter(|id| id.contains(":cpu:"))
                .collect()
        })
        .unwrap_or_default();
    for id in &ids {
        let Some(profile) = post(
            "/querier.v1.QuerierService/SelectMergeProfile",
            serde_json::json!({
                "profileTypeID": id,
                "labelSelector": format!("{{service_name=\"{app}\"}}"),
                "start": start,
                "end": end,
            }),
        ) else {
            continue;
        };
        let totals = json_pprof_totals(&profile);
        if !totals.is_empty() {
            return (totals, id.clone());
        }
    }
    (
        Totals::new(),
        format!("no CPU profile type had them; types: {ids:?}"),
    )
}

fn through_pyroscope(protocol: &str) {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some(python) = python() else {
        return;
    };
    // gRPC: h2c on Pyroscope's HTTP port; HTTP: /v1development/profiles there.
    let exporter = match protocol {
        "grpc" => format!(
            "protocol: grpc\nendpoint: {}\ntls: {{ insecure: true }}\n",
            pyroscope.endpoint()
        ),
        _ => format!("protocol: http\nendpoint: {}\n", pyroscope.http_base()),
    };
    let proflow = common::start_with_file_and("otlp", &exporter);
    let app = common::unique_name(&format!("py-pyro-{protocol}"));
    let want = run_client(&proflow, &python, &app);
    let http = common::http_client();
    let base = pyroscope.http_base();
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = pyroscope_totals(&http, &base, &app);
        (last.0 == want).then_some(())
    });
    assert!(
        same.is_some(),
        "Pyroscope has totals {:?} ({}) for service_name={app}, proflow received {want:?}\nlog:\n{}",
        last.0,
        last.1,
        proflow.log_text()
    );
    eprintln!("pyroscope via {protocol} as {}: {want:?}", last.1);
}

#[test]
fn python_profiles_reach_pyroscope_over_grpc() {
    through_pyroscope("grpc");
}

#[test]
fn python_profiles_reach_pyroscope_over_http() {
    through_pyroscope("http");
}
