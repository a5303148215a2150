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
//!   file output every link names a span the SDK exported, with exactly the
//!   trace id it exported that span in; every `hot-request` is linked; every
//!   sample in `goSpanHot` or `goChildHot` is linked to its `hot-request`,
//!   the two functions splitting their CPU 10:3 as the program's work does;
//!   no sample that names a span goes unlinked (the index's `wait` covers
//!   spans exported after the profile that sampled them), so what is left
//!   unlinked is the program's CPU outside any span, at most 10%;
//! - the `file` exporter's pprof keeps the `span_id` and `span_name` labels
//!   and gets no `trace_id` label (`output` lists `otlp_links` and `labels`,
//!   not `trace_id_label`, so the trace ids found in the index go only into
//!   the OTLP links); each span's CPU in it is exactly the CPU linked to that
//!   span at the collector, and the collector has all of its CPU;
//! - the `pyroscope` exporter sends to the real Pyroscope, which still finds
//!   the span labels it expects: `SelectMergeSpanProfile` for the hot spans
//!   returns the CPU of `goSpanHot` and `goChildHot` the collector got
//!   (within 1%).
//!
//! `otlp_input` (tests/trace_link_cases/otlp_input.rs): OTLP profiles from
//! the official Python classes, linked through spans sent over OTLP/HTTP.

mod common;
#[path = "trace_link_cases/otlp_input.rs"]
mod otlp_input;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use proflow_model::otlp::{json, proto};

const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);
const CPU_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";
/// gotrace's functions in a `hot-request`: 30,000 units of work in
/// `goSpanHot`, then 9,000 in `goChildHot` (in the child span, labelled
/// with the root span).
const HOT_FUNCTIONS: [&str; 2] = ["main.goSpanHot", "main.goChildHot"];
/// `goSpanHot`'s share (percent) of the CPU of both: 30 / 39.
const SPAN_HOT_SHARE: f64 = 100.0 * 30.0 / 39.0;
/// How far (percentage points) a run's share may be from [`SPAN_HOT_SHARE`].
const SHARE_BAND: f64 = 10.0;
/// At most this share (percent) of gotrace's CPU may be outside any span
/// (its loop, the span and profile exporters, the runtime).
const MAX_UNLINKED_SHARE: f64 = 10.0;

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

/// Each line of the collector's file output naming `app`, one per line:
/// its profiles' sample type, samples and time (shown when a profile is
/// missing, to see which one).
fn describe_lines(file: &str, app: &str) -> String {
    let Ok(all) = std::fs::read_to_string(file) else {
        return format!("{file} cannot be read");
    };
    let mut out = format!(
        "{} lines in {file}; those naming {app}:\n",
        all.lines().count()
    );
    for (n, line) in all.lines().enumerate().filter(|(_, l)| l.contains(app)) {
        let Ok(request) = json::decode_request(line.as_bytes()) else {
            out.push_str(&format!(
                "  line {n}: {} bytes, not a request\n",
                line.len()
            ));
            continue;
        };
        let strings = request
            .dictionary
            .as_ref()
            .map(|d| d.string_table.clone())
            .unwrap_or_default();
        let profiles: Vec<String> = request
            .resource_profiles
            .iter()
            .flat_map(|rp| &rp.scope_profiles)
            .flat_map(|sp| &sp.profiles)
            .map(|p| {
                let kind = p
                    .sample_type
                    .as_ref()
                    .and_then(|t| strings.get(t.type_strindex as usize))
                    .map_or("?", String::as_str);
                format!(
                    "{kind}: {} samples at {} for {} ns",
                    p.samples.len(),
                    p.time_unix_nano,
                    p.duration_nano
                )
            })
            .collect();
        out.push_str(&format!("  line {n}: {profiles:?}\n"));
    }
    out
}

/// What the collector's file output holds for one service: its CPU
/// profiles' samples (nanoseconds).
#[derive(Debug, Default)]
struct Collected {
    /// How many CPU profiles.
    profiles: usize,
    /// How many lines naming the app were not a request the decoder reads,
    /// and how many requests naming it had no dictionary (shown when a
    /// profile is missing).
    unread_lines: usize,
    /// Per (trace id, span id) of a sample link, the CPU of the samples
    /// carrying it.
    links: BTreeMap<(String, String), i64>,
    /// Of the samples without a link.
    unlinked: i64,
    /// Of the samples without a link that carry a `span_id` attribute.
    unlinked_labelled: i64,
    /// Per function of [`HOT_FUNCTIONS`], of the samples whose stack holds it.
    functions: common::Totals,
    /// Of the samples in [`HOT_FUNCTIONS`], per span id linked (`None`:
    /// no link).
    functions_by_span: BTreeMap<Option<String>, i64>,
}

