//! The processor on every id convention in the field, into every output and
//! back, and the span index's bounds as the processor meets them.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload};
use proflow_model::otlp::common::any_value::Value;
use proflow_model::pprof::{self, Label, Profile};
use proflow_model::spans::Span;
use proflow_model::testdata;

use super::ids::hex;
use super::*;

mod pprof_wire;

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN: &str = "00f067aa0ba902b7";
const ROOT: &str = "0000000000000011";
const NAME: &str = "GET /checkout";

fn trace_bytes() -> [u8; 16] {
    match ids::hex_id::<16>(TRACE) {
        ids::Parsed::Id(t) => t,
        _ => unreachable!(),
    }
}

fn span_bytes(hex: &str) -> [u8; 8] {
    match ids::hex_id::<8>(hex) {
        ids::Parsed::Id(s) => s,
        _ => unreachable!(),
    }
}

#[derive(Debug, Clone, Copy)]
enum V<'a> {
    S(&'a str),
    N(i64),
}

/// A profile of `n` samples (the first two with one stack), sample 0
/// labelled with `labels`, the others with a `thread` label only.
fn profile(labels: &[(&str, V)], n: usize) -> Profile {
    let mut p = testdata::cpu_profile(n, 20);
    let first = p.sample[0].location_id.clone();
    if n > 1 {
        p.sample[1].location_id = first;
    }
    let intern = |p: &mut Profile, s: &str| -> i64 {
        p.string_table.push(s.to_owned());
        p.string_table.len() as i64 - 1
    };
    for (k, v) in labels {
        let key = intern(&mut p, k);
        let label = match v {
            V::S(s) => Label {
                key,
                str: intern(&mut p, s),
                ..Label::default()
            },
            V::N(n) => Label {
                key,
                num: *n,
                ..Label::default()
            },
        };
        p.sample[0].label.push(label);
    }
    for i in 1..n {
        let key = intern(&mut p, "thread");
        let str = intern(&mut p, "main");
        p.sample[i].label.push(Label {
            key,
            str,
            ..Label::default()
        });
    }
    p
}

fn envelope(payload: Payload) -> Envelope {
    Envelope {
        labels: Labels::from_pairs([("service_name", "checkout")]),
        start_unix_nanos: 0,
        end_unix_nanos: 0,
        sample_types: Vec::new(),
        period_type: None,
        period: 0,
        payload,
    }
}

fn pprof_envelope(p: &Profile) -> Envelope {
    envelope(Payload::from_bytes(
        pprof::gzip(&pprof::encode(p)),
        pprof::DEFAULT_MAX_DECOMPRESSED,
    ))
}

/// The OTLP form of `p`, as a receiver would hold it (one payload).
fn otlp_envelope(p: &Profile) -> Envelope {
    let mut dict = potlp::DictionaryBuilder::new();
    let profiles = potlp::pprof_to_otlp(p, &mut dict, &mut Lost::default()).unwrap();
    envelope(Payload::from_otlp(OtlpProfiles::decoded(
        dict.finish(),
        profiles,
    )))
}

struct Setup {
    processor: TraceLinkProcessor,
    telemetry: Arc<Telemetry>,
}

fn processor(yaml: &str, make_otlp: bool) -> Setup {
    let config: TraceLinkProcessorConfig = serde_saphyr::from_str(yaml).unwrap();
    assert!(config.problems().is_empty(), "{:?}", config.problems());
    let telemetry = Arc::new(Telemetry::new());
    let processor = TraceLinkProcessor::new(
        &config,
        make_otlp,
        Some(&telemetry),
        super::TraceLinkTelemetry::new(&telemetry, "trace_link"),
    );
    Setup {
        processor,
        telemetry,
    }
}

