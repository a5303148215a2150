//! The `ebpf` receiver end to end, as root, against real programs
//! (`tests/ebpf_targets/`): C with two hot functions at a 2:1 CPU split,
//! built with and without frame pointers, a Rust release binary (no frame
//! pointers) and a Go binary. Each test starts its targets, then its own
//! proflow with a relabel `keep` rule on their pids (which also proves the
//! discovery labels), and reads what the `file` exporter wrote.
//!
//! JIT runtimes run their own targets (`hot.js`, `hot.py`, `Hot.java`) with
//! their perf maps on: Node `--perf-basic-prof` (also in a mount and PID
//! namespace of its own), CPython 3.12 and 3.13 `-X perf`, the JVM after
//! `jcmd Compiler.perfmap`.
//!
//! Off-CPU: a C program sleeping 20 ms and 10 ms in two functions, its
//! `off_cpu` profile against the time it measured around its sleeps.
//!
//! One test sends to the real Pyroscope and reads the profile back.
//!
//! One test names a stripped binary's frames downstream with the
//! `symbolize` processor, from its debug file found by build id.
//!
//! These tests need root (CI runs as root); without it they fail, with a
//! message saying so: they never skip. They run one at a time, since each
//! measures the CPU share of busy targets.

mod common;
mod ebpf_targets;
// Both helper modules include `peer_skip` (one copy each, same skip rules).
#[allow(clippy::duplicate_mod)]
mod peer_env;
mod readback;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{IndexEntry, KillOnDrop, Ports, Proflow};
use ebpf_targets::Target;
use proflow_pipeline::pprof;

/// Held by each test for its whole run: the tests measure CPU shares of
/// busy targets, and on a two-core machine two of them at once starve each
/// other's targets (one saw 530 samples where a third of a core gives 1,000).
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Fails unless root, then waits for the other tests of this file to end;
/// hold the guard for the whole test.
fn require_root() -> std::sync::MutexGuard<'static, ()> {
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
fn proflow_for(pids: &[u32], interval: &str) -> Proflow {
    let keep = pids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join("|");
    Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: {interval}\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{keep}', action: keep}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Every sample of `pid`'s profiles as (root-first function names, count),
/// once at least `min_samples` were written.
fn stacks_of(proflow: &Proflow, pid: u32, min_samples: i64) -> Vec<(Vec<String>, i64)> {
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
fn count_with(stacks: &[(Vec<String>, i64)], function: &str) -> i64 {
    stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x.contains(function)))
        .map(|(_, n)| n)
        .sum()
}

/// Checks the 2:1 split between `two` and `one`, that every sample in either
/// has a full stack: `chain` in root-first order (each a substring of its
/// frame, other frames allowed between), ending in the hot function, and
/// that nearly all of them are in `leaf`, the function both call.
fn check_split_and_stacks(
    stacks: &[(Vec<String>, i64)],
    two: &str,
    one: &str,
    chain: &[&str],
    leaf: &str,
) {
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
    assert!(b > 0, "no sample in {one}; stacks: {dump:#?}");
    let ratio = a as f64 / b as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "{two}:{one} = {a}:{b} = {ratio:.2}, want 2 ± 10%; stacks: {dump:#?}"
    );
    // Nearly every sample is in the two hot functions (a few land in the
    // loop between them, or in the kernel on a timer tick).
    assert!(
        (a + b) as f64 >= 0.9 * all as f64,
        "only {} of {all} samples in {two} or {one}; stacks: {dump:#?}",
        a + b
    );
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
    for (frames, n) in stacks {
        let hot = frames.iter().any(|f| f.contains(two) || f.contains(one));
        if !hot {
            continue;
        }
        let mut at = 0;
        for want in chain {
            match frames[at..].iter().position(|f| f.contains(want)) {
                Some(i) => at += i + 1,
                None => panic!(
                    "a stack ({n} samples) misses {want} after frame {at} (want root-first {chain:?}):\n{frames:#?}\nall stacks: {dump:#?}"
                ),
            }
        }
    }
}

fn run_split_test(target: Target, two: &str, one: &str, chain: &[&str], leaf: &str) {
    let _one_at_a_time = require_root();
    let bin = ebpf_targets::build(target).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 30);
    let _child = KillOnDrop(child);
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    check_split_and_stacks(&stacks, two, one, chain, leaf);
}

