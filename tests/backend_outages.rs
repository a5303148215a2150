//! A backend stopped and started again while profiles stream through proflow:
//! nothing is lost. Each test runs a private instance of the real peer
//! (`peer_env::PrivatePeer`, `tests/peers/private`: its own ports and data
//! dir, so the shared peers other tests use are never touched), and proflow
//! with `pprof_push` → the peer's exporter, a queue far larger than the stream
//! and quick retries.
//!
//! The test pushes a steady stream of distinct CPU profiles (every 100 ms,
//! each with its own value, all by `main;proflowOutageStream;<phase>`, where
//! the phase function names the part of the stream it was pushed in: before
//! the stop, while the peer was down or starting, after it was back). The peer
//! is stopped with SIGTERM (its own clean shutdown, as in a deploy) between
//! two pushes, once everything pushed so far was sent, for [`OUTAGE`], then
//! started again on the same ports and data dir. Checked:
//! - while the peer was up, proflow sent without retrying;
//! - while it was down, nothing was sent, every profile pushed since the stop
//!   was waiting in the exporter's queue (`proflow_exporter_queue_profiles`),
//!   and the exporter retried (`proflow_exporter_retries_total` rose);
//! - after the restart the queue fell back to 0, every pushed profile was
//!   sent, none failed or was dropped;
//! - the peer, queried back, has per phase function exactly the total of what
//!   was pushed in that phase: the profiles delivered before the stop
//!   survived the peer's restart, and those held in proflow's queue during
//!   the outage arrived once each (no loss, no duplicate).
//!
//! Pyroscope keeps what it flushed on shutdown in its data dir and accepts
//! profiles up to an hour old (`-validation.reject-older-than`), so the
//! profiles queued during the outage keep their own timestamps. Parca keeps
//! its data in memory unless told otherwise: the private Parca runs with its
//! write-ahead log (`--storage-enable-wal` under its data dir) and replays it
//! when started again, so the whole stream can be compared there too.

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules):
// this test needs proflow from `common` and the peers from `peer_env`.
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{Proflow, Totals};
use peer_env::PrivatePeer;
use proflow_model::pprof;

/// The function naming each part of the stream: pushed before the stop,
/// while the peer was down (or starting again), after it was back.
const PHASES: [&str; 3] = [
    "proflowOutageBefore",
    "proflowOutageDuring",
    "proflowOutageAfter",
];
/// How long the stream runs before the stop and after the restart.
const STEADY: Duration = Duration::from_secs(3);
/// How long the peer stays down (from the end of its shutdown).
const OUTAGE: Duration = Duration::from_secs(12);
/// Time between two pushes of the stream.
const PUSH_EVERY: Duration = Duration::from_millis(100);
/// How long the queue may take to drain after the restart, and the peer to
/// show what it was sent.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The type Pyroscope files the stream's profiles under.
const PYROSCOPE_TYPE: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

/// What the stream pushed and proflow accepted.
#[derive(Debug, Default)]
struct Pushed {
    /// Per phase function, the sum of the values accepted.
    totals: Totals,
    /// Profiles accepted.
    profiles: u64,
    /// Each profile accepted: its leaf function ([`seq_function`]), value
    /// and when its push was answered (from the stream's start).
    each: Vec<(String, i64, Duration)>,
    /// Answers other than 200 (none expected: the queue has room for all).
    refused: Vec<String>,
}

/// The stream of pushes, run on its own thread until [`Stream::finish`].
struct Stream {
    phase: Arc<AtomicUsize>,
    /// Profiles accepted so far, per phase.
    accepted: Arc<[AtomicU64; 3]>,
    stop: Arc<AtomicBool>,
    /// Held by the stream for each push: whoever holds it knows no push is
    /// in flight.
    pushing: Arc<Mutex<()>>,
    handle: JoinHandle<Pushed>,
}

impl Stream {
    /// Starts pushing to `proflow` as service `app`.
    fn start(proflow: &Proflow, app: &str) -> Stream {
        let phase = Arc::new(AtomicUsize::new(0));
        let accepted: Arc<[AtomicU64; 3]> = Arc::new(Default::default());
        let stop = Arc::new(AtomicBool::new(false));
        let pushing = Arc::new(Mutex::new(()));
        let base = proflow.receiver_url("");
        let app = app.to_owned();
        let handle = {
            let (phase, accepted, stop, pushing) = (
                phase.clone(),
                accepted.clone(),
                stop.clone(),
                pushing.clone(),
            );
            std::thread::spawn(move || {
                push_until(&base, &app, (&phase, &accepted, &stop, &pushing))
            })
        };
        Stream {
            phase,
            accepted,
            stop,
            pushing,
            handle,
        }
    }

