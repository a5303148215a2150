//! A processor that holds profiles back: what it releases runs through the
//! processors after it into the queues; shutdown and reload release all of
//! it before the queues close.

use super::*;

fn config(key: &str, every_ms: u64, tag: u32) -> String {
    format!(
        "receivers:\n  test: {{key: {key}}}\nprocessors:\n  hold: {{every_ms: {every_ms}, tag: {tag}}}\n  filter: {{}}\nexporters:\n  test: {{key: {key}-x, behaviour: ok}}\nservice:\n  shutdown_timeout: 5s\n  pipelines:\n    profiles: {{receivers: [test], processors: [hold, filter], exporters: [test]}}\n"
    )
}

#[tokio::test]
async fn what_a_holder_releases_runs_through_the_rest_of_the_pipeline() {
    let (running, telemetry) = start(&config("hr", 50, 0)).await;
    let c = consumer("hr");
    let meta = Arc::new(BatchMeta {
        tenant: Some("red".to_owned()),
        ..BatchMeta::default()
    });
    c.consume(
        Batch::new(vec![envelope("yes"), envelope("no"), envelope("yes")], meta),
        Admission::Refuse,
    )
    .await
    .unwrap();
    let r = record("hr-x");
    assert_eq!(r.delivered.load(Ordering::SeqCst), 0, "held, not passed on");
    // The filter after the holder drops `keep=no` once it is released.
    eventually("the released profiles are exported", || {
        r.delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    // Counted for their tenant once, as they came in.
    let page = telemetry.tenants_json();
    let rows = page["tenants"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "{page}");
    assert_eq!(
        (&rows[0]["tenant"], &rows[0]["profiles_total"]),
        (&"red".into(), &3.into())
    );
    let report = running.shutdown().await;
    assert!(report.all_delivered(), "{report:?}");
    assert_eq!(r.delivered.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn shutdown_releases_what_is_held_before_the_queues_close() {
    let (running, _) = start(&config("hs", 3_600_000, 0)).await;
    let c = consumer("hs");
    for _ in 0..3 {
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
    }
    let report = running.shutdown().await;
    assert!(report.all_delivered(), "{report:?}");
    assert_eq!(record("hs-x").delivered.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_reload_releases_what_the_replaced_pipeline_held() {
    let (mut running, _) = start(&config("hl", 3_600_000, 0)).await;
    let c = consumer("hl");
    c.consume(
        batch(vec![envelope("yes"), envelope("yes")]),
        Admission::Refuse,
    )
    .await
    .unwrap();
    let doc = Document::parse_with_env(&config("hl", 3_600_000, 1), &|_| None).unwrap();
    let report = running
        .reload(plan(&doc, &registry()).unwrap())
        .await
        .unwrap();
    assert!(
        report.kept.contains(&"exporters.test".to_owned()),
        "{report:?}"
    );
    let r = record("hl-x");
    eventually("the old holder's profiles are exported", || {
        r.delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    // The new pipeline holds what comes next, until shutdown.
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    let report = running.shutdown().await;
    assert!(report.all_delivered(), "{report:?}");
    assert_eq!(r.delivered.load(Ordering::SeqCst), 3);
}

#[tokio::test]
async fn a_pipeline_lists_one_holder() {
    let yaml = "receivers:\n  test: {key: h2}\nprocessors:\n  hold: {every_ms: 10}\n  hold/2: {every_ms: 10}\nexporters:\n  test: {key: h2-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], processors: [hold, hold/2], exporters: [test]}\n";
    let doc = Document::parse_with_env(yaml, &|_| None).unwrap();
    let err = plan(&doc, &registry())
        .unwrap()
        .start(Arc::new(Telemetry::new()))
        .await
        .err()
        .expect("two holders in one pipeline are refused");
    assert!(err.to_string().contains("list one"), "{err}");
}
