//! Shutdown: queues drained, consumers ended, deadlines kept, waiting
//! receivers released.

use super::*;

#[tokio::test]
async fn shutdown_drains_queues_before_stopping() {
    let yaml = "receivers:\n  test: {key: sd}\nexporters:\n  test: {key: sd-ok, behaviour: fail_twice, retry_on_failure: {initial_interval: 20ms}}\nservice:\n  shutdown_timeout: 5s\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("sd");
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    let report = running.shutdown().await;
    assert_eq!(report.total_undelivered(), 0);
    assert_eq!(
        record("sd-ok").delivered.load(Ordering::SeqCst),
        1,
        "the retried batch was delivered during the drain"
    );
    assert_eq!(
        c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
            .await,
        Err(ConsumeError::ShuttingDown)
    );
}

#[tokio::test]
async fn a_receiver_that_stops_on_its_own_is_reported() {
    let yaml = "receivers:\n  test: {key: die, die: true}\nexporters:\n  test: {key: die-x, behaviour: ok}\nservice:\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    tokio::time::timeout(Duration::from_secs(5), running.receiver_failed())
        .await
        .expect("receiver_failed completes when a receiver ends by itself");
    running.shutdown().await;
}

#[tokio::test]
async fn a_waiting_receiver_is_released_by_shutdown() {
    let yaml = "receivers:\n  test: {key: ws}\nexporters:\n  test: {key: ws-x, behaviour: hang, sending_queue: {queue_size: 1, num_consumers: 1, when_full: block}}\nservice:\n  shutdown_timeout: 50ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("ws");
    c.consume(batch(vec![envelope("yes")]), Admission::Wait)
        .await
        .unwrap();
    let waiting = tokio::spawn({
        let c = c.clone();
        async move {
            c.consume(batch(vec![envelope("yes")]), Admission::Wait)
                .await
        }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    running.shutdown().await;
    let result = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("shutdown ends the wait")
        .unwrap();
    assert_eq!(result, Err(ConsumeError::ShuttingDown));
}

#[tokio::test]
async fn shutdown_ends_idle_consumers_at_once() {
    // Four idle consumers must all end when the queue closes: a lost
    // wakeup would leave three asleep until the 30 s deadline.
    let yaml = "receivers:\n  test: {key: sh}\nexporters:\n  test: {key: sh-x, behaviour: ok, sending_queue: {num_consumers: 4}}\nservice:\n  shutdown_timeout: 30s\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let c = consumer("sh");
    c.consume(batch(vec![envelope("yes")]), Admission::Refuse)
        .await
        .unwrap();
    let report = tokio::time::timeout(Duration::from_secs(10), running.shutdown())
        .await
        .expect("idle consumers end when the queue closes, not at the deadline");
    assert_eq!(report.total_undelivered(), 0);
    assert_eq!(record("sh-x").delivered.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_hanging_exporter_shutdown_is_bounded_by_the_deadline() {
    let yaml = "receivers:\n  test: {key: hs}\nexporters:\n  test: {key: hs-x, behaviour: ok, hang_on_shutdown: true}\nservice:\n  shutdown_timeout: 1500ms\n  pipelines:\n    profiles: {receivers: [test], exporters: [test]}\n";
    let (running, _) = start(yaml).await;
    let shutdown = tokio::spawn(running.shutdown());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !shutdown.is_finished(),
        "the exporter's shutdown is given what is left of the deadline"
    );
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("a hanging exporter shutdown is left after shutdown_timeout")
        .unwrap();
}