    /// Holds the stream between two pushes until the guard is dropped.
    fn hold(&self) -> MutexGuard<'_, ()> {
        self.pushing.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_phase(&self, phase: usize) {
        self.phase.store(phase, Ordering::SeqCst);
    }

    fn accepted(&self, phase: usize) -> u64 {
        self.accepted[phase].load(Ordering::SeqCst)
    }

    fn finish(self) -> Pushed {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().expect("the stream thread panicked")
    }
}

/// The leaf function of the stream's profile number `i`: when the totals
/// differ, the peer's total of each names the profiles lost or doubled.
fn seq_function(i: i64) -> String {
    format!("proflowOutageSeq{i}")
}

/// One CPU profile of the last `PUSH_EVERY`: `value` nanoseconds in
/// `main;proflowOutageStream;<phase function>;<seq function>`.
fn stream_profile(function: &str, seq: &str, value: i64, now: i64) -> Vec<u8> {
    let mut b = pprof::ProfileBuilder::new();
    let span = PUSH_EVERY.as_nanos() as i64;
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now - span, span)
        .sample_root_first(["main", "proflowOutageStream", function, seq], vec![value]);
    pprof::gzip(&pprof::encode(&b.build())).to_vec()
}

fn push_until(
    base: &str,
    app: &str,
    (phase, accepted, stop, pushing): (&AtomicUsize, &[AtomicU64; 3], &AtomicBool, &Mutex<()>),
) -> Pushed {
    let http = common::http_client();
    let mut pushed = Pushed::default();
    let started = Instant::now();
    let mut next = started;
    let mut last_time = 0i64;
    for i in 0i64.. {
        let _push = pushing.lock().unwrap_or_else(|p| p.into_inner());
        if stop.load(Ordering::SeqCst) {
            break;
        }
        let p = phase.load(Ordering::SeqCst);
        let function = PHASES[p];
        let seq = seq_function(i);
        // Distinct values (10 to 40 ms plus the sequence number in ns), so
        // a profile lost or delivered twice changes the totals.
        let value = 10_000_000 * (1 + i % 4) + i;
        // Each profile's time at least `PUSH_EVERY` after the one before:
        // Pyroscope counts the profiles of one series that share a
        // millisecond once (its query deduplicates by series and
        // millisecond, though it stored and acknowledged both; see
        // `pyroscope_counts_one_profile_per_series_and_millisecond` in
        // tests/pyroscope_exporter.rs), and a stream held while the peer
        // stopped must not push two into one millisecond when it goes on.
        let now = common::now_nanos().max(last_time + PUSH_EVERY.as_nanos() as i64);
        last_time = now;
        let url = format!(
            "{base}/ingest?name={app}&from={}&until={now}&format=pprof&spyName=e2e&sampleRate=100",
            now - PUSH_EVERY.as_nanos() as i64
        );
        let answer = http
            .post(&url)
            .header("content-type", "application/octet-stream")
            .body(stream_profile(function, &seq, value, now))
            .send();
        match answer {
            Ok(r) if r.status().as_u16() == 200 => {
                *pushed.totals.entry(function.to_owned()).or_default() += value;
                pushed.profiles += 1;
                pushed.each.push((seq, value, started.elapsed()));
                accepted[p].fetch_add(1, Ordering::SeqCst);
            }
            Ok(r) => {
                pushed
                    .refused
                    .push(format!("{}: {}", r.status(), r.text().unwrap_or_default()))
            }
            Err(e) => pushed.refused.push(e.to_string()),
        }
        drop(_push);
        // After a hold, on from now: no burst to catch up.
        next = (next + PUSH_EVERY).max(Instant::now());
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    pushed
}

/// proflow with `pprof_push` → the exporter `id` (body `body`, YAML lines),
/// a queue of 100,000 profiles and retries every 200 ms to 1 s for up to 2
/// minutes.
fn start_proflow(id: &str, body: &str) -> Proflow {
    let body: String = body
        .lines()
        .chain([
            "timeout: 2s",
            "sending_queue: { queue_size: 100000, num_consumers: 2 }",
            "retry_on_failure: { initial_interval: 200ms, max_interval: 1s, max_elapsed_time: 2m }",
        ])
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("    {l}\n"))
        .collect();
    Proflow::start(|ports, _| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             exporters:\n  {id}:\n{body}\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [{id}]\n",
            ports.receiver, ports.telemetry
        )
    })
}