#[test]
fn c_with_frame_pointers_two_to_one_with_full_stacks() {
    run_split_test(
        Target::CFp,
        "proflow_hot_two",
        "proflow_hot_one",
        &["main", "run", "proflow_hot_"],
        "proflow_spin",
    );
}

#[test]
fn c_without_frame_pointers_unwinds_through_eh_frame() {
    run_split_test(
        Target::CNoFp,
        "proflow_hot_two",
        "proflow_hot_one",
        &["__libc_start", "main", "run", "proflow_hot_"],
        "proflow_spin",
    );
}

#[test]
fn rust_release_binary_without_frame_pointers() {
    run_split_test(
        Target::Rust,
        "proflow_rust_hot_two",
        "proflow_rust_hot_one",
        &["main", "proflow_rust_hot_"],
        "proflow_rust_spin",
    );
}

#[test]
fn go_binary() {
    run_split_test(
        Target::Go,
        "hotTwo",
        "hotOne",
        &["runtime.main", "main.main", "main.hot"],
        "main.spin",
    );
}

/// Checks the 2:1 split between the samples with a frame containing `two`
/// and those with one containing `one`, and that nearly all are in either.
fn jit_split(stacks: &[(Vec<String>, i64)], two: &str, one: &str) {
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
}

/// Removes the perf map a runtime left in /tmp, when dropped.
struct PerfMapFile(std::path::PathBuf);

impl PerfMapFile {
    fn of(pid: u32) -> Self {
        PerfMapFile(format!("/tmp/perf-{pid}.map").into())
    }
}

impl Drop for PerfMapFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// CPython `major.minor` from pyenv (`PYENV_ROOT`, else `~/.pyenv`): its
/// newest patch release installed.
fn pyenv_python(minor: &str) -> Option<std::path::PathBuf> {
    let root = std::env::var_os("PYENV_ROOT")
        .map(std::path::PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".pyenv")))?;
    let mut found: Vec<(Vec<u32>, std::path::PathBuf)> = std::fs::read_dir(root.join("versions"))
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let patch = name.strip_prefix(&format!("{minor}."))?.parse().ok()?;
            let python = e.path().join("bin/python3");
            python.is_file().then_some((vec![patch], python))
        })
        .collect();
    found.sort();
    found.pop().map(|(_, p)| p).or_else(|| {
        common::missing_peer(&format!(
            "CPython {minor} (pyenv install {minor}; looked in {}/versions)",
            root.display()
        ))
    })
}

/// Node with `--perf-basic-prof`: its optimized functions are named from
/// `/tmp/perf-PID.map`, at the program's 2:1 split.
#[test]
fn node_jit_code_named_from_its_perf_map() {
    let _one_at_a_time = require_root();
    // Node writes a log of its own beside the perf map, in its directory.
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = Command::new(std::env::var_os("NODE").unwrap_or_else(|| "node".into()));
    cmd.current_dir(cwd.path())
        .arg("--perf-basic-prof")
        .arg(ebpf_targets::source("hot.js"))
        .arg("30");
    let (child, pid) = ebpf_targets::spawn_command(cmd);
    let _map = PerfMapFile::of(pid);
    let _child = KillOnDrop(child);
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    jit_split(&stacks, "proflow_hot_two /", "proflow_hot_one /");
    // Named with their file, as Node writes them.
    assert!(
        stacks.iter().any(|(f, _)| f
            .iter()
            .any(|x| x.contains("proflow_hot_two") && x.contains("hot.js:"))),
        "{stacks:?}"
    );
}

