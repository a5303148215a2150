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
//!
//! The exporter's TLS settings meet a Collector of the test's own serving
//! TLS and asking for client certificates: the CA and a client certificate
//! deliver over gRPC and HTTP, each copy with the totals the `file`
//! exporter wrote; another CA, or no client certificate, is refused with
//! the reason in the log.

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{HOT_FUNCTION, Totals, WARM_FUNCTION};
use proflow_model::otlp::{self, Lost, common as otlp_common, json, proto};

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

/// Per resource of `service.name = app` in a collector's file output so
/// far, the [`Totals`] of `functions` in its profiles, converted back to
/// pprof.
fn totals_per_resource(file: &std::path::Path, app: &str, functions: &[&str]) -> Vec<Totals> {
    let mut per_resource = Vec::new();
    let Ok(all) = std::fs::read_to_string(file) else {
        return per_resource;
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
            let mut totals = Totals::new();
            for p in otlp::otlp_to_pprof(dict, &profiles, &mut lost).expect("converts back") {
                common::add_function_totals(&mut totals, &p, functions, None);
            }
            per_resource.push(totals);
        }
    }
    per_resource
}

/// The totals of every profile of `service.name = app` in the collector's
/// file output so far.
fn collector_totals(file: &str, app: &str) -> Totals {
    let mut totals = Totals::new();
    for resource in totals_per_resource(file.as_ref(), app, &common::PY_FUNCTIONS) {
        for (f, v) in resource {
            *totals.entry(f).or_default() += v;
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

/// A Collector of the test's own from the `otelcol` peer's binary, its OTLP
/// receiver serving TLS on both protocols and asking for client
/// certificates of the test CA (`client_ca_file`), its `file` exporter
/// writing OTLP JSON lines; killed on drop.
struct TlsCollector {
    child: std::process::Child,
    out: PathBuf,
    log: PathBuf,
    grpc: u16,
    http: u16,
    _dir: tempfile::TempDir,
}

impl TlsCollector {
    fn start(bin: &str, pki: &common::pki::Pki) -> TlsCollector {
        let dir = tempfile::tempdir().unwrap();
        let (grpc, http) = (common::free_port(), common::free_port());
        let out = dir.path().join("profiles.jsonl");
        let tls = format!(
            "{{cert_file: {}, key_file: {}, client_ca_file: {}}}",
            pki.file("server.pem").display(),
            pki.file("server-key.pem").display(),
            pki.file("ca.pem").display()
        );
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: 127.0.0.1:{grpc}, tls: {tls}}}\n      http: {{endpoint: 127.0.0.1:{http}, tls: {tls}}}\nexporters:\n  file:\n    path: {}\nservice:\n  telemetry:\n    metrics: {{level: none}}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            out.display()
        );
        let config_path = dir.path().join("otelcol.yaml");
        std::fs::write(&config_path, &config).unwrap();
        let log = dir.path().join("otelcol.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = std::process::Command::new(bin)
            .arg("--config")
            .arg(&config_path)
            .arg("--feature-gates=+service.profilesSupport")
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {bin}: {e}"));
        let mut c = TlsCollector {
            child,
            out,
            log,
            grpc,
            http,
            _dir: dir,
        };
        // Ready once both receivers listen (the Collector starts its
        // exporters before its receivers).
        let listening = peer_env::poll(Duration::from_secs(30), || {
            if let Ok(Some(status)) = c.child.try_wait() {
                panic!("the collector exited with {status}:\n{}", c.log_text());
            }
            [c.grpc, c.http]
                .iter()
                .all(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok())
                .then_some(())
        });
        assert!(
            listening.is_some(),
            "the collector did not listen:\n{}",
            c.log_text()
        );
        c
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Per resource of service `app` in what its file exporter wrote, the
    /// totals of [`HOT_FUNCTION`] and [`WARM_FUNCTION`].
    fn totals_per_resource(&self, app: &str) -> Vec<Totals> {
        totals_per_resource(&self.out, app, &[HOT_FUNCTION, WARM_FUNCTION])
    }
}

impl Drop for TlsCollector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- collector log ----\n{}", self.log_text());
        }
    }
}

