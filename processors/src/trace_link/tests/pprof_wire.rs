//! The pprof side on its wire: labels read without allocating by what they
//! claim, the rewrite that keeps all but the labels, the bytes that go on
//! untouched, and the shortcut that skips the rewrite checked against
//! walking every sample.

use std::sync::Arc;

use bytes::Bytes;
use proflow_model::model::BatchMeta;
use proflow_model::pprof::{self, Label};
use proflow_model::testdata;

use super::*;

#[test]
fn hostile_labels_are_bounded_by_what_arrived() {
    // A huge label value is read as malformed without allocating by what it claims.
    let big = "f".repeat(1 << 20);
    let p = profile(&[("span_id", V::S(&big)), ("span id", V::S("-5"))], 1);
    let found = super::super::pprof::Wire::scan(pprof::encode(&p))
        .unwrap()
        .read()
        .unwrap();
    assert!(found[0].as_ref().unwrap().malformed);
}

#[tokio::test]
async fn the_rewrite_keeps_everything_but_the_labels() {
    let p = profile(&[("span_id", V::S(SPAN)), ("span id", V::S("7"))], 5);
    let s = fed(
        "output: [labels, trace_id_label]\nspan_index: {wait: 0s}\n",
        false,
    )
    .await;
    let out = s
        .processor
        .process(vec![pprof_envelope(&p)], &BatchMeta::default())
        .await;
    let q = out[0].payload.decoded().unwrap();
    assert_eq!(q.sample.len(), p.sample.len());
    for (a, b) in p.sample.iter().zip(&q.sample) {
        assert_eq!(a.location_id, b.location_id);
        assert_eq!(a.value, b.value);
    }
    assert_eq!(q.location, p.location);
    assert_eq!(q.function, p.function);
    assert_eq!(q.mapping, p.mapping);
    assert_eq!(q.sample_type, p.sample_type);
    assert_eq!(
        (q.time_nanos, q.duration_nanos, q.period),
        (p.time_nanos, p.duration_nanos, p.period)
    );
    // Old strings keep their indexes; new ones follow.
    assert_eq!(&q.string_table[..p.string_table.len()], &p.string_table[..]);
    let labels = &pprof_labels(&out[0].payload)[0];
    assert_eq!(labels.get("span id").map(String::as_str), Some("7"));
    assert_eq!(labels.get("span_id").map(String::as_str), Some(SPAN));
    assert_eq!(labels.get("trace_id").map(String::as_str), Some(TRACE));
    assert_eq!(labels.get("span_name").map(String::as_str), Some(NAME));
}

#[tokio::test]
async fn labels_already_in_normal_form_go_on_as_they_came() {
    // otel-profiling-go's own labels: nothing to write, the gzip bytes stay.
    let s = fed("output: [labels]\nspan_index: {wait: 0s}\n", false).await;
    let e = pprof_envelope(&profile(
        &[("span_id", V::S(SPAN)), ("span_name", V::S(NAME))],
        3,
    ));
    let before = e.payload.identity();
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    assert_eq!(out[0].payload.identity(), before);
    assert!(out[0].payload.encoded().unwrap().gzipped);
    assert_eq!(
        metric(
            &s.telemetry,
            "proflow_trace_link_samples_total{processor=\"trace_link\",result=\"linked\"}"
        ),
        Some(1.0)
    );
    // With the trace id to write too, it changes.
    let s = fed(
        "output: [labels, trace_id_label]\nspan_index: {wait: 0s}\n",
        false,
    )
    .await;
    let e = pprof_envelope(&profile(
        &[("span_id", V::S(SPAN)), ("span_name", V::S(NAME))],
        3,
    ));
    let before = e.payload.identity();
    let out = s.processor.process(vec![e], &BatchMeta::default()).await;
    assert_ne!(out[0].payload.identity(), before);
}

#[test]
fn hostile_profiles_naming_a_span_per_sample_stay_linear() {
    // 20,000 samples, each its own span: the per-label cache hashes past a few.
    let mut p = testdata::cpu_profile(20_000, 20);
    p.string_table.push("span_id".into());
    let key = p.string_table.len() as i64 - 1;
    for (i, s) in p.sample.iter_mut().enumerate() {
        p.string_table.push(format!("{:016x}", i + 1));
        s.label.push(Label {
            key,
            str: p.string_table.len() as i64 - 1,
            ..Label::default()
        });
    }
    super::super::ids::PROBES.with(|n| n.set(0));
    let found = super::super::pprof::Wire::scan(pprof::encode(&p))
        .unwrap()
        .read()
        .unwrap();
    assert_eq!(found.iter().flatten().count(), 20_000);
    // Linear: each sample's lookup compares at most the 16 keys a small
    // map scans before it hashes (a scan of every span seen so far would
    // be about 200 million).
    let probes = super::super::ids::PROBES.with(|n| n.get());
    assert!(probes <= 20_000 * 17, "{probes} keys compared or hashed");
}

