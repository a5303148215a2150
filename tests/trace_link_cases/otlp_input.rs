//! `trace_link` on OTLP input: a real OTLP producer, the official Python
//! classes (`opentelemetry-proto`, `tests/peers/apps/otlp-python/send.py
//! --trace-link`), POSTs spans to proflow's `otlp` receiver (`/v1/traces`,
//! a `traces` pipeline feeding the span index), then one OTLP CPU profile
//! (`/v1development/profiles`) whose samples name those spans by a
//! `span_id` sample attribute only (no trace id, no link). After
//! `trace_link` the `otlp` exporter sends to the real OpenTelemetry
//! Collector, whose file output must hold every sample sent, with its
//! value: each that names an indexed span linked to exactly that span's
//! trace id (an upper-case `span_id` too), and the one naming a span never
//! sent and the one naming none without a link.

use std::collections::BTreeMap;
use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::process::Command;
use std::time::Duration;

use proflow_model::otlp::json;

use super::{READ_BACK_TIMEOUT, hex};
use crate::{common, peer_env};

/// `n` random hex digits (n a multiple of 16), never all zeros.
fn random_hex(n: usize) -> String {
    (0..n / 16)
        .map(|i| format!("{:016x}", RandomState::new().hash_one(i) | 1))
        .collect()
}

/// One sample of the collector's output: function, value, and the trace
/// and span ids of its link (`None`: no link).
type Sample = (String, i64, Option<(String, String)>);

/// The samples of `app`'s CPU profiles in the collector's file output.
fn collected_samples(file: &str, app: &str) -> Vec<Sample> {
    let mut out = Vec::new();
    let Ok(all) = std::fs::read_to_string(file) else {
        return out;
    };
    for line in all.lines().filter(|l| l.contains(app)) {
        let Ok(request) = json::decode_request(line.as_bytes()) else {
            continue;
        };
        let Some(dict) = request.dictionary.as_ref() else {
            continue;
        };
        let string = |i: i32| dict.string_table.get(i as usize).map_or("", String::as_str);
        for p in request
            .resource_profiles
            .iter()
            .flat_map(|rp| &rp.scope_profiles)
            .flat_map(|sp| &sp.profiles)
        {
            for s in &p.samples {
                let function = dict
                    .stack_table
                    .get(s.stack_index as usize)
                    .and_then(|st| st.location_indices.first())
                    .and_then(|&l| dict.location_table.get(l as usize))
                    .and_then(|l| l.lines.first())
                    .and_then(|line| dict.function_table.get(line.function_index as usize))
                    .map_or("", |f| string(f.name_strindex));
                let link = (s.link_index != 0).then(|| {
                    let l = &dict.link_table[s.link_index as usize];
                    (hex(&l.trace_id), hex(&l.span_id))
                });
                out.push((function.to_owned(), s.values.iter().sum(), link));
            }
        }
    }
    out.sort();
    out
}

