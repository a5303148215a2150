//! The `ebpf` receiver end to end, as root, against real programs
//! (`tests/ebpf_targets/`): C with two hot functions at a 2:1 CPU split,
//! built with and without frame pointers, a Rust release binary (no frame
//! pointers) and a Go binary. Each test starts its targets, then its own
//! proflow with a relabel `keep` rule on their pids (which also proves the
//! discovery labels), and reads what the `file` exporter wrote.
//!
//! JIT runtimes and off-CPU time are in `tests/ebpf_runtimes.rs`.
//!
//! One test sends to the real Pyroscope and reads the profile back.
//!
//! One test names a stripped binary's frames downstream with the
//! `symbolize` processor, from its debug file found by build id.
//!
//! `state_budget` (tests/ebpf_cases/state_budget.rs): one user of the node
//! cannot take the agent past its memory with perf maps and unwind
//! sections.
//!
//! These tests need root (CI runs as root); without it they fail, with a
//! message saying so: they never skip. They run one at a time, since each
//! measures the CPU share of busy targets.

mod common;
#[path = "common/ebpf_support.rs"]
mod ebpf_support;
#[allow(dead_code)] // Not the runtimes and waits of `ebpf_runtimes.rs`.
mod ebpf_targets;
// Both helper modules include `peer_skip` (one copy each, same skip rules).
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;
#[path = "ebpf_cases/state_budget.rs"]
mod state_budget;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{IndexEntry, KillOnDrop, Ports, Proflow};
use ebpf_support::{
    check_split_and_stacks, count_with, proflow_for, proflow_for_with, pyroscope_has, require_root,
    stacks_of,
};
use ebpf_targets::Target;
use proflow_model::pprof;

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

/// The pod that runs the container `container_id` (`main`, beside a
/// `sidecar`, of Deployment `shop`), as the kubelet would report it, in a
/// new namespace; returns the namespace.
fn shop_pod(kube: &peer_env::Peer, container_id: &str) -> String {
    let ns = peer_env::unique("ebpf");
    let kubectl = |args: &[&str], stdin: &str| peer_env::kubectl(kube, args, stdin);
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
        kube,
        &ns,
        "shop-7c9-x1",
        &format!(
            r#"{{"phase":"Running","podIP":"10.244.0.9","containerStatuses":[{{"name":"main","containerID":"containerd://{}","image":"shop:1","imageID":"","ready":true,"restartCount":0,"state":{{"running":{{}}}}}},{{"name":"sidecar","containerID":"containerd://{:064x}","image":"proxy:1","imageID":"","ready":true,"restartCount":0,"state":{{"running":{{}}}}}}]}}"#,
            container_id, 7
        ),
    );
    ns
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
    let ns = shop_pod(&kube, &cgroup.id);
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

