//! The persistent queue (`sending_queue.storage`) end to end, with two real
//! proflow processes: the first takes pushes and sends them through its
//! `pyroscope` exporter to the second, whose `pprof_push` receiver writes
//! files. The second is down while 500 distinct profiles are pushed; the
//! first is killed with SIGKILL at the worst moments and started again on the
//! same directory. Every profile a push was answered 200 for must arrive
//! (compared by a hash of its decoded content); duplicates are counted and
//! printed, never lost.
//!
//! - SIGKILL while the pushes are coming in;
//! - SIGKILL while the first is sending what it had stored (replay);
//! - a segment truncated and damaged while the first is down: it starts, the
//!   damage is counted, and every intact record is delivered.
//!
//! And against the real Pyroscope (a private one, `tests/peers/private`):
//! stopped while the pushes come in and the first is killed, started again
//! after; each profile names a function of its own, and every one must be
//! there in Pyroscope's merged profile with its value (a whole multiple of
//! it: a profile delivered twice is counted, never lost).

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Proflow, gzip, read_index};

const N: usize = 500;
/// How long the second may take to get everything.
const ARRIVAL: Duration = Duration::from_secs(120);
/// The first's exporter: consumers, and profiles in one export of each.
const CONSUMERS: usize = 2;
const BATCH: usize = 2;
/// The most profiles the first can have sent and not yet recorded as sent
/// when it is killed: each consumer's one export in flight. After its
/// restart only those may arrive twice.
const IN_FLIGHT: usize = CONSUMERS * BATCH;
/// Threads pushing at once: each may have one push stored whose answer a
/// SIGKILL cut off, which the client sends again (a second copy).
const PUSHERS: usize = 8;

/// Profile `i`: its hot function's value is `i + 1` ms.
fn profile(i: usize) -> Vec<u8> {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "pq_hot"], vec![(i as i64 + 1) * 1_000_000])
        .sample_root_first(["main", "pq_warm"], vec![3_000_000]);
    gzip(&proflow_model::pprof::encode(&b.build()))
}

/// A hash of what a profile says: its stacks and values, in a stable order.
fn content_hash(p: &proflow_model::pprof::Profile) -> u64 {
    let mut stacks: Vec<String> = proflow_model::pprof::stacks_root_first(p)
        .map(|(frames, s)| format!("{}={:?}", frames.join(";"), s.value))
        .collect();
    stacks.sort();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    stacks.hash(&mut h);
    h.finish()
}

fn expected_hash(i: usize) -> u64 {
    let raw = profile(i);
    let p = proflow_model::pprof::decode(&bytes::Bytes::from(raw), 1 << 24)
        .expect("our own profile decodes");
    content_hash(&p)
}

/// The first proflow: `pprof_push` → `pyroscope` (to `second`) with a disk queue.
fn start_first(queue: &Path, second: SocketAddr) -> Proflow {
    Proflow::start(|ports, _| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             exporters:\n  pyroscope:\n    endpoint: http://{second}\n    timeout: 5s\n    \
             sending_queue:\n      num_consumers: {CONSUMERS}\n      batch: {{max_profiles: {BATCH}}}\n      storage: {{directory: {}, fsync: batch}}\n    \
             retry_on_failure: {{initial_interval: 100ms, max_interval: 500ms, max_elapsed_time: 0s}}\n\
             service:\n  shutdown_timeout: 1s\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [pyroscope]\n",
            ports.receiver,
            queue.display(),
            ports.telemetry
        )
    })
}

