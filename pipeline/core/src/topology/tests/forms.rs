//! Forms: which exporter gets pprof or OTLP, converted once; what
//! processors see (metadata, plain bytes, spans).

use super::*;

#[tokio::test]
async fn one_span_taking_processor_serves_its_traces_and_profiles_pipelines() {
    let yaml = "receivers:\n  test: {key: sp-p}\n  test/spans: {key: sp-s, spans: true}\nprocessors:\n  filter: {spans: sp}\nexporters:\n  test: {key: sp-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles/a: {receivers: [test], processors: [filter], exporters: [test]}\n    profiles/b: {receivers: [test], processors: [filter], exporters: [test]}\n    traces: {receivers: [test/spans], processors: [filter]}\n    traces/2: {receivers: [test/spans], processors: [filter]}\n";
    let (running, _) = start(yaml).await;
    // Built once for all four pipelines.
    assert_eq!(record("sp-processor").built.load(Ordering::SeqCst), 1);
    let (takes_profiles, spans) = span_consumers()
        .lock()
        .unwrap()
        .get("sp-s")
        .cloned()
        .unwrap();
    assert!(!takes_profiles, "only in traces pipelines");
    let spans = spans.expect("a span consumer");
    let (takes_profiles, none) = span_consumers()
        .lock()
        .unwrap()
        .get("sp-p")
        .cloned()
        .unwrap();
    assert!(takes_profiles && none.is_none());
    let span = Span {
        trace_id: [1; 16],
        span_id: [2; 8],
        parent_span_id: [0; 8],
        name: "x".into(),
        service: Arc::from("s"),
        start_unix_nanos: 0,
        end_unix_nanos: 0,
    };
    spans.consume_spans(&[span.clone(), span]);
    // Two traces pipelines, one processor: each span reaches it once.
    assert_eq!(record("sp").delivered.load(Ordering::SeqCst), 2);
    running.shutdown().await;
}

fn otlp_envelope() -> Envelope {
    let mut e = envelope("yes");
    let o = e.payload.otlp().unwrap();
    e.payload = Payload::from_otlp(proflow_model::otlp::OtlpProfiles::new(
        o.dictionary.clone(),
        None,
        o.profiles.clone(),
        0,
    ));
    e
}