/// The `otlp` exporter's TLS settings against the real Collector serving
/// TLS and demanding client certificates: one push fans out to four `otlp`
/// exporters. With the test CA (`ca_file`) and a client certificate of it
/// (`cert_file`, `key_file`), gRPC and HTTP deliver; with another CA the
/// server's certificate is refused; without a client certificate the
/// Collector refuses the exporter. The Collector then holds exactly the two
/// good copies, each with the totals the `file` exporter wrote.
#[test]
fn tls_and_mutual_tls_against_the_collector_and_refusals() {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let Some(bin) = otelcol.get("BIN").map(str::to_owned) else {
        panic!("the otelcol peer did not report its binary (OTELCOL_BIN)");
    };
    let pki = common::pki::Pki::new();
    let collector = TlsCollector::start(&bin, &pki);
    let (ca, other_ca, cert, key) = (
        pki.file("ca.pem"),
        pki.file("other-ca.pem"),
        pki.file("client.pem"),
        pki.file("client-key.pem"),
    );
    let exporter = |name: &str, protocol: &str, ca: &std::path::Path, client: bool| {
        let endpoint = match protocol {
            "grpc" => format!("https://127.0.0.1:{}", collector.grpc),
            _ => format!("https://127.0.0.1:{}", collector.http),
        };
        let mut tls = format!("ca_file: {}", ca.display());
        if client {
            tls.push_str(&format!(
                ", cert_file: {}, key_file: {}",
                cert.display(),
                key.display()
            ));
        }
        format!(
            "  {name}:\n    protocol: {protocol}\n    endpoint: {endpoint}\n    tls: {{{tls}}}\n    retry_on_failure: {{enabled: false}}\n"
        )
    };
    let exporters = [
        exporter("otlp/grpc", "grpc", &ca, true),
        exporter("otlp/http", "http", &ca, true),
        exporter("otlp/wrong_ca", "grpc", &other_ca, true),
        exporter("otlp/no_client_cert", "http", &ca, false),
    ]
    .concat();
    let proflow = common::Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\n{exporters}service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file, otlp/grpc, otlp/http, otlp/wrong_ca, otlp/no_client_cert]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    let app = common::unique_name("otlp-tls");
    common::push_valid(&proflow, &app);
    common::wait_one_sent_one_failed(
        &proflow,
        &["otlp/grpc", "otlp/http"],
        &["otlp/wrong_ca", "otlp/no_client_cert"],
    );
    // Each refusal is logged. The wrong CA's says why: the server's
    // certificate has an unknown issuer. Without a client certificate the
    // reason depends on a race (TLS 1.3 ends the client's handshake before
    // the server checks for a certificate): the Collector's
    // `CertificateRequired` alert, or the connection closed or broken under
    // the request, each seen in repeated runs; the refusal itself is what the
    // counts above and the Collector's output below establish.
    let log = proflow.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("otlp/wrong_ca") && l.contains("UnknownIssuer")),
        "the wrong CA's failure should name the unknown issuer:\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("otlp/no_client_cert") && l.contains("export failed")),
        "the refusal of the exporter without a client certificate should be logged:\n{log}"
    );
    // The two good copies arrive, and no other (the refused exporters'
    // failures were final before this count), each with the totals the
    // `file` exporter wrote.
    let mut want = Totals::new();
    for e in common::written_entries(&proflow, &app, READ_BACK_TIMEOUT) {
        common::add_function_totals(
            &mut want,
            &common::read_profile(&e.path),
            &[HOT_FUNCTION, WARM_FUNCTION],
            None,
        );
    }
    assert!(
        want.values().all(|v| *v > 0) && want.len() == 2,
        "the file exporter wrote {want:?} for {app}"
    );
    let mut got = Vec::new();
    let both = peer_env::poll(READ_BACK_TIMEOUT, || {
        got = collector.totals_per_resource(&app);
        (got.len() >= 2).then_some(())
    });
    assert!(
        both.is_some(),
        "the collector wrote {} resources of {app}:\n{}",
        got.len(),
        collector.log_text()
    );
    assert_eq!(
        got,
        vec![want.clone(), want],
        "only the two exporters with the CA and a client certificate delivered, each the totals the file exporter wrote"
    );
}