fn metric(t: &Telemetry, line_start: &str) -> Option<f64> {
    t.render()
        .lines()
        .find(|l| l.starts_with(line_start))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// Each sample's string labels (numeric ones as decimal) of the pprof form.
fn pprof_labels(payload: &Payload) -> Vec<BTreeMap<String, String>> {
    let p = payload.decoded().unwrap();
    let s = |i: i64| p.string_table[i as usize].clone();
    p.sample
        .iter()
        .map(|x| {
            x.label
                .iter()
                .map(|l| {
                    let v = if l.str != 0 {
                        s(l.str)
                    } else {
                        l.num.to_string()
                    };
                    (s(l.key), v)
                })
                .collect()
        })
        .collect()
}

/// Each sample's link (hex) and string attributes, in the OTLP form the
/// payload holds (no conversion: `None` when it has none).
#[allow(clippy::type_complexity)]
fn otlp_samples(
    payload: &Payload,
) -> Option<Vec<(Option<(String, String)>, BTreeMap<String, String>)>> {
    if !payload.has(Format::Otlp) {
        return None;
    }
    let o = payload.otlp().unwrap();
    let d = o.dictionary.decoded().unwrap();
    let mut out = Vec::new();
    // The first profile (sample types share samples).
    let p = o.profiles[0].decoded().unwrap();
    for s in &p.samples {
        let link = (s.link_index != 0).then(|| {
            let l = &d.link_table[s.link_index as usize];
            (hex(&l.trace_id), hex(&l.span_id))
        });
        let attrs = s
            .attribute_indices
            .iter()
            .map(|&a| {
                let a = &d.attribute_table[a as usize];
                let v = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(Value::StringValue(s)) => s.clone(),
                    Some(Value::IntValue(n)) => n.to_string(),
                    _ => String::new(),
                };
                (d.string_table[a.key_strindex as usize].clone(), v)
            })
            .collect();
        out.push((link, attrs));
    }
    Some(out)
}

/// The spans the index must know for the conventions that name no trace.
fn index_spans() -> Vec<Span> {
    [SPAN, ROOT]
        .iter()
        .map(|s| Span {
            trace_id: trace_bytes(),
            span_id: span_bytes(s),
            parent_span_id: [0; 8],
            name: NAME.to_owned(),
            service: Arc::from("checkout"),
            start_unix_nanos: 1,
            end_unix_nanos: 2,
        })
        .collect()
}

/// Every convention in the field, as sample 0 of a profile, and whether
/// it names the trace itself.
fn conventions() -> Vec<(&'static str, Envelope)> {
    let dd_span = u64::from_str_radix(SPAN, 16).unwrap().to_string();
    let dd_root = u64::from_str_radix(ROOT, 16).unwrap().to_string();
    let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
    let dd_span = leak(dd_span);
    let dd_root = leak(dd_root);
    vec![
        (
            "pyroscope otel-profiling-go v0.5 (span only)",
            pprof_envelope(&profile(
                &[("span_id", V::S(SPAN)), ("span_name", V::S(NAME))],
                3,
            )),
        ),
        (
            "otel-profiling-go v0.6+ (trace id too)",
            pprof_envelope(&profile(
                &[
                    ("span_id", V::S(SPAN)),
                    ("span_name", V::S(NAME)),
                    ("trace_id", V::S(TRACE)),
                ],
                3,
            )),
        ),
        (
            "upper-case hex",
            pprof_envelope(&profile(
                &[
                    ("span_id", V::S(leak(SPAN.to_uppercase()))),
                    ("trace_id", V::S(leak(TRACE.to_uppercase()))),
                ],
                3,
            )),
        ),
        (
            "pyroscope profile_id",
            pprof_envelope(&profile(&[("profile_id", V::S(SPAN))], 3)),
        ),
        (
            "datadog decimal",
            pprof_envelope(&profile(
                &[
                    ("span id", V::S(dd_span)),
                    ("local root span id", V::S(dd_root)),
                ],
                3,
            )),
        ),
        (
            "datadog numeric",
            pprof_envelope(&profile(
                &[("span id", V::N(i64::from_be_bytes(span_bytes(SPAN))))],
                3,
            )),
        ),
        (
            "otlp link",
            otlp_envelope(&profile(
                &[("trace_id", V::S(TRACE)), ("span_id", V::S(SPAN))],
                3,
            )),
        ),
        (
            "otlp attributes (span only)",
            otlp_envelope(&profile(&[("span_id", V::S(SPAN))], 3)),
        ),
    ]
}

