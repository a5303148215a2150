//! The real peers and clients the tests drive: where they are installed,
//! how to run them, and `go tool pprof` reading our files.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use super::files::{IndexEntry, read_profile, wait_exported};
use super::peer_skip;
use super::process::{Proflow, run_bounded};
use super::profiles::{Totals, add_totals};

/// Reports a peer that is not available: fails under CI and by default; skips
/// visibly (returns `None`) only when `PROFLOW_SKIP_PEERS=1` outside CI. See
/// [`peer_skip`].
pub fn missing_peer<T>(what: &str) -> Option<T> {
    peer_skip::unavailable(
        what,
        "Install the peers with tests/peers/install-clients (scripts/test does).",
    )
}

/// The Python with `pyroscope-io`: `PROFLOW_PYTHON`, else what
/// `tests/peers/install-clients` prints. `Err` says why it is not available.
pub fn python_client() -> Result<PathBuf, String> {
    let python = client_path("PROFLOW_PYTHON")?;
    if !python.is_file() {
        return Err(format!(
            "PROFLOW_PYTHON {} does not exist",
            python.display()
        ));
    }
    Ok(python)
}

/// The Python with the official `opentelemetry-proto` classes, which runs
/// `tests/peers/apps/otlp-python/send.py`: `PROFLOW_OTLP_PYTHON`, else what
/// `tests/peers/install-clients` prints. When it is not available this
/// panics, unless `PROFLOW_SKIP_PEERS=1` outside CI: then the skip is
/// recorded loudly and `None` is returned (the test returns).
pub fn otlp_python_client() -> Option<PathBuf> {
    let python = client_path("PROFLOW_OTLP_PYTHON").and_then(|python| {
        if python.is_file() {
            Ok(python)
        } else {
            Err(format!(
                "PROFLOW_OTLP_PYTHON {} does not exist",
                python.display()
            ))
        }
    });
    match python {
        Ok(python) => Some(python),
        Err(why) => missing_peer(&format!(
            "the Python opentelemetry-proto client is not available: {why}"
        )),
    }
}

/// The bin directory of the venv with py-spy (and its python):
/// `PROFLOW_PYSAMPLERS`, else what `tests/peers/install-clients` prints.
/// `Err` says why it is not available.
pub fn py_samplers() -> Result<PathBuf, String> {
    let dir = client_path("PROFLOW_PYSAMPLERS")?;
    if !dir.join("py-spy").is_file() {
        return Err(format!(
            "PROFLOW_PYSAMPLERS {} has no py-spy",
            dir.display()
        ));
    }
    Ok(dir)
}

/// The `node_modules` with `@pyroscope/nodejs` (used as `NODE_PATH`):
/// `PROFLOW_NODE_MODULES`, else what `tests/peers/install-clients` prints.
pub fn node_client() -> Result<PathBuf, String> {
    let modules = client_path("PROFLOW_NODE_MODULES")?;
    if !modules.join("@pyroscope/nodejs").is_dir() {
        return Err(format!(
            "PROFLOW_NODE_MODULES {} has no @pyroscope/nodejs",
            modules.display()
        ));
    }
    Ok(modules)
}

/// async-profiler's agent (`libasyncProfiler.so`, from Maven Central):
/// `PROFLOW_ASYNC_PROFILER`, else what `tests/peers/install-clients` prints.
pub fn async_profiler() -> Result<PathBuf, String> {
    let lib = client_path("PROFLOW_ASYNC_PROFILER")?;
    if !lib.is_file() {
        return Err(format!(
            "PROFLOW_ASYNC_PROFILER {} does not exist",
            lib.display()
        ));
    }
    Ok(lib)
}

/// Runs the Node program of `tests/peers/apps/node` (with the real
/// `@pyroscope/nodejs` of `node_modules`) as `app` for `seconds`, pushing to
/// `proflow`; panics if it fails or reports a failed upload.
pub fn run_node_client(proflow: &Proflow, node_modules: &Path, app: &str, seconds: &str) {
    let log = proflow.dir.path().join("node-client.log");
    let node = std::env::var_os("NODE").unwrap_or_else(|| "node".into());
    let (status, output) = run_bounded(
        Command::new(node)
            .env("NODE_PATH", node_modules)
            // Lets the client log failed uploads.
            .env("DEBUG", "pyroscope")
            .arg(peers_dir().join("apps/node/main.js"))
            .args(["--server", &proflow.receiver_url("")])
            .args(["--app-name", app])
            .arg(seconds),
        &log,
        Duration::from_secs(60),
    );
    assert!(status.success(), "node client failed ({status}):\n{output}");
    assert!(
        !output.contains("rejected") && !output.contains("Error sending"),
        "the node client reports failed uploads:\n{output}"
    );
}

