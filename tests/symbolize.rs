//! The `symbolize` processor end to end with debuginfod: a pprof profile
//! of a running, stripped C program (its real runtime addresses, from its
//! `/proc/PID/maps` and the unstripped copy's symbols) is pushed to
//! proflow, whose `symbolize` processor fetches the debug file by build id
//! from the real debuginfod (the Debian package, from the harness) and
//! names the frames. Also: a build id no server has is asked once (negative
//! cache), and a server that never answers does not hold profiles back.
//!
//! Also: the same program's addresses sent as OTLP profiles by the official
//! Python classes (`opentelemetry-proto`, `tests/peers/apps/otlp-python`)
//! to the `otlp` receiver are named from debuginfod by the mapping's build id.
//!
//! Also (`budget`, tests/symbolize_cases/budget.rs): a debuginfod fetch
//! is granted from the in-flight budget.
//!
//! Also: a pushed profile is named from no local file and no kallsyms by
//! default (`local`/`kernel: this_host`), and is with `true`; a file
//! swapped for a FIFO between two pushes does not hold a worker.
//!
//! The processor's other sources (local binaries, debug directories,
//! kallsyms, OTLP frame types) are tested in `processors/src/symbolize/tests.rs` and
//! `safety_tests.rs`, and the `ebpf` receiver → `symbolize` → Pyroscope
//! path (this host's profiles, named locally) in `tests/ebpf.rs`.

#[path = "symbolize_cases/budget.rs"]
mod budget;
mod common;
#[allow(dead_code)] // Only the C target is used here.
mod ebpf_targets;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{KillOnDrop, Ports, Proflow};
use ebpf_targets::Target;
use proflow_model::pprof;
use proflow_symbolize::elf::ElfInfo;

/// The stripped copy of the C target, its debug file and build id.
struct Stripped {
    dir: PathBuf,
    binary: PathBuf,
    full: PathBuf,
    debug: PathBuf,
    build_id: String,
}

impl Drop for Stripped {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn stripped() -> Stripped {
    let full = ebpf_targets::build(Target::CNoFp).unwrap_or_else(|e| panic!("{e}"));
    let dir = std::env::temp_dir().join(common::unique_name("symbolize-stripped"));
    std::fs::create_dir_all(&dir).unwrap();
    let build_id = ElfInfo::read(&full)
        .and_then(|i| i.build_id)
        .expect("cc links with a build id");
    let debug = dir.join("hot.debug");
    let binary = dir.join("hot-stripped");
    for (tool, args) in [
        (
            "objcopy",
            vec![
                "--only-keep-debug".as_ref(),
                full.as_os_str(),
                debug.as_os_str(),
            ],
        ),
        (
            "strip",
            vec![
                "--strip-all".as_ref(),
                "-o".as_ref(),
                binary.as_os_str(),
                full.as_os_str(),
            ],
        ),
    ] {
        let status = Command::new(tool).args(args).status().unwrap();
        assert!(status.success(), "{tool} failed");
    }
    Stripped {
        dir,
        binary,
        full,
        debug,
        build_id,
    }
}

/// The runtime address of `symbol` (+ `offset`) in process `pid`, which
/// runs a copy of `full` mapped from `path`: from `nm` on the unstripped
/// binary, its segments, and the process's executable mapping.
fn runtime_address(
    pid: u32,
    path: &Path,
    full: &Path,
    symbol: &str,
    offset: u64,
) -> (u64, (u64, u64, u64)) {
    let nm = Command::new("nm")
        .arg("--defined-only")
        .arg(full)
        .output()
        .unwrap();
    let vaddr = String::from_utf8_lossy(&nm.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == symbol).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("nm does not list {symbol}"));
    let info = ElfInfo::read(full).unwrap();
    let load = info
        .loads
        .iter()
        .find(|l| l.executable && l.vaddr <= vaddr && vaddr < l.vaddr + l.file_size)
        .expect("the symbol is in an executable segment");
    let file_offset = vaddr - load.vaddr + load.offset;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mapping = maps
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() < 6 || !f[1].contains('x') || Path::new(f[5]) != path {
                return None;
            }
            let (s, e) = f[0].split_once('-')?;
            Some((
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
                u64::from_str_radix(f[2], 16).ok()?,
            ))
        })
        .expect("the program's executable mapping");
    (mapping.0 + file_offset - mapping.2 + offset, mapping)
}

