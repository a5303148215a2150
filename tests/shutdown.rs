//! SIGTERM while clients push, against the real binary: every push answered
//! 200 is written by the `file` exporter unless the log's undelivered count
//! says otherwise, and that count is exact; nothing is written that was not
//! accepted.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use common::{Proflow, cpu_profile, gzip, ingest_query, read_index};

/// `clients` threads, each pushing `app{seq=…}` to `base` (a receiver URL)
/// with [`pusher`] until `stop`.
fn spawn_pushers(
    base: &str,
    app: &'static str,
    clients: u64,
    stop: &Arc<AtomicBool>,
) -> Vec<thread::JoinHandle<(Vec<u64>, Vec<u64>)>> {
    (1..=clients)
        .map(|c| {
            let base = base.to_owned();
            let stop = stop.clone();
            thread::spawn(move || {
                pusher(
                    move |seq| {
                        format!(
                            "{base}{}",
                            ingest_query(&format!("{app}{{seq={seq}}}"), Some("pprof"))
                        )
                    },
                    c,
                    stop,
                )
            })
        })
        .collect()
}

/// Pushes until the collector stops answering; returns the sequence numbers
/// answered 200, and those whose request got no answer at all (cut off).
fn pusher(
    proflow_url: impl Fn(u64) -> String,
    client: u64,
    stop: Arc<AtomicBool>,
) -> (Vec<u64>, Vec<u64>) {
    let http = common::http_client();
    let body = gzip(&cpu_profile());
    let (mut ok, mut unanswered) = (Vec::new(), Vec::new());
    for i in 0.. {
        let seq = client * 1_000_000 + i;
        match http.post(proflow_url(seq)).body(body.clone()).send() {
            Ok(r) if r.status().as_u16() == 200 => ok.push(seq),
            Ok(r) => {
                // 503 while stopping, then connection refused: done.
                assert!(
                    matches!(r.status().as_u16(), 503 | 429),
                    "unexpected status {}",
                    r.status()
                );
                if stop.load(Ordering::SeqCst) {
                    break;
                }
            }
            Err(e) => {
                if e.is_connect() {
                    break;
                }
                unanswered.push(seq);
                if stop.load(Ordering::SeqCst) {
                    break;
                }
            }
        }
    }
    (ok, unanswered)
}

/// The undelivered count the collector logged when it stopped.
fn logged_undelivered(log: &str) -> Option<usize> {
    if log.contains("stopped; every accepted profile was delivered") {
        return Some(0);
    }
    let line = log
        .lines()
        .find(|l| l.contains("not every accepted profile was delivered"))?;
    let marker = "was delivered: ";
    let rest = &line[line.find(marker)? + marker.len()..];
    rest.split_whitespace().next()?.parse().ok()
}

#[test]
fn sigterm_while_clients_push_drains_everything_in_time() {
    let undelivered = sigterm_while_pushing("fsync: false", "10s", 0);
    assert_eq!(undelivered, 0, "a 10 s drain is plenty for a fast exporter");
}

#[test]
fn sigterm_with_a_backlog_reports_exactly_what_was_left() {
    // One consumer that fsyncs every file, and a drain far too short for
    // the backlog four clients build; SIGTERM only once the queue holds one
    // (on a loaded machine the clients alone may not outrun the exporter).
    let undelivered = sigterm_while_pushing("fsync: true", "1ms", 50);
    assert!(undelivered > 0, "a backlog was left and reported");
}

/// Pushes from four clients, sends SIGTERM (once the receiver has accepted
/// more than 100 profiles and the exporter's queue holds at least `backlog`),
/// and checks the accounting; returns the undelivered count the log
/// reported.
fn sigterm_while_pushing(fsync: &str, shutdown_timeout: &str, backlog: usize) -> usize {
    // With a backlog wanted, every profile is its own fsynced export.
    let max_profiles = if backlog > 0 { 1 } else { 20 };
    let mut proflow = Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\n    {fsync}\n    sending_queue: {{queue_size: 100000, num_consumers: 1, batch: {{max_profiles: {max_profiles}}}}}\nservice:\n  shutdown_timeout: {shutdown_timeout}\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file]}}\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    let stop = Arc::new(AtomicBool::new(false));
    let clients = spawn_pushers(&proflow.receiver_url(""), "sig.app", 4, &stop);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let metrics = proflow.metrics();
        let queued = common::metric_sum(
            &metrics,
            "proflow_exporter_queue_profiles",
            &[("exporter", "file")],
        );
        let accepted =
            common::metric_sum(&metrics, "proflow_receiver_accepted_profiles_total", &[]);
        if queued >= backlog as f64 && accepted > 100.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "in 30 s the file exporter's queue held {queued} profiles (want {backlog}) and the receiver accepted {accepted} (want over 100)"
        );
        thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::SeqCst);
    let code = proflow.terminate(Duration::from_secs(30));
    let mut ok = BTreeSet::new();
    let mut unanswered = BTreeSet::new();
    for c in clients {
        let (o, u) = c.join().unwrap();
        ok.extend(o);
        unanswered.extend(u);
    }
    let log = proflow.log_text();
    assert_eq!(code, Some(0), "clean exit after SIGTERM\nlog:\n{log}");
    let undelivered = logged_undelivered(&log)
        .unwrap_or_else(|| panic!("the log states what was not delivered\n{log}"));
    let written: BTreeSet<u64> = read_index(&proflow.profiles)
        .iter()
        .filter(|e| e.path.is_file())
        .filter_map(|e| e.label("seq").and_then(|s| s.parse().ok()))
        .collect();
    let missing: Vec<_> = ok.difference(&written).collect();
    let extra: Vec<_> = written
        .difference(&ok)
        .filter(|s| !unanswered.contains(s))
        .collect();
    eprintln!(
        "shutdown: {} answered 200, {} written, {} unanswered, {undelivered} reported undelivered",
        ok.len(),
        written.len(),
        unanswered.len()
    );
    assert!(ok.len() > 100, "the clients pushed for real: {}", ok.len());
    assert!(extra.is_empty(), "written but never accepted: {extra:?}");
    assert_eq!(
        missing.len(),
        undelivered,
        "the log's undelivered count is exact: answered 200 but not written: {missing:?}\nlog:\n{log}"
    );
    undelivered
}