/// CPython 3.12 and 3.13 with `-X perf`: every Python function's trampoline
/// is named from the perf map, and unwinding steps through the trampolines
/// (which keep no frame pointer) to the callers: `run` above each hot
/// function, the interpreter's `main` above all.
#[test]
fn python_with_x_perf_named_and_unwound_through_its_trampolines() {
    let _one_at_a_time = require_root();
    for minor in ["3.12", "3.13"] {
        let Some(python) = pyenv_python(minor) else {
            continue;
        };
        let mut cmd = Command::new(&python);
        cmd.args(["-X", "perf"])
            .arg(ebpf_targets::source("hot.py"))
            .arg("30");
        let (child, pid) = ebpf_targets::spawn_command(cmd);
        let _map = PerfMapFile::of(pid);
        let _child = KillOnDrop(child);
        let proflow = proflow_for(&[pid], "2s");
        let stacks = stacks_of(&proflow, pid, 4000);
        check_split_and_stacks(
            &stacks,
            "py::proflow_hot_two:",
            "py::proflow_hot_one:",
            &["Py_BytesMain", "py::run:", "py::proflow_hot_"],
            "_PyEval_EvalFrameDefault",
        );
        assert!(
            stacks
                .iter()
                .any(|(f, _)| f.iter().any(|x| x.ends_with("tests/ebpf_targets/hot.py"))),
            "CPython {minor}: frames name their file: {stacks:?}"
        );
    }
}

/// The JVM: after `jcmd PID Compiler.perfmap`, its compiled methods are
/// named from the perf map, at the program's 2:1 split.
#[test]
fn jvm_compiled_methods_named_after_compiler_perfmap() {
    let _one_at_a_time = require_root();
    let java = std::env::var_os("JAVA").unwrap_or_else(|| "java".into());
    let mut cmd = Command::new(&java);
    cmd.arg(ebpf_targets::source("Hot.java")).arg("40");
    let (child, pid) = ebpf_targets::spawn_command(cmd);
    let _map = PerfMapFile::of(pid);
    let _child = KillOnDrop(child);
    // Both methods are compiled within a few seconds of spinning; the map
    // is written when asked.
    std::thread::sleep(Duration::from_secs(4));
    let jcmd = Path::new(&java)
        .parent()
        .map(|d| d.join("jcmd"))
        .filter(|p| p.is_file())
        .unwrap_or_else(|| "jcmd".into());
    let out = Command::new(&jcmd)
        .args([&pid.to_string(), "Compiler.perfmap"])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", jcmd.display()));
    assert!(
        out.status.success(),
        "jcmd Compiler.perfmap: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    jit_split(
        &stacks,
        "Hot.proflow_hot_two(long)",
        "Hot.proflow_hot_one(long)",
    );
}

/// A process in its own mount and PID namespaces with a /tmp of its own,
/// as in a container: its perf map is `/tmp/perf-1.map` there, found
/// through `/proc/PID/root` and its pid in its namespace.
#[test]
fn a_containers_perf_map_is_read_inside_its_root() {
    let _one_at_a_time = require_root();
    let node = std::env::var_os("NODE").unwrap_or_else(|| "node".into());
    let script = format!(
        "mount -t tmpfs tmpfs /tmp && exec {} --perf-basic-prof {} 30",
        Path::new(&node).display(),
        ebpf_targets::source("hot.js").display()
    );
    let cwd = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("unshare");
    cmd.current_dir(cwd.path()).args([
        "--mount",
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        &script,
    ]);
    let (child, ns_pid) = ebpf_targets::spawn_command(cmd);
    assert_eq!(ns_pid, 1, "node is pid 1 in its namespace");
    let unshare = child.id();
    let _child = KillOnDrop(child);
    let pid: u32 = std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children"))
        .unwrap()
        .split_whitespace()
        .next()
        .and_then(|p| p.parse().ok())
        .expect("unshare's child is node");
    assert!(
        !Path::new("/tmp/perf-1.map").exists()
            || !std::fs::read_to_string("/tmp/perf-1.map")
                .unwrap_or_default()
                .contains("proflow_hot_two"),
        "the map is in the namespace's own /tmp only"
    );
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 2000);
    jit_split(&stacks, "proflow_hot_two /", "proflow_hot_one /");
}