/// The shortcut that tells from the read alone that a sample needs no
/// rewrite agrees with walking it, for every mix of correlation labels,
/// link, output and rule.
#[test]
fn the_no_rewrite_shortcut_agrees_with_walking_every_sample() {
    let labels: &[(&str, V)] = &[
        ("span_id", V::S(SPAN)),
        ("span_id", V::S("00F067AA0BA902B7")),
        ("span_id", V::S("0000000000000000")),
        ("span_id", V::S("f067aa0ba902b7")),
        ("span_id", V::S("not an id")),
        ("span_name", V::S(NAME)),
        ("span_name", V::S("")),
        ("trace_id", V::S(TRACE)),
        ("trace_id", V::S("00000000000000000000000000000000")),
        ("profile_id", V::S(SPAN)),
        ("local root span id", V::S("17")),
        ("span id", V::N(17)),
        // Numeric values of string keys: no text (string 0).
        ("trace_id", V::N(0)),
        ("span_id", V::N(5)),
    ];
    let names: [Option<Arc<str>>; 2] = [None, Some(Arc::from("from the index"))];
    let mut compared = 0;
    let mut skipped = 0;
    // Every pair (a label twice included) and every single label.
    let mut sets: Vec<Vec<(&str, V)>> = labels.iter().map(|l| vec![*l]).collect();
    for a in labels {
        for b in labels {
            sets.push(vec![*a, *b]);
        }
    }
    // A few of three: what otel-profiling-go v0.6+ sends, with a stray one.
    for c in labels {
        sets.push(vec![labels[0], labels[5], *c]);
    }
    let mut profiles = Vec::new();
    for set in &sets {
        let p = profile(set, 3);
        // The same, with every sample labelled alike, and with a profile
        // whose string 0 is not empty (the spec says it is; it is read as
        // empty either way).
        let mut shared = p.clone();
        let first = shared.sample[0].label.clone();
        for s in &mut shared.sample {
            s.label = first.clone();
        }
        let mut odd = p.clone();
        odd.string_table[0] = "0".to_owned();
        profiles.extend([(set, p), (set, shared), (set, odd)]);
    }
    for (set, p) in &profiles {
        let bytes = Bytes::from(pprof::encode(p).to_vec());
        let Some(wire) = super::super::pprof::Wire::scan(bytes) else {
            panic!("{set:?}: no correlation key found");
        };
        let Some(found) = wire.read() else {
            panic!("{set:?}: nothing read");
        };
        for root_only in [false, true] {
            for drop_after_link in [false, true] {
                let rules = Rules {
                    drop_after_link,
                    root_only,
                };
                for name in &names {
                    for trace in [None, Some(trace_bytes())] {
                        for linked in [false, true] {
                            let links: Vec<Option<Link>> = found
                                .iter()
                                .map(|f| {
                                    let f = f.as_ref()?;
                                    let span = f.span(root_only)?;
                                    linked.then(|| Link {
                                        span,
                                        trace: f.trace().or(trace),
                                        name: f.span_name.clone().or(name.clone()),
                                    })
                                })
                                .collect();
                            for bits in 0..8u8 {
                                let mode = super::super::pprof::Mode {
                                    labels: bits & 1 != 0,
                                    trace_label: bits & 2 != 0,
                                    link_labels: bits & 4 != 0,
                                };
                                let run = |shortcut| {
                                    super::super::pprof::write_samples(
                                        &wire, &links, &found, &rules, mode, shortcut,
                                    )
                                    .map(|w| match w {
                                        super::super::pprof::Written::Same => None,
                                        super::super::pprof::Written::New(b) => Some(b),
                                    })
                                };
                                let (fast, walked) = (run(true), run(false));
                                assert_eq!(
                                    fast, walked,
                                    "{set:?} {mode:?} root_only={root_only} drop={drop_after_link} name={name:?} trace={trace:?} linked={linked}"
                                );
                                compared += 1;
                                if walked == Some(None)
                                    && mode.labels
                                    && !mode.trace_label
                                    && !mode.link_labels
                                    && !drop_after_link
                                {
                                    skipped += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert!(compared > 100_000, "{compared}");
    assert!(skipped > 100, "the shortcut's cases were met: {skipped}");
}