async fn fed(yaml: &str, make_otlp: bool) -> Setup {
    let s = processor(yaml, make_otlp);
    let consumer = s.processor.span_consumer().expect("an index");
    consumer.consume_spans(&index_spans());
    s
}

/// The ids the payload carries in the form `output` writes.
fn ids_of(payload: &Payload, output: Output) -> (Option<String>, Option<String>, Option<String>) {
    match output {
        Output::OtlpLinks => {
            let samples = otlp_samples(payload).expect("an OTLP form");
            let (link, attrs) = &samples[0];
            let (t, s) = link.clone().unzip();
            (t, s, attrs.get("span_name").cloned())
        }
        Output::Labels | Output::TraceIdLabel => {
            let labels = &pprof_labels(payload)[0];
            (
                labels.get("trace_id").cloned(),
                labels.get("span_id").cloned(),
                labels.get("span_name").cloned(),
            )
        }
    }
}

fn output_name(o: Output) -> &'static str {
    match o {
        Output::OtlpLinks => "otlp_links",
        Output::Labels => "labels",
        Output::TraceIdLabel => "trace_id_label",
    }
}

#[tokio::test]
async fn every_convention_converts_to_every_output_and_back() {
    let span = Some(SPAN.to_owned());
    let trace = Some(TRACE.to_owned());
    for output in [Output::OtlpLinks, Output::Labels, Output::TraceIdLabel] {
        let name = output_name(output);
        let yaml = format!("output: [{name}]\nspan_index: {{wait: 0s}}\n");
        for (convention, e) in conventions() {
            let s = fed(&yaml, true).await;
            let out = s.processor.process(vec![e], &BatchMeta::default()).await;
            assert_eq!(out.len(), 1);
            let (t, sp, n) = ids_of(&out[0].payload, output);
            assert_eq!(sp, span, "{convention} → {name}: the span");
            if output != Output::Labels {
                assert_eq!(t, trace, "{convention} → {name}: the trace");
            }
            if output == Output::Labels || convention.contains("v0.") {
                assert_eq!(
                    n.as_deref(),
                    Some(NAME),
                    "{convention} → {name}: the span name"
                );
            }
            // The other samples are untouched and not merged into sample 0.
            assert_eq!(
                pprof_labels(&out[0].payload).len(),
                3,
                "{convention} → {name}"
            );
            assert_eq!(
                metric(
                    &s.telemetry,
                    "proflow_trace_link_samples_total{processor=\"trace_link\",result=\"linked\"}"
                ),
                // OTLP holds one profile per sample type, each with its samples.
                Some(if convention.starts_with("otlp") {
                    2.0
                } else {
                    1.0
                }),
                "{convention} → {name}"
            );

            // And back: what goes on the wire in that output's form, read
            // afresh into another output. Pyroscope's labels name no trace,
            // so from them only the index gives it back.
            let wire = match output {
                Output::OtlpLinks => Payload::from_otlp((*out[0].payload.otlp().unwrap()).clone()),
                _ => Payload::from_bytes(
                    out[0].payload.encoded().unwrap().bytes,
                    pprof::DEFAULT_MAX_DECOMPRESSED,
                ),
            };
            let (back_output, back) = match output {
                Output::OtlpLinks => (
                    Output::TraceIdLabel,
                    processor("output: [trace_id_label]\n", true),
                ),
                Output::Labels => (
                    Output::OtlpLinks,
                    fed("output: [otlp_links]\nspan_index: {wait: 0s}\n", true).await,
                ),
                Output::TraceIdLabel => {
                    (Output::OtlpLinks, processor("output: [otlp_links]\n", true))
                }
            };
            let again = back
                .processor
                .process(vec![envelope(wire)], &BatchMeta::default())
                .await;
            let (t, sp, _) = ids_of(&again[0].payload, back_output);
            assert_eq!(
                (t, sp),
                (trace.clone(), span.clone()),
                "{convention} → {name} → {}",
                output_name(back_output)
            );
        }
    }
}