#[test]
fn otlp_profiles_from_the_python_classes_are_linked_to_the_traces_of_their_spans() {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let Some(python) = common::otlp_python_client() else {
        return;
    };
    let collector = otelcol.var("ENDPOINT").to_owned();
    let proflow = common::Proflow::start(|ports, _| {
        let grpc = common::free_port();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: 127.0.0.1:{grpc}}}\n      http: {{endpoint: {receiver}}}\n\
             processors:\n  trace_link:\n    output: [otlp_links, labels]\n    span_index: {{window: 5m, max_spans: 100000, wait: 1s}}\n\
             exporters:\n  otlp:\n    protocol: grpc\n    endpoint: {collector}\n    tls: {{insecure: true}}\n\
             service:\n  telemetry:\n    address: {telemetry}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      processors: [trace_link]\n      exporters: [otlp]\n    traces:\n      receivers: [otlp]\n      processors: [trace_link]\n",
            receiver = ports.receiver,
            telemetry = ports.telemetry,
        )
    });

    // Three spans in two traces (two spans of one trace); each sample names
    // one by its span id alone.
    let traces = [random_hex(32), random_hex(32)];
    let spans: Vec<(String, String, &str)> = [
        (&traces[0], "checkout"),
        (&traces[0], "charge"),
        (&traces[1], "search"),
    ]
    .into_iter()
    .map(|(t, name)| (t.clone(), random_hex(16), name))
    .collect();
    let unknown_span = random_hex(16);
    // function, value (ns), the span id its `span_id` attribute names.
    let samples: Vec<(&str, i64, Option<String>)> = vec![
        ("checkout_a", 30_000_000, Some(spans[0].1.clone())),
        ("checkout_b", 20_000_000, Some(spans[0].1.clone())),
        ("charge", 50_000_000, Some(spans[1].1.clone())),
        // Upper-case hex: the same span in another spelling.
        ("search", 70_000_000, Some(spans[2].1.to_uppercase())),
        ("never_sent", 40_000_000, Some(unknown_span.clone())),
        ("no_span", 10_000_000, None),
    ];
    let spec = serde_json::json!({
        "spans": spans.iter().map(|(t, s, n)| serde_json::json!({"trace_id": t, "span_id": s, "name": n})).collect::<Vec<_>>(),
        "samples": samples.iter().map(|(f, v, s)| serde_json::json!({"function": f, "value": v, "span_id": s})).collect::<Vec<_>>(),
    });
    let spec_path = proflow.dir.path().join("trace-link.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let app = common::unique_name("trace-link-otlp");
    let (status, output) = common::run_bounded(
        Command::new(&python)
            .arg(common::peers_dir().join("apps/otlp-python/send.py"))
            .arg("--url")
            .arg(format!(
                "http://{}/v1development/profiles",
                proflow.ports.receiver
            ))
            .arg("--traces-url")
            .arg(format!("http://{}/v1/traces", proflow.ports.receiver))
            .arg("--tag")
            .arg(&app)
            .arg("--out")
            .arg(proflow.dir.path().join("sent.pb"))
            .arg("--trace-link")
            .arg(&spec_path),
        &proflow.dir.path().join("send.log"),
        Duration::from_secs(60),
    );
    assert!(status.success(), "send.py failed ({status}):\n{output}");

    // What the collector must hold: every sample sent with its value, those
    // naming a span sent linked to that span (lower case) in its trace.
    let trace_of: BTreeMap<&str, &str> = spans
        .iter()
        .map(|(t, s, _)| (s.as_str(), t.as_str()))
        .collect();
    let mut expected: Vec<Sample> = samples
        .iter()
        .map(|(f, v, s)| {
            let link = s.as_ref().and_then(|s| {
                let s = s.to_lowercase();
                trace_of.get(s.as_str()).map(|t| (t.to_string(), s.clone()))
            });
            (format!("{app}.{f}"), *v, link)
        })
        .collect();
    expected.sort();

    let file = otelcol.var("FILE_PATH").to_owned();
    let mut got = Vec::new();
    let settled = peer_env::poll(READ_BACK_TIMEOUT, || {
        got = collected_samples(&file, &app);
        (got.len() >= expected.len()).then_some(())
    });
    assert!(
        settled.is_some(),
        "the collector's output for {app} has {} of the {} samples sent: {got:?}\nproflow log:\n{}",
        got.len(),
        expected.len(),
        proflow.log_text()
    );
    assert_eq!(
        got, expected,
        "samples at the collector (left) and as sent, linked to the traces of the spans sent (right)"
    );

    let metrics = proflow.metrics();
    let count =
        |metric: &str, result: &str| common::metric_sum(&metrics, metric, &[("result", result)]);
    let linked = expected.iter().filter(|s| s.2.is_some()).count() as f64;
    assert_eq!(
        (
            count("proflow_trace_link_samples_total", "linked"),
            count("proflow_trace_link_samples_total", "no_trace_id"),
            count("proflow_trace_link_samples_total", "malformed"),
            common::metric_sum(&metrics, "proflow_trace_link_spans_indexed_total", &[]),
        ),
        (linked, 1.0, 0.0, spans.len() as f64),
        "samples linked, left without a trace (the span never sent), malformed; spans indexed\n{metrics}"
    );
    eprintln!(
        "collector: {} samples, {linked} linked to {} spans in {} traces",
        got.len(),
        spans.len(),
        traces.len()
    );
}