/// The second proflow: `pprof_push` on `addr` → `file`.
fn start_second(addr: SocketAddr) -> Proflow {
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {addr}\n\
             exporters:\n  file:\n    directory: {}\n\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Profile `i` for the real Pyroscope: `main` → `pq_fn_<i>` of `i + 1` ms,
/// so each profile shows in the merged profile by a function of its own.
fn named_profile(i: usize) -> Vec<u8> {
    let name = format!("pq_fn_{i}");
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", name.as_str()], vec![(i as i64 + 1) * 1_000_000]);
    gzip(&proflow_model::pprof::encode(&b.build()))
}

/// Pushes profiles `0..N` to whichever first proflow `target` names, from
/// several threads (each push waits for the group commit), until every one
/// was answered 200. A push that fails (the process was killed under it) is
/// tried again, as a client would.
struct Pusher {
    target: Arc<Mutex<SocketAddr>>,
    acked: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<()>>,
    n: usize,
}

impl Pusher {
    fn start(first: SocketAddr, n: usize) -> Pusher {
        Pusher::start_with(first, n, "pq-app", profile)
    }

    /// Pushes `body(i)` as `app{seq=i}`.
    fn start_with(first: SocketAddr, n: usize, app: &str, body: fn(usize) -> Vec<u8>) -> Pusher {
        let target = Arc::new(Mutex::new(first));
        let acked = Arc::new(AtomicUsize::new(0));
        let work: Arc<Mutex<VecDeque<usize>>> = Arc::new(Mutex::new((0..n).collect()));
        let deadline = Instant::now() + ARRIVAL;
        let threads = (0..PUSHERS)
            .map(|_| {
                let (target, acked, work) = (target.clone(), acked.clone(), work.clone());
                let app = app.to_owned();
                std::thread::spawn(move || {
                    let http = common::http_client();
                    loop {
                        let Some(i) = work.lock().unwrap().pop_front() else {
                            return;
                        };
                        let addr = *target.lock().unwrap();
                        let url = format!(
                            "http://{addr}{}",
                            common::ingest_query(&format!("{app}{{seq={i}}}"), Some("pprof"))
                        );
                        let ok = http
                            .post(&url)
                            .header("content-type", "application/octet-stream")
                            .body(body(i))
                            .send()
                            .is_ok_and(|r| r.status().as_u16() == 200);
                        if ok {
                            acked.fetch_add(1, Ordering::SeqCst);
                        } else {
                            assert!(Instant::now() < deadline, "profile {i} never accepted");
                            work.lock().unwrap().push_back(i);
                            std::thread::sleep(Duration::from_millis(100));
                        }
                    }
                })
            })
            .collect();
        Pusher {
            target,
            acked,
            threads,
            n,
        }
    }

    fn wait_acked(&self, n: usize) {
        let deadline = Instant::now() + ARRIVAL;
        while self.acked.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "pushes not accepted in time");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn retarget(&self, addr: SocketAddr) {
        *self.target.lock().unwrap() = addr;
    }

    fn finish(self) {
        for t in self.threads {
            t.join().expect("pusher thread");
        }
        assert_eq!(self.acked.load(Ordering::SeqCst), self.n);
    }
}

/// Pushes `body(i)` as `app{seq=i}` for `0..N` to a first proflow on
/// `queue` that sends to `backend`, kills it with SIGKILL halfway (pushes in
/// flight on every thread), starts it again on the same directory and
/// finishes the pushes there; returns the restarted one.
fn push_across_a_sigkill(
    queue: &Path,
    backend: SocketAddr,
    app: &str,
    body: fn(usize) -> Vec<u8>,
) -> Proflow {
    let mut first = start_first(queue, backend);
    let pusher = Pusher::start_with(first.ports.receiver, N, app, body);
    pusher.wait_acked(N / 2);
    sigkill(&mut first);
    let first = start_first(queue, backend);
    assert!(
        first.log_text().contains("persistent queue opened"),
        "the restarted proflow found nothing to send again\n{}",
        first.log_text()
    );
    pusher.retarget(first.ports.receiver);
    pusher.finish();
    first
}

/// SIGKILL by pid (the harness's own kill needs the handle the test holds).
fn sigkill(p: &mut Proflow) {
    let status = Command::new("kill")
        .args(["-KILL", &p.pid().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
    p.sigkill(); // reaps it
}

/// What the second wrote: per `seq`, the content hashes of its copies.
fn arrived(second: &Proflow) -> BTreeMap<usize, Vec<u64>> {
    let mut out: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
    for e in read_index(&second.profiles) {
        if !e.path.is_file() {
            continue;
        }
        let Some(seq) = e.label("seq").and_then(|s| s.parse().ok()) else {
            continue;
        };
        out.entry(seq)
            .or_default()
            .push(content_hash(&common::read_profile(&e.path)));
    }
    out
}

/// Waits until `want` arrived at `second`, every copy with the right
/// content.
fn wait_all_arrived(second: &Proflow, first: &Proflow, want: &[usize]) {
    let hashes: HashMap<usize, u64> = want.iter().map(|&i| (i, expected_hash(i))).collect();
    let deadline = Instant::now() + ARRIVAL;
    loop {
        let got = arrived(second);
        let missing: Vec<usize> = want
            .iter()
            .copied()
            .filter(|i| !got.contains_key(i))
            .collect();
        if missing.is_empty() {
            for (seq, copies) in &got {
                if let Some(h) = hashes.get(seq) {
                    assert!(
                        copies.iter().all(|c| c == h),
                        "profile seq={seq} arrived with other content"
                    );
                }
            }
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "{} of {} profiles never arrived: {:?}\nfirst's log:\n{}\nfirst's metrics:\n{}",
                missing.len(),
                want.len(),
                &missing[..missing.len().min(40)],
                first.log_text(),
                first.metrics()
            );
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn metric(p: &Proflow, name: &str) -> f64 {
    common::metric_sum(&p.metrics(), name, &[("exporter", "pyroscope")])
}

/// Waits until the first has sent everything and recorded it (nothing
/// queued, nothing stored): no copy can come later. Then the copies that
/// arrived more than once.
fn duplicates_once_drained(second: &Proflow, first: &Proflow) -> usize {
    let deadline = Instant::now() + ARRIVAL;
    while metric(first, "proflow_exporter_queue_stored_records") > 0.0
        || metric(first, "proflow_exporter_queue_profiles") > 0.0
    {
        assert!(
            Instant::now() < deadline,
            "the first still holds records after everything arrived\n{}",
            first.metrics()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    arrived(second).values().map(|c| c.len() - 1).sum()
}

#[test]
fn sigkill_while_profiles_arrive_and_the_backend_is_down_loses_nothing() {
    let queue = tempfile::tempdir().unwrap();
    // The backend comes up late, at an address the first proflow already has.
    let second_port = common::late_port();
    let second_addr = SocketAddr::from(([127, 0, 0, 1], second_port.port));
    let first = push_across_a_sigkill(queue.path(), second_addr, "pq-app", profile);
    // Only now does the backend come up.
    let second = start_second(second_addr);
    let all: Vec<usize> = (0..N).collect();
    wait_all_arrived(&second, &first, &all);
    assert!(metric(&first, "proflow_exporter_queue_replayed_records_total") >= 1.0);
    // Nothing was delivered before the kill (the backend was down): a copy
    // can only be a push the client sent again after the kill cut off its
    // answer, one per pushing thread at most.
    let duplicates = duplicates_once_drained(&second, &first);
    assert!(
        duplicates <= PUSHERS,
        "{duplicates} profiles arrived twice; at most {PUSHERS} pushes were cut off by the kill\nfirst's log:\n{}",
        first.log_text()
    );
    eprintln!(
        "{N} profiles across a SIGKILL of the sender with the backend down: none lost, {duplicates} delivered twice"
    );
}

#[test]
fn sigkill_while_replaying_loses_nothing() {
    let queue = tempfile::tempdir().unwrap();
    // The backend comes up late, at an address the first proflow already has.
    let second_port = common::late_port();
    let second_addr = SocketAddr::from(([127, 0, 0, 1], second_port.port));
    let mut first = start_first(queue.path(), second_addr);
    let pusher = Pusher::start(first.ports.receiver, N);
    pusher.finish();
    // Stopped the hard way with everything still on disk.
    sigkill(&mut first);
    let second = start_second(second_addr);
    let mut first = start_first(queue.path(), second_addr);
    // Killed again while it sends what it stored.
    let deadline = Instant::now() + ARRIVAL;
    while read_index(&second.profiles).len() < N / 5 {
        assert!(
            Instant::now() < deadline,
            "replay never started\n{}",
            first.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    sigkill(&mut first);
    let before_kill = arrived(&second).len();
    assert!(
        before_kill < N,
        "everything arrived before the kill; the test did not kill during replay"
    );
    let first = start_first(queue.path(), second_addr);
    let all: Vec<usize> = (0..N).collect();
    wait_all_arrived(&second, &first, &all);
    // The replay goes on from where the killed one recorded it was: only
    // what it had in flight may come twice.
    let duplicates = duplicates_once_drained(&second, &first);
    assert!(
        duplicates <= IN_FLIGHT,
        "{duplicates} profiles arrived twice after a SIGKILL during replay ({before_kill} had arrived); \
         at most {IN_FLIGHT} ({CONSUMERS} consumers x {BATCH} a batch) were in flight\nfirst's log:\n{}",
        first.log_text()
    );
    eprintln!(
        "{N} profiles across a SIGKILL during replay ({before_kill} had arrived): none lost, {duplicates} delivered twice"
    );
    // Once all is delivered the segments go.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric(&first, "proflow_exporter_queue_stored_records") > 0.0 {
        assert!(
            Instant::now() < deadline,
            "records still stored after delivery"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_damaged_segment_is_counted_and_every_intact_record_delivered() {
    use proflow_core::queue::storage::{record, segment};
    const M: usize = 120;
    let queue = tempfile::tempdir().unwrap();
    // The backend comes up late, at an address the first proflow already has.
    let second_port = common::late_port();
    let second_addr = SocketAddr::from(([127, 0, 0, 1], second_port.port));
    let mut first = start_first(queue.path(), second_addr);
    Pusher::start(first.ports.receiver, M).finish();
    sigkill(&mut first);
    // The exporter's folder, and its segment with records.
    let folder = queue.path().join("pyroscope");
    let mut damaged_seqs = Vec::new();
    let mut records_seen = 0;
    for n in segment::list(&folder).unwrap() {
        let path = segment::segment_path(&folder, n);
        let scan = segment::scan(&path, u32::MAX).unwrap();
        assert!(
            scan.damage.is_empty(),
            "a SIGKILL after the answers left no damage"
        );
        if scan.records.len() < 6 {
            records_seen += scan.records.len();
            continue;
        }
        records_seen += scan.records.len();
        let mut bytes = std::fs::read(&path).unwrap();
        let seqs_of = |f: &segment::Found, bytes: &[u8]| -> Vec<usize> {
            let from = f.offset as usize + segment::FRAME_HEADER;
            let rec = bytes::Bytes::copy_from_slice(&bytes[from..from + f.len as usize]);
            let (envelopes, _) = record::decode(&rec).unwrap();
            envelopes
                .iter()
                .map(|e| e.labels.get("seq").unwrap().parse().unwrap())
                .collect()
        };
        // A flipped byte inside a record a third of the way in...
        let hit = scan.records[scan.records.len() / 3];
        damaged_seqs.extend(seqs_of(&hit, &bytes));
        // ...and a torn tail: the last record cut in its middle.
        let last = *scan.records.last().unwrap();
        damaged_seqs.extend(seqs_of(&last, &bytes));
        bytes[hit.offset as usize + segment::FRAME_HEADER + hit.len as usize / 2] ^= 0xa5;
        bytes.truncate(last.offset as usize + segment::FRAME_HEADER + last.len as usize / 2);
        std::fs::write(&path, bytes).unwrap();
        break;
    }
    assert!(
        !damaged_seqs.is_empty(),
        "no segment with records ({records_seen} records seen)"
    );
    let second = start_second(second_addr);
    let first = start_first(queue.path(), second_addr);
    let intact: Vec<usize> = (0..M).filter(|i| !damaged_seqs.contains(i)).collect();
    wait_all_arrived(&second, &first, &intact);
    assert_eq!(metric(&first, "proflow_exporter_queue_corrupt_total"), 2.0);
    assert!(
        first
            .log_text()
            .contains("damaged bytes in the persistent queue"),
        "{}",
        first.log_text()
    );
    eprintln!(
        "{M} stored profiles, 2 damaged records ({} profiles: {damaged_seqs:?}): the other {} delivered",
        damaged_seqs.len(),
        intact.len()
    );
}

#[test]
fn sigkill_with_the_real_pyroscope_down_loses_nothing() {
    let Some(mut pyroscope) = peer_env::PrivatePeer::start("pyroscope") else {
        return;
    };
    // Down before the first push: everything waits on the first's disk.
    pyroscope.stop();
    let addr: SocketAddr = pyroscope
        .endpoint()
        .parse()
        .expect("Pyroscope's endpoint is host:port");
    let queue = tempfile::tempdir().unwrap();
    let app = common::unique_name("pq-pyroscope");
    let first = push_across_a_sigkill(queue.path(), addr, &app, named_profile);
    pyroscope.start_again();
    let names: Vec<String> = (0..N).map(|i| format!("pq_fn_{i}")).collect();
    let functions: Vec<&str> = names.iter().map(String::as_str).collect();
    let (all, got, _) = readback::pyroscope_wait(
        &common::http_client(),
        &pyroscope.http_base(),
        (
            &format!("{{service_name=\"{app}\"}}"),
            &functions,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        ),
        ARRIVAL,
        |t| t.len() == N,
    );
    let missing: Vec<&str> = functions
        .iter()
        .copied()
        .filter(|f| !got.contains_key(*f))
        .collect();
    assert!(
        all,
        "{} of {N} profiles are not in Pyroscope: {:?}\nfirst's log:\n{}\nfirst's metrics:\n{}",
        missing.len(),
        &missing[..missing.len().min(40)],
        first.log_text(),
        first.metrics()
    );
    // Each a whole multiple of its own value. A record proflow sends twice
    // has the same series and time, which Pyroscope counts once
    // (tests/pyroscope_exporter.rs); a push the client sent again because
    // the kill cut off its answer is a profile of its own and counts: at
    // most one per pushing thread.
    let mut duplicates = 0;
    for (i, f) in functions.iter().enumerate() {
        let (got, one) = (got[*f], (i as i64 + 1) * 1_000_000);
        assert!(
            got >= one && got % one == 0,
            "{f}: {got} ns in Pyroscope, want a whole multiple of {one}"
        );
        duplicates += (got / one - 1) as usize;
    }
    assert!(
        duplicates <= PUSHERS,
        "{duplicates} profiles counted twice in Pyroscope; at most {PUSHERS} pushes were cut off by the kill"
    );
    assert!(metric(&first, "proflow_exporter_queue_replayed_records_total") >= 1.0);
    eprintln!(
        "{N} profiles across a SIGKILL of the sender with the real Pyroscope down: all in Pyroscope, {duplicates} pushed again by the client"
    );
}
