//! The real Pyroscope clients (`pyroscope-io` for Python, `@pyroscope/nodejs`)
//! push to proflow's `pprof_push` receiver; a `relabel` processor adds
//! `team=core`; the `file` exporter writes the profiles. The files must carry
//! the client's labels plus `team=core`, be readable by `go tool pprof`, and
//! show the programs' hot function with 75% ± 10 points of the CPU of the
//! hot and warm ones (the programs do 3:1 work in them).
//!
//! The client programs live in `tests/peers/apps/`; `tests/peers/install-clients`
//! installs the client libraries (see `common::clients`).

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::{IndexEntry, Proflow};

/// How long the Node program burns CPU (the share of 12 runs on a busy
/// 2-core machine: 70.3% to 78.3%).
const NODE_RUN_SECONDS: &str = "6";
/// How long the Python program burns CPU. Its client samples by wall time,
/// so on a busy machine a run of samples lands in one function while the
/// program waits for a core: 6 s runs put 67.6% to 79.1% in the hot
/// function (12 runs, load 5 to 19), too near the band, and a longer run
/// averages more of those waits.
const PYTHON_RUN_SECONDS: &str = "10";
/// The Python client's run must end well within this.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// The hot function's share (percent) of the CPU of hot + warm: the client
/// programs do 3 units of work in it for each unit in the warm one.
const HOT_SHARE: f64 = 75.0;
/// How far (percentage points) a run's hot share may be from [`HOT_SHARE`].
const SHARE_BAND: f64 = 10.0;

/// The client (`python_client` or `node_client`) and Go, or `None` when
/// missing and skipping is allowed.
fn peers(client: fn() -> Result<PathBuf, String>, what: &str) -> Option<(PathBuf, PathBuf)> {
    let client = match client() {
        Ok(c) => c,
        Err(why) => return common::missing_peer(&format!("{what}: {why}")),
    };
    let go = match common::go() {
        Ok(go) => go,
        Err(why) => return common::missing_peer(&why),
    };
    Some((client, go))
}

/// What one client's files must show.
struct Expect<'a> {
    app: &'a str,
    /// The `peer` tag the program sets.
    peer_tag: &'a str,
    /// The `__name__` of its profiles.
    name: &'a str,
    /// Sample types (`type` of `sample_types` in the index) every file has.
    sample_types: &'a [&'a str],
    hot: &'a str,
    warm: &'a str,
}

/// Checks what a client run produced: labels, readable files, the hot share.
fn check_files(proflow: &Proflow, go: &std::path::Path, want: Expect<'_>) {
    let Expect {
        app,
        peer_tag,
        name,
        sample_types,
        hot,
        warm,
    } = want;
    // The client flushed before it exited: the proportions use every
    // profile it pushed.
    let entries = settle(proflow, app);
    assert!(!entries.is_empty(), "nothing of {app} was written");

    for e in &entries {
        assert_eq!(
            e.label("team"),
            Some("core"),
            "relabel should add team=core: {:?}",
            e.raw
        );
        assert_eq!(e.label("__name__"), Some(name), "__name__: {:?}", e.raw);
        let types: Vec<&str> = e
            .raw
            .get("sample_types")
            .and_then(|t| t.as_array())
            .map(|t| t.iter().filter_map(|t| t.get("type")?.as_str()).collect())
            .unwrap_or_default();
        for ty in sample_types {
            assert!(
                types.contains(ty),
                "sample type {ty} missing from the index entry: {:?}",
                e.raw
            );
        }
        assert_eq!(
            e.label("peer"),
            Some(peer_tag),
            "the client's own tag is kept: {:?}",
            e.raw
        );
        assert!(
            e.path.starts_with(&proflow.profiles),
            "{} is outside the exporter directory",
            e.path.display()
        );
        assert!(
            e.path
                .to_str()
                .is_some_and(|p| p.ends_with(".pb.gz") && p.contains(&format!("/{app}/"))),
            "files go to <dir>/<service_name>/*.pb.gz, got {}",
            e.path.display()
        );
    }

    let files: Vec<PathBuf> = entries.iter().map(|e| e.path.clone()).collect();
    let (totals, traces) = common::pprof_trace_totals(go, &files, &[hot, warm]);
    let (hot_total, warm_total) = (totals[0], totals[1]);
    assert!(
        hot_total > 0.0,
        "{hot} does not appear in go tool pprof -traces:\n{traces}"
    );
    assert!(
        warm_total > 0.0,
        "{warm} does not appear in go tool pprof -traces:\n{traces}"
    );
    // The program does three times the work in the hot function that it
    // does in the warm one, so 75% of their CPU is the hot function's.
    let hot_share = 100.0 * hot_total / (hot_total + warm_total);
    assert!(
        (HOT_SHARE - SHARE_BAND..=HOT_SHARE + SHARE_BAND).contains(&hot_share),
        "{hot} has {hot_share:.1}% of {hot}+{warm} ({hot_total} and {warm_total}), want {HOT_SHARE}% ± {SHARE_BAND}:\n{traces}"
    );
    eprintln!(
        "{app}: {} file(s), {hot}={hot_total:.0} {warm}={warm_total:.0} ({hot_share:.1}% hot)",
        files.len(),
    );
}

/// The entries of `app` once everything the receiver accepted is written:
/// the client has exited, so what it pushed is final, and the `file`
/// exporter has sent as many profiles as the receiver accepted.
fn settle(proflow: &Proflow, app: &str) -> Vec<IndexEntry> {
    common::wait_all_written(proflow, Duration::from_secs(30));
    common::read_index(&proflow.profiles)
        .into_iter()
        .filter(|e| e.label("service_name") == Some(app))
        .collect()
}

#[test]
fn python_client_pushes_through_relabel_to_files() {
    let Some((python, go)) = peers(common::python_client, "pyroscope-io") else {
        return;
    };
    let proflow = Proflow::start_default("");
    let app = common::unique_name("py-e2e");
    let log = proflow.dir.path().join("python-client.log");
    let (status, output) = common::run_bounded(
        Command::new(&python)
            .arg(common::peers_dir().join("apps/python/main.py"))
            .args(["--server", &proflow.receiver_url("")])
            .args(["--app-name", &app])
            .arg(PYTHON_RUN_SECONDS),
        &log,
        RUN_TIMEOUT,
    );
    assert!(
        status.success(),
        "python client failed ({status}):\n{output}"
    );
    check_files(
        &proflow,
        &go,
        Expect {
            app: &app,
            peer_tag: "python",
            name: "process_cpu",
            sample_types: &["cpu"],
            hot: "py_hot_loop",
            warm: "py_warm_loop",
        },
    );
}

#[test]
fn node_client_pushes_through_relabel_to_files() {
    let Some((node_modules, go)) = peers(common::node_client, "@pyroscope/nodejs") else {
        return;
    };
    let proflow = Proflow::start_default("");
    let app = common::unique_name("node-e2e");
    common::run_node_client(&proflow, &node_modules, &app, NODE_RUN_SECONDS);
    // Wall-clock profiles with CPU time collected: one profile, three types.
    check_files(
        &proflow,
        &go,
        Expect {
            app: &app,
            peer_tag: "node",
            name: "wall",
            sample_types: &["samples", "wall", "cpu"],
            hot: "nodeHotLoop",
            warm: "nodeWarmLoop",
        },
    );
}