/// A CPU profile of the running stripped program, 2:1 between its two hot
/// functions, each called from `main`; the mapping names `build_id`.
fn profile_of(s: &Stripped, pid: u32, build_id: &str) -> Vec<u8> {
    profile_mapping(&s.binary, &s.full, pid, build_id, None)
}

/// The same profile of a process that runs `path` (a copy of `full`),
/// the mapping named `path`; with `kernel`, a kernel frame (no mapping) at
/// that address on top of each stack.
fn profile_mapping(
    path: &Path,
    full: &Path,
    pid: u32,
    build_id: &str,
    kernel: Option<u64>,
) -> Vec<u8> {
    let addr = |symbol| runtime_address(pid, path, full, symbol, 4);
    let (two, mapping) = addr("proflow_hot_two");
    let (one, _) = addr("proflow_hot_one");
    let (main, _) = addr("main");
    let strings: Vec<String> = ["", "cpu", "nanoseconds", path.to_str().unwrap(), build_id]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let location = |id, address| pprof::Location {
        id,
        mapping_id: 1,
        address,
        ..Default::default()
    };
    let on_top = |stack: Vec<u64>| match kernel {
        Some(_) => [vec![4], stack].concat(),
        None => stack,
    };
    let mut p = pprof::Profile {
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        sample: vec![
            pprof::Sample {
                location_id: on_top(vec![1, 3]),
                value: vec![200_000_000],
                label: vec![],
            },
            pprof::Sample {
                location_id: on_top(vec![2, 3]),
                value: vec![100_000_000],
                label: vec![],
            },
        ],
        mapping: vec![pprof::Mapping {
            id: 1,
            memory_start: mapping.0,
            memory_limit: mapping.1,
            file_offset: mapping.2,
            filename: 3,
            build_id: 4,
            ..Default::default()
        }],
        location: vec![location(1, two), location(2, one), location(3, main)],
        string_table: strings,
        period_type: Some(pprof::ValueType { r#type: 1, unit: 2 }),
        period: 10_000_000,
        time_nanos: common::now_nanos(),
        duration_nanos: 10_000_000_000,
        ..Default::default()
    };
    if let Some(address) = kernel {
        p.location.push(pprof::Location {
            id: 4,
            mapping_id: 0,
            address,
            ..Default::default()
        });
    }
    common::gzip(&pprof::encode(&p))
}

/// proflow: `pprof_push` → `symbolize` (no local files, no debug
/// directories: debuginfod alone) → `file`.
fn proflow_with(urls: &[String], timeout: &str, cache: &Path) -> Proflow {
    let urls = urls.join(", ");
    Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nprocessors:\n  symbolize:\n    local: false\n    debug_dirs: []\n    debuginfod:\n      urls: [{urls}]\n      timeout: {timeout}\n      cache_dir: {}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      processors: [symbolize]\n      exporters: [file]\n",
            ports.receiver,
            cache.display(),
            profiles.display(),
            ports.telemetry
        )
    })
}

fn push(proflow: &Proflow, app: &str, body: Vec<u8>) {
    proflow
        .post(
            &common::ingest_query(app, Some("pprof")),
            &[("content-type", "application/octet-stream")],
            body,
        )
        .expect_status(200, "pprof push");
}

/// The function names of the `n`th profile written for `app`.
fn names_of(proflow: &Proflow, app: &str, n: usize) -> Vec<String> {
    let entries = proflow.wait_for_files(n, |e| e.label("service_name") == Some(app));
    common::function_names(&common::read_profile(&entries[n - 1].path))
}

fn metric(proflow: &Proflow, name: &str, result: &str) -> f64 {
    common::metric_sum(&proflow.metrics(), name, &[("result", result)])
}

/// Puts the debug file of `s` where `server` (debuginfod) serves from and
/// waits until it serves it; returns the file's path there. The copy is
/// never removed: every test's stripped program has the same build id, and
/// once one copy is gone debuginfod answers 404 for the build id until its
/// next groom, even with other copies in place (seen once in a run of the
/// whole suite: a test that pushed just after another removed its copy).
fn serve(server: &peer_env::Peer, s: &Stripped) -> PathBuf {
    // The server indexes its directory every second; the file is asked for
    // once it is served (a 404 before would be remembered for negative_ttl).
    serve_file(server, &s.debug, &s.build_id, "hot")
}