impl Collected {
    fn linked(&self) -> i64 {
        self.links.values().sum()
    }

    /// The CPU linked to each span id.
    fn by_span(&self) -> BTreeMap<String, i64> {
        let mut by_span = BTreeMap::new();
        for ((_, span), value) in &self.links {
            *by_span.entry(span.clone()).or_default() += value;
        }
        by_span
    }
}

/// Reads the collector's file output for `app`.
fn collected(file: &str, app: &str) -> Collected {
    let mut c = Collected::default();
    let Ok(all) = std::fs::read_to_string(file) else {
        return c;
    };
    for line in all.lines().filter(|l| l.contains(app)) {
        let Ok(request) = json::decode_request(line.as_bytes()) else {
            c.unread_lines += 1;
            continue;
        };
        let Some(dict) = request.dictionary.as_ref() else {
            c.unread_lines += 1;
            continue;
        };
        let string = |i: i32| dict.string_table.get(i as usize).map(String::as_str);
        let cpu = |p: &proto::Profile| {
            p.sample_type
                .as_ref()
                .is_some_and(|t| string(t.type_strindex) == Some("cpu"))
        };
        // The function names of a stack, leaf first.
        let frames = |stack: i32| -> Vec<&str> {
            dict.stack_table
                .get(stack as usize)
                .into_iter()
                .flat_map(|s| &s.location_indices)
                .filter_map(|&l| dict.location_table.get(l as usize))
                .flat_map(|l| &l.lines)
                .filter_map(|line| dict.function_table.get(line.function_index as usize))
                .filter_map(|f| string(f.name_strindex))
                .collect()
        };
        for p in request
            .resource_profiles
            .iter()
            .flat_map(|rp| &rp.scope_profiles)
            .flat_map(|sp| &sp.profiles)
            .filter(|p| cpu(p))
        {
            c.profiles += 1;
            for s in &p.samples {
                let value: i64 = s.values.iter().sum();
                let span = (s.link_index != 0).then(|| {
                    let l = &dict.link_table[s.link_index as usize];
                    let (trace, span) = (hex(&l.trace_id), hex(&l.span_id));
                    *c.links.entry((trace, span.clone())).or_default() += value;
                    span
                });
                if span.is_none() {
                    c.unlinked += value;
                    let labelled = s.attribute_indices.iter().any(|&a| {
                        dict.attribute_table
                            .get(a as usize)
                            .is_some_and(|a| string(a.key_strindex) == Some("span_id"))
                    });
                    if labelled {
                        c.unlinked_labelled += value;
                    }
                }
                let frames = frames(s.stack_index);
                let mut in_hot = false;
                for f in HOT_FUNCTIONS {
                    if frames.contains(&f) {
                        *c.functions.entry(f.to_owned()).or_default() += value;
                        in_hot = true;
                    }
                }
                if in_hot {
                    *c.functions_by_span.entry(span).or_default() += value;
                }
            }
        }
    }
    c
}

/// The CPU (nanoseconds, sample type `cpu`) of the samples the `file`
/// exporter wrote for one service.
#[derive(Debug, Default)]
struct Filed {
    /// Of every sample.
    total: i64,
    /// Per `span_id` label, of the samples carrying it.
    by_span: BTreeMap<String, i64>,
    /// How many samples carry a `span_id` label.
    labelled_samples: usize,
}

