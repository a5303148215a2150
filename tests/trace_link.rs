//! The `trace_link` processor end to end with real clients and backends.
//!
//! `gotrace` (tests/peers/apps/gotrace: pyroscope-go, otel-profiling-go
//! v0.5.3 and the OpenTelemetry Go SDK, all from the module proxy) runs
//! root spans that burn CPU. It pushes its CPU profiles to proflow's
//! `pprof_push` receiver (samples labelled with the root span's `span_id` and
//! `span_name`, no trace id) and exports its spans over OTLP gRPC to
//! proflow's `otlp` receiver, which feeds them to the span index of the same
//! `trace_link` processor through a `traces` pipeline. After `trace_link`:
//! - the `otlp` exporter sends to the real OpenTelemetry Collector; in its
//!   file output, the samples of the hot spans carry links whose trace ids
//!   are exactly the trace ids the SDK exported for those spans;
//! - the `file` exporter's pprof keeps the `span_id` and `span_name` labels
//!   and gets no `trace_id` label (`output` lists `otlp_links` and `labels`,
//!   not `trace_id_label`, so the trace ids found in the index go only into
//!   the OTLP links);
//! - the `pyroscope` exporter sends to the real Pyroscope, which still finds
//!   the span labels it expects: `SelectMergeSpanProfile` by span id returns
//!   the hot function.

mod common;
#[allow(clippy::duplicate_mod)]
mod peer_env;
mod readback;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use proflow_pipeline::otlp::{json, proto};

const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);
const CPU_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// One span the SDK exported, as gotrace wrote it.
#[derive(Debug, Clone)]
struct Exported {
    trace_id: String,
    name: String,
}

fn read_spans(path: &Path) -> HashMap<String, Exported> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let fields: BTreeMap<&str, &str> =
                line.split(' ').filter_map(|f| f.split_once('=')).collect();
            Some((
                fields.get("span_id")?.to_string(),
                Exported {
                    trace_id: fields.get("trace_id")?.to_string(),
                    name: fields.get("name")?.to_string(),
                },
            ))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Every (trace id, span id) of a sample link in the collector's file
/// output for `app`, with the CPU value of the samples carrying it, and the
/// value of the samples without a link.
fn collector_links(file: &str, app: &str) -> (BTreeMap<(String, String), i64>, i64) {
    let mut links = BTreeMap::new();
    let mut unlinked = 0;
    let Ok(all) = std::fs::read_to_string(file) else {
        return (links, unlinked);
    };
    for line in all.lines().filter(|l| l.contains(app)) {
        let Ok(request) = json::decode_request(line.as_bytes()) else {
            continue;
        };
        let Some(dict) = request.dictionary.as_ref() else {
            continue;
        };
        let cpu = |p: &proto::Profile| {
            p.sample_type.as_ref().is_some_and(|t| {
                dict.string_table
                    .get(t.type_strindex as usize)
                    .map(String::as_str)
                    == Some("cpu")
            })
        };
        for p in request
            .resource_profiles
            .iter()
            .flat_map(|rp| &rp.scope_profiles)
            .flat_map(|sp| &sp.profiles)
            .filter(|p| cpu(p))
        {
            for s in &p.samples {
                let value: i64 = s.values.iter().sum();
                if s.link_index == 0 {
                    unlinked += value;
                    continue;
                }
                let l = &dict.link_table[s.link_index as usize];
                *links
                    .entry((hex(&l.trace_id), hex(&l.span_id)))
                    .or_default() += value;
            }
        }
    }
    (links, unlinked)
}

/// Runs gotrace as `app` for 6 s against `proflow` (profiles to its
/// `pprof_push` receiver, spans to its OTLP receiver on `otlp_port`); checks
/// it reported no failure and exported at least 10 `hot-request` spans.
/// Returns the spans it exported and the span ids of the `hot-request`
/// ones.
fn run_gotrace(
    gotrace: &Path,
    proflow: &common::Proflow,
    otlp_port: u16,
    app: &str,
) -> (HashMap<String, Exported>, HashSet<String>) {
    let spans_out = proflow.dir.path().join("spans.txt");
    let log = proflow.dir.path().join("gotrace.log");
    let (status, output) = common::run_bounded(
        Command::new(gotrace)
            .arg("-server")
            .arg(format!("http://{}", proflow.ports.receiver))
            .arg("-otlp")
            .arg(format!("127.0.0.1:{otlp_port}"))
            .arg("-app")
            .arg(app)
            .arg("-upload-rate")
            .arg("1s")
            .arg("-duration")
            .arg("6s")
            .arg("-spans-out")
            .arg(&spans_out),
        &log,
        Duration::from_secs(60),
    );
    assert!(status.success(), "gotrace: {status}\n{output}");
    assert!(
        !output.contains("failed"),
        "gotrace reported failures:\n{output}\nproflow log:\n{}",
        proflow.log_text()
    );
    let exported = read_spans(&spans_out);
    let hot: HashSet<String> = exported
        .iter()
        .filter(|(_, e)| e.name == "hot-request")
        .map(|(s, _)| s.clone())
        .collect();
    assert!(
        hot.len() >= 10,
        "gotrace exported {} hot-request spans:\n{output}",
        hot.len()
    );
    (exported, hot)
}