/// Copies the debug file `debug` of `build_id` where `server` serves from
/// (named after `name`) and waits until it serves it; its path there.
fn serve_file(server: &peer_env::Peer, debug: &Path, build_id: &str, name: &str) -> PathBuf {
    let served = Path::new(server.var("DIR")).join(format!("{}.debug", common::unique_name(name)));
    std::fs::copy(debug, &served).unwrap();
    let http = common::http_client();
    let url = format!("{}/buildid/{build_id}/debuginfo", server.http_base());
    let indexed = peer_env::poll(Duration::from_secs(60), || {
        http.get(&url)
            .send()
            .ok()
            .filter(|r| r.status().as_u16() == 200)
            .map(|_| ())
    });
    assert!(indexed.is_some(), "debuginfod never served {url}");
    served
}

/// `examples/symbolize-gateway.yaml` as a user copies it (its listening
/// addresses moved to free ports, its cache to a temporary directory;
/// `DEBUGINFOD_URL` and `PYROSCOPE_URL` naming the real debuginfod and
/// Pyroscope): one push of a stripped program's addresses reaches Pyroscope
/// with its frames named from the debug file debuginfod served, with the
/// values pushed.
#[test]
fn the_symbolize_gateway_example_names_a_push_from_debuginfod_into_pyroscope() {
    let Some(server) = peer_env::peer("debuginfod") else {
        return;
    };
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let s = stripped();
    // Never removed (see `serve`).
    let _served = serve(&server, &s);
    let (child, pid) = ebpf_targets::spawn(&s.binary, 60);
    let _child = KillOnDrop(child);
    let cache = s.dir.join("cache");
    let proflow = Proflow::start_with_env(&["run"], |ports, _| {
        let yaml = common::example_config(
            "symbolize-gateway.yaml",
            &[
                (
                    "endpoint: 0.0.0.0:4040",
                    &format!("endpoint: {}", ports.receiver),
                ),
                (
                    "endpoint: 0.0.0.0:4317",
                    &format!("endpoint: 127.0.0.1:{}", common::free_port()),
                ),
                (
                    "cache_dir: /var/cache/proflow/debuginfod",
                    &format!("cache_dir: {}", cache.display()),
                ),
                (
                    "address: 127.0.0.1:8888",
                    &format!("address: {}", ports.telemetry),
                ),
            ],
        );
        let env = vec![
            ("DEBUGINFOD_URL".to_owned(), server.http_base()),
            ("PYROSCOPE_URL".to_owned(), pyroscope.http_base()),
        ];
        (yaml, env)
    });
    let app = common::unique_name("symbolize-gateway");
    push(&proflow, &app, profile_of(&s, pid, &s.build_id));
    // profile_of's values: 200 ms in proflow_hot_two, 100 ms in
    // proflow_hot_one, both called from main.
    let functions = ["proflow_hot_two", "proflow_hot_one", "main"];
    let want: readback::Totals = functions
        .iter()
        .zip([200_000_000, 100_000_000, 300_000_000])
        .map(|(f, v)| (f.to_string(), v))
        .collect();
    let (same, got, answer) = readback::pyroscope_wait(
        &common::http_client(),
        &pyroscope.http_base(),
        (
            &format!("{{service_name=\"{app}\"}}"),
            &functions,
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        ),
        Duration::from_secs(60),
        |t| *t == want,
    );
    assert!(
        same,
        "Pyroscope has {got:?} for {app}, want {want:?} ({answer})\nmetrics:\n{}\nlog:\n{}",
        proflow.metrics(),
        proflow.log_text()
    );
    assert!(
        cache.join(&s.build_id).join("debuginfo").is_file(),
        "the fetched file is in the example's cache_dir"
    );
}