/// Reads the profiles the `file` exporter wrote for `app` once it wrote
/// every profile accepted, and checks their labels: no `trace_id` label
/// (`trace_id_label` is not in the output); a `span_id` names a root span
/// the SDK exported, with its `span_name`.
fn filed(proflow: &common::Proflow, app: &str, exported: &HashMap<String, Exported>) -> Filed {
    let mut filed = Filed::default();
    for entry in common::written_entries(proflow, app, Duration::from_secs(30)) {
        let p = common::read_profile(&entry.path);
        let s = |i: i64| p.string_table[i as usize].as_str();
        let cpu = p
            .sample_type
            .iter()
            .position(|t| s(t.r#type) == "cpu")
            .unwrap_or_else(|| panic!("{} has no cpu sample type", entry.path.display()));
        for sample in &p.sample {
            let value = sample.value[cpu];
            filed.total += value;
            let labels: BTreeMap<&str, &str> =
                sample.label.iter().map(|l| (s(l.key), s(l.str))).collect();
            assert_eq!(labels.get("trace_id"), None, "{labels:?}");
            let Some(span) = labels.get("span_id") else {
                continue;
            };
            // A root span: hot-request, or idle-request (its span's own
            // work, starting, sleeping and ending, is sometimes sampled);
            // never hot-child. Named as the SDK exported it.
            let name = exported
                .get(*span)
                .unwrap_or_else(|| panic!("label of span {span}, which the SDK never exported"))
                .name
                .as_str();
            assert!(
                ["hot-request", "idle-request"].contains(&name),
                "{labels:?}"
            );
            assert_eq!(labels.get("span_name"), Some(&name));
            *filed.by_span.entry(span.to_string()).or_default() += value;
            filed.labelled_samples += 1;
        }
    }
    assert!(
        filed.labelled_samples > 0,
        "no sample of the files has a span_id label"
    );
    filed
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

    let filed = filed(&proflow, &app, &exported);
    let collected = check_collector(&otelcol, &app, &exported, &hot, &proflow);

    // The file exporter's pprof and the collector hold the same CPU, each
    // span's linked at the collector exactly as labelled in the pprof.
    assert_eq!(
        collected.linked() + collected.unlinked,
        filed.total,
        "the collector's CPU for {app} (left) and the file exporter's (right)"
    );
    assert_eq!(
        collected.by_span(),
        filed.by_span,
        "the CPU linked to each span (left) and labelled with it (right)"
    );
    let samples_linked = common::metric_sum(
        &proflow.metrics(),
        "proflow_trace_link_samples_total",
        &[("result", "linked")],
    );
    assert_eq!(
        samples_linked, filed.labelled_samples as f64,
        "samples counted linked, and labelled in the files"
    );

    check_pyroscope(&pyroscope_base, &app, &collected, &hot);
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
    let collected = check_collector(&otelcol, &app, &exported, &hot, &proflow);
    check_pyroscope(&pyroscope_base, &app, &collected, &hot);
}

/// The collector's own metrics of what its receiver took and its exporters
/// sent (`otelcol_receiver_*`, `otelcol_exporter_*`, in samples), for a
/// failure message.
fn collector_counts(otelcol: &peer_env::Peer) -> String {
    let url = format!("http://{}/metrics", otelcol.var("METRICS_ENDPOINT"));
    match common::http_client()
        .get(&url)
        .send()
        .and_then(|r| r.text())
    {
        Ok(text) => text
            .lines()
            .filter(|l| l.starts_with("otelcol_receiver_") || l.starts_with("otelcol_exporter_"))
            .collect::<Vec<_>>()
            .join("\n"),
        Err(e) => format!("{url}: {e}"),
    }
}

/// The collector's output for `app`, once it has as many CPU profiles as
/// proflow accepted: every link names a root span the SDK exported, in the
/// trace it exported it in; every hot span is linked, and every sample in
/// [`HOT_FUNCTIONS`] linked to a hot span, the functions' CPU split as the
/// work is; no sample naming a span is unlinked, and at most
/// [`MAX_UNLINKED_SHARE`] of the CPU is; proflow's metrics count no sample
/// left without its trace, no wait for a span in vain, and every span
/// indexed.
fn check_collector(
    otelcol: &peer_env::Peer,
    app: &str,
    exported: &HashMap<String, Exported>,
    hot: &HashSet<&String>,
    proflow: &common::Proflow,
) -> Collected {
    let file = otelcol.var("FILE_PATH").to_owned();
    let mut c = Collected::default();
    let mut accepted = 0.0;
    let settled = peer_env::poll(READ_BACK_TIMEOUT, || {
        accepted = common::metric_sum(
            &proflow.metrics(),
            "proflow_receiver_accepted_profiles_total",
            &[],
        );
        c = collected(&file, app);
        (accepted > 0.0 && c.profiles as f64 >= accepted).then_some(())
    });
    assert!(
        settled.is_some(),
        "the collector's output for {app} has {} CPU profiles of the {accepted} proflow accepted: {c:?}\n{}\nthe collector's own counts (of every test's profiles: did it take them all, did its file exporter write them?):\n{}\nproflow's exporter metrics (did it send them all?):\n{}\nproflow log:\n{}",
        c.profiles,
        describe_lines(&file, app),
        collector_counts(otelcol),
        proflow
            .metrics()
            .lines()
            .filter(|l| l.starts_with("proflow_exporter_")
                || l.starts_with("proflow_receiver_accepted"))
            .collect::<Vec<_>>()
            .join("\n"),
        proflow.log_text()
    );
    for (trace, span) in c.links.keys() {
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
    let by_span = c.by_span();
    let not_linked: Vec<&&String> = hot.iter().filter(|s| !by_span.contains_key(**s)).collect();
    assert!(
        not_linked.is_empty(),
        "{} of the {} hot-request spans have no linked CPU (each did 39,000 units of work): {not_linked:?}",
        not_linked.len(),
        hot.len()
    );
    // goSpanHot and goChildHot run inside hot-request only.
    assert!(
        c.functions_by_span
            .keys()
            .all(|s| s.as_ref().is_some_and(|s| hot.contains(s))),
        "CPU of {HOT_FUNCTIONS:?} per span linked (None: unlinked), where every sample should be linked to a hot-request: {:?}",
        c.functions_by_span
    );
    let (span_hot, child_hot) = (
        c.functions.get(HOT_FUNCTIONS[0]).copied().unwrap_or(0),
        c.functions.get(HOT_FUNCTIONS[1]).copied().unwrap_or(0),
    );
    let share = 100.0 * span_hot as f64 / (span_hot + child_hot).max(1) as f64;
    assert!(
        (SPAN_HOT_SHARE - SHARE_BAND..=SPAN_HOT_SHARE + SHARE_BAND).contains(&share),
        "goSpanHot has {share:.1}% of the CPU of goSpanHot and goChildHot ({:?}), want {SPAN_HOT_SHARE:.1}% ± {SHARE_BAND}",
        c.functions
    );
    let linked = c.linked();
    let total = linked + c.unlinked;
    assert_eq!(
        c.unlinked_labelled, 0,
        "CPU of samples that name a span but got no link (of {total})"
    );
    let unlinked_share = 100.0 * c.unlinked as f64 / total.max(1) as f64;
    assert!(
        unlinked_share <= MAX_UNLINKED_SHARE,
        "{} of {total} CPU nanoseconds ({unlinked_share:.1}%) are outside any span",
        c.unlinked
    );
    let metrics = proflow.metrics();
    let count =
        |metric: &str, result: &str| common::metric_sum(&metrics, metric, &[("result", result)]);
    let spans_indexed = common::metric_sum(&metrics, "proflow_trace_link_spans_indexed_total", &[]);
    assert!(
        count("proflow_trace_link_samples_total", "linked") > 0.0
            && count("proflow_trace_link_samples_total", "no_trace_id") == 0.0
            && count("proflow_trace_link_samples_total", "malformed") == 0.0
            && count("proflow_trace_link_waits_total", "timed_out") == 0.0
            && spans_indexed >= exported.len() as f64,
        "{} spans exported:\n{metrics}",
        exported.len()
    );
    let per_hot: Vec<i64> = hot.iter().map(|s| by_span[*s]).collect();
    eprintln!(
        "collector: {} CPU profiles, {} spans linked, all {} hot; {linked} ns linked, {} ns unlinked ({unlinked_share:.1}%); CPU per hot span {} to {} ns; {:?} ({share:.1}% goSpanHot); {spans_indexed} spans indexed",
        c.profiles,
        by_span.len(),
        hot.len(),
        c.unlinked,
        per_hot.iter().min().unwrap_or(&0),
        per_hot.iter().max().unwrap_or(&0),
        c.functions,
    );
    c
}

/// Pyroscope at `pyroscope_base`: its span profile of `app`'s hot spans
/// holds the CPU of [`HOT_FUNCTIONS`] the collector got (within 1%), and no
/// `trace_id` label reached it.
fn check_pyroscope(pyroscope_base: &str, app: &str, collected: &Collected, hot: &HashSet<&String>) {
    let spans: Vec<String> = hot.iter().map(|s| s.to_string()).collect();
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
            &HOT_FUNCTIONS,
        );
        last.as_ref()
            .ok()
            .filter(|t| common::totals_close(t, &collected.functions))
            .cloned()
    });
    assert!(
        found.is_some(),
        "Pyroscope's SelectMergeSpanProfile for {} spans of {app}: {last:?}, the collector got {:?}",
        spans.len(),
        collected.functions
    );
    eprintln!(
        "pyroscope span profile: {found:?}, collector: {:?}",
        collected.functions
    );
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
