//! proflow's `otlp` receiver against the real OpenTelemetry Collector: the
//! test posts OTLP profiles to a collector of its own (started from the
//! `otelcol` peer's binary with a config of its own), whose `otlp_grpc` or
//! `otlp_http` exporter forwards them to proflow's `otlp` receiver; proflow's
//! `file` exporter writes them as OTLP JSON, and the test checks functions,
//! values and resource attributes against what it sent.
//!
//! A request built with the official Python classes (`opentelemetry-proto`
//! from PyPI, `tests/peers/apps/otlp-python/send.py`, run by the Python of
//! `PROFLOW_OTLP_PYTHON` from `tests/peers/install-clients`) goes the same
//! way, collector's OTLP/HTTP receiver → `otlp_grpc` → proflow, and every
//! profile must arrive unchanged: resolved through each request's
//! dictionary, all fields equal and the samples equal as multisets
//! (`otlp_receiver_cases/python.rs`). A request in the 1.9 layout, made with
//! that release's own Go bindings, arrives converted
//! (`otlp_receiver_cases/older.rs`).

// Both helpers include `peer_skip` (the first test to use the two): each
// gets its own copy, which only means a skip is recorded by the one that saw it.
#![allow(clippy::duplicate_mod)]

mod common;
#[path = "common/peer_env.rs"]
mod peer_env;

#[path = "otlp_receiver_cases/older.rs"]
mod older;
#[path = "otlp_receiver_cases/python.rs"]
mod python;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proflow, free_port, http_client};
use proflow_model::otlp::common::{AnyValue, InstrumentationScope, KeyValue, any_value};
use proflow_model::otlp::{DictionaryBuilder, Resource, collector, json, proto};
use prost::Message;

/// The collector binary the `otelcol` peer was built into.
fn otelcol_bin(peer: &peer_env::Peer) -> PathBuf {
    if let Some(bin) = peer.get("BIN") {
        return PathBuf::from(bin);
    }
    // A collector started by an older `up` did not report its binary.
    let home = std::env::var("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/proflow-peers/otelcol-v0.158.0/src/otelcol-proflow")
}

/// A collector of the test's own, killed on drop.
struct Otelcol {
    child: Child,
    http: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Otelcol {
    /// Starts `bin` with an OTLP receiver on free ports and `exporter`
    /// (a YAML body for the `exporter_type` exporter) in the profiles pipeline.
    fn start(bin: &Path, exporter_type: &str, exporter: &str) -> Otelcol {
        let dir = tempfile::tempdir().unwrap();
        let (grpc, http) = (free_port(), free_port());
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: 127.0.0.1:{grpc}}}\n      http: {{endpoint: 127.0.0.1:{http}}}\nexporters:\n  {exporter_type}:\n{exporter}\nservice:\n  telemetry:\n    metrics: {{level: none}}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [{exporter_type}]\n"
        );
        let config_path = dir.path().join("otelcol.yaml");
        std::fs::write(&config_path, &config).unwrap();
        let log = dir.path().join("otelcol.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config_path)
            .arg("--feature-gates=+service.profilesSupport")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut otelcol = Otelcol {
            child,
            http: format!("127.0.0.1:{http}"),
            log,
            _dir: dir,
        };
        // Ready once the profiles path takes an empty request.
        let client = http_client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = client
                .post(otelcol.url())
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return otelcol;
            }
            if let Ok(Some(status)) = otelcol.child.try_wait() {
                panic!(
                    "the collector exited with {status}:\n{}\nconfig:\n{config}",
                    otelcol.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the collector did not get ready:\n{}",
                otelcol.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn url(&self) -> String {
        format!("http://{}/v1development/profiles", self.http)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Otelcol {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- collector log ----\n{}", self.log_text());
        }
    }
}

/// proflow with an `otlp` receiver (gRPC on the standard receiver port,
/// HTTP on a port picked for each attempt of the start, so a retry after a
/// port was taken gets a fresh one, returned beside it) and a `file`
/// exporter writing OTLP JSON.
fn start_proflow() -> (Proflow, u16) {
    let mut http_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        http_port = free_port();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}}}\n      http: {{endpoint: 127.0.0.1:{http_port}}}\nexporters:\n  file:\n    directory: {}\n    format: otlp_json\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    (proflow, http_port)
}

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        key_strindex: 0,
    }
}

/// The stacks (root first) and values sent.
const STACKS: [(&[&str], i64); 3] = [
    (&["main", "serve", "parse"], 70),
    (&["main", "serve", "write"], 20),
    (&["main", "gc"], 5),
];