#[test]
fn debug_files_from_the_real_debuginfod_named_once_fetched_and_misses_asked_once() {
    let Some(server) = peer_env::peer("debuginfod") else {
        return;
    };
    let s = stripped();
    // Never removed (see `serve`).
    let _served = serve(&server, &s);

    let (child, pid) = ebpf_targets::spawn(&s.binary, 60);
    let _child = KillOnDrop(child);
    let cache = s.dir.join("cache");
    // A deadline too short for any fetch: the first profiles go on unnamed
    // (the pipeline does not wait) and a later one is named once the fetch
    // has ended.
    let proflow = proflow_with(&[server.http_base()], "1ms", &cache);
    let app = common::unique_name("debuginfod");
    let body = profile_of(&s, pid, &s.build_id);
    let mut named = None;
    for n in 1..=40 {
        push(&proflow, &app, body.clone());
        let names = names_of(&proflow, &app, n);
        if names.iter().any(|f| f == "proflow_hot_two") {
            named = Some((n, names));
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    let (n, names) = named.unwrap_or_else(|| {
        panic!(
            "no profile was named after 40 pushes; metrics:\n{}\nlog:\n{}",
            proflow.metrics(),
            proflow.log_text()
        )
    });
    for want in ["proflow_hot_two", "proflow_hot_one", "main"] {
        assert!(names.iter().any(|f| f == want), "{want} missing: {names:?}");
    }
    assert!(
        cache.join(&s.build_id).join("debuginfo").is_file(),
        "the fetched file is in the cache"
    );
    assert_eq!(
        metric(
            &proflow,
            "proflow_symbolize_debuginfod_fetches_total",
            "found"
        ),
        1.0
    );
    if n > 1 {
        assert!(
            metric(
                &proflow,
                "proflow_symbolize_frames_total",
                "debuginfod_timeout"
            ) >= 3.0,
            "the unnamed profiles' frames are counted: {}",
            proflow.metrics()
        );
    }

    // A build id no server has: asked once, then remembered.
    let missing = "00112233445566778899aabbccddeeff00112233";
    let other = common::unique_name("missing");
    for n in 1..=3 {
        push(&proflow, &other, profile_of(&s, pid, missing));
        names_of(&proflow, &other, n);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(
        &proflow,
        "proflow_symbolize_debuginfod_fetches_total",
        "not_found",
    ) < 1.0
    {
        assert!(Instant::now() < deadline, "{}", proflow.metrics());
        std::thread::sleep(Duration::from_millis(100));
    }
    // The miss is remembered in the same step that ends its fetch, so a
    // push from now on finds either the fetch or the miss, never neither.
    push(&proflow, &other, profile_of(&s, pid, missing));
    names_of(&proflow, &other, 4);
    assert_eq!(
        metric(
            &proflow,
            "proflow_symbolize_debuginfod_fetches_total",
            "not_found"
        ),
        1.0,
        "a miss is asked for once within negative_ttl"
    );
}

/// A server that takes connections and never answers (a failure the real
/// debuginfod does not produce on demand): profiles go on unnamed after
/// the timeout, counted, and the next ones do not wait for the same fetch
/// again beyond their own deadline.
#[test]
fn a_server_that_never_answers_does_not_hold_profiles_back() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in listener.incoming().take(4).flatten() {
            open.push(conn);
        }
        std::thread::sleep(Duration::from_secs(30));
        drop(open);
    });
    let s = stripped();
    let (child, pid) = ebpf_targets::spawn(&s.binary, 30);
    let _child = KillOnDrop(child);
    let proflow = proflow_with(&[format!("http://{addr}")], "300ms", &s.dir.join("cache"));
    let app = common::unique_name("silent");
    let body = profile_of(&s, pid, &s.build_id);
    for n in 1..=3 {
        let start = Instant::now();
        push(&proflow, &app, body.clone());
        let names = names_of(&proflow, &app, n);
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "profile {n} took {:?} to be written",
            start.elapsed()
        );
        assert!(
            !names.iter().any(|f| f.starts_with("proflow_hot")),
            "{names:?}"
        );
    }
    assert!(
        metric(
            &proflow,
            "proflow_symbolize_frames_total",
            "debuginfod_timeout"
        ) >= 9.0,
        "three frames of three profiles: {}",
        proflow.metrics()
    );
    drop(held);
}

/// proflow: `pprof_push` → `symbolize` (`settings`, no debug directories,
/// no debuginfod) → `file`.
fn proflow_local(settings: &str) -> Proflow {
    Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nprocessors:\n  symbolize:\n    debug_dirs: []\n    debuginfod: {{urls: []}}\n{settings}exporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      processors: [symbolize]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

/// The kernel's `schedule` function, plus one (a return address into it).
/// Needs root, as the test command runs: kallsyms shows others zeros.
fn kernel_address() -> u64 {
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").unwrap();
    let schedule = kallsyms
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 3 && f[1] == "T" && f[2] == "schedule")
                .then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .expect("the kernel has a `schedule` function");
    assert_ne!(
        schedule, 0,
        "kallsyms hides addresses: run the tests as root"
    );
    schedule + 1
}

