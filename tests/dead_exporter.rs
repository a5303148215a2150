//! One of two exporters down for a while, against the real binary. The "down"
//! `file` exporter cannot write (a regular file stands where it must create
//! the service's directory, a retryable error) until the test removes it.
//!
//! - Default `when_full: drop_newest`: every push is accepted, the healthy
//!   exporter receives every profile, the dead one keeps what fits its queue
//!   and drops the rest (counted, logged once per episode), and delivers what
//!   it kept once it recovers.
//! - `when_full: block`: once the dead exporter's queue is full, pushes get
//!   429 with `Retry-After`, and the healthy exporter receives exactly the
//!   accepted profiles (a refused push leaves no copy anywhere).

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Proflow, cpu_profile, gzip, ingest_query, metric_sum, read_index};

const SERVICE: &str = "deadtest";

fn start(when_full: &str) -> Proflow {
    Proflow::start(|ports, profiles| {
        let down = profiles.join("down");
        std::fs::create_dir_all(&down).unwrap();
        // Where the exporter must create `down/deadtest/`, a file is in the way.
        std::fs::write(down.join(SERVICE), b"in the way").unwrap();
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file/down:\n    directory: {}\n    sending_queue: {{queue_size: 5, num_consumers: 1, when_full: {when_full}}}\n    retry_on_failure: {{initial_interval: 100ms, max_interval: 100ms, max_elapsed_time: 0s}}\n  file/ok:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file/down, file/ok]}}\n",
            ports.receiver,
            down.display(),
            profiles.join("ok").display(),
            ports.telemetry
        )
    })
}

fn files(dir: &Path) -> usize {
    read_index(dir).iter().filter(|e| e.path.is_file()).count()
}

fn wait_for(what: &str, proflow: &Proflow, f: impl Fn() -> bool) {
    for _ in 0..300 {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}\nlog:\n{}", proflow.log_text());
}

#[test]
fn with_drop_newest_the_healthy_exporter_gets_every_profile() {
    let proflow = start("drop_newest");
    let body = gzip(&cpu_profile());
    let query = ingest_query(SERVICE, Some("pprof"));
    for i in 0..40 {
        let reply = proflow.post(&query, &[], body.clone());
        assert_eq!(reply.status, 200, "push {i}: {}", reply.text());
    }
    let ok_dir = proflow.profiles.join("ok");
    let down_dir = proflow.profiles.join("down");
    wait_for("40 profiles at the healthy exporter", &proflow, || {
        files(&ok_dir) == 40
    });
    assert_eq!(files(&down_dir), 0, "the dead exporter wrote nothing yet");
    assert_eq!(
        metric_sum(
            &proflow.metrics(),
            "proflow_exporter_dropped_profiles_total",
            &[("exporter", "file/down"), ("reason", "queue_full")]
        ),
        35.0,
        "5 kept in its queue, 35 dropped"
    );
    let log = proflow.log_text();
    assert_eq!(
        log.matches("exporter queue is full").count(),
        1,
        "one warning per episode, not per profile\n{log}"
    );
    // It recovers: what it kept is delivered.
    std::fs::remove_file(down_dir.join(SERVICE)).unwrap();
    wait_for("the recovered exporter's 5 profiles", &proflow, || {
        files(&down_dir) == 5
    });
    // The next push ends the drop episode.
    assert_eq!(proflow.post(&query, &[], body.clone()).status, 200);
    wait_for("the end of the episode logged", &proflow, || {
        proflow.log_text().contains("exporter queue has room again")
    });
    wait_for("41 at the healthy exporter", &proflow, || {
        files(&ok_dir) == 41
    });
}

#[test]
fn with_block_a_dead_exporter_refuses_pushes_and_leaves_no_copies() {
    let proflow = start("block");
    let body = gzip(&cpu_profile());
    let query = ingest_query(SERVICE, Some("pprof"));
    let mut accepted = 0;
    for _ in 0..40 {
        let reply = proflow.post(&query, &[], body.clone());
        match reply.status {
            200 => accepted += 1,
            429 => assert_eq!(
                reply.retry_after.as_deref(),
                Some("1"),
                "429 says when to retry"
            ),
            other => panic!("unexpected {other}: {}", reply.text()),
        }
    }
    assert_eq!(accepted, 5, "the dead exporter's queue holds 5");
    let ok_dir = proflow.profiles.join("ok");
    wait_for("the 5 accepted at the healthy exporter", &proflow, || {
        files(&ok_dir) == 5
    });
    // What the healthy exporter ever took, not what it wrote so far: a
    // refused push left no copy in its queue either.
    assert_eq!(
        metric_sum(
            &proflow.metrics(),
            "proflow_exporter_enqueued_profiles_total",
            &[("exporter", "file/ok")]
        ),
        5.0,
        "refused pushes left no copies"
    );
    assert_eq!(files(&ok_dir), 5, "refused pushes left no copies");
    let down_dir = proflow.profiles.join("down");
    std::fs::remove_file(down_dir.join(SERVICE)).unwrap();
    wait_for("the recovered exporter's 5 profiles", &proflow, || {
        files(&down_dir) == 5
    });
    assert_eq!(
        proflow.post(&query, &[], body).status,
        200,
        "pushes are accepted again"
    );
}