/// A tenant per namespace on the node agent: `k8s_attributes` names the
/// pod's namespace, a `relabel` rule makes it the tenant (`__tenant_id__`),
/// and the profile reads back from a multi-tenant Pyroscope under that
/// tenant alone; the file exporter's index names the same tenant.
#[test]
fn the_namespace_of_a_profiled_pod_is_its_tenant() {
    let _one_at_a_time = require_root();
    let Some(kube) = peer_env::peer("kube") else {
        return;
    };
    let Some(pyroscope) =
        peer_env::PrivatePeer::start_with("pyroscope", &[("PROFLOW_PYROSCOPE_MULTITENANT", "1")])
    else {
        return;
    };
    let bin = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 30);
    let child = KillOnDrop(child);
    let cgroup = common::ContainerCgroup::enter(pid);
    let ns = shop_pod(&kube, &cgroup.id);
    let base = pyroscope.http_base();
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 2s\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{pid}', action: keep}}\n\
             processors:\n  k8s_attributes:\n    auth_type: kubeConfig\n    kubeconfig_file: {kc}\n    filter: {{namespace: {ns}}}\n    wait_for_metadata: true\n\
             \x20 relabel:\n    relabel_configs:\n      - {{source_labels: [k8s_namespace_name], regex: '(.+)', target_label: __tenant_id__}}\n\
             exporters:\n  file:\n    directory: {}\n  pyroscope:\n    endpoint: {base}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      processors: [k8s_attributes, relabel]\n      exporters: [file, pyroscope]\n",
            profiles.display(),
            ports.telemetry,
            kc = kube.var("KUBECONFIG"),
        )
    });
    let entries = proflow.wait_for_files(1, |e| e.label("pid") == Some(pid.to_string().as_str()));
    for e in &entries {
        assert_eq!(e.raw["tenant"].as_str(), Some(ns.as_str()), "{:?}", e.raw);
        assert_eq!(e.label("k8s_namespace_name"), Some(ns.as_str()));
    }
    let selector = "{k8s_pod_name=\"shop-7c9-x1\"}";
    let hot = ["proflow_hot_one", "proflow_hot_two"];
    let deadline = Instant::now() + Duration::from_secs(60);
    let found = loop {
        let (totals, seen) =
            readback::pyroscope_totals(&readback::tenant_reader(&ns), &base, selector, &hot, None);
        if !totals.is_empty() {
            break totals;
        }
        assert!(
            Instant::now() < deadline,
            "Pyroscope holds the pod's profile under tenant {ns}: {seen}"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    assert!(found.values().all(|v| *v > 0), "{found:?}");
    // Another tenant sees none of it.
    let (other, _) = readback::pyroscope_totals(
        &readback::tenant_reader("anonymous"),
        &base,
        selector,
        &hot,
        None,
    );
    assert!(other.is_empty(), "another tenant reads {other:?}");
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
    // A ring of 64MiB, four seconds of every process's samples at 997 Hz
    // on two CPUs: a sampler thread starved by a parallel build must not
    // lose the target's samples to a full ring (16MiB, one second, lost
    // three quarters of them once). The test is of what the stop sends,
    // not of the ring's size.
    // All the CPU the target can have had while proflow sampled: from
    // before proflow started to after it stopped (the upper bound).
    let ticks_before_start = cpu_ticks(pid);
    let mut proflow = proflow_for_with(&[pid], "60s", "    ring_buffer_size: 64MiB\n");
    // Sampling runs once proflow is ready: the target's CPU time from here
    // to the stop is what the profile must hold (997 samples a CPU second).
    let ticks_from = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        common::read_index(&proflow.profiles).is_empty(),
        "nothing is written before the interval ends"
    );
    let cpu_seconds = (cpu_ticks(pid) - ticks_from) as f64 / ticks_per_second();
    let code = proflow.terminate(Duration::from_secs(20));
    assert_eq!(code, Some(0), "log:\n{}", proflow.log_text());
    let cpu_seconds_at_most = (cpu_ticks(pid) - ticks_before_start) as f64 / ticks_per_second();
    let entries = common::read_index(&proflow.profiles);
    let mine: Vec<&IndexEntry> = entries
        .iter()
        .filter(|e| e.label("pid") == Some(pid.to_string().as_str()))
        .collect();
    assert_eq!(mine.len(), 1, "index: {entries:?}");
    let p = common::read_profile(&mine[0].path);
    let samples: i64 = p.sample.iter().map(|s| s.value[1]).sum();
    // However much CPU a loaded machine gave the target (once 754 samples
    // in 3 s beside a build), at least half its samples: the interval so
    // far was sent, not a sliver of it.
    let expected = cpu_seconds * 997.0;
    assert!(
        samples > 0 && samples as f64 >= expected * 0.5,
        "{samples} samples for {cpu_seconds:.2} s of the target's CPU at 997 Hz (about {expected:.0})"
    );
    // And no more than the CPU it had while sampled, give or take the
    // clock ticks' 10 ms and the sampler's rate: an interval sent twice, or
    // samples counted twice, is far past this.
    let at_most = cpu_seconds_at_most * 997.0 * 1.15 + 20.0;
    assert!(
        samples as f64 <= at_most,
        "{samples} samples, but the target had at most {cpu_seconds_at_most:.2} s of CPU while sampled (at most {at_most:.0} at 997 Hz)"
    );
    eprintln!("{samples} samples for {cpu_seconds:.2} s of the target's CPU (about {expected:.0})");
}

