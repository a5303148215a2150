//! Planning: what a config is checked for (every problem, with lines),
//! what is built, claims that conflict, traces pipelines' shape.

use super::*;

#[test]
fn traces_pipelines_feed_span_taking_processors_and_export_nothing() {
    let yaml = "receivers:\n  test: {key: tp}\n  test/spans: {key: tp-s, spans: true}\nprocessors:\n  filter: {}\n  filter/idx: {spans: tp}\nexporters:\n  test: {key: tp-x, behaviour: ok}\nservice:\n  pipelines:\n    traces:\n      receivers: [test, test/spans]\n      processors: [filter, filter/idx]\n      exporters: [test]\n    traces/none: {receivers: [test/spans]}\n    profiles: {receivers: [test], exporters: [test]}\n";
    let doc = Document::parse_with_env(yaml, &|_| None).unwrap();
    let text = plan(&doc, &registry()).unwrap_err().to_string();
    for want in [
        "receiver `test` takes no traces; in a traces pipeline use an otlp receiver",
        "processor `filter` takes no spans",
        "pipeline `traces` lists exporters, but proflow exports no traces",
        "pipeline `traces/none` needs a processor to feed",
    ] {
        assert!(text.contains(want), "{want}: {text}");
    }
    let bad_id = Document::parse_with_env(
        "receivers:\n  test: {key: a}\nexporters:\n  test: {key: b}\nservice:\n  pipelines:\n    logs: {receivers: [test], exporters: [test]}\n",
        &|_| None,
    )
    .unwrap_err()
    .to_string();
    assert!(
        bad_id.contains("write `profiles` or `profiles/<name>` (or `traces`"),
        "{bad_id}"
    );
    let fed_only = "receivers:\n  test: {key: a}\n  test/spans: {key: b, spans: true}\nprocessors:\n  filter/idx: {spans: w}\nexporters:\n  test: {key: c, behaviour: ok}\nservice:\n  pipelines:\n    traces: {receivers: [test/spans], processors: [filter/idx]}\n    profiles: {receivers: [test], exporters: [test]}\n";
    let p = plan(
        &Document::parse_with_env(fed_only, &|_| None).unwrap(),
        &registry(),
    )
    .unwrap();
    assert!(
        p.warnings
            .iter()
            .any(|w| w
                .contains("processor `filter/idx` is fed spans but is in no profiles pipeline")),
        "{:?}",
        p.warnings
    );
}

#[test]
fn plan_reports_every_problem_with_lines_and_warns_unused() {
    let yaml = "receivers:\n  test: {key: a, endpoint: '127.0.0.1:9'}\n  test/2: {key: b, endpoint: '127.0.0.1:9'}\n  test/3: {key: c, endpoint: nowhere}\n  nosuch: {}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: d, behaviour: ok}\nservice:\n  pipelines:\n    profiles:\n      receivers: [test, test/2, test/3]\n      exporters: [test, missing]\n";
    let doc = Document::parse_with_env(yaml, &|_| None).unwrap();
    let errs = plan(&doc, &registry()).unwrap_err();
    let text = errs.to_string();
    assert!(text.contains("line 3:3: receivers::test/2: at `receivers.test/2`: listen address 127.0.0.1:9 is already used by receivers::test"), "{text}");
    assert!(
        text.contains(
            "line 4:30: receivers::test/3: at `receivers.test/3.endpoint`: not host:port"
        ),
        "{text}"
    );
    assert!(
        text.contains("unknown receiver type `nosuch`; known types: test"),
        "{text}"
    );
    assert!(text.contains("line 14:25: at `service.pipelines.profiles.exporters.1`: exporter `missing` is not defined"), "{text}");
    assert_eq!(errs.len(), 4, "{text}");

    let ok = "receivers:\n  test: {key: a}\nprocessors:\n  filter: {}\nexporters:\n  test: {key: d, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let p = plan(
        &Document::parse_with_env(ok, &|_| None).unwrap(),
        &registry(),
    )
    .unwrap();
    assert_eq!(p.warnings.len(), 1);
    assert!(
        p.warnings[0].contains(
            "processor `filter` is defined at `processors.filter` but used by no pipeline"
        ),
        "{:?}",
        p.warnings
    );
}

#[tokio::test]
async fn exporters_no_pipeline_uses_are_never_built() {
    let yaml = "receivers:\n  test: {key: un}\nexporters:\n  test/used: {key: un-used, behaviour: ok}\n  test/unused: {key: un-unused, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/used]}\n";
    let (running, _) = start(yaml).await;
    assert_eq!(record("un-used").built.load(Ordering::SeqCst), 1);
    assert_eq!(record("un-unused").built.load(Ordering::SeqCst), 0);
    assert_eq!(running.queue_levels().len(), 1);
    running.shutdown().await;
}

#[test]
fn listeners_conflict_by_port_and_directories_by_nesting() {
    let l = |s: &str| Resource::TcpListen(s.parse().unwrap());
    let d = |s: &str| Resource::Directory(s.into());
    assert!(conflicts(&l("0.0.0.0:4040"), &l("127.0.0.1:4040")));
    assert!(conflicts(&l("127.0.0.1:4040"), &l("127.0.0.1:4040")));
    assert!(conflicts(&l("[::]:4040"), &l("0.0.0.0:4040")));
    assert!(!conflicts(&l("127.0.0.1:4040"), &l("127.0.0.2:4040")));
    assert!(
        !conflicts(&l("127.0.0.1:0"), &l("127.0.0.1:0")),
        "port 0 never collides"
    );
    assert!(conflicts(&d("/data"), &d("/data/svc")));
    assert!(!conflicts(&d("/data/a"), &d("/data/ab")));
}

#[test]
fn the_in_flight_budget_must_be_positive() {
    let yaml = "receivers:\n  test: {key: lim}\nexporters:\n  test: {key: lim, behaviour: ok}\nservice:\n  limits: {max_in_flight_bytes: 0}\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let errs = plan(
        &Document::parse_with_env(yaml, &|_| None).unwrap(),
        &registry(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        errs.contains("service.limits.max_in_flight_bytes"),
        "{errs}"
    );
    let ok = yaml.replace("max_in_flight_bytes: 0", "max_in_flight_bytes: 1MiB");
    let p = plan(
        &Document::parse_with_env(&ok, &|_| None).unwrap(),
        &registry(),
    )
    .unwrap();
    assert_eq!(p.max_in_flight_bytes, 1 << 20);
}

#[test]
fn queue_and_retry_blocks_are_validated_for_every_exporter() {
    let yaml = "receivers:\n  test: {key: v}\nexporters:\n  test: {key: v, behaviour: ok, sending_queue: {num_consumers: 0}, retry_on_failure: {multiplier: 1e19}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let errs = plan(
        &Document::parse_with_env(yaml, &|_| None).unwrap(),
        &registry(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        errs.contains("exporters.test.sending_queue.num_consumers"),
        "{errs}"
    );
    assert!(
        errs.contains("exporters.test.retry_on_failure.multiplier"),
        "{errs}"
    );
}

#[test]
fn error_class_helpers() {
    let e =
        ExportError::retryable("http_503", "unavailable").with_retry_after(Duration::from_secs(3));
    assert_eq!(
        e.class,
        ErrorClass::Retryable {
            retry_after: Some(Duration::from_secs(3))
        }
    );
}