/// The exporter `id`'s sample of `metric`.
fn exporter_metric(metrics: &str, metric: &str, id: &str) -> f64 {
    common::metric_sum(metrics, metric, &[("exporter", id)])
}

/// Runs the stream through proflow to `peer` (exporter `id`), stops the peer
/// for [`OUTAGE`], starts it again, and checks what the module doc says;
/// `read_back(app, functions)` reads the peer's totals of those functions
/// (and a description of what it saw).
fn outage_loses_nothing(
    peer: &mut PrivatePeer,
    id: &str,
    body: &str,
    read_back: impl Fn(&str, &[&str]) -> (Totals, String),
) {
    let started = Instant::now();
    let proflow = start_proflow(id, body);
    let app = common::unique_name(&format!("outage-{id}"));
    let stream = Stream::start(&proflow, &app);
    let stream_started = Instant::now();
    let metric = |name: &str| exporter_metric(&proflow.metrics(), name, id);

    // Up: profiles are sent as they come, without a retry.
    std::thread::sleep(STEADY);
    let sent_before = metric("proflow_exporter_sent_profiles_total");
    assert!(
        sent_before > 0.0,
        "nothing was sent while {id} was up\nlog:\n{}",
        proflow.log_text()
    );
    assert_eq!(
        metric("proflow_exporter_retries_total"),
        0.0,
        "retries while {id} was up\nlog:\n{}",
        proflow.log_text()
    );

    // Down, between two pushes and once everything pushed so far was sent:
    // a Pyroscope sent a profile as it shut down answered 200 and did not
    // have it after the restart (once, on a loaded machine). What is checked
    // here is proflow's queue across the outage, not the peer's shutdown.
    let hold = stream.hold();
    let mut metrics = String::new();
    let delivered = peer_env::poll(SETTLE_TIMEOUT, || {
        metrics = proflow.metrics();
        let queue = exporter_metric(&metrics, "proflow_exporter_queue_profiles", id);
        let sent = exporter_metric(&metrics, "proflow_exporter_sent_profiles_total", id);
        (queue == 0.0 && sent >= stream.accepted(0) as f64).then_some(())
    });
    assert!(
        delivered.is_some(),
        "{} profiles pushed before the stop were not all sent\nmetrics:\n{metrics}",
        stream.accepted(0)
    );
    stream.set_phase(1);
    peer.stop();
    drop(hold);
    let down_at = Instant::now();
    // Profiles pushed while the peer was shutting down may have reached it,
    // and an answer it gave just before it exited may still be being
    // counted: the baseline is taken once a send has failed against the
    // stopped peer (a retry counted after it exited), which comes after the
    // answers it gave.
    let retries_at_stop = metric("proflow_exporter_retries_total");
    let failed_once = peer_env::poll(SETTLE_TIMEOUT, || {
        (metric("proflow_exporter_retries_total") > retries_at_stop).then_some(())
    });
    assert!(
        failed_once.is_some(),
        "no send failed in {SETTLE_TIMEOUT:?} after {id} stopped\nlog:\n{}",
        proflow.log_text()
    );
    let pushed_when_down = stream.accepted(1);
    let sent_when_down = metric("proflow_exporter_sent_profiles_total");
    // The rest of the outage, measured from the baseline.
    let settle = Duration::from_secs(1);
    std::thread::sleep(OUTAGE - settle);
    // Read before the metrics: a profile is queued before its push is
    // answered, and the queue only grows while the peer is down.
    let pushed_while_down = stream.accepted(1) - pushed_when_down;
    let metrics = proflow.metrics();
    let queued = exporter_metric(&metrics, "proflow_exporter_queue_profiles", id);
    let retries = exporter_metric(&metrics, "proflow_exporter_retries_total", id);
    let sent_while_down =
        exporter_metric(&metrics, "proflow_exporter_sent_profiles_total", id) - sent_when_down;
    assert!(
        pushed_while_down >= ((OUTAGE - settle).as_millis() / PUSH_EVERY.as_millis() / 2) as u64,
        "the stream pushed only {pushed_while_down} profiles during the outage"
    );
    assert_eq!(
        sent_while_down, 0.0,
        "profiles counted as sent while {id} was down\nmetrics:\n{metrics}"
    );
    assert!(
        queued >= pushed_while_down as f64,
        "{pushed_while_down} profiles were pushed while {id} was down, but the queue holds {queued}\nmetrics:\n{metrics}"
    );
    assert!(
        retries > 0.0,
        "no retry while {id} was down\nmetrics:\n{metrics}"
    );

    // Back.
    peer.start_again();
    let back_at = Instant::now();
    let outage = down_at.elapsed();
    stream.set_phase(2);
    std::thread::sleep(STEADY);
    let pushed = stream.finish();
    assert!(
        pushed.refused.is_empty(),
        "proflow refused pushes: {:?}",
        pushed.refused
    );
    let mut metrics = String::new();
    let drained = peer_env::poll(SETTLE_TIMEOUT, || {
        metrics = proflow.metrics();
        let queue = exporter_metric(&metrics, "proflow_exporter_queue_profiles", id);
        let sent = exporter_metric(&metrics, "proflow_exporter_sent_profiles_total", id);
        (queue == 0.0 && sent >= pushed.profiles as f64).then_some(())
    });
    assert!(
        drained.is_some(),
        "{} profiles pushed; after {SETTLE_TIMEOUT:?} the queue has not drained to 0 with all sent\nmetrics:\n{metrics}\nlog:\n{}",
        pushed.profiles,
        proflow.log_text()
    );
    for (what, want) in [
        (
            "proflow_exporter_sent_profiles_total",
            pushed.profiles as f64,
        ),
        ("proflow_exporter_failed_profiles_total", 0.0),
        ("proflow_exporter_dropped_profiles_total", 0.0),
    ] {
        assert_eq!(
            exporter_metric(&metrics, what, id),
            want,
            "{what}\nmetrics:\n{metrics}\nlog:\n{}",
            proflow.log_text()
        );
    }

    // Everything is in the peer, once.
    let want = pushed.totals;
    assert_eq!(want.len(), PHASES.len(), "every phase pushed: {want:?}");
    let mut last = (Totals::new(), String::new());
    let same = peer_env::poll(SETTLE_TIMEOUT, || {
        last = read_back(&app, &PHASES);
        (last.0 == want).then_some(())
    });
    if same.is_none() {
        // Which profiles: each one's own leaf function, read back.
        let since = |at: Instant| at.duration_since(stream_started);
        let seqs: Vec<&str> = pushed.each.iter().map(|(f, _, _)| f.as_str()).collect();
        let (by_seq, _) = read_back(&app, &seqs);
        let differ: Vec<String> = pushed
            .each
            .iter()
            .filter(|(f, value, _)| by_seq.get(f).copied().unwrap_or(0) != *value)
            .map(|(f, value, answered)| {
                format!(
                    "{f}: pushed {value}, read {} (answered {answered:?} into the stream)",
                    by_seq.get(f).copied().unwrap_or(0)
                )
            })
            .collect();
        panic!(
            "{id} has per-phase totals {:?} ({}) for service_name={app}; proflow accepted {want:?}\n\
             the profiles that differ (the peer stopped {:?} and was started again {:?} into the stream):\n{}\nlog:\n{}",
            last.0,
            last.1,
            since(down_at),
            since(back_at),
            differ.join("\n"),
            proflow.log_text()
        );
    }
    eprintln!(
        "{id}: {} profiles ({pushed_while_down} while down, outage {outage:?}, {retries} retries, {queued} queued before the restart) all read back as {want:?}; test took {:?}",
        pushed.profiles,
        started.elapsed()
    );
}