/// A request of one CPU profile of [`STACKS`] from `service`.
fn request(service: &str) -> collector::ExportProfilesServiceRequest {
    let mut d = DictionaryBuilder::new();
    let mut samples = Vec::new();
    for (frames, value) in STACKS {
        let locations = frames
            .iter()
            .rev()
            .map(|name| {
                let name = d.string(name);
                let f = d.function(proto::Function {
                    name_strindex: name,
                    ..Default::default()
                });
                d.location(proto::Location {
                    lines: vec![proto::Line {
                        function_index: f,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            })
            .collect();
        samples.push(proto::Sample {
            stack_index: d.stack(locations),
            values: vec![value],
            ..Default::default()
        });
    }
    let sample_type = proto::ValueType {
        type_strindex: d.string("cpu"),
        unit_strindex: d.string("nanoseconds"),
    };
    let now = peer_env::now_nanos() as u64;
    collector::ExportProfilesServiceRequest {
        resource_profiles: vec![proto::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    string_kv("service.name", service),
                    string_kv("host.name", "box-1"),
                ],
                ..Default::default()
            }),
            scope_profiles: vec![proto::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "proflow-test".into(),
                    ..Default::default()
                }),
                profiles: vec![proto::Profile {
                    sample_type: Some(sample_type),
                    period_type: Some(sample_type),
                    period: 10_000_000,
                    time_unix_nano: now,
                    duration_nano: 1_000_000_000,
                    samples,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(d.finish()),
    }
}

fn text(strings: &[String], inline: &str, index: i32) -> String {
    if inline.is_empty() {
        strings.get(index as usize).cloned().unwrap_or_default()
    } else {
        inline.to_owned()
    }
}

/// Resource attributes (string values) of a request's first resource.
fn resource_attributes(r: &collector::ExportProfilesServiceRequest) -> BTreeMap<String, String> {
    let strings = &r.dictionary.as_ref().unwrap().string_table;
    r.resource_profiles[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => s.clone(),
                any_value::Value::StringValueStrindex(i) => text(strings, "", *i),
                _ => return None,
            };
            Some((text(strings, &kv.key, kv.key_strindex), value))
        })
        .collect()
}

/// Value per stack (root first, `;`-joined) of every profile in a request.
fn stacks(r: &collector::ExportProfilesServiceRequest) -> BTreeMap<String, i64> {
    let d = r.dictionary.as_ref().unwrap();
    let mut out = BTreeMap::new();
    for p in r
        .resource_profiles
        .iter()
        .flat_map(|rp| &rp.scope_profiles)
        .flat_map(|sp| &sp.profiles)
    {
        for s in &p.samples {
            let stack = &d.stack_table[s.stack_index as usize];
            let names: Vec<String> = stack
                .location_indices
                .iter()
                .rev()
                .flat_map(|&l| &d.location_table[l as usize].lines)
                .map(|line| {
                    let f = &d.function_table[line.function_index as usize];
                    d.string_table[f.name_strindex as usize].clone()
                })
                .collect();
            *out.entry(names.join(";")).or_default() += s.values.iter().sum::<i64>();
        }
    }
    out
}

/// Sends a request to the collector, waits for proflow's file and checks it.
fn forward_and_check(exporter_type: &str, exporter: impl Fn(&Proflow, u16) -> String) {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let (proflow, http_port) = start_proflow();
    let otelcol = Otelcol::start(&bin, exporter_type, &exporter(&proflow, http_port));
    post_and_check(&proflow, &otelcol.url());
}

/// Posts a request to `url` (which leads to `proflow`), waits for proflow's
/// file and checks it against what was sent.
fn post_and_check(proflow: &Proflow, url: &str) {
    let service = peer_env::unique("proflow-otlp-in-");
    let sent = request(&service);
    let accepted = || {
        common::metric_sum(
            &proflow.metrics(),
            "proflow_receiver_accepted_profiles_total",
            &[("receiver", "otlp")],
        )
    };
    let accepted_before = accepted();
    let reply = http_client()
        .post(url)
        .header("content-type", "application/x-protobuf")
        .body(sent.encode_to_vec())
        .send()
        .unwrap();
    assert!(reply.status().is_success(), "{:?}", reply.text());
    proflow.wait_for_files(1, |e| e.label("service_name") == Some(&service));
    // Counted once everything accepted is written: a second copy would be
    // accepted and written too.
    let entries = common::written_entries(proflow, &service, Duration::from_secs(30));
    assert_eq!(entries.len(), 1, "one profile sent, one written");
    assert_eq!(
        accepted() - accepted_before,
        1.0,
        "one profile sent, one accepted"
    );
    let written = json::decode_request(&std::fs::read(&entries[0].path).unwrap()).unwrap();
    assert_eq!(stacks(&written), stacks(&sent), "functions and values");
    let attributes = resource_attributes(&written);
    assert_eq!(attributes.get("service.name"), Some(&service));
    assert_eq!(
        attributes.get("host.name").map(String::as_str),
        Some("box-1")
    );
    assert_eq!(entries[0].label("__name__"), Some("process_cpu"));
    assert_eq!(entries[0].label("host_name"), Some("box-1"));
}

/// The proflow half alone (no peer): what proflow's own OTLP/HTTP endpoint
/// takes is what its file exporter writes; a request that holds no profile
/// is answered 200 (as the Collector answers it) and counted.
#[test]
fn proflow_writes_what_its_otlp_receiver_took() {
    let (proflow, http_port) = start_proflow();
    let url = format!("http://127.0.0.1:{http_port}/v1development/profiles");
    post_and_check(&proflow, &url);
    let mut empty = request(&peer_env::unique("proflow-otlp-empty-"));
    empty.resource_profiles[0].scope_profiles[0]
        .profiles
        .clear();
    let reply = http_client()
        .post(&url)
        .header("content-type", "application/x-protobuf")
        .body(empty.encode_to_vec())
        .send()
        .unwrap();
    assert!(reply.status().is_success(), "{:?}", reply.text());
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_empty_requests_total",
            &[("receiver", "otlp"), ("format", "otlp_proto")]
        ),
        1.0,
        "a request of no profile is counted\n{metrics}"
    );
    assert!(
        proflow.log_text().contains("held no sample to store"),
        "and logged"
    );
}