/// The sidecar's config as `examples/sidecar.yaml` has it (every default),
/// with free ports and a temporary directory.
fn sidecar_config(ports: &common::Ports, profiles: &std::path::Path) -> String {
    let example = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/sidecar.yaml"),
    )
    .expect("read examples/sidecar.yaml");
    let replaced = example
        .replace(
            "127.0.0.1:${env:PROFLOW_PORT:-4040}",
            &ports.receiver.to_string(),
        )
        .replace(
            "${env:PROFLOW_DIR:-./profiles}",
            &profiles.display().to_string(),
        )
        .replace("127.0.0.1:8888", &ports.telemetry.to_string());
    assert!(
        !replaced.contains("${env:") && !replaced.contains(":8888"),
        "every address and directory of the example was replaced:\n{replaced}"
    );
    replaced
}

/// A burst the sidecar's only exporter cannot keep up with, against its
/// config with every default: eight clients push flat out while the
/// exporter cannot write (a file stands where it must create the service's
/// directory, a retryable failure) and after it recovers; SIGTERM comes
/// while they still push. (A debug build's receiver does not outrun the
/// file exporter by itself as the release build's does, so the test makes
/// the exporter fall behind.) The full queue holds the clients back
/// (`wait_when_full`), then refuses them with 429 while it stays full, and
/// queues them again once there is room; it never answers 200 and drops:
/// every push answered 200 is in the files, and the log says nothing was
/// lost.
#[test]
fn a_burst_against_the_sidecar_config_loses_no_push_answered_200() {
    let mut proflow = Proflow::start(|ports, profiles| {
        std::fs::create_dir_all(profiles).unwrap();
        std::fs::write(profiles.join("burst.app"), b"in the way").unwrap();
        sidecar_config(ports, profiles)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let clients = spawn_pushers(&proflow.receiver_url(""), "burst.app", 8, &stop);
    let waits = |result: &str| {
        common::metric_sum(
            &proflow.metrics(),
            "proflow_exporter_queue_waits_total",
            &[("exporter", "file"), ("result", result)],
        )
    };
    let until = |what: &str, f: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !f() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}\nlog:\n{}",
                proflow.log_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    };
    until("the full queue to hold a client back and give up", &|| {
        waits("timeout") >= 1.0
    });
    std::fs::remove_file(proflow.profiles.join("burst.app")).unwrap();
    until(
        "a held-back client queued once the exporter made room",
        &|| waits("room") >= 1.0,
    );
    let code = proflow.terminate(Duration::from_secs(60));
    stop.store(true, Ordering::SeqCst);
    let mut ok = BTreeSet::new();
    for c in clients {
        ok.extend(c.join().unwrap().0);
    }
    let log = proflow.log_text();
    assert_eq!(code, Some(0), "clean exit after SIGTERM\nlog:\n{log}");
    let written: BTreeSet<u64> = read_index(&proflow.profiles)
        .iter()
        .filter(|e| e.path.is_file())
        .filter_map(|e| e.label("seq").and_then(|s| s.parse().ok()))
        .collect();
    let missing: Vec<_> = ok.difference(&written).collect();
    eprintln!(
        "burst: {} answered 200, {} written",
        ok.len(),
        written.len()
    );
    // The waits above prove the queue filled; this, that pushes were answered 200.
    assert!(!ok.is_empty(), "no push was answered 200");
    assert!(
        missing.is_empty(),
        "{} push(es) answered 200 but not written: {:?}\nlog:\n{log}",
        missing.len(),
        missing.iter().take(20).collect::<Vec<_>>()
    );
    assert!(
        log.contains("stopped; every accepted profile was delivered"),
        "the shutdown report says nothing was lost\nlog:\n{log}"
    );
}
