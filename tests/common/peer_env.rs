//! How an integration test gets a real peer (Pyroscope, Parca, Kafka, the
//! OpenTelemetry Collector, debuginfod, the Go scrape target): through
//! [`peer`], which returns the peer's endpoint lines.
//!
//! If the test command exported the endpoints (`PYROSCOPE_ENDPOINT=...`, as
//! printed by `tests/peers/up`), those are used as they are. Otherwise the
//! helper runs `tests/peers/up NAME` itself, which installs the peer once into
//! `~/.cache/proflow-peers/`, starts it on 127.0.0.1 (or finds it running) and
//! prints the lines. Peers are left running for the next test; `tests/peers/down`
//! stops them.
//!
//! When a peer cannot be had: under `CI` the test fails with the peer's own
//! error output, never skips. Locally it fails too, loudly, unless
//! `PROFLOW_SKIP_PEERS=1`, in which case [`peer`] returns `None` and the test
//! returns early; [`peer_skip`] shows the skip and records it for
//! `scripts/test`.
//!
//! A test that stops and restarts a peer must not do it to the shared one
//! (other tests use it at the same time): [`PrivatePeer`] starts an instance of
//! its own through `tests/peers/private`, on free ports with its own data dir,
//! which it can stop and start again on the same ports and data.
//!
//! Also here: [`go_app`] (the Go client programs of `tests/peers/apps/`) and
//! [`kafka_consume`] (reads a topic through `tests/peers/kafka/consume`).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

#[path = "names.rs"]
pub mod names;
#[path = "peer_skip.rs"]
pub mod peer_skip;

#[allow(unused_imports)]
pub use names::{now_nanos, unique};

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

/// The endpoint lines of one running peer, e.g. `PYROSCOPE_ENDPOINT`.
#[derive(Debug, Clone)]
pub struct Peer {
    name: String,
    vars: BTreeMap<String, String>,
}

impl Peer {
    /// `NAME_ENDPOINT` (host:port on 127.0.0.1).
    pub fn endpoint(&self) -> &str {
        self.var("ENDPOINT")
    }

    /// `http://` + [`Peer::endpoint`].
    pub fn http_base(&self) -> String {
        format!("http://{}", self.endpoint())
    }

    /// The value of `NAME_<suffix>`, e.g. `var("HTTP_ENDPOINT")` for otelcol.
    /// Panics (naming what there is) if the peer did not report it.
    pub fn var(&self, suffix: &str) -> &str {
        let key = format!("{}_{suffix}", self.prefix());
        match self.vars.get(&key) {
            Some(v) => v,
            None => panic!(
                "peer {} reported no {key}; it reported: {:?}",
                self.name, self.vars
            ),
        }
    }

    /// The value of `NAME_<suffix>`, if the peer reported it.
    pub fn get(&self, suffix: &str) -> Option<&str> {
        self.vars
            .get(&format!("{}_{suffix}", self.prefix()))
            .map(String::as_str)
    }

    fn prefix(&self) -> String {
        self.name.to_ascii_uppercase()
    }
}

/// The repository root (where `tests/peers/up` lives).
fn repo_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// Returns the running peer `name` (`pyroscope`, `parca`, `kafka`, `otelcol`,
/// `debuginfod`, `goscrape`), starting it if the test command did not export
/// its endpoints. `None` only when the peer cannot be had and
/// `PROFLOW_SKIP_PEERS=1` outside CI; otherwise that case panics.
pub fn peer(name: &str) -> Option<Peer> {
    static STARTED: OnceLock<Mutex<HashMap<String, Peer>>> = OnceLock::new();
    let started = STARTED.get_or_init(|| Mutex::new(HashMap::new()));
    // Held across `up`: tests of one binary asking for the same peer wait for
    // one start instead of racing (up itself also locks per peer).
    let mut started = started
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(p) = started.get(name) {
        return Some(p.clone());
    }
    let peer = match from_environment(name) {
        Some(p) => p,
        None => match run_up(name) {
            Ok(p) => p,
            Err(report) => {
                return unavailable(&format!("peer '{name}' is not available.\n{report}"));
            }
        },
    };
    started.insert(name.to_owned(), peer.clone());
    Some(peer)
}

/// `NAME_*` variables, if `NAME_ENDPOINT` is among them.
fn from_environment(name: &str) -> Option<Peer> {
    let prefix = format!("{}_", name.to_ascii_uppercase());
    let vars: BTreeMap<String, String> = std::env::vars()
        .filter(|(k, _)| k.starts_with(&prefix))
        .collect();
    vars.contains_key(&format!("{prefix}ENDPOINT"))
        .then(|| Peer {
            name: name.to_owned(),
            vars,
        })
}