#[tokio::test]
async fn exporters_get_the_form_they_want_converted_once_and_counted() {
    // Two pipelines, three exporters: two want OTLP, one takes any form.
    let yaml = "receivers:\n  test: {key: fm}\nexporters:\n  test/o1: {key: fm-o1, behaviour: ok, wants: otlp}\n  test/o2: {key: fm-o2, behaviour: ok, wants: otlp}\n  test/any: {key: fm-any, behaviour: ok}\nservice:\n  pipelines:\n    profiles/a: {receivers: [test], exporters: [test/o1, test/any]}\n    profiles/b: {receivers: [test], exporters: [test/o2]}\n";
    let (running, t) = start(yaml).await;
    let e = envelope("yes");
    let arrived = e.payload.clone();
    consumer("fm")
        .consume(batch(vec![e]), Admission::Refuse)
        .await
        .unwrap();
    eventually("all three delivered", || {
        ["fm-o1", "fm-o2", "fm-any"]
            .iter()
            .all(|k| record(k).delivered.load(Ordering::SeqCst) == 1)
    })
    .await;
    let got = |k: &str| record(k).payloads.lock().unwrap()[0].clone();
    let (o1, o2, any) = (got("fm-o1"), got("fm-o2"), got("fm-any"));
    assert!(o1.has(Format::Otlp) && o2.has(Format::Otlp));
    assert!(
        Arc::ptr_eq(&o1.otlp().unwrap(), &o2.otlp().unwrap()),
        "one conversion shared by both pipelines"
    );
    assert_eq!(
        any.identity(),
        o1.identity(),
        "the converted payload goes to every exporter of the pipeline"
    );
    assert!(
        o1.size_bytes() > arrived.size_bytes(),
        "the queue counted both forms"
    );
    assert_eq!(
        o1.gzipped().unwrap().as_ptr(),
        arrived.gzipped().unwrap().as_ptr(),
        "the pprof bytes are the ones that arrived"
    );
    let text = t.render();
    assert!(
        text.contains("proflow_conversions_total{to=\"otlp\"} 1"),
        "{text}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn otlp_to_otlp_never_converts_and_pprof_to_pprof_never_decodes() {
    for (key, wants, e) in [
        ("pt-o", "otlp", otlp_envelope()),
        ("pt-p", "pprof", envelope("yes")),
    ] {
        let yaml = format!(
            "receivers:\n  test: {{key: {key}}}\nprocessors:\n  filter: {{}}\nexporters:\n  test: {{key: {key}-x, behaviour: ok, wants: {wants}}}\nservice:\n  pipelines:\n    profiles: {{receivers: [test], processors: [filter], exporters: [test]}}\n"
        );
        let (running, t) = start(&yaml).await;
        let arrived = e.payload.clone();
        consumer(key)
            .consume(batch(vec![e]), Admission::Refuse)
            .await
            .unwrap();
        eventually("delivered", || {
            record(&format!("{key}-x")).delivered.load(Ordering::SeqCst) == 1
        })
        .await;
        let got = record(&format!("{key}-x")).payloads.lock().unwrap()[0].clone();
        assert_eq!(
            got.identity(),
            arrived.identity(),
            "{wants}: the payload as it arrived"
        );
        assert!(!arrived.is_converted(), "{wants}: never converted");
        assert!(!arrived.is_decoded(), "{wants}: never decoded");
        assert!(
            !t.render().contains("proflow_conversions_total{"),
            "{wants}"
        );
        running.shutdown().await;
    }
}

#[tokio::test]
async fn processors_get_the_batch_meta_as_the_receiver_made_it() {
    let yaml = "receivers:\n  test: {key: meta}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: meta-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], processors: [filter], exporters: [test]}\n";
    let (running, _t) = start(yaml).await;
    for this_host in [true, false] {
        let meta = Arc::new(BatchMeta {
            receiver: "ebpf/x".into(),
            this_host,
            ..Default::default()
        });
        consumer("meta")
            .consume(Batch::new(vec![envelope("meta")], meta), Admission::Refuse)
            .await
            .unwrap();
    }
    eventually("delivered", || {
        record("meta-x").delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    for key in ["meta-ebpf/x-true", "meta-ebpf/x-false"] {
        assert_eq!(record(key).delivered.load(Ordering::SeqCst), 1, "{key}");
    }
    running.shutdown().await;
}

#[tokio::test]
async fn a_receivers_plain_bytes_reach_processors_and_no_queue() {
    let yaml = "receivers:\n  test: {key: pl}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: pl-p, behaviour: ok, wants: pprof}\n  test/o: {key: pl-o, behaviour: ok, wants: otlp}\nservice:\n  pipelines:\n    profiles: {receivers: [test], processors: [filter], exporters: [test, test/o]}\n";
    let (running, _t) = start(yaml).await;
    assert!(consumer("pl").reads_profiles(), "a processor reads them");
    let mut e = envelope("plain");
    let gzipped = e.payload.encoded().unwrap().bytes;
    let plain = proflow_model::pprof::decompress(&gzipped, 1 << 20).unwrap();
    e.payload = e.payload.with_plain(plain.clone());
    assert!(e.payload.has_plain());
    assert_eq!(e.payload.plain().unwrap(), plain);
    consumer("pl")
        .consume(batch(vec![e]), Admission::Refuse)
        .await
        .unwrap();
    for key in ["pl-p", "pl-o"] {
        eventually("delivered", || {
            record(key).delivered.load(Ordering::SeqCst) == 1
        })
        .await;
        let got = record(key).payloads.lock().unwrap()[0].clone();
        assert!(!got.has_plain(), "{key}: no queue keeps the plain bytes");
    }
    let pprof = record("pl-p").payloads.lock().unwrap()[0].clone();
    assert_eq!(
        pprof.encoded().unwrap().bytes,
        gzipped,
        "the bytes as they came"
    );
    assert_eq!(pprof.plain().unwrap(), plain, "inflated again when asked");
    assert_eq!(record("plain-seen").delivered.load(Ordering::SeqCst), 1);
    running.shutdown().await;
    // pprof exporters alone read nothing: receivers keep no plain bytes
    // for them; an OTLP exporter makes the pipeline convert (read) them.
    for (key, wants, reads) in [("pl2", "pprof", false), ("pl3", "otlp", true)] {
        let yaml = format!(
            "receivers:\n  test: {{key: {key}}}\nexporters:\n  test: {{key: {key}-x, behaviour: ok, wants: {wants}}}\nservice:\n  pipelines:\n    profiles: {{receivers: [test], exporters: [test]}}\n"
        );
        let (running, _t) = start(&yaml).await;
        assert_eq!(consumer(key).reads_profiles(), reads, "{wants}");
        running.shutdown().await;
    }
}