/// User plus system CPU time of `pid` so far, in clock ticks
/// (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the target's stat");
    // After the command name in parentheses: state is field 3, so utime
    // (14) and stime (15) are the 12th and 13th from there.
    let rest = &stat[stat.rfind(')').expect("a stat line") + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf only reads a constant of the system.
    unsafe { libc::sysconf(libc::_SC_CLK_TCK) as f64 }
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
    // Three processes one after the other, each about a second. Their CPU
    // time, user and system, is what this process's waited-for children
    // gained meanwhile (each test runs in a process of its own).
    let children_before = children_cpu_seconds();
    let mut pids = Vec::new();
    for _ in 0..3 {
        let (mut child, pid) = ebpf_targets::spawn(&bin, 1);
        child.wait().unwrap();
        pids.push(pid);
    }
    let cpu_seconds = children_cpu_seconds() - children_before;
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
    // All three processes are in the one profile, each whole: the samples
    // are the CPU they had at 997 Hz (a process missed leaves two thirds,
    // an interval sent twice doubles it), and split 2:1 as they spend it.
    let samples: i64 = stacks.values().sum();
    let expected = cpu_seconds * 997.0;
    assert!(
        (expected * 0.8..=expected * 1.15 + 20.0).contains(&(samples as f64)),
        "{samples} samples for the {cpu_seconds:.2} s of CPU the processes {pids:?} had (about {expected:.0} at 997 Hz); stacks: {stacks:#?}"
    );
    let ratio = two as f64 / one as f64;
    assert!(
        (1.6..=2.5).contains(&ratio),
        "split {two}:{one} = {ratio:.2}, not 2:1; stacks: {stacks:#?}"
    );
    eprintln!(
        "{samples} samples for {cpu_seconds:.2} s of CPU (about {expected:.0}), split {ratio:.2}"
    );
}

/// User plus system CPU time, in seconds, of this process's children that
/// have ended and been waited for (`getrusage(RUSAGE_CHILDREN)`).
fn children_cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the zeroed struct it is given and reads nothing else.
    let usage = unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage), 0);
        usage
    };
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
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
    let (child, pid) = ebpf_targets::spawn(&bin, 60);
    let mut child = KillOnDrop(child);
    let app = common::unique_name("ebpf-hot");
    let mut proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    sample_rate: 997\n    collect_interval: 2s\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{pid}', action: keep}}\n      - {{target_label: service_name, replacement: '{app}'}}\nexporters:\n  file:\n    directory: {}\n  pyroscope:\n    endpoint: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file, pyroscope]\n",
            profiles.display(),
            pyroscope.http_base(),
            ports.telemetry
        )
    });
    // Sampled long enough for the split to show (the target started
    // before the collector, whose start takes longer on a loaded machine:
    // a fixed run left it a window of a few hundred samples there).
    stacks_of(&proflow, pid, 2000);
    let _ = child.0.kill();
    child.0.wait().unwrap();
    stop_sending_everything(&mut proflow);
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
    pyroscope_has(&pyroscope, &app, (&HOT_FUNCTIONS, CPU), &want, &proflow);
}