/// Runs `tests/peers/up NAME` and parses its `KEY=VALUE` lines.
fn run_up(name: &str) -> Result<Peer, String> {
    let up = repo_root().join("tests/peers/up");
    eprintln!(
        "peer_env: running {} {name} (a cold install builds the peer; that takes minutes)",
        up.display()
    );
    let output = Command::new(&up)
        .arg(name)
        .current_dir(repo_root())
        .output()
        .map_err(|e| format!("could not run {}: {e}", up.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        return Err(format!(
            "`tests/peers/up {name}` failed ({}). Its output:\n{stderr}{stdout}",
            output.status
        ));
    }
    // Keep the install/start log with the test's captured output.
    eprint!("{stderr}");
    let prefix = format!("{}_", name.to_ascii_uppercase());
    let vars = endpoint_lines(name, &stdout);
    if !vars.contains_key(&format!("{prefix}ENDPOINT")) {
        return Err(format!(
            "`tests/peers/up {name}` succeeded but printed no {prefix}ENDPOINT line. stdout:\n{stdout}\nstderr:\n{stderr}"
        ));
    }
    Ok(Peer {
        name: name.to_owned(),
        vars,
    })
}

/// Parses the `NAME_*=VALUE` lines of `stdout`.
fn endpoint_lines(name: &str, stdout: &str) -> BTreeMap<String, String> {
    let prefix = format!("{}_", name.to_ascii_uppercase());
    stdout
        .lines()
        .filter_map(|line| line.split_once('='))
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

/// A private instance of the peer `pyroscope`, `parca` or `kafka` for one
/// test, run by `tests/peers/private` from the cached build (installed first
/// if the cache lacks it) on free ports, with its pid, log, ports and data in
/// a temporary directory of its own. [`PrivatePeer::stop`] (SIGTERM) or
/// [`PrivatePeer::kill`] (SIGKILL) ends it, keeping its data;
/// [`PrivatePeer::start_again`] brings it back on the same ports with that
/// data (see `tests/peers/private` for what each peer keeps). Dropping it
/// kills the peer and removes the directory; if the test process dies without
/// dropping it, the script's watcher kills the peer.
pub struct PrivatePeer {
    name: String,
    peer: Peer,
    dir: tempfile::TempDir,
    running: bool,
    /// Passed to every start (see [`PrivatePeer::start_with`]).
    env: Vec<(String, String)>,
}

impl PrivatePeer {
    /// Starts a private `name`; waits until it is ready. `None` only when
    /// it cannot be had and `PROFLOW_SKIP_PEERS=1` outside CI (see [`peer`]).
    pub fn start(name: &str) -> Option<PrivatePeer> {
        PrivatePeer::start_with(name, &[])
    }

    /// [`PrivatePeer::start`] with variables for the peer's start function,
    /// given again to [`PrivatePeer::start_again`]: for Kafka
    /// `PROFLOW_KAFKA_LISTENERS`, `PROFLOW_KAFKA_PROPERTIES` and
    /// `PROFLOW_KAFKA_SCRAM` (see `tests/peers/kafka/peer.sh`); the extra
    /// listeners' endpoints are [`Peer::var`]`("<NAME>_ENDPOINT")`.
    pub fn start_with(name: &str, env: &[(&str, &str)]) -> Option<PrivatePeer> {
        let dir = match tempfile::Builder::new()
            .prefix(&format!("proflow-private-{name}-"))
            .tempdir()
        {
            Ok(d) => d,
            Err(e) => return unavailable(&format!("no temporary directory for {name}: {e}")),
        };
        let mut private = PrivatePeer {
            name: name.to_owned(),
            peer: Peer {
                name: name.to_owned(),
                vars: BTreeMap::new(),
            },
            dir,
            running: false,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        };
        match private.run_start() {
            Ok(vars) => {
                private.peer.vars = vars;
                Some(private)
            }
            Err(report) => unavailable(&format!(
                "a private '{name}' could not be started.\n{report}"
            )),
        }
    }

    /// Starts the stopped peer again in its directory: same ports, same data.
    /// Panics with the script's output if it does not come back ready.
    pub fn start_again(&mut self) {
        assert!(!self.running, "{} is still running", self.name);
        let vars = self
            .run_start()
            .unwrap_or_else(|report| panic!("{} did not start again:\n{report}", self.name));
        assert_eq!(
            vars, self.peer.vars,
            "{} came back with other endpoints",
            self.name
        );
    }

    /// Sends SIGTERM to the peer and waits until it has exited.
    pub fn stop(&mut self) {
        self.run_stop(false);
    }

    /// Kills the peer with SIGKILL (no shutdown of its own) and waits until
    /// it is gone.
    pub fn kill(&mut self) {
        self.run_stop(true);
    }

    /// The endpoint lines, as [`peer`] returns them for a shared peer.
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// `NAME_ENDPOINT` (host:port on 127.0.0.1).
    pub fn endpoint(&self) -> &str {
        self.peer.endpoint()
    }

    /// `http://` + [`PrivatePeer::endpoint`].
    pub fn http_base(&self) -> String {
        self.peer.http_base()
    }

    /// The last `lines` lines of the peer's log (all its runs).
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.dir.path().join(&self.name).join("peer.log");
        let text = std::fs::read_to_string(&log)
            .unwrap_or_else(|e| format!("(cannot read {}: {e})", log.display()));
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    fn script() -> PathBuf {
        repo_root().join("tests/peers/private")
    }

    fn run_start(&mut self) -> Result<BTreeMap<String, String>, String> {
        let script = Self::script();
        let output = Command::new(&script)
            .args(["start", &self.name])
            .arg(self.dir.path())
            .env("PROFLOW_PRIVATE_OWNER", std::process::id().to_string())
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir(repo_root())
            .output()
            .map_err(|e| format!("could not run {}: {e}", script.display()))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            return Err(format!(
                "`tests/peers/private start {}` failed ({}). Its output:\n{stderr}{stdout}",
                self.name, output.status
            ));
        }
        self.running = true;
        eprint!("{stderr}");
        let vars = endpoint_lines(&self.name, &stdout);
        if !vars.contains_key(&format!("{}_ENDPOINT", self.name.to_ascii_uppercase())) {
            return Err(format!(
                "`tests/peers/private start {}` printed no endpoint. stdout:\n{stdout}\nstderr:\n{stderr}",
                self.name
            ));
        }
        Ok(vars)
    }

    fn run_stop(&mut self, kill: bool) {
        let script = Self::script();
        let mut cmd = Command::new(&script);
        cmd.args(["stop", &self.name]).arg(self.dir.path());
        if kill {
            cmd.arg("--kill");
        }
        let output = cmd
            .current_dir(repo_root())
            .output()
            .unwrap_or_else(|e| panic!("could not run {}: {e}", script.display()));
        self.running = false;
        assert!(
            output.status.success(),
            "`tests/peers/private stop {}` failed ({}):\n{}",
            self.name,
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
}

impl Drop for PrivatePeer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- private {} log, last lines ----\n{}",
                self.name,
                self.log_tail(40)
            );
        }
        if self.running {
            let _ = Command::new(Self::script())
                .args(["stop", &self.name])
                .arg(self.dir.path())
                .arg("--kill")
                .current_dir(repo_root())
                .output();
        }
    }
}