/// A pushed profile names a binary that is on this host (with its build id
/// and symbols) and a kernel address: by default neither the file nor
/// kallsyms is read for it, and the frames are counted as such; with
/// `local: true` and `kernel: true` (senders trusted) both name it.
#[test]
fn a_pushed_profile_is_named_from_local_files_and_kallsyms_only_when_the_config_trusts_senders() {
    let s = stripped();
    let (child, pid) = ebpf_targets::spawn(&s.full, 60);
    let _child = KillOnDrop(child);
    let body = profile_mapping(&s.full, &s.full, pid, &s.build_id, Some(kernel_address()));
    let local = ["proflow_hot_two", "proflow_hot_one", "main"];

    let proflow = proflow_local("");
    let app = common::unique_name("pushed-default");
    push(&proflow, &app, body.clone());
    let names = names_of(&proflow, &app, 1);
    for f in local.iter().chain(&["schedule"]) {
        assert!(!names.iter().any(|n| n == f), "{f} named: {names:?}");
    }
    assert_eq!(
        metric(
            &proflow,
            "proflow_symbolize_frames_total",
            "local_not_this_host"
        ),
        3.0,
        "{}",
        proflow.metrics()
    );
    assert_eq!(
        metric(
            &proflow,
            "proflow_symbolize_frames_total",
            "kernel_not_this_host"
        ),
        1.0
    );
    assert_eq!(
        metric(&proflow, "proflow_symbolize_frames_total", "symbolized"),
        0.0
    );
    drop(proflow);

    let proflow = proflow_local("    local: true\n    kernel: true\n");
    let app = common::unique_name("pushed-trusted");
    push(&proflow, &app, body);
    let names = names_of(&proflow, &app, 1);
    for f in local.iter().chain(&["schedule"]) {
        assert!(names.iter().any(|n| n == f), "{f} missing: {names:?}");
    }
    assert_eq!(
        metric(&proflow, "proflow_symbolize_frames_total", "symbolized"),
        4.0
    );
}

/// With `local: true`: a binary whose `.gnu_debuglink` names a debug file
/// that was swapped for a FIFO (blazesym followed such a link itself and
/// waited on the FIFO for good), then the binary itself swapped for a FIFO
/// between two pushes (a new lookup finds the FIFO at the path). Both
/// pushes are written, named as far as the files that are there allow,
/// and no worker was held (none timed out).
#[test]
fn fifos_swapped_in_for_a_debug_file_and_a_binary_hold_no_worker() {
    let s = stripped();
    let app = s.dir.join("app");
    let debug = s.dir.join("app.debug");
    std::fs::copy(&s.debug, &debug).unwrap();
    let linked = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&s.full)
        .arg(&app)
        .status()
        .unwrap();
    assert!(linked.success());
    let mkfifo = |path: &Path| {
        std::fs::remove_file(path).unwrap();
        let made = Command::new("mkfifo").arg(path).status().unwrap();
        assert!(made.success());
    };
    mkfifo(&debug);
    let (child, pid) = ebpf_targets::spawn(&app, 60);
    let _child = KillOnDrop(child);
    let proflow = proflow_local("    local: true\n");
    let name = common::unique_name("fifo-swap");
    let body = profile_mapping(&app, &s.full, pid, &s.build_id, None);
    push(&proflow, &name, body.clone());
    let names = names_of(&proflow, &name, 1);
    assert!(
        names.iter().any(|n| n == "proflow_hot_two"),
        "named from the binary's symbol table: {names:?}\n{}",
        proflow.log_text()
    );

    // The running process keeps its (unlinked) file; the path is a FIFO.
    mkfifo(&app);
    // Another build id at the same path: a new lookup, which finds the FIFO.
    let other = "00112233445566778899aabbccddeeff00112233";
    push(
        &proflow,
        &name,
        profile_mapping_again(&body, &s.build_id, other),
    );
    let names = names_of(&proflow, &name, 2);
    assert!(!names.iter().any(|n| n == "proflow_hot_two"), "{names:?}");
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(&metrics, "proflow_symbolize_skipped_profiles_total", &[]),
        0.0,
        "{metrics}"
    );
    assert_eq!(
        metric(&proflow, "proflow_symbolize_frames_total", "not_found"),
        3.0,
        "{metrics}"
    );
}