/// Off-CPU: a program that sleeps 20 ms in one function and 10 ms in
/// another shows both in its `off_cpu` profile with the time it measured
/// around its sleeps (within 20%), with the kernel's sleep and the whole
/// user stack (unwound from .eh_frame) of where it waited.
#[test]
fn off_cpu_time_is_where_a_thread_waited_and_how_long() {
    let _one_at_a_time = require_root();
    let bin = ebpf_targets::build(Target::Sleep).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(&bin);
    cmd.arg("3");
    let (child, pid, lines) = ebpf_targets::spawn_with_output(cmd);
    let mut child = KillOnDrop(child);
    let keep = pid.to_string();
    // The default rate (100 waits a second per CPU): the target waits about
    // 67 times a second, and other processes' waits are no longer noted
    // once relabelling dropped them.
    let mut proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    collect_interval: 2s\n    off_cpu: {{threshold: 1ms}}\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{keep}', action: keep}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    });
    std::thread::sleep(Duration::from_secs(3));
    let signalled = Command::new("kill")
        .args(["-USR1", &keep])
        .status()
        .expect("run kill");
    assert!(signalled.success());
    let slept = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the target prints what it slept");
    let measured: Vec<f64> = slept
        .strip_prefix("slept ")
        .unwrap_or_else(|| panic!("{slept:?}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    let _ = child.0.wait();
    proflow.terminate(Duration::from_secs(20));
    let (mut two, mut one, mut waits) = (0.0, 0.0, 0);
    let mut stacks = Vec::new();
    for e in common::read_index(&proflow.profiles) {
        if e.label("pid") != Some(keep.as_str()) || e.label("__name__") != Some("off_cpu") {
            continue;
        }
        let p = common::read_profile(&e.path);
        assert_eq!(p.string(p.sample_type[0].r#type), "off_cpu");
        assert_eq!(p.string(p.sample_type[0].unit), "nanoseconds");
        for (frames, s) in pprof::stacks_root_first(&p) {
            let names: Vec<String> = frames.iter().map(|f| f.to_string()).collect();
            if names.iter().any(|f| f.contains("proflow_sleep_two")) {
                two += s.value[0] as f64;
                waits += s.value[1];
            } else if names.iter().any(|f| f.contains("proflow_sleep_one")) {
                one += s.value[0] as f64;
                waits += s.value[1];
            }
            stacks.push((names, s.value[0]));
        }
    }
    let report = format!(
        "measured by the target: {measured:?} ns; off_cpu: {two} and {one} ns in {waits} waits; stacks: {stacks:#?}"
    );
    eprintln!(
        "off_cpu: the target measured {measured:?} ns, its profile has {two} and {one} ns in {waits} waits"
    );
    for (got, want) in [(two, measured[0]), (one, measured[1])] {
        assert!(
            (got - want).abs() <= 0.2 * want,
            "off-CPU time within 20% of what the target slept: {report}"
        );
    }
    // Each wait: root-first main → run → the function → proflow_nap →
    // nanosleep's kernel side.
    for (names, _) in stacks
        .iter()
        .filter(|(f, _)| f.iter().any(|x| x.contains("proflow_sleep_")))
    {
        let mut at = 0;
        for want in [
            "main",
            "run",
            "proflow_sleep_",
            "proflow_nap",
            "nanosleep",
            "schedule",
        ] {
            match names[at..].iter().position(|f| f.contains(want)) {
                Some(i) => at += i + 1,
                None => {
                    panic!("a wait's stack misses {want} after frame {at}: {names:?}\n{report}")
                }
            }
        }
    }
}

/// A process moved into a container-like cgroup (named as Docker's systemd
/// driver names them) is labelled with its container id.
#[test]
fn container_label_from_the_cgroup() {
    let _one_at_a_time = require_root();
    let bin = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 30);
    let child = KillOnDrop(child);
    let cgroup = common::ContainerCgroup::enter(pid);
    let proflow = proflow_for(&[pid], "2s");
    let entries = proflow.wait_for_files(1, |e| e.label("pid") == Some(pid.to_string().as_str()));
    for e in &entries {
        assert_eq!(
            e.label("container_id"),
            Some(cgroup.id.as_str()),
            "{:?}",
            e.labels
        );
    }
    drop(proflow);
    drop(child);
}

/// The node agent on Kubernetes: the `k8s_attributes` processor finds the
/// pod of a profiled process by the container id of its cgroup, in a real
/// API server's pods (`tests/peers/up kube`), and names pod, namespace,
/// node, container and deployment.
#[test]
fn k8s_attributes_names_the_pod_of_a_containers_process() {
    let _one_at_a_time = require_root();
    let Some(kube) = peer_env::peer("kube") else {
        return;
    };
    let bin = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 30);
    let child = KillOnDrop(child);
    let cgroup = common::ContainerCgroup::enter(pid);
    // The pod that runs this container, as the kubelet would report it.
    let ns = peer_env::unique("ebpf");
    let kubectl = |args: &[&str], stdin: &str| peer_env::kubectl(&kube, args, stdin);
    kubectl(&["create", "namespace", &ns], "");
    kubectl(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: apps/v1\nkind: ReplicaSet\nmetadata:\n  name: shop-7c9\n  namespace: {ns}\n  ownerReferences: [{{apiVersion: apps/v1, kind: Deployment, name: shop, uid: 00000000-0000-0000-0000-000000000001, controller: true}}]\n\
             spec:\n  selector: {{matchLabels: {{app: shop}}}}\n  template:\n    metadata: {{labels: {{app: shop}}}}\n    spec: {{containers: [{{name: main, image: shop:1}}]}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata:\n  name: shop-7c9-x1\n  namespace: {ns}\n  labels: {{app: shop}}\n  ownerReferences: [{{apiVersion: apps/v1, kind: ReplicaSet, name: shop-7c9, uid: 00000000-0000-0000-0000-000000000002, controller: true}}]\n\
             spec:\n  nodeName: node-ebpf\n  containers: [{{name: sidecar, image: proxy:1}}, {{name: main, image: shop:1}}]\n"
        ),
    );
    peer_env::patch_pod_status(
        &kube,
        &ns,
        "shop-7c9-x1",
        &format!(
            r#"{{"phase":"Running","podIP":"10.244.0.9","containerStatuses":[{{"name":"main","containerID":"containerd://{}","image":"shop:1","imageID":"","ready":true,"restartCount":0,"state":{{"running":{{}}}}}},{{"name":"sidecar","containerID":"containerd://{:064x}","image":"proxy:1","imageID":"","ready":true,"restartCount":0,"state":{{"running":{{}}}}}}]}}"#,
            cgroup.id, 7
        ),
    );

    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 2s\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{pid}', action: keep}}\n\
             processors:\n  k8s_attributes:\n    auth_type: kubeConfig\n    kubeconfig_file: {kc}\n    filter: {{namespace: {ns}}}\n    wait_for_metadata: true\n\
             exporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [k8s_attributes]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry,
            kc = kube.var("KUBECONFIG"),
        )
    });
    let entries = proflow.wait_for_files(1, |e| e.label("pid") == Some(pid.to_string().as_str()));
    for e in &entries {
        for (name, want) in [
            ("container_id", cgroup.id.as_str()),
            ("k8s_namespace_name", ns.as_str()),
            ("k8s_pod_name", "shop-7c9-x1"),
            ("k8s_container_name", "main"),
            ("k8s_node_name", "node-ebpf"),
            ("k8s_deployment_name", "shop"),
        ] {
            assert_eq!(e.label(name), Some(want), "{name}: {:?}", e.labels);
        }
    }
    let metrics = proflow.metrics();
    assert!(
        metrics.contains(r#"proflow_k8s_attributes_profiles_total{processor="k8s_attributes",result="associated"}"#),
        "{metrics}"
    );
    drop(proflow);
    drop(child);
}