/// Reports a peer (or peer program) that cannot be had: panics under CI and by
/// default; returns `None` after a visible, recorded notice only when
/// `PROFLOW_SKIP_PEERS=1` and `CI` is not set. See [`peer_skip`].
pub fn unavailable<T>(what: &str) -> Option<T> {
    peer_skip::unavailable(
        what,
        "The peers are installed and started by tests/peers/up (see its header).",
    )
}

/// The path of the Go client program `tests/peers/apps/NAME` (`goscrape`,
/// `gopush`), built into the peer cache by `tests/peers/build-go-app`, or
/// taken from `NAME_BIN` if the test command exported it.
pub fn go_app(name: &str) -> Option<PathBuf> {
    let key = format!("{}_BIN", name.to_ascii_uppercase());
    if let Some(path) = std::env::var_os(&key) {
        return Some(PathBuf::from(path));
    }
    let script = repo_root().join("tests/peers/build-go-app");
    let output = match Command::new(&script)
        .arg(name)
        .current_dir(repo_root())
        .output()
    {
        Ok(o) => o,
        Err(e) => return unavailable(&format!("could not run {}: {e}", script.display())),
    };
    let stdout = String::from_utf8_lossy(&output.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")));
    match (output.status.success(), line) {
        (true, Some(path)) => Some(PathBuf::from(path)),
        _ => unavailable(&format!(
            "building Go app '{name}' failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )),
    }
}

/// One Kafka record: key (None when null) and value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KafkaRecord {
    pub key: Option<Vec<u8>>,
    pub value: Vec<u8>,
}

/// Reads the first `count` records of `topic` from the broker at `broker`
/// (host:port), waiting at most `timeout`. Panics with kcat's error output if
/// fewer arrive.
pub fn kafka_consume(
    broker: &str,
    topic: &str,
    count: usize,
    timeout: Duration,
) -> Vec<KafkaRecord> {
    let script = repo_root().join("tests/peers/kafka/consume");
    let output = Command::new(&script)
        .args([
            broker,
            topic,
            &count.to_string(),
            &timeout.as_secs().max(1).to_string(),
        ])
        .output()
        .unwrap_or_else(|e| panic!("could not run {}: {e}", script.display()));
    if !output.status.success() {
        panic!(
            "consuming {count} records from {topic} at {broker} failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let records = parse_consumed(&output.stdout)
        .unwrap_or_else(|e| panic!("unreadable output of {}: {e}", script.display()));
    assert_eq!(records.len(), count, "records read from {topic}");
    records
}

/// Parses `<len>:<bytes><len>:<bytes>` pairs (key, value); length -1 is null.
fn parse_consumed(mut buf: &[u8]) -> Result<Vec<KafkaRecord>, String> {
    fn field<'a>(buf: &mut &'a [u8]) -> Result<Option<&'a [u8]>, String> {
        let colon = buf
            .iter()
            .position(|&b| b == b':')
            .ok_or("missing ':' after a length")?;
        let len: i64 = std::str::from_utf8(&buf[..colon])
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("bad length {:?}", String::from_utf8_lossy(&buf[..colon])))?;
        *buf = &buf[colon + 1..];
        if len < 0 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| "length out of range")?;
        if len > buf.len() {
            return Err(format!("length {len} exceeds the {} bytes left", buf.len()));
        }
        let (bytes, rest) = buf.split_at(len);
        *buf = rest;
        Ok(Some(bytes))
    }
    let mut records = Vec::new();
    while !buf.is_empty() {
        let key = field(&mut buf)?.map(<[u8]>::to_vec);
        let value = field(&mut buf)?.map(<[u8]>::to_vec).unwrap_or_default();
        records.push(KafkaRecord { key, value });
    }
    Ok(records)
}