#[test]
fn a_pyroscope_instrumented_go_service_reaches_an_otlp_backend_linked_to_its_traces() {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some(gotrace) = peer_env::go_app("gotrace") else {
        return;
    };
    let collector = otelcol.var("ENDPOINT").to_owned();
    let pyroscope_base = pyroscope.http_base();
    // Picked for each attempt of the start, so a retry after a port was
    // taken gets a fresh one for the OTLP receiver too.
    let mut otlp_port = 0;
    let proflow = common::Proflow::start(|ports, profiles| {
        otlp_port = common::free_port();
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {receiver}\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{otlp_port}\n\
             processors:\n  trace_link:\n    output: [otlp_links, labels]\n    span_index: {{window: 5m, max_spans: 100000, wait: 3s}}\n\
             exporters:\n  file:\n    directory: {profiles}\n  otlp:\n    protocol: grpc\n    endpoint: {collector}\n    tls: {{insecure: true}}\n  pyroscope:\n    endpoint: {pyroscope_base}\n\
             service:\n  telemetry:\n    address: {telemetry}\n    log_level: info\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      processors: [trace_link]\n      exporters: [file, otlp, pyroscope]\n    traces:\n      receivers: [otlp]\n      processors: [trace_link]\n",
            receiver = ports.receiver,
            profiles = profiles.display(),
            telemetry = ports.telemetry,
        )
    });
    let app = common::unique_name("gotrace");
    let (exported, hot) = run_gotrace(&gotrace, &proflow, otlp_port, &app);
    let hot: HashSet<&String> = hot.iter().collect();

    let links = check_collector(&otelcol, &app, &exported, &hot, &proflow);

    // The file exporter's pprof: Pyroscope's labels, normalized (no
    // `trace_id` label: `trace_id_label` is not in the output).
    let mut checked = 0;
    for entry in common::read_index(&proflow.profiles) {
        if entry.label("service_name") != Some(app.as_str()) {
            continue;
        }
        let p = common::read_profile(&entry.path);
        let s = |i: i64| p.string_table[i as usize].as_str();
        for sample in &p.sample {
            let labels: BTreeMap<&str, &str> =
                sample.label.iter().map(|l| (s(l.key), s(l.str))).collect();
            assert_eq!(labels.get("trace_id"), None, "{labels:?}");
            let Some(span) = labels.get("span_id") else {
                continue;
            };
            // A root span (see above), named as the SDK exported it.
            let name = exported[*span].name.as_str();
            assert!(
                ["hot-request", "idle-request"].contains(&name),
                "{labels:?}"
            );
            assert_eq!(labels.get("span_name"), Some(&name));
            checked += 1;
        }
    }
    assert!(checked > 0, "no sample of the files has a span_id label");

    check_pyroscope(&pyroscope_base, &app, &links, &hot);
}