/// Without CAP_BPF and CAP_PERFMON (root with every capability dropped), the
/// receiver logs what is missing and idles; the collector and its other
/// receivers run on.
#[test]
fn without_privileges_a_clear_error_and_the_rest_runs() {
    let _one_at_a_time = require_root();
    let setpriv = Command::new("setpriv")
        .arg("--version")
        .stdout(Stdio::null())
        .status();
    assert!(
        setpriv.is_ok_and(|s| s.success()),
        "setpriv (util-linux) is needed to drop capabilities"
    );
    let dir = tempfile::tempdir().unwrap();
    let ports = Ports::fresh();
    let profiles = dir.path().join("profiles");
    let config = dir.path().join("proflow.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  ebpf: {{}}\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf, pprof_push]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        ),
    )
    .unwrap();
    let log = dir.path().join("proflow.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(env!("CARGO_BIN_EXE_proflow"))
        .args(["run", "-c"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap();
    let _child = KillOnDrop(child);
    let http = common::http_client();
    let deadline = Instant::now() + Duration::from_secs(30);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    loop {
        let ready = http
            .get(format!("http://{}/readyz", ports.telemetry))
            .send()
            .is_ok_and(|r| r.status().as_u16() == 200);
        if ready {
            break;
        }
        assert!(Instant::now() < deadline, "not ready; log:\n{}", log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = log_text();
    assert!(
        text.contains("lacks CAP_BPF and CAP_PERFMON") && text.contains("run proflow as root"),
        "the log should name the missing capabilities and what to do:\n{text}"
    );
    // pprof_push still takes profiles.
    let reply = http
        .post(format!(
            "http://{}{}",
            ports.receiver,
            common::ingest_query("app.cpu", Some("pprof"))
        ))
        .body(common::gzip(&common::cpu_profile()))
        .send()
        .unwrap();
    assert_eq!(reply.status().as_u16(), 200, "log:\n{}", log_text());
    let deadline = Instant::now() + Duration::from_secs(20);
    while common::read_index(&profiles).is_empty() {
        assert!(
            Instant::now() < deadline,
            "the pushed profile was not written; log:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// On SIGTERM the interval so far is sent, not lost: with a 60 s interval,
/// a stop after a few seconds still writes the target's profile.
#[test]
fn stopping_sends_the_interval_so_far() {
    let _one_at_a_time = require_root();
    let bin = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 30);
    let _child = KillOnDrop(child);
    let mut proflow = proflow_for(&[pid], "60s");
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        common::read_index(&proflow.profiles).is_empty(),
        "nothing is written before the interval ends"
    );
    let code = proflow.terminate(Duration::from_secs(20));
    assert_eq!(code, Some(0), "log:\n{}", proflow.log_text());
    let entries = common::read_index(&proflow.profiles);
    let mine: Vec<&IndexEntry> = entries
        .iter()
        .filter(|e| e.label("pid") == Some(pid.to_string().as_str()))
        .collect();
    assert_eq!(mine.len(), 1, "index: {entries:?}");
    let p = common::read_profile(&mine[0].path);
    let samples: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    assert!(samples > 1000, "{samples} samples in about 3 s at 997 Hz");
}

/// Processes that live a second and are gone before the interval ends are
/// still profiled, named and symbolized (names and symbols are taken while
/// they run), and `group_by: service` puts them in one profile without `pid`.
#[test]
fn short_lived_processes_grouped_by_service() {
    let _one_at_a_time = require_root();
    let bin = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let app = common::unique_name("short");
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 6s\n    group_by: service\n    relabel_configs:\n      - {{source_labels: [__meta_process_exe], regex: '{}', action: keep}}\n      - {{target_label: service_name, replacement: '{app}'}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file]\n",
            bin.display(),
            profiles.display(),
            ports.telemetry
        )
    });
    // Three processes one after the other, each about a second.
    let mut pids = Vec::new();
    for _ in 0..3 {
        let (mut child, pid) = ebpf_targets::spawn(&bin, 1);
        child.wait().unwrap();
        pids.push(pid);
    }
    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app.as_str()));
    for e in &entries {
        assert_eq!(
            e.label("pid"),
            None,
            "group_by: service has no pid: {:?}",
            e.labels
        );
    }
    let mut totals = common::Totals::new();
    let mut stacks = BTreeMap::new();
    for e in &entries {
        let p = common::read_profile(&e.path);
        common::add_function_totals(
            &mut totals,
            &p,
            &["proflow_hot_two", "proflow_hot_one"],
            Some("samples"),
        );
        for (frames, s) in pprof::stacks_root_first(&p) {
            *stacks.entry(frames.join(";")).or_insert(0) += s.value[1];
        }
    }
    let (two, one) = (
        totals.get("proflow_hot_two").copied().unwrap_or(0),
        totals.get("proflow_hot_one").copied().unwrap_or(0),
    );
    assert!(
        two > 0 && one > 0,
        "the short-lived processes {pids:?} were not symbolized: {totals:?}; stacks: {stacks:#?}; index:\n{}",
        std::fs::read_to_string(proflow.profiles.join("index.jsonl")).unwrap_or_default()
    );
}

/// The receiver's profiles in the real Pyroscope: the same totals come back
/// as the `file` exporter wrote, split 2:1, under `process_cpu`.
#[test]
fn into_pyroscope() {
    let _one_at_a_time = require_root();
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let bin = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 6);
    let mut child = KillOnDrop(child);
    let app = common::unique_name("ebpf-hot");
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 2s\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{pid}', action: keep}}\n      - {{target_label: service_name, replacement: '{app}'}}\nexporters:\n  file:\n    directory: {}\n  pyroscope:\n    endpoint: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file, pyroscope]\n",
            profiles.display(),
            pyroscope.http_base(),
            ports.telemetry
        )
    });
    child.0.wait().unwrap();
    // Its last interval is written within one more interval.
    std::thread::sleep(Duration::from_secs(5));
    let want = hot_totals_in_files(&proflow, pid);
    let (two, one) = (
        want.get(HOT_FUNCTIONS[0]).copied().unwrap_or(0),
        want.get(HOT_FUNCTIONS[1]).copied().unwrap_or(0),
    );
    assert!(
        one > 0,
        "nothing written for pid {pid}: {want:?}\nlog:\n{}",
        proflow.log_text()
    );
    let ratio = two as f64 / one as f64;
    assert!(
        (1.8..=2.2).contains(&ratio),
        "split {two}:{one} = {ratio:.2}"
    );
    pyroscope_has(&pyroscope, &app, &want, &proflow);
}