/// `body` (gzipped pprof) with the mapping's build id `from` replaced by `to`.
fn profile_mapping_again(body: &[u8], from: &str, to: &str) -> Vec<u8> {
    let mut p = pprof::decode(&body.to_vec().into(), 1 << 20).unwrap();
    for s in &mut p.string_table {
        if s == from {
            *s = to.to_owned();
        }
    }
    common::gzip(&pprof::encode(&p))
}

/// A real OTLP producer, the official Python classes (`send.py
/// --addresses`), sends the running stripped program's runtime addresses
/// (no lines, no functions) in one mapping whose only clue is its GNU build
/// id attribute, to proflow's `otlp` receiver → `symbolize` (debuginfod
/// alone) → `file` (pprof): the stacks come out named, each with the value
/// sent, the mapping keeps the build id, and the debug file fetched is the
/// one filed under that build id.
#[test]
fn otlp_from_the_python_classes_is_named_from_debuginfod_by_the_mappings_build_id() {
    let Some(server) = peer_env::peer("debuginfod") else {
        return;
    };
    let Some(python) = common::otlp_python_client() else {
        return;
    };
    let s = stripped();
    // Never removed (see `serve`).
    let _served = serve(&server, &s);
    let (child, pid) = ebpf_targets::spawn(&s.binary, 60);
    let _child = KillOnDrop(child);
    let cache = s.dir.join("cache");
    let grpc = common::free_port();
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: 127.0.0.1:{grpc}}}\n      http: {{endpoint: {}}}\nprocessors:\n  symbolize:\n    local: false\n    debug_dirs: []\n    debuginfod:\n      urls: [{}]\n      timeout: 30s\n      cache_dir: {}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      processors: [symbolize]\n      exporters: [file]\n",
            ports.receiver,
            server.http_base(),
            cache.display(),
            profiles.display(),
            ports.telemetry
        )
    });

    let addr = |symbol| runtime_address(pid, &s.binary, &s.full, symbol, 4);
    let (two, mapping) = addr("proflow_hot_two");
    let (one, _) = addr("proflow_hot_one");
    let (main, _) = addr("main");
    let spec = serde_json::json!({
        "mapping": {
            "filename": s.binary.to_str().unwrap(),
            "memory_start": mapping.0,
            "memory_limit": mapping.1,
            "file_offset": mapping.2,
            "build_id": s.build_id,
        },
        "samples": [
            {"addresses": [two, main], "value": 200_000_000},
            {"addresses": [one, main], "value": 100_000_000},
        ],
    });
    let spec_path = proflow.dir.path().join("addresses.json");
    std::fs::write(&spec_path, spec.to_string()).unwrap();
    let app = common::unique_name("symbolize-otlp");
    let (status, output) = common::run_bounded(
        Command::new(&python)
            .arg(common::peers_dir().join("apps/otlp-python/send.py"))
            .arg("--url")
            .arg(format!(
                "http://{}/v1development/profiles",
                proflow.ports.receiver
            ))
            .arg("--tag")
            .arg(&app)
            .arg("--out")
            .arg(proflow.dir.path().join("sent.pb"))
            .arg("--addresses")
            .arg(&spec_path),
        &proflow.dir.path().join("send.log"),
        Duration::from_secs(60),
    );
    assert!(status.success(), "send.py failed ({status}):\n{output}");

    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app.as_str()));
    assert_eq!(entries.len(), 1, "one profile sent, one written");
    let written = common::read_profile(&entries[0].path);
    let mut stacks: Vec<(String, i64)> = pprof::stacks_root_first(&written)
        .map(|(frames, sample)| (frames.join(";"), sample.value[0]))
        .collect();
    stacks.sort();
    assert_eq!(
        stacks,
        [
            ("main;proflow_hot_one".to_owned(), 100_000_000),
            ("main;proflow_hot_two".to_owned(), 200_000_000),
        ],
        "the stacks sent, named, with the values sent\nmetrics:\n{}\nlog:\n{}",
        proflow.metrics(),
        proflow.log_text()
    );
    let build_ids: Vec<&str> = written
        .mapping
        .iter()
        .map(|m| written.string(m.build_id))
        .collect();
    assert_eq!(build_ids, [s.build_id.as_str()], "the mapping sent");
    assert!(
        cache.join(&s.build_id).join("debuginfo").is_file(),
        "the debug file fetched is filed under the mapping's build id"
    );
    assert_eq!(
        metric(
            &proflow,
            "proflow_symbolize_debuginfod_fetches_total",
            "found"
        ),
        1.0
    );
}