/// `java` (11 or later) and the Pyroscope Java agent's jar:
/// `PROFLOW_JAVA` and `PROFLOW_JAVA_AGENT`, else what
/// `tests/peers/install-clients` prints (it fetches the agent from Maven
/// Central once). `Err` says why they are not available.
pub fn java_agent() -> Result<(PathBuf, PathBuf), String> {
    let java = client_path("PROFLOW_JAVA")?;
    let agent = client_path("PROFLOW_JAVA_AGENT")?;
    if !agent.is_file() {
        return Err(format!(
            "PROFLOW_JAVA_AGENT {} does not exist",
            agent.display()
        ));
    }
    Ok((java, agent))
}

/// Helm (built from the Go module proxy) and podman (with runc):
/// `PROFLOW_HELM` and `PROFLOW_PODMAN`, else what
/// `tests/peers/install-clients` prints. `Err` says why they are not
/// available.
pub fn deploy_tools() -> Result<(PathBuf, PathBuf), String> {
    let helm = client_path("PROFLOW_HELM")?;
    let podman = client_path("PROFLOW_PODMAN")?;
    for tool in [&helm, &podman] {
        if !tool.is_file() {
            return Err(format!("{} does not exist", tool.display()));
        }
    }
    Ok((helm, podman))
}

/// Prometheus's promtool (built from the Go module proxy):
/// `PROFLOW_PROMTOOL`, else what `tests/peers/install-clients` prints.
/// `Err` says why it is not available.
pub fn promtool() -> Result<PathBuf, String> {
    let promtool = client_path("PROFLOW_PROMTOOL")?;
    if !promtool.is_file() {
        return Err(format!("{} does not exist", promtool.display()));
    }
    Ok(promtool)
}

/// The Prometheus Operator's published CRDs (ServiceMonitor, PodMonitor,
/// PrometheusRule), a file each: `PROFLOW_MONITORING_CRDS`, else what
/// `tests/peers/install-clients` prints. `Err` says why they are not there.
pub fn monitoring_crds() -> Result<Vec<PathBuf>, String> {
    let dir = client_path("PROFLOW_MONITORING_CRDS")?;
    let files: Vec<PathBuf> = ["servicemonitors", "podmonitors", "prometheusrules"]
        .iter()
        .map(|k| dir.join(format!("monitoring.coreos.com_{k}.yaml")))
        .collect();
    match files.iter().find(|f| !f.is_file()) {
        Some(f) => Err(format!("{} does not exist", f.display())),
        None => Ok(files),
    }
}

/// Headless Chromium (Debian's `chromium`): `PROFLOW_CHROMIUM`, else
/// `chromium` on the PATH (`scripts/test` installs it). `Err` says why it
/// is not available.
pub fn chromium() -> Result<PathBuf, String> {
    if let Some(c) = std::env::var_os("PROFLOW_CHROMIUM") {
        return Ok(PathBuf::from(c));
    }
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("chromium"))
        .find(|p| p.is_file())
        .ok_or_else(|| "chromium is not on the PATH (apt-get install chromium)".to_owned())
}

/// `key` from the environment, else from the `KEY=value` lines of
/// `tests/peers/install-clients` (run once per test binary; a fast no-op once
/// the clients are installed).
fn client_path(key: &str) -> Result<PathBuf, String> {
    if let Some(v) = std::env::var_os(key) {
        return Ok(PathBuf::from(v));
    }
    static INSTALLED: OnceLock<Result<String, String>> = OnceLock::new();
    let stdout = INSTALLED.get_or_init(install_clients).clone()?;
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
        .map(PathBuf::from)
        .ok_or_else(|| format!("install-clients printed no {key}= line:\n{stdout}"))
}

fn install_clients() -> Result<String, String> {
    let script = peers_dir().join("install-clients");
    let out = Command::new(&script)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        return Err(format!(
            "{} failed ({}):\n{stdout}{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(stdout)
}

/// `tests/peers` of this repository.
pub fn peers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("peers")
}

/// The `go` command: `PROFLOW_GO`, else `/usr/local/go/bin/go`, else `go` on `PATH`.
pub fn go() -> Result<PathBuf, String> {
    let candidates: Vec<PathBuf> = std::env::var_os("PROFLOW_GO")
        .map(PathBuf::from)
        .into_iter()
        .chain([PathBuf::from("/usr/local/go/bin/go"), PathBuf::from("go")])
        .collect();
    for go in &candidates {
        let ok = Command::new(go)
            .arg("version")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return Ok(go.clone());
        }
    }
    Err(format!(
        "no working Go toolchain (tried {candidates:?}); `go tool pprof` is needed to check the profiles"
    ))
}