#[test]
fn the_collectors_otlp_grpc_exporter_delivers_to_proflow() {
    forward_and_check("otlp_grpc", |proflow, _| {
        format!(
            "    endpoint: {}\n    tls: {{insecure: true}}\n",
            proflow.ports.receiver
        )
    });
}

#[test]
fn the_collectors_otlp_http_exporter_delivers_to_proflow() {
    forward_and_check("otlp_http", |_, http_port| {
        format!("    endpoint: http://127.0.0.1:{http_port}\n")
    });
}

// ---- TLS and tokens: the Collector as a client of a secured receiver -------

/// proflow's `otlp` receiver with TLS (certificates of `pki`) and a bearer
/// token file on both protocols, and the HTTP port it listens on (picked
/// for each attempt of the start).
fn start_secured_proflow(pki: &common::pki::Pki, tokens: &Path) -> (Proflow, u16) {
    let secured = format!(
        "tls: {}, auth: {{bearer_tokens_file: {}}}",
        pki.server_tls(false),
        tokens.display()
    );
    // Picked for each attempt of the start, as in `start_proflow`.
    let mut http_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        http_port = free_port();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}, {secured}}}\n      http: {{endpoint: 127.0.0.1:{http_port}, {secured}}}\nexporters:\n  file:\n    directory: {}\n    format: otlp_json\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    (proflow, http_port)
}

/// The collector's exporter body for a secured proflow: TLS with the test
/// CA, `token` as the bearer token.
fn secured_exporter(endpoint: &str, ca: &Path, token: &str) -> String {
    format!(
        "    endpoint: {endpoint}\n    tls: {{ca_file: {}}}\n    headers: {{authorization: \"Bearer {token}\"}}\n    retry_on_failure: {{enabled: false}}\n",
        ca.display()
    )
}

