//! Admission: how full queues hold back, refuse or drop for each receiver
//! kind, and how one batch reaches several exporters.

use super::*;

#[tokio::test]
async fn block_backpressure_is_all_or_nothing_and_drop_newest_only_drops_there() {
    let yaml = "receivers:\n  test: {key: bp}\nexporters:\n  test/hang: {key: bp-hang, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\n  test/dropper: {key: bp-drop, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: drop_newest}}\n  test/ok: {key: bp-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 100ms\n  pipelines:\n    profiles/a: {receivers: [test], exporters: [test/hang, test/ok]}\n    profiles/b: {receivers: [test], exporters: [test/dropper, test/ok]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("bp");
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    eventually("first batch delivered twice (two pipelines)", || {
        record("bp-ok").delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    // The hanging block queue is full now: the whole batch is refused and nobody gets a copy.
    let err = c
        .consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ConsumeError::Backpressure { ref exporter, .. } if exporter == "test/hang"),
        "{err:?}"
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        record("bp-ok").delivered.load(Ordering::SeqCst),
        2,
        "a refused batch must leave no copies"
    );
    let levels = running.queue_levels();
    assert!(levels.contains(&(
        "test/dropper".to_string(),
        1,
        levels.iter().find(|l| l.0 == "test/dropper").unwrap().2
    )));
    let report = running.shutdown().await;
    assert_eq!(report.undelivered.get("test/hang"), Some(&1));
    assert_eq!(report.undelivered.get("test/dropper"), Some(&1));
    assert!(t.render().contains(
        r#"proflow_exporter_dropped_profiles_total{exporter="test/hang",reason="shutdown"} 1"#
    ));
}