/// The hot functions' CPU totals in what the `file` exporter wrote for
/// `pid`.
fn hot_totals_in_files(proflow: &Proflow, pid: u32) -> common::Totals {
    let mut want = common::Totals::new();
    for e in common::read_index(&proflow.profiles) {
        if e.label("pid") == Some(pid.to_string().as_str()) {
            common::add_function_totals(
                &mut want,
                &common::read_profile(&e.path),
                &HOT_FUNCTIONS,
                Some("cpu"),
            );
        }
    }
    want
}

const HOT_FUNCTIONS: [&str; 2] = ["proflow_hot_two", "proflow_hot_one"];

/// Waits (90 s at most) until the real Pyroscope has `want` for service
/// `app`'s CPU profiles.
fn pyroscope_has(pyroscope: &peer_env::Peer, app: &str, want: &common::Totals, proflow: &Proflow) {
    let http = common::http_client();
    let base = pyroscope.http_base();
    let selector = format!("{{service_name=\"{app}\"}}");
    let mut last = (common::Totals::new(), String::new());
    let same = peer_env::poll(Duration::from_secs(90), || {
        last = readback::pyroscope_totals(
            &http,
            &base,
            &selector,
            &HOT_FUNCTIONS,
            Some("process_cpu:cpu:nanoseconds:cpu:nanoseconds"),
        );
        common::totals_close(&last.0, want).then_some(())
    });
    assert!(
        same.is_some(),
        "Pyroscope has {:?} ({}) for {selector}; the file exporter wrote {want:?}\nlog:\n{}",
        last.0,
        last.1,
        proflow.log_text()
    );
}