/// Sums, over the `go tool pprof -traces` output of `files`, the values of the
/// samples whose stack contains a frame mentioning each of `functions`
/// (in the profile's default sample type). Also returns the raw output.
pub fn pprof_trace_totals(go: &Path, files: &[PathBuf], functions: &[&str]) -> (Vec<f64>, String) {
    let mut totals = vec![0.0; functions.len()];
    let mut all = String::new();
    for file in files {
        let out = Command::new(go)
            .args(["tool", "pprof", "-traces"])
            .arg(file)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("cannot run {} tool pprof: {e}", go.display()));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "go tool pprof -traces {} failed ({}):\n{}{}",
            file.display(),
            out.status,
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        for (value, frames) in parse_traces(&stdout) {
            for (i, f) in functions.iter().enumerate() {
                if frames.iter().any(|fr| fr.contains(f)) {
                    totals[i] += value;
                }
            }
        }
        all.push_str(&format!("==> {}\n{stdout}\n", file.display()));
    }
    (totals, all)
}

/// The samples of `go tool pprof -traces` output: value (in the unit's base,
/// e.g. nanoseconds for times) and frame lines.
fn parse_traces(text: &str) -> Vec<(f64, Vec<String>)> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut current: Option<(f64, Vec<String>)> = None;
    for line in text.lines() {
        if line.starts_with("-----------+") {
            if let Some(block) = current.take() {
                out.push(block);
            }
            in_block = true;
            continue;
        }
        if !in_block || line.trim().is_empty() {
            continue;
        }
        match current.as_mut() {
            None => {
                // "<value>   <leaf frame>"
                let trimmed = line.trim_start();
                let (value, frame) = trimmed
                    .split_once(char::is_whitespace)
                    .unwrap_or((trimmed, ""));
                let Some(value) = parse_quantity(value) else {
                    continue;
                };
                current = Some((value, vec![frame.trim().to_owned()]));
            }
            Some((_, frames)) => frames.push(line.trim().to_owned()),
        }
    }
    if let Some(block) = current.take() {
        out.push(block);
    }
    out
}

/// `620ms`, `1.05s`, `42`, `3.5kB`... as a number in the base unit.
fn parse_quantity(s: &str) -> Option<f64> {
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == 'e'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: f64 = num.parse().ok()?;
    let scale = match unit {
        "" | "ns" | "B" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        "mins" | "min" => 60e9,
        "hrs" | "h" => 3600e9,
        "kB" | "KB" => 1024.0,
        "MB" => 1024.0 * 1024.0,
        "GB" => 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some(n * scale)
}

/// The Python client program's hot and warm functions.
pub const PY_FUNCTIONS: [&str; 2] = ["py_hot_loop", "py_warm_loop"];

/// The Go push client's (`tests/peers/apps/gopush`) hot and warm functions,
/// as pprof names them.
pub const GO_FUNCTIONS: [&str; 2] = ["main.goHotLoop", "main.goWarmLoop"];

/// What [`run_python_client_through`] saw.
pub struct ClientRun {
    /// Totals of what the `file` exporter wrote.
    pub totals: Totals,
    /// The first profile written (for its sample and period types).
    pub first: proflow_model::pprof::Profile,
    /// Its index entry.
    pub entry: IndexEntry,
    /// proflow's metrics once the exporter had sent everything.
    pub metrics: String,
}

/// Runs the Python client against `proflow` (started by
/// [`start_with_file_and`]) as `app` for `seconds`; waits until the file
/// count is stable and `exporter` has sent as many profiles, with none
/// failed; the client's hot function must outweigh its warm one.
pub fn run_python_client_through(
    proflow: &Proflow,
    python: &Path,
    app: &str,
    seconds: &str,
    exporter: &str,
) -> ClientRun {
    let log = proflow.dir.path().join("python-client.log");
    let (status, output) = run_bounded(
        Command::new(python)
            .arg(peers_dir().join("apps/python/main.py"))
            .args(["--server", &proflow.receiver_url("")])
            .args(["--app-name", app])
            .arg(seconds),
        &log,
        Duration::from_secs(60),
    );
    assert!(
        status.success(),
        "python client failed ({status}):\n{output}"
    );
    let (entries, metrics) = wait_exported(proflow, app, exporter);
    let mut totals = Totals::new();
    let mut first = None;
    for e in &entries {
        let p = read_profile(&e.path);
        add_totals(&mut totals, &p);
        first.get_or_insert(p);
    }
    let [hot, warm] = PY_FUNCTIONS;
    assert!(
        totals.get(hot) > totals.get(warm) && totals.get(warm).is_some_and(|w| *w > 0),
        "the client's profiles should show {hot} above {warm} > 0: {totals:?}"
    );
    let mut entries = entries;
    ClientRun {
        totals,
        first: first.expect("at least one profile was written"),
        entry: entries.swap_remove(0),
        metrics,
    }
}
