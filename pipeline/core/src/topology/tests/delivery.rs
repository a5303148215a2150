//! Delivery: retries, failures, panics and the acknowledgements a tracked
//! batch reports.

use super::*;

#[tokio::test]
async fn retryable_failures_are_retried_and_permanent_ones_are_not() {
    let yaml = "receivers:\n  test: {key: rt}\nexporters:\n  test/flaky: {key: rt-flaky, behaviour: fail_twice, retry_on_failure: {initial_interval: 5ms, max_interval: 10ms}}\n  test/perm: {key: rt-perm, behaviour: permanent}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/flaky, test/perm]}\n";
    let (running, t) = start(yaml).await;
    consumer("rt")
        .consume(
            batch(vec![envelope("yes"), envelope("yes")]),
            Admission::Refuse,
        )
        .await
        .unwrap();
    eventually("flaky delivery", || {
        record("rt-flaky").delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    eventually("permanent failure counted", || {
        t.render().contains(
            r#"proflow_exporter_failed_profiles_total{exporter="test/perm",reason="rejected"} 2"#,
        )
    })
    .await;
    assert_eq!(record("rt-flaky").attempts.load(Ordering::SeqCst), 3);
    assert_eq!(
        record("rt-perm").attempts.load(Ordering::SeqCst),
        1,
        "permanent errors are not retried"
    );
    let text = t.render();
    assert!(
        text.contains(r#"proflow_exporter_retries_total{exporter="test/flaky"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(r#"proflow_exporter_sent_profiles_total{exporter="test/flaky"} 2"#),
        "{text}"
    );
    let report = running.shutdown().await;
    assert_eq!(report.total_undelivered(), 0);
}

#[tokio::test]
async fn retries_give_up_after_max_elapsed_time() {
    let yaml = "receivers:\n  test: {key: me}\nexporters:\n  test: {key: me-x, behaviour: fail_twice, retry_on_failure: {initial_interval: 50ms, max_elapsed_time: 20ms}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    consumer("me")
        .consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    eventually("retries exhausted", || {
        t.render().contains(r#"reason="retries_exhausted"} 1"#)
    })
    .await;
    assert_eq!(record("me-x").delivered.load(Ordering::SeqCst), 0);
    running.shutdown().await;
}

#[tokio::test]
async fn a_panicking_exporter_fails_the_batch_and_keeps_its_queue_moving() {
    let yaml = "receivers:\n  test: {key: pn}\nexporters:\n  test: {key: pn-x, behaviour: panic, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("pn");
    for i in 1..=3 {
        // Each batch fits only once the previous one was finished.
        let mut accepted = false;
        for _ in 0..200 {
            if c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await
                .is_ok()
            {
                accepted = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(accepted, "batch {i} was never admitted: the queue is stuck");
    }
    eventually("three panics counted", || {
        t.render()
            .contains(r#"proflow_exporter_failed_profiles_total{exporter="test",reason="panic"} 3"#)
    })
    .await;
    assert_eq!(running.shutdown().await.total_undelivered(), 0);
}

fn tracked(envelopes: Vec<Envelope>) -> (Batch, proflow_model::delivery::Delivery) {
    Batch::tracked(envelopes, Arc::new(BatchMeta::default()))
}

#[tokio::test]
async fn acks_report_delivered_filtered_failed_and_dropped_copies() {
    let yaml = "receivers:\n  test: {key: ack}\nprocessors:\n  filter: {}\nexporters:\n  test/ok: {key: ack-ok, behaviour: ok}\n  test/perm: {key: ack-perm, behaviour: permanent}\n  test/hang: {key: ack-hang, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles/a: {receivers: [test], processors: [filter], exporters: [test/ok, test/perm]}\n    profiles/b: {receivers: [test], exporters: [test/hang]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("ack");
    // Fills test/hang's queue (1 profile), so the next batch is dropped there.
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    let (b, delivery) = tracked(vec![envelope("yes"), envelope("no"), envelope("yes")]);
    c.consume(b, Admission::Refuse).await.unwrap();
    let report = tokio::time::timeout(Duration::from_secs(5), delivery.wait())
        .await
        .expect("the delivery resolves");
    assert_eq!(
        report,
        DeliveryReport {
            delivered: 2,
            stored: 0,
            failed: 2,
            dropped: 3,
            filtered: 1,
            abandoned: 0
        },
        "pipeline a: 1 filtered, 2 to ok and 2 to perm; pipeline b: 3 dropped"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn acks_of_profiles_left_at_shutdown_report_abandoned() {
    let yaml = "receivers:\n  test: {key: ab}\nexporters:\n  test: {key: ab-x, behaviour: hang, sending_queue: {num_consumers: 1}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("ab");
    let (in_flight, d1) = tracked(vec![envelope("yes")]);
    c.consume(in_flight, Admission::Refuse).await.unwrap();
    eventually("the first batch is being sent", || {
        record("ab-x").attempts.load(Ordering::SeqCst) == 1
    })
    .await;
    let (queued, d2) = tracked(vec![envelope("yes"), envelope("yes")]);
    c.consume(queued, Admission::Refuse).await.unwrap();
    let report = running.shutdown().await;
    assert_eq!(report.undelivered.get("test"), Some(&3));
    assert_eq!(d1.wait().await.abandoned, 1, "in flight when aborted");
    assert_eq!(d2.wait().await.abandoned, 2, "still queued");
}

#[tokio::test]
async fn a_partial_failure_counts_each_profile_once() {
    let yaml = "receivers:\n  test: {key: pf}\nexporters:\n  test: {key: pf-x, behaviour: refuse_odd}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    let (b, delivery) = tracked(vec![envelope("yes"), envelope("yes"), envelope("yes")]);
    consumer("pf").consume(b, Admission::Refuse).await.unwrap();
    let report = delivery.wait().await;
    assert_eq!((report.delivered, report.failed), (2, 1));
    let text = t.render();
    assert!(
        text.contains(r#"proflow_exporter_sent_profiles_total{exporter="test"} 2"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"proflow_exporter_failed_profiles_total{exporter="test",reason="invalid"} 1"#
        ),
        "{text}"
    );
    assert_eq!(
        record("pf-x").attempts.load(Ordering::SeqCst),
        1,
        "never retried"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn one_dead_backend_does_not_stop_the_healthy_one_by_default() {
    let yaml = "receivers:\n  test: {key: dd}\nexporters:\n  test/down: {key: dd-down, behaviour: down, sending_queue: {queue_size: 5, num_consumers: 1}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\n  test/ok: {key: dd-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/down, test/ok]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("dd");
    for _ in 0..50 {
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .expect("a full drop_newest queue never refuses the sender");
    }
    eventually("the healthy exporter got every profile", || {
        record("dd-ok").delivered.load(Ordering::SeqCst) == 50
    })
    .await;
    // The dead one kept 5 (its queue) and dropped the rest, counted.
    let text = t.render();
    assert!(text.contains(r#"proflow_exporter_dropped_profiles_total{exporter="test/down",reason="queue_full"} 45"#), "{text}");
    // It comes back: what it kept is delivered.
    record("dd-down").up.store(1, Ordering::SeqCst);
    eventually("the recovered exporter sent its queue", || {
        record("dd-down").delivered.load(Ordering::SeqCst) == 5
    })
    .await;
    assert_eq!(running.shutdown().await.total_undelivered(), 0);
}