#[test]
fn pyroscope_stopped_and_restarted_mid_stream_loses_nothing() {
    let Some(mut pyroscope) = PrivatePeer::start("pyroscope") else {
        return;
    };
    let base = pyroscope.http_base();
    let http = common::http_client();
    outage_loses_nothing(
        &mut pyroscope,
        "pyroscope",
        &format!("endpoint: {base}\n"),
        |app, functions| {
            readback::pyroscope_totals(
                &http,
                &base,
                &format!("{{service_name=\"{app}\"}}"),
                functions,
                Some(PYROSCOPE_TYPE),
            )
        },
    );
}

#[test]
fn parca_stopped_and_restarted_mid_stream_loses_nothing() {
    let Some(mut parca) = PrivatePeer::start("parca") else {
        return;
    };
    let base = parca.http_base();
    let endpoint = parca.endpoint().to_owned();
    let http = common::http_client();
    outage_loses_nothing(
        &mut parca,
        "parca",
        &format!("endpoint: {endpoint}\ntls: {{ insecure: true }}\n"),
        |app, functions| {
            let query = format!("{PYROSCOPE_TYPE}:delta{{service_name=\"{app}\"}}");
            let mut last = String::new();
            let mut totals = Totals::new();
            if let Some(merged) = readback::parca_merge(&http, &base, &query, &mut last) {
                common::add_function_totals(&mut totals, &merged, functions, None);
            }
            (totals, format!("{query}: {last}"))
        },
    );
}