#[test]
fn the_collector_delivers_over_tls_with_a_token_and_is_refused_without_one() {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let pki = common::pki::Pki::new();
    let tokens = pki.dir.path().join("tokens");
    std::fs::write(&tokens, "collector-token\n").unwrap();
    let (proflow, http_port) = start_secured_proflow(&pki, &tokens);
    let ca = pki.file("ca.pem");
    let grpc_endpoint = format!("localhost:{}", proflow.ports.receiver.port());
    let http_endpoint = format!("https://localhost:{http_port}");
    // Both protocols, with the token: delivered and checked like the plain runs.
    for (ty, endpoint) in [("otlp_grpc", &grpc_endpoint), ("otlp_http", &http_endpoint)] {
        let otelcol = Otelcol::start(
            &bin,
            ty,
            &secured_exporter(endpoint, &ca, "collector-token"),
        );
        post_and_check(&proflow, &otelcol.url());
    }
    // A wrong token: refused (UNAUTHENTICATED / 401), counted, nothing written;
    // one protocol after the other, so each one's refusal is seen.
    let before = common::read_index(&proflow.profiles).len();
    let refused = || {
        common::metric_sum(
            &proflow.metrics(),
            "proflow_receiver_refused_requests_total",
            &[("reason", "unauthenticated")],
        )
    };
    // Kept running until proflow saw the refusal: their exporters send from a queue.
    let mut running = Vec::new();
    for (ty, endpoint) in [("otlp_grpc", &grpc_endpoint), ("otlp_http", &http_endpoint)] {
        let already = refused();
        let otelcol = Otelcol::start(&bin, ty, &secured_exporter(endpoint, &ca, "wrong"));
        let _ = http_client()
            .post(otelcol.url())
            .header("content-type", "application/x-protobuf")
            .body(request("refused-service").encode_to_vec())
            .send()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while refused() <= already {
            assert!(
                Instant::now() < deadline,
                "the collector's {ty} requests with a wrong token were not refused as unauthenticated ({already})\n{}",
                proflow.metrics()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        running.push(otelcol);
    }
    assert_eq!(common::read_index(&proflow.profiles).len(), before);
    drop(running);
}

/// proflow's only exporter stalls with a full queue (the default
/// `drop_newest`): what no exporter can take is refused with
/// `RESOURCE_EXHAUSTED` and `RetryInfo`, not answered OK and dropped, so
/// the real Collector's `otlp_grpc` exporter keeps it and sends it again;
/// once the exporter recovers, every request the Collector took arrives.
#[test]
fn the_collector_sends_again_what_a_stalled_proflow_refused() {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let service = peer_env::unique("proflow-stalled-");
    // Picked for each attempt of the start, as in `start_proflow`.
    let mut http_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        http_port = free_port();
        std::fs::create_dir_all(profiles).unwrap();
        // Where the exporter must create the service's directory, a file is in the way.
        std::fs::write(profiles.join(&service), b"in the way").unwrap();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}}}\n      http: {{endpoint: 127.0.0.1:{http_port}}}\nexporters:\n  file:\n    directory: {}\n    format: otlp_json\n    sending_queue: {{queue_size: 1, num_consumers: 1, wait_when_full: 100ms}}\n    retry_on_failure: {{initial_interval: 100ms, max_interval: 100ms, max_elapsed_time: 0s}}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    let otelcol = Otelcol::start(
        &bin,
        "otlp_grpc",
        &format!(
            "    endpoint: {}\n    tls: {{insecure: true}}\n    retry_on_failure: {{initial_interval: 200ms, max_interval: 1s, max_elapsed_time: 120s}}\n",
            proflow.ports.receiver
        ),
    );
    const N: usize = 4;
    let send = || {
        let reply = http_client()
            .post(otelcol.url())
            .header("content-type", "application/x-protobuf")
            .body(request(&service).encode_to_vec())
            .send()
            .unwrap();
        assert!(reply.status().is_success(), "{:?}", reply.text());
    };
    let wait_metric = |what: &str, metric: &str, labels: &[(&str, &str)]| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while common::metric_sum(&proflow.metrics(), metric, labels) < 1.0 {
            assert!(
                Instant::now() < deadline,
                "{what} never happened\n{}\ncollector:\n{}",
                proflow.log_text(),
                otelcol.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The first fills the stalled exporter's queue; the Collector's sends
    // after it find no exporter with room and are refused as retryable.
    send();
    wait_metric(
        "the first request queued",
        "proflow_exporter_queue_profiles",
        &[("exporter", "file")],
    );
    for _ in 1..N {
        send();
    }
    wait_metric(
        "a refusal of the Collector's send",
        "proflow_receiver_refused_requests_total",
        &[("receiver", "otlp"), ("reason", "backpressure")],
    );
    std::fs::remove_file(proflow.profiles.join(&service)).unwrap();
    proflow.wait_for_files(N, |e| e.label("service_name") == Some(&service));
    // Counted once everything accepted is written: a request the Collector
    // sent again after proflow took it would be a second copy here.
    let entries = common::written_entries(&proflow, &service, Duration::from_secs(60));
    assert_eq!(
        entries.len(),
        N,
        "every request the Collector took arrived once"
    );
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_accepted_profiles_total",
            &[("receiver", "otlp")]
        ),
        N as f64,
        "proflow accepted each of the Collector's {N} requests once\n{metrics}"
    );
    assert_eq!(
        common::metric_sum(&metrics, "proflow_exporter_dropped_profiles_total", &[]),
        0.0,
        "nothing answered OK was dropped\n{metrics}"
    );
}