#[tokio::test]
async fn without_the_index_span_only_samples_stay_unlinked_and_are_counted() {
    let s = processor("output: [otlp_links, labels]\n", true);
    let e = pprof_envelope(&profile(
        &[("span_id", V::S(SPAN)), ("span_name", V::S(NAME))],
        2,
    ));
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    let labels = &pprof_labels(&out[0].payload)[0];
    assert_eq!(labels.get("span_id").map(String::as_str), Some(SPAN));
    assert_eq!(labels.get("trace_id"), None);
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_samples_total{processor=\"trace_link\",result=\"no_trace_id\"}"
        ),
        Some(1.0)
    );
    // No link to make: the pipeline's own conversion makes the OTLP form.
    assert!(!out[0].payload.has(Format::Otlp));
}

#[tokio::test]
async fn samples_of_one_stack_in_different_spans_stay_apart() {
    let mut p = profile(&[("span_id", V::S(SPAN)), ("trace_id", V::S(TRACE))], 2);
    // Sample 1: the same stack, another span.
    p.sample[1].label.clear();
    for (k, v) in [("span_id", ROOT), ("trace_id", TRACE)] {
        p.string_table.push(k.into());
        p.string_table.push(v.into());
        let n = p.string_table.len() as i64;
        p.sample[1].label.push(Label {
            key: n - 2,
            str: n - 1,
            ..Label::default()
        });
    }
    assert_eq!(p.sample[0].location_id, p.sample[1].location_id);
    let s = processor(
        "output: [otlp_links]\ndrop_span_labels_after_link: true\n",
        true,
    );
    let out = s
        .processor
        .process(vec![pprof_envelope(&p)], &BatchMeta::default())
        .await;
    let samples = otlp_samples(&out[0].payload).unwrap();
    assert_eq!(samples.len(), 2, "{samples:?}");
    assert_eq!(samples[0].0, Some((TRACE.to_owned(), SPAN.to_owned())));
    assert_eq!(samples[1].0, Some((TRACE.to_owned(), ROOT.to_owned())));
    // Dropped after link: no span attributes in OTLP, no span labels in pprof.
    assert!(samples.iter().all(|(_, a)| a.is_empty()), "{samples:?}");
    let labels = pprof_labels(&out[0].payload);
    assert_eq!(labels.len(), 2);
    assert!(labels.iter().all(|l| l.is_empty()), "{labels:?}");
}

#[tokio::test]
async fn malformed_ids_are_counted_and_left_alone_and_zero_ids_dropped() {
    let s = processor("output: [labels]\n", false);
    let e = pprof_envelope(&profile(&[("span_id", V::S("not-an-id"))], 2));
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    assert_eq!(
        pprof_labels(&out[0].payload)[0]
            .get("span_id")
            .map(String::as_str),
        Some("not-an-id")
    );
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_samples_total{processor=\"trace_link\",result=\"malformed\"}"
        ),
        Some(1.0)
    );

    let e = pprof_envelope(&profile(
        &[
            ("span_id", V::S("0000000000000000")),
            ("trace_id", V::S(TRACE)),
        ],
        2,
    ));
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    let labels = &pprof_labels(&out[0].payload)[0];
    assert_eq!(labels.get("span_id"), None, "{labels:?}");

    // An OTLP link of the wrong length is malformed too.
    let mut e = otlp_envelope(&profile(
        &[("trace_id", V::S(TRACE)), ("span_id", V::S(SPAN))],
        2,
    ));
    let o = e.payload.otlp().unwrap();
    let mut d = o.dictionary.decoded().unwrap().into_owned();
    d.link_table[1].span_id.truncate(3);
    e.payload = Payload::from_otlp(OtlpProfiles::new(
        Arc::new(potlp::SharedDictionary::from_decoded(d)),
        None,
        o.profiles.clone(),
        0,
    ));
    let s = processor("output: [otlp_links]\n", false);
    s.processor.process(vec![e], &BatchMeta::default()).await;
    // One sample in each of the two OTLP profiles (one per sample type).
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_samples_total{processor=\"trace_link\",result=\"malformed\"}"
        ),
        Some(2.0)
    );
}