/// A stripped binary profiled with `symbolize: none` leaves the receiver as
/// addresses; the `symbolize` processor names it from its debug file,
/// found by build id, and the real Pyroscope shows the names. One proflow,
/// two pipelines from the same receiver: one without the processor (its
/// files are the "before"), one with it into files and Pyroscope.
#[test]
fn a_stripped_binary_named_downstream_by_the_symbolize_processor_into_pyroscope() {
    let _one_at_a_time = require_root();
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let full = ebpf_targets::build(Target::CNoFp).unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(common::unique_name("ebpf-stripped"));
    std::fs::create_dir_all(&dir).unwrap();
    let build_id = proflow_symbolize::elf::ElfInfo::read(&full)
        .and_then(|i| i.build_id)
        .expect("cc links with a build id");
    let debug = dir
        .join("debug/.build-id")
        .join(&build_id[..2])
        .join(format!("{}.debug", &build_id[2..]));
    std::fs::create_dir_all(debug.parent().unwrap()).unwrap();
    let stripped = dir.join("hot-stripped");
    for cmd in [
        Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&full)
            .arg(&debug)
            .status(),
        Command::new("strip")
            .arg("--strip-all")
            .arg("-o")
            .arg(&stripped)
            .arg(&full)
            .status(),
    ] {
        assert!(cmd.unwrap().success(), "objcopy or strip failed");
    }
    // As long as the split tests' targets: on a loaded machine it gets less
    // than a core, and the split check needs 4,000 samples.
    let (child, pid) = ebpf_targets::spawn(&stripped, 20);
    let mut child = KillOnDrop(child);
    let app = common::unique_name("ebpf-stripped");
    let raw = dir.join("raw");
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 2s\n    symbolize: none\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{pid}', action: keep}}\n      - {{target_label: service_name, replacement: '{app}'}}\nprocessors:\n  symbolize:\n    debug_dirs: [{debug_dir}]\nexporters:\n  file/raw:\n    directory: {raw}\n  file:\n    directory: {profiles}\n  pyroscope:\n    endpoint: {endpoint}\nservice:\n  telemetry:\n    address: {telemetry}\n  pipelines:\n    profiles/raw:\n      receivers: [ebpf]\n      exporters: [file/raw]\n    profiles:\n      receivers: [ebpf]\n      processors: [symbolize]\n      exporters: [file, pyroscope]\n",
            debug_dir = dir.join("debug").display(),
            raw = raw.display(),
            profiles = profiles.display(),
            endpoint = pyroscope.http_base(),
            telemetry = ports.telemetry
        )
    });
    let stacks = stacks_of(&proflow, pid, 4000);
    child.0.wait().unwrap();
    // Its last interval is written within one more interval.
    std::thread::sleep(Duration::from_secs(5));

    // Before: addresses only, no name of the program's.
    let mut raw_samples = 0;
    for e in common::read_index(&raw) {
        let p = common::read_profile(&e.path);
        for (frames, s) in pprof::stacks_root_first(&p) {
            raw_samples += s.value[1];
            assert!(
                !frames.iter().any(|f| f.contains("proflow_hot")),
                "symbolize: none named a frame: {frames:?}"
            );
        }
    }
    assert!(
        raw_samples > 0,
        "the pipeline without the processor wrote nothing"
    );

    // After: the names, the 2:1 split and full stacks, as with symbolize: local.
    check_split_and_stacks(
        &stacks,
        "proflow_hot_two",
        "proflow_hot_one",
        &["main", "run", "proflow_hot_"],
        "proflow_spin",
    );
    let metrics = common::http_client()
        .get(format!("http://{}/metrics", proflow.ports.telemetry))
        .send()
        .and_then(|r| r.text())
        .unwrap();
    let symbolized = common::metric_sum(
        &metrics,
        "proflow_symbolize_frames_total",
        &[("processor", "symbolize"), ("result", "symbolized")],
    );
    assert!(symbolized > 0.0, "{metrics}");

    // And Pyroscope shows the names with the same totals as the files.
    let want = hot_totals_in_files(&proflow, pid);
    pyroscope_has(&pyroscope, &app, &want, &proflow);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The `symbolize` processor serves this host's profiles from this host:
/// with its defaults (`local` and `kernel`: `this_host`) the `ebpf`
/// receiver's profiles (`symbolize: none`: addresses) are named from the
/// binary at the path the process maps (no debug directory), which a
/// pushed profile would not be (`tests/symbolize.rs`).
#[test]
fn this_hosts_profiles_named_by_the_symbolize_processor_from_local_files() {
    let _one_at_a_time = require_root();
    let full = ebpf_targets::build(Target::CNoFp).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&full, 20);
    let _child = KillOnDrop(child);
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 2s\n    symbolize: none\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{pid}', action: keep}}\nprocessors:\n  symbolize:\n    debug_dirs: []\n    debuginfod: {{urls: []}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [symbolize]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    });
    let stacks = stacks_of(&proflow, pid, 500);
    assert!(
        count_with(&stacks, "proflow_hot_two") > 0,
        "not named from the local binary: {stacks:?}"
    );
    let metrics = proflow.metrics();
    for refused in ["local_not_this_host", "kernel_not_this_host"] {
        assert_eq!(
            common::metric_sum(
                &metrics,
                "proflow_symbolize_frames_total",
                &[("result", refused)]
            ),
            0.0,
            "{metrics}"
        );
    }
}