/// Stops proflow with SIGTERM once its target has exited: the receiver sends
/// the interval so far and the exporters deliver what they hold before it
/// exits, so the files are then the whole of what Pyroscope was sent (no
/// window to guess at).
fn stop_sending_everything(proflow: &mut Proflow) {
    let code = proflow.terminate(Duration::from_secs(60));
    assert_eq!(code, Some(0), "log:\n{}", proflow.log_text());
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

/// The profile type Pyroscope files the receiver's CPU profiles under.
const CPU: &str = "process_cpu:cpu:nanoseconds:cpu:nanoseconds";

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
    let mut proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
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
    let metrics = proflow.metrics();
    stop_sending_everything(&mut proflow);

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
    let symbolized = common::metric_sum(
        &metrics,
        "proflow_symbolize_frames_total",
        &[("processor", "symbolize"), ("result", "symbolized")],
    );
    assert!(symbolized > 0.0, "{metrics}");

    // And Pyroscope shows the names with the same totals as the files.
    let want = hot_totals_in_files(&proflow, pid);
    pyroscope_has(&pyroscope, &app, (&HOT_FUNCTIONS, CPU), &want, &proflow);
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

/// `examples/node-agent.yaml` as a user copies it (its telemetry address
/// moved to a free port, `PYROSCOPE_URL` naming the real Pyroscope): every
/// process of the host is sampled at 19 Hz and each one's profile reaches
/// Pyroscope every 15 s, named after its executable, or after its
/// container by the example's rule for a process in a container's cgroup.
/// Two copies of the C target run: one as it is, one moved into a
/// container-like cgroup; both are found in Pyroscope by the name the
/// example gives them, with their two hot functions split about 2:1.
#[test]
fn the_node_agent_example_sends_every_process_to_pyroscope() {
    // The example's sample_rate: 19 Hz, a sample is 1/19 s of CPU.
    const SAMPLE_NANOS: i64 = 1_000_000_000 / 19;
    const MIN_SAMPLES: i64 = 200;
    let _one_at_a_time = require_root();
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let built = ebpf_targets::build(Target::CFp).unwrap_or_else(|e| panic!("{e}"));
    let dir = tempfile::tempdir().expect("tempdir");
    // A name of its own: the example names a process after its executable.
    let name = common::unique_name("node-agent");
    let bin = dir.path().join(&name);
    std::fs::copy(&built, &bin).expect("copy the target");
    let (child, _) = ebpf_targets::spawn(&bin, 240);
    let _plain = KillOnDrop(child);
    let (child, in_container) = ebpf_targets::spawn(&bin, 240);
    let contained = KillOnDrop(child);
    let cgroup = common::ContainerCgroup::enter(in_container);
    let proflow = Proflow::start_with_env(&["run"], |ports, _| {
        let yaml = common::example_config(
            "node-agent.yaml",
            &[(
                "address: 127.0.0.1:8888",
                &format!("address: {}", ports.telemetry),
            )],
        );
        (
            yaml,
            vec![("PYROSCOPE_URL".to_owned(), pyroscope.http_base())],
        )
    });
    let http = common::http_client();
    for selector in [
        format!("{{service_name=\"{name}\"}}"),
        format!(
            "{{service_name=\"container-{}\", container_id=\"{}\"}}",
            &cgroup.id[..12],
            cgroup.id
        ),
    ] {
        let (found, got, answer) = readback::pyroscope_wait(
            &http,
            &pyroscope.http_base(),
            (&selector, &HOT_FUNCTIONS, CPU),
            Duration::from_secs(150),
            |t| {
                HOT_FUNCTIONS
                    .iter()
                    .all(|f| t.get(*f).is_some_and(|v| *v > 0))
                    && t.values().sum::<i64>() >= MIN_SAMPLES * SAMPLE_NANOS
            },
        );
        assert!(
            found,
            "Pyroscope has {got:?} for {selector} ({answer})\nlog:\n{}",
            proflow.log_text()
        );
        // With n ≥ 200 samples the 2:1 split's share (2/3) is known to
        // ±3 × 3.3%: a ratio of 1.3 to 3.3.
        let (two, one) = (got[HOT_FUNCTIONS[0]], got[HOT_FUNCTIONS[1]]);
        let ratio = two as f64 / one as f64;
        let samples = (two + one) / SAMPLE_NANOS;
        assert!(
            (1.3..=3.3).contains(&ratio),
            "{selector}: split {two}:{one} = {ratio:.2} over {samples} samples"
        );
        eprintln!("{selector}: {got:?}, split {ratio:.2} over {samples} samples");
    }
    drop(proflow);
    drop(contained);
    drop(cgroup);
}