/// `examples/trace-link.yaml` as a user copies it (its listening addresses
/// moved to free ports; `OTLP_BACKEND` and `PYROSCOPE_URL` naming the real
/// Collector and Pyroscope): gotrace's profiles reach the Collector linked to
/// the traces it exported, and Pyroscope with the span labels it reads.
#[test]
fn the_trace_link_example_links_gotraces_profiles_to_its_traces() {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some(gotrace) = peer_env::go_app("gotrace") else {
        return;
    };
    let pyroscope_base = pyroscope.http_base();
    let mut otlp_port = 0;
    let proflow = common::Proflow::start_with_env(&["run"], |ports, _| {
        otlp_port = common::free_port();
        let yaml = common::example_config(
            "trace-link.yaml",
            &[
                (
                    "endpoint: 0.0.0.0:4040",
                    &format!("endpoint: {}", ports.receiver),
                ),
                (
                    "endpoint: 0.0.0.0:4317",
                    &format!("endpoint: 127.0.0.1:{otlp_port}"),
                ),
                (
                    "address: 127.0.0.1:8888",
                    &format!("address: {}", ports.telemetry),
                ),
            ],
        );
        let env = [
            ("OTLP_BACKEND", otelcol.endpoint()),
            ("PYROSCOPE_URL", pyroscope_base.as_str()),
        ];
        (
            yaml,
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    });
    let app = common::unique_name("gotrace-example");
    let (exported, hot) = run_gotrace(&gotrace, &proflow, otlp_port, &app);
    let hot: HashSet<&String> = hot.iter().collect();
    let links = check_collector(&otelcol, &app, &exported, &hot, &proflow);
    check_pyroscope(&pyroscope_base, &app, &links, &hot);
}

/// The collector's output for `app`: every link is a (trace, span) the SDK
/// exported, and most of the hot spans' CPU arrived linked; proflow's
/// metrics count the linked samples and the spans indexed. Returns the
/// links with the CPU of their samples.
fn check_collector(
    otelcol: &peer_env::Peer,
    app: &str,
    exported: &HashMap<String, Exported>,
    hot: &HashSet<&String>,
    proflow: &common::Proflow,
) -> BTreeMap<(String, String), i64> {
    let file = otelcol.var("FILE_PATH").to_owned();
    let mut last = (BTreeMap::new(), 0);
    let settled = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = collector_links(&file, app);
        let linked_hot = last.0.keys().filter(|(_, s)| hot.contains(s)).count();
        (linked_hot * 2 >= hot.len()).then_some(())
    });
    let (links, unlinked) = &last;
    assert!(
        settled.is_some(),
        "the collector's output for {app} links {} of {} hot spans: {links:?}\nproflow log:\n{}",
        links.keys().filter(|(_, s)| hot.contains(s)).count(),
        hot.len(),
        proflow.log_text()
    );
    for (trace, span) in links.keys() {
        let e = exported
            .get(span)
            .unwrap_or_else(|| panic!("link to span {span}, which the SDK never exported"));
        assert_eq!(
            &e.trace_id, trace,
            "span {span} ({}) linked to the wrong trace",
            e.name
        );
        // A root span: hot-request, or idle-request (its span's own work,
        // starting, sleeping and ending, is sometimes sampled); never
        // hot-child.
        assert!(
            ["hot-request", "idle-request"].contains(&e.name.as_str()),
            "only root spans are labelled by otel-profiling-go, not {}",
            e.name
        );
    }
    let linked: i64 = links.values().sum();
    assert!(
        linked * 10 >= (linked + unlinked) * 6,
        "only {linked} of {} CPU nanoseconds arrived linked",
        linked + unlinked
    );
    let metrics = proflow.metrics();
    let samples_linked = common::metric_sum(
        &metrics,
        "proflow_trace_link_samples_total",
        &[("result", "linked")],
    );
    let spans_indexed = common::metric_sum(&metrics, "proflow_trace_link_spans_indexed_total", &[]);
    assert!(
        samples_linked > 0.0 && spans_indexed >= exported.len() as f64,
        "{metrics}"
    );
    eprintln!(
        "collector: {} of {} hot spans linked, {linked} ns linked, {unlinked} ns unlinked; {spans_indexed} spans indexed",
        links.keys().filter(|(_, s)| hot.contains(s)).count(),
        hot.len()
    );
    last.0
}

/// Pyroscope at `pyroscope_base`: its span profiles find the hot function
/// of `app` by the ids of the hot spans that were linked, and no
/// `trace_id` label reached it.
fn check_pyroscope(
    pyroscope_base: &str,
    app: &str,
    links: &BTreeMap<(String, String), i64>,
    hot: &HashSet<&String>,
) {
    let spans: Vec<String> = links
        .keys()
        .filter(|(_, s)| hot.contains(s))
        .map(|(_, s)| s.clone())
        .collect();
    let http = common::http_client();
    let selector = format!("{{service_name=\"{app}\"}}");
    let mut last = Err(String::from("not asked yet"));
    let found = peer_env::poll(READ_BACK_TIMEOUT, || {
        last = readback::pyroscope_span_totals(
            &http,
            pyroscope_base,
            &selector,
            CPU_TYPE,
            &spans,
            &["main.goSpanHot"],
        );
        last.as_ref()
            .ok()
            .filter(|t| t.get("main.goSpanHot").is_some_and(|v| *v > 0))
            .cloned()
    });
    assert!(
        found.is_some(),
        "Pyroscope's SelectMergeSpanProfile for {} spans of {app}: {last:?}",
        spans.len()
    );
    eprintln!("pyroscope span profile: {found:?}");
    // Pyroscope makes every sample label but `span_id` a series label: no
    // `trace_id` label may reach it (one series per trace).
    let now_ms = peer_env::now_nanos() / 1_000_000;
    let names: serde_json::Value = http
        .post(format!("{pyroscope_base}/querier.v1.QuerierService/LabelNames"))
        .header("Content-Type", "application/json")
        .body(
            serde_json::json!({"matchers": [selector], "start": now_ms - 3_600_000, "end": now_ms + 60_000})
                .to_string(),
        )
        .send()
        .and_then(|r| r.text())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .expect("Pyroscope's LabelNames");
    let names: Vec<&str> = names["names"]
        .as_array()
        .map(|a| a.iter().filter_map(|n| n.as_str()).collect())
        .unwrap_or_default();
    assert!(names.contains(&"service_name"), "{names:?}");
    assert!(!names.contains(&"trace_id"), "{names:?}");
}