#[tokio::test]
async fn root_spans_only_keeps_the_local_root() {
    let dd_span = u64::from_str_radix(SPAN, 16).unwrap().to_string();
    let dd_root = u64::from_str_radix(ROOT, 16).unwrap().to_string();
    let s = fed(
        "output: [labels, trace_id_label]\nroot_spans_only: true\nspan_index: {wait: 0s}\n",
        false,
    )
    .await;
    let e = pprof_envelope(&profile(
        &[
            ("span id", V::S(&dd_span)),
            ("local root span id", V::S(&dd_root)),
        ],
        2,
    ));
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    let labels = &pprof_labels(&out[0].payload)[0];
    assert_eq!(labels.get("span_id").map(String::as_str), Some(ROOT));
    assert_eq!(labels.get("trace_id").map(String::as_str), Some(TRACE));
}

#[tokio::test]
async fn profiles_without_correlation_go_on_as_they_came() {
    let s = processor("output: [otlp_links, labels]\n", true);
    let e = pprof_envelope(&testdata::cpu_profile(10, 10));
    let before = e.payload.identity();
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    assert_eq!(out[0].payload.identity(), before);
    let e = otlp_envelope(&testdata::cpu_profile(10, 10));
    let before = e.payload.identity();
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    assert_eq!(out[0].payload.identity(), before);
}

// On tokio's paused clock: the waits are measured in the runtime's own
// time, which a loaded machine cannot stretch.
#[tokio::test(start_paused = true)]
async fn a_span_that_arrives_late_is_waited_for_and_one_that_never_does_is_not() {
    let s = processor(
        "output: [labels, trace_id_label]\nspan_index: {wait: 5s}\n",
        false,
    );
    let consumer = s.processor.span_consumer().unwrap();
    let e = pprof_envelope(&profile(&[("span_id", V::S(SPAN))], 2));
    let late = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(200)).await;
        consumer.consume_spans(&index_spans());
    });
    let started = tokio::time::Instant::now();
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    late.await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        pprof_labels(&out[0].payload)[0]
            .get("trace_id")
            .map(String::as_str),
        Some(TRACE)
    );
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_waits_total{processor=\"trace_link\",result=\"found\"}"
        ),
        Some(1.0)
    );

    let s = processor(
        "output: [labels, trace_id_label]\nspan_index: {wait: 300ms}\n",
        false,
    );
    let _ = s.processor.span_consumer();
    let e = pprof_envelope(&profile(&[("span_id", V::S("0123456789abcdef"))], 2));
    let started = tokio::time::Instant::now();
    let out = s
        .processor
        .process(vec![e.clone()], &BatchMeta::default())
        .await;
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(pprof_labels(&out[0].payload)[0].get("trace_id"), None);
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_waits_total{processor=\"trace_link\",result=\"timed_out\"}"
        ),
        Some(1.0)
    );
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_samples_total{processor=\"trace_link\",result=\"no_trace_id\"}"
        ),
        Some(1.0)
    );
    // A span waited for in vain is not waited for again.
    let started = tokio::time::Instant::now();
    s.processor.process(vec![e], &BatchMeta::default()).await;
    assert!(
        started.elapsed() < Duration::from_millis(250),
        "{:?}",
        started.elapsed()
    );
}