#[tokio::test]
async fn drop_newest_exporter_never_stalls_the_others() {
    let yaml = "receivers:\n  test: {key: dn}\nprocessors:\n  filter: {}\nexporters:\n  test/slow: {key: dn-slow, behaviour: hang, sending_queue: {queue_size: 2, num_consumers: 1, when_full: drop_newest}}\n  test/ok: {key: dn-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 100ms\n  pipelines:\n    profiles: {receivers: [test], processors: [filter], exporters: [test/slow, test/ok]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("dn");
    for i in 0..20 {
        c.consume(
            batch(vec![envelope(if i % 5 == 0 { "no" } else { "yes" })]),
            Admission::Refuse,
        )
        .await
        .unwrap();
    }
    eventually("16 kept profiles at the healthy exporter", || {
        record("dn-ok").delivered.load(Ordering::SeqCst) == 16
    })
    .await;
    let text = t.render();
    assert!(text.contains(r#"proflow_exporter_dropped_profiles_total{exporter="test/slow",reason="queue_full"} 14"#), "{text}");
    assert!(
        text.contains(r#"proflow_processor_received_profiles_total{processor="filter"} 20"#),
        "{text}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn an_exporter_fed_by_two_pipelines_gets_both_copies_in_one_admission() {
    let yaml = "receivers:\n  test: {key: tw}\nexporters:\n  test: {key: tw-x, behaviour: ok, sending_queue: {queue_size: 3}}\nservice:\n  pipelines:\n    profiles/a: {receivers: [test], exporters: [test]}\n    profiles/b: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    // 2 profiles × 2 pipelines = 4 > queue_size 3, but the queue is idle: admitted whole.
    consumer("tw")
        .consume(
            batch(vec![envelope("yes"), envelope("yes")]),
            Admission::Refuse,
        )
        .await
        .unwrap();
    eventually("both copies delivered", || {
        record("tw-x").delivered.load(Ordering::SeqCst) == 4
    })
    .await;
    running.shutdown().await;
}

#[tokio::test]
async fn a_refused_batch_counts_no_drops() {
    let yaml = "receivers:\n  test: {key: rd}\nexporters:\n  test/drop: {key: rd-d, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: drop_newest}}\n  test/block: {key: rd-b, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test/drop, test/block]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("rd");
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    for _ in 0..3 {
        assert!(matches!(
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await,
            Err(ConsumeError::Backpressure { .. })
        ));
    }
    let text = t.render();
    assert!(
        !text.contains("queue_full"),
        "refused batches must not count as dropped: {text}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn consumers_gather_batches_up_to_the_limits() {
    let yaml = "receivers:\n  test: {key: bt}\nexporters:\n  test: {key: bt-x, behaviour: ok, sending_queue: {num_consumers: 2, batch: {flush_timeout: 200ms, max_profiles: 10}}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("bt");
    for _ in 0..25 {
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap();
    }
    eventually("all 25 delivered", || {
        record("bt-x").delivered.load(Ordering::SeqCst) == 25
    })
    .await;
    let batches = record("bt-x").batches.load(Ordering::SeqCst);
    assert!(
        (3..=6).contains(&batches),
        "25 profiles pushed at once go out in a few batches of at most 10, not one by one: {batches}"
    );
    running.shutdown().await;
}

#[tokio::test]
async fn a_waiting_receiver_waits_for_room_instead_of_being_refused() {
    let yaml = "receivers:\n  test: {key: wa}\nexporters:\n  test: {key: wa-x, behaviour: down, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("wa");
    c.consume(batch(vec![envelope("yes")]), Admission::Wait)
        .await
        .unwrap();
    assert!(matches!(
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await,
        Err(ConsumeError::Backpressure { .. })
    ));
    let waiting = tokio::spawn({
        let c = c.clone();
        async move {
            c.consume(batch(vec![envelope("yes")]), Admission::Wait)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !waiting.is_finished(),
        "the queue is full: the sender waits"
    );
    record("wa-x").up.store(1, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("admitted once the backend recovered")
        .unwrap()
        .unwrap();
    eventually("both delivered", || {
        record("wa-x").delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(running.shutdown().await.total_undelivered(), 0);
}

#[tokio::test]
async fn a_full_queue_holds_the_sender_until_it_has_room_instead_of_dropping() {
    let yaml = "receivers:\n  test: {key: hold}\nexporters:\n  test: {key: hold-x, behaviour: down, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 30s}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("hold");
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    // The queue (1) is full and its exporter failing: the next batch waits.
    let second = tokio::spawn({
        let c = c.clone();
        async move {
            c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
                .await
        }
    });
    eventually("the exporter tried the first batch twice", || {
        record("hold-x").attempts.load(Ordering::SeqCst) >= 2
    })
    .await;
    assert!(!second.is_finished(), "held back while the queue is full");
    record("hold-x").up.store(1, Ordering::SeqCst);
    second
        .await
        .unwrap()
        .expect("queued once the exporter made room");
    eventually("both delivered", || {
        record("hold-x").delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    let text = t.render();
    assert!(
        text.contains(r#"proflow_exporter_queue_waits_total{exporter="test",result="room"} 1"#),
        "{text}"
    );
    assert!(
        !text.contains("proflow_exporter_dropped_profiles_total"),
        "{text}"
    );
    let report = running.shutdown().await;
    assert!(report.all_delivered(), "{report:?}");
}

#[tokio::test]
async fn a_stalled_queue_costs_one_wait_then_drops_and_a_batch_nobody_took_is_refused() {
    let yaml = "receivers:\n  test: {key: stall}\nexporters:\n  test/dead: {key: stall-dead, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 50ms}}\n  test/ok: {key: stall-ok, behaviour: ok}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles/both: {receivers: [test], exporters: [test/dead, test/ok]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("stall");
    for _ in 0..4 {
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .expect("the healthy exporter takes every batch");
    }
    eventually("the healthy exporter got all four", || {
        record("stall-ok").delivered.load(Ordering::SeqCst) == 4
    })
    .await;
    let text = t.render();
    for want in [
        r#"proflow_exporter_queue_waits_total{exporter="test/dead",result="timeout"} 1"#,
        r#"proflow_exporter_queue_waits_total{exporter="test/dead",result="stalled"} 2"#,
        r#"proflow_exporter_dropped_profiles_total{exporter="test/dead",reason="queue_full"} 3"#,
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    let report = running.shutdown().await;
    assert_eq!(report.total_dropped(), 3, "{report:?}");
    assert_eq!(report.total_undelivered(), 1, "the hanging send");
    assert!(!report.all_delivered());

    // Alone, the dead exporter takes nothing: refused, not dropped.
    let yaml = "receivers:\n  test: {key: alone}\nexporters:\n  test: {key: alone-x, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 20ms}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("alone");
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    for _ in 0..2 {
        let err = c
            .consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await
            .unwrap_err();
        assert!(
            matches!(err, ConsumeError::Backpressure { ref exporter, .. } if exporter == "test"),
            "{err:?}"
        );
    }
    assert!(
        !t.render()
            .contains("proflow_exporter_dropped_profiles_total")
    );
    // A receiver that cannot be refused (scrape, eBPF) drops, counted.
    c.consume(batch(vec![envelope("yes")]), Admission::Wait)
        .await
        .unwrap();
    let text = t.render();
    assert!(
        text.contains(
            r#"proflow_exporter_dropped_profiles_total{exporter="test",reason="queue_full"} 1"#
        ),
        "{text}"
    );
    assert_eq!(running.shutdown().await.total_dropped(), 1);
}

#[tokio::test]
async fn wait_all_waits_for_drop_newest_queues_too() {
    let yaml = "receivers:\n  test: {key: wall}\nexporters:\n  test: {key: wall-x, behaviour: down, sending_queue: {queue_size: 1, num_consumers: 1, wait_when_full: 10ms}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms, max_elapsed_time: 0s}}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("wall");
    c.consume(batch(vec![envelope("yes")]), Admission::WaitAll)
        .await
        .unwrap();
    let second = tokio::spawn({
        let c = c.clone();
        async move {
            c.consume(batch(vec![envelope("yes")]), Admission::WaitAll)
                .await
        }
    });
    // Far past wait_when_full, it still waits: nothing is dropped.
    eventually("the exporter retried a few times", || {
        record("wall-x").attempts.load(Ordering::SeqCst) >= 5
    })
    .await;
    assert!(!second.is_finished());
    record("wall-x").up.store(1, Ordering::SeqCst);
    second.await.unwrap().unwrap();
    eventually("both delivered", || {
        record("wall-x").delivered.load(Ordering::SeqCst) == 2
    })
    .await;
    assert!(
        !t.render()
            .contains("proflow_exporter_dropped_profiles_total")
    );
    assert!(running.shutdown().await.all_delivered());
}

/// A batch of one profile from `tenant` (as its `X-Scope-OrgID`).
fn from(tenant: &str) -> Batch {
    Batch::new(
        vec![envelope("yes")],
        Arc::new(BatchMeta {
            tenant: Some(tenant.to_owned()),
            ..BatchMeta::default()
        }),
    )
}

#[tokio::test]
async fn a_tenant_over_its_share_of_a_busy_queue_is_refused_and_others_get_in() {
    let yaml = "receivers:\n  test: {key: ts}\nexporters:\n  test: {key: ts-x, behaviour: hang, sending_queue: {queue_size: 10, num_consumers: 1, when_full: block, batch: {max_profiles: 1}}}\nservice:\n  shutdown_timeout: 100ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, t) = start(yaml).await;
    let c = consumer("ts");
    // Alone, a tenant may fill the queue past half.
    for _ in 0..6 {
        c.consume(from("noisy"), Admission::Refuse).await.unwrap();
    }
    // Another tenant gets in; now each has half.
    c.consume(from("quiet"), Admission::Refuse).await.unwrap();
    let err = c
        .consume(from("noisy"), Admission::Refuse)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ConsumeError::OverShare { exporter, tenant, .. } if exporter == "test" && tenant == "noisy"),
        "{err:?}"
    );
    assert!(
        crate::component::PushRefusal::from(err.clone())
            != crate::component::PushRefusal::ShuttingDown,
        "a refusal the sender retries"
    );
    // The quiet tenant takes the rest of its half.
    for _ in 0..3 {
        c.consume(from("quiet"), Admission::Refuse).await.unwrap();
    }
    assert_eq!(running.queue_levels()[0].1, 10);
    let metrics = t.render();
    assert!(
        metrics.contains(
            r#"proflow_exporter_queue_waits_total{exporter="test",result="tenant_share"} 1"#
        ),
        "{metrics}"
    );
    // Counted for the tenant, on /metrics and /tenants.
    assert!(
        metrics.contains(r#"tenant="noisy",reason="tenant_share"} 1"#),
        "{metrics}"
    );
    let page = t.tenants_json();
    let noisy = page["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["tenant"] == "noisy")
        .unwrap()
        .clone();
    assert_eq!(noisy["refused"]["tenant_share"], 1, "{page}");
    running.shutdown().await;
}

#[tokio::test]
async fn shares_free_as_the_tenants_profiles_are_sent() {
    let yaml = "receivers:\n  test: {key: tf}\nexporters:\n  test: {key: tf-x, behaviour: down, sending_queue: {queue_size: 4, num_consumers: 1, when_full: block, batch: {max_profiles: 1}}, retry_on_failure: {initial_interval: 10ms, max_interval: 10ms}}\nservice:\n  shutdown_timeout: 1s\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("tf");
    for _ in 0..3 {
        c.consume(from("a"), Admission::Refuse).await.unwrap();
    }
    c.consume(from("b"), Admission::Refuse).await.unwrap();
    assert!(matches!(
        c.consume(from("a"), Admission::Refuse).await,
        Err(ConsumeError::Backpressure { .. }) | Err(ConsumeError::OverShare { .. })
    ));
    // The backend comes back: `a`'s profiles are sent, and its share with them.
    record("tf-x").up.store(1, Ordering::SeqCst);
    eventually("the queue drained", || {
        record("tf-x").delivered.load(Ordering::SeqCst) == 4
    })
    .await;
    c.consume(from("a"), Admission::Refuse).await.unwrap();
    let report = running.shutdown().await;
    assert!(report.all_delivered(), "{report:?}");
}
