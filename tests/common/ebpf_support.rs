//! Helpers of the `ebpf` receiver's end-to-end tests (`tests/ebpf.rs`,
//! `tests/ebpf_runtimes.rs`): root and one test at a time, a proflow that
//! profiles chosen pids into files, the stacks it wrote, the checks of a
//! 2:1 split, and the same totals read back from the real Pyroscope.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::{self, IndexEntry, Ports, Proflow};
use proflow_model::pprof;

/// Held by each test for its whole run: the tests measure CPU shares of
/// busy targets, and on a two-core machine two of them at once starve each
/// other's targets (one saw 530 samples where a third of a core gives 1,000).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Fails unless root, then waits for the other tests of this file to end;
/// hold the guard for the whole test.
pub fn require_root() -> std::sync::MutexGuard<'static, ()> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next())
        .unwrap_or("?");
    assert_eq!(
        uid, "0",
        "the ebpf tests load a BPF program and need root (run the test command as root, as CI does)"
    );
    // A test that failed while holding it poisoned it; the next may run.
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// proflow with the ebpf receiver profiling only `pids`, into files, at
/// 997 Hz: the 2:1 split is checked to ±10%, and with n samples the split's
/// standard error is about 9.5% × √(500/n), so a few thousand samples are
/// needed for the check to mean something (4,000: 3.4%, the bound ≈ 3σ).
pub fn proflow_for(pids: &[u32], interval: &str) -> Proflow {
    proflow_for_with(pids, interval, "")
}

/// [`proflow_for`] with more settings of the receiver (`extra`: YAML lines
/// indented under `ebpf:`).
pub fn proflow_for_with(pids: &[u32], interval: &str, extra: &str) -> Proflow {
    let keep = pids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("|");
    Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n{extra}    sample_rate: 997\n    collect_interval: {interval}\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{keep}', action: keep}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Every sample of `pid`'s profiles as (root-first function names, count),
/// once at least `min_samples` were written.
pub fn stacks_of(proflow: &Proflow, pid: u32, min_samples: i64) -> Vec<(Vec<String>, i64)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let entries: Vec<IndexEntry> = common::read_index(&proflow.profiles)
            .into_iter()
            .filter(|e| e.label("pid") == Some(pid.to_string().as_str()) && e.path.is_file())
            .collect();
        let mut stacks = Vec::new();
        for e in &entries {
            let p = common::read_profile(&e.path);
            assert_eq!(
                p.string(p.sample_type[0].r#type),
                "cpu",
                "first sample type is cpu/nanoseconds"
            );
            for (frames, s) in pprof::stacks_root_first(&p) {
                stacks.push((frames.iter().map(|f| f.to_string()).collect(), s.value[1]));
            }
        }
        let total: i64 = stacks.iter().map(|(_, n)| n).sum();
        if total >= min_samples {
            return stacks;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s, {total} samples of pid {pid} (want {min_samples}); index:\n{}\nlog:\n{}",
            std::fs::read_to_string(proflow.profiles.join("index.jsonl")).unwrap_or_default(),
            proflow.log_text()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Samples whose stack has a frame containing `function`.
pub fn count_with(stacks: &[(Vec<String>, i64)], function: &str) -> i64 {
    stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x.contains(function)))
        .map(|(_, n)| n)
        .sum()
}

/// Checks the 2:1 split between `two` and `one`, that the samples in either
/// (all but at most 1%) have a full stack: `chain` in root-first order (each a substring of its
/// frame, other frames allowed between), ending in the hot function, and
/// that nearly all of them are in `leaf`, the function both call.
pub fn check_split_and_stacks(
    stacks: &[(Vec<String>, i64)],
    two: &str,
    one: &str,
    chain: &[&str],
    leaf: &str,
) {
    let dump = check_split(stacks, two, one);
    let (a, b) = (count_with(stacks, two), count_with(stacks, one));
    let in_leaf: i64 = stacks
        .iter()
        .filter(|(f, _)| {
            let hot = f.iter().position(|x| x.contains(two) || x.contains(one));
            hot.is_some_and(|i| f[i + 1..].iter().any(|x| x.contains(leaf)))
        })
        .map(|(_, n)| n)
        .sum();
    assert!(
        in_leaf as f64 >= 0.9 * (a + b) as f64,
        "only {in_leaf} of {} hot samples have {leaf} below the hot function; stacks: {dump:#?}",
        a + b
    );
    // Every hot stack holds the chain, but for at most 1% of the hot
    // samples: a stack the BPF program could not read whole comes back
    // short (in a loaded run, 1 sample of about 1,500 held the Python frame
    // alone), and a profiler keeps it rather than lose the sample.
    let mut broken = 0i64;
    let mut first_broken = None;
    for (frames, n) in stacks {
        let hot = frames.iter().any(|f| f.contains(two) || f.contains(one));
        if hot && !holds_chain(frames, chain) {
            broken += n;
            first_broken.get_or_insert(frames);
        }
    }
    assert!(
        broken as f64 <= 0.01 * (a + b) as f64,
        "{broken} of {} hot samples miss the chain (root-first {chain:?}); the first:\n{first_broken:#?}\nall stacks: {dump:#?}",
        a + b
    );
}

/// Whether `frames` (root first) hold each of `chain` in order, other frames
/// allowed between.
pub fn holds_chain(frames: &[String], chain: &[&str]) -> bool {
    let mut at = 0;
    chain.iter().all(
        |want| match frames[at..].iter().position(|f| f.contains(want)) {
            Some(i) => {
                at += i + 1;
                true
            }
            None => false,
        },
    )
}

/// Checks the 2:1 split between the samples with a frame containing `two`
/// and those with one containing `one`, and that nearly all are in either;
/// returns the stacks with their samples, for messages.
pub fn check_split(stacks: &[(Vec<String>, i64)], two: &str, one: &str) -> BTreeMap<String, i64> {
    let (a, b) = (count_with(stacks, two), count_with(stacks, one));
    let all: i64 = stacks.iter().map(|(_, n)| n).sum();
    let dump: BTreeMap<String, i64> =
        stacks
            .iter()
            .map(|(f, n)| (f.join(";"), *n))
            .fold(BTreeMap::new(), |mut m, (k, n)| {
                *m.entry(k).or_default() += n;
                m
            });
    assert!(
        a > 0 && b > 0,
        "no sample in {two} or {one}; stacks: {dump:#?}"
    );
    let ratio = a as f64 / b as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "{two}:{one} = {a}:{b} = {ratio:.2}, want 2 ± 10%; stacks: {dump:#?}"
    );
    assert!(
        (a + b) as f64 >= 0.9 * all as f64,
        "only {} of {all} samples in {two} or {one}; stacks: {dump:#?}",
        a + b
    );
    dump
}

/// Waits (90 s at most) until the real Pyroscope has `want`, the totals of
/// `functions`, for service `app` under profile type `profile_type`.
pub fn pyroscope_has(
    pyroscope: &crate::peer_env::Peer,
    app: &str,
    (functions, profile_type): (&[&str], &str),
    want: &common::Totals,
    proflow: &Proflow,
) {
    let selector = format!("{{service_name=\"{app}\"}}");
    let (same, got, answer) = crate::readback::pyroscope_wait(
        &common::http_client(),
        &pyroscope.http_base(),
        (&selector, functions, profile_type),
        Duration::from_secs(90),
        |t| common::totals_close(t, want),
    );
    assert!(
        same,
        "Pyroscope has {got:?} ({answer}) for {selector}; the file exporter wrote {want:?}\nlog:\n{}",
        proflow.log_text()
    );
}