// On tokio's paused clock: the waits are measured in the runtime's own
// time, which a loaded machine cannot stretch.
#[tokio::test(start_paused = true)]
async fn an_index_nobody_feeds_is_never_waited_for() {
    let s = processor("output: [labels]\nspan_index: {wait: 10s}\n", false);
    let e = pprof_envelope(&profile(&[("span_id", V::S(SPAN))], 2));
    let started = tokio::time::Instant::now();
    s.processor.process(vec![e], &BatchMeta::default()).await;
    assert!(started.elapsed() < Duration::from_secs(1));
}

#[tokio::test]
async fn otlp_payloads_of_one_request_share_the_new_dictionary() {
    // Two payloads cut from one request share a dictionary.
    let p = profile(&[("span_id", V::S(SPAN))], 2);
    let mut dict = potlp::DictionaryBuilder::new();
    let profiles = potlp::pprof_to_otlp(&p, &mut dict, &mut Lost::default()).unwrap();
    let shared = Arc::new(potlp::SharedDictionary::from_decoded(dict.finish()));
    let make = || {
        envelope(Payload::from_otlp(OtlpProfiles::new(
            shared.clone(),
            None,
            profiles
                .iter()
                .cloned()
                .map(ProfileData::from_decoded)
                .collect(),
            0,
        )))
    };
    let s = fed(
        "output: [otlp_links, labels]\nspan_index: {wait: 0s}\n",
        true,
    )
    .await;
    let out = s
        .processor
        .process(vec![make(), make()], &BatchMeta::default())
        .await;
    let a = out[0].payload.otlp().unwrap();
    let b = out[1].payload.otlp().unwrap();
    assert!(Arc::ptr_eq(&a.dictionary, &b.dictionary));
    assert!(!Arc::ptr_eq(&a.dictionary, &shared));
    for e in &out {
        let samples = otlp_samples(&e.payload).unwrap();
        assert_eq!(samples[0].0, Some((TRACE.to_owned(), SPAN.to_owned())));
        assert_eq!(
            samples[0].1.get("span_name").map(String::as_str),
            Some(NAME)
        );
        assert_eq!(samples[1].0, None);
    }
}

#[test]
fn config_problems_are_all_reported() {
    let config: TraceLinkProcessorConfig = serde_saphyr::from_str(
        "output: [labels, labels]\nspan_index: {window: 0s, max_spans: 0, wait: 1h}\n",
    )
    .unwrap();
    let paths: Vec<String> = config.problems().into_iter().map(|p| p.path).collect();
    assert_eq!(
        paths,
        [
            "output.1",
            "span_index.window",
            "span_index.max_spans",
            "span_index.wait"
        ]
    );
    assert!(serde_saphyr::from_str::<TraceLinkProcessorConfig>("output: [spans]\n").is_err());
    assert!(serde_saphyr::from_str::<TraceLinkProcessorConfig>("outputs: [labels]\n").is_err());
    let defaults: TraceLinkProcessorConfig = serde_saphyr::from_str("{}").unwrap();
    assert_eq!(defaults.output, [Output::OtlpLinks, Output::Labels]);
    assert!(defaults.span_index.is_none());
    assert!(!ProcessorConfig::takes_spans(&defaults));
}

// On tokio's paused clock: the waits are measured in the runtime's own
// time, which a loaded machine cannot stretch.
#[tokio::test(start_paused = true)]
async fn spans_only_the_index_would_name_are_not_waited_for() {
    // The sample names its trace; only the span's name is missing.
    let s = processor("output: [labels]\nspan_index: {wait: 10s}\n", false);
    let _ = s.processor.span_consumer();
    let e = pprof_envelope(&profile(
        &[("span_id", V::S(SPAN)), ("trace_id", V::S(TRACE))],
        2,
    ));
    let started = tokio::time::Instant::now();
    s.processor.process(vec![e], &BatchMeta::default()).await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
}