/// Polls `f` every 500 ms until it returns `Some`, for at most `timeout`.
pub fn poll<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// A goscrape process (`tests/peers/apps/goscrape`: Go's `net/http/pprof`
/// on 127.0.0.1), one per test: Go serves one CPU profile at a time per
/// process, so tests sharing one would collide. Killed on drop.
pub struct GoTarget {
    child: std::process::Child,
    /// `127.0.0.1:PORT`.
    pub endpoint: String,
}

impl GoTarget {
    pub fn port(&self) -> &str {
        self.endpoint.rsplit_once(':').map_or("", |(_, p)| p)
    }
}

impl Drop for GoTarget {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts goscrape with `args` on a free port; `None` only where
/// [`go_app`] skips.
pub fn go_target(args: &[&str]) -> Option<GoTarget> {
    use std::io::BufRead;
    let bin = go_app("goscrape")?;
    let mut child = Command::new(&bin)
        .args(["-addr", "127.0.0.1:0"])
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    let stdout = child.stdout.take().expect("goscrape stdout is piped");
    let mut target = GoTarget {
        child,
        endpoint: String::new(),
    };
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("read goscrape's first line");
    target.endpoint = line
        .trim()
        .strip_prefix("GOSCRAPE_ENDPOINT=")
        .unwrap_or_else(|| panic!("goscrape printed {line:?}, not GOSCRAPE_ENDPOINT=…"))
        .to_owned();
    Some(target)
}

/// Runs `cmd` with `stdin` as its input and returns its stdout; panics with
/// its output when it fails (a peer's command-line client, such as kubectl).
pub fn run_with_stdin(cmd: &mut Command, stdin: &str) -> String {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {cmd:?}: {e}"));
    child
        .stdin
        .take()
        .expect("stdin is piped")
        .write_all(stdin.as_bytes())
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait for the command");
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `kube` peer's kubectl with its kubeconfig: runs `args` with `stdin`,
/// returns stdout; panics with the output on failure.
pub fn kubectl(kube: &Peer, args: &[&str], stdin: &str) -> String {
    run_with_stdin(
        Command::new(kube.var("KUBECTL"))
            .arg("--kubeconfig")
            .arg(kube.var("KUBECONFIG"))
            .args(args),
        stdin,
    )
}

/// Sets a pod's `status` (a JSON object) as its kubelet would: no kubelet
/// runs beside the test API server.
pub fn patch_pod_status(kube: &Peer, namespace: &str, pod: &str, status: &str) {
    let patch = format!(r#"{{"status":{status}}}"#);
    kubectl(
        kube,
        &[
            "-n",
            namespace,
            "patch",
            "pod",
            pod,
            "--subresource=status",
            "--type=merge",
            "-p",
            &patch,
        ],
        "",
    );
}
