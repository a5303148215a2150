//! Helpers shared by the end-to-end tests: start the real `proflow` binary on
//! free loopback ports with a config in a temporary directory, wait until it is
//! ready, talk HTTP to it, read what the file exporter wrote, and find the real
//! peer programs (Pyroscope clients, `go tool pprof`).
//!
//! Every spawned process is killed when its guard is dropped. Waits are bounded.
//! A missing peer fails the test; only `PROFLOW_SKIP_PEERS=1` outside CI turns
//! that into a skip, shown and recorded by [`peer_skip`].

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

#[path = "../names/mod.rs"]
pub mod names;
#[path = "../peer_skip/mod.rs"]
pub mod peer_skip;

#[allow(unused_imports)]
pub use names::now_nanos;
// Certificates made at test time (tests/tls_auth.rs, tests/otlp_receiver.rs).
#[allow(unused_imports)]
pub use proflow_pipeline::test_pki as pki;

use std::collections::{BTreeMap, HashSet};
use std::fs::File;
use std::io::Read as _;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// How long the binary may take to report ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a pushed profile may take to appear as a file.
pub const FILE_TIMEOUT: Duration = Duration::from_secs(30);

/// A free port on 127.0.0.1: bound, read, released. Another process could take
/// it before proflow binds it; [`Proflow::start`] retries with fresh ports
/// when the binary reports the address in use. Never the same port twice in
/// one test process: a port released can be handed out again at once, and two
/// picked for one config (a receiver's and the telemetry's) would then clash.
pub fn free_port() -> u16 {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = listener
            .local_addr()
            .expect("local_addr of a bound listener")
            .port();
        if handed_out
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

/// A port on 127.0.0.1 for a server started long after its address went
/// into another process's config (a backend that comes up later), held
/// while this guard lives.
///
/// [`free_port`] hands out ports of the kernel's ephemeral range, which any
/// `bind(0)` or outgoing connection of any test may take before the late
/// server binds. This one comes from below that range
/// (`/proc/sys/net/ipv4/ip_local_port_range`), which the kernel never hands
/// out by itself, and a lock file (`proflow-test-late-ports/<port>` under
/// the temporary directory, holding the owner's pid; a dead owner's lock is
/// taken over) keeps other test processes from picking it meanwhile.
pub struct LatePort {
    pub port: u16,
    lock: PathBuf,
}

impl Drop for LatePort {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.lock);
    }
}

pub fn late_port() -> LatePort {
    use std::hash::{BuildHasher, RandomState};
    const LOWEST: u16 = 10_000;
    let ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    assert!(
        ephemeral > LOWEST + 100,
        "the ephemeral port range starts at {ephemeral}: no room below it for late ports"
    );
    let dir = std::env::temp_dir().join("proflow-test-late-ports");
    std::fs::create_dir_all(&dir).expect("create the late-port lock directory");
    let span = u64::from(ephemeral - LOWEST);
    // A random start, so parallel test processes rarely try the same ports.
    let start = RandomState::new().hash_one(std::process::id()) % span;
    let mine = std::process::id().to_string();
    for i in 0..span {
        let port = LOWEST + ((start + i) % span) as u16;
        let lock = dir.join(port.to_string());
        let taken = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&lock)
            .and_then(|mut f| f.write_all(mine.as_bytes()));
        if taken.is_err() {
            // Held by a test process still running, or left by a dead one
            // (cleared for later picks).
            let owner = std::fs::read_to_string(&lock).unwrap_or_default();
            let alive = !owner.is_empty() && Path::new("/proc").join(owner.trim()).exists();
            if !alive {
                let _ = std::fs::remove_file(&lock);
            }
            continue;
        }
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return LatePort { port, lock };
        }
        let _ = std::fs::remove_file(&lock);
    }
    panic!("no port below {ephemeral} is free on 127.0.0.1");
}

/// The addresses and directories one proflow instance gets.
#[derive(Debug, Clone)]
pub struct Ports {
    /// `receivers.pprof_push.endpoint`.
    pub receiver: SocketAddr,
    /// `service.telemetry.address`.
    pub telemetry: SocketAddr,
}

impl Ports {
    pub fn fresh() -> Self {
        Ports {
            receiver: SocketAddr::from(([127, 0, 0, 1], free_port())),
            telemetry: SocketAddr::from(([127, 0, 0, 1], free_port())),
        }
    }
}

/// The usual test pipeline: `pprof_push` → optional processors → `file`.
/// `receiver_extra` is YAML spliced into the receiver's body (indented 4).
pub fn file_pipeline_config(
    ports: &Ports,
    profiles_dir: &Path,
    receiver_extra: &str,
    relabel_team: bool,
) -> String {
    let mut yaml = format!(
        "receivers:\n  pprof_push:\n    endpoint: {}\n",
        ports.receiver
    );
    for line in receiver_extra.lines().filter(|l| !l.trim().is_empty()) {
        yaml.push_str("    ");
        yaml.push_str(line);
        yaml.push('\n');
    }
    if relabel_team {
        yaml.push_str(
            "processors:\n  relabel/team:\n    relabel_configs:\n      - {action: replace, target_label: team, replacement: core}\n",
        );
    }
    yaml.push_str(&format!(
        "exporters:\n  file:\n    directory: {}\n",
        profiles_dir.display()
    ));
    yaml.push_str(&format!(
        "service:\n  telemetry:\n    address: {}\n    log_level: info\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n",
        ports.telemetry
    ));
    if relabel_team {
        yaml.push_str("      processors: [relabel/team]\n");
    }
    yaml.push_str("      exporters: [file]\n");
    yaml
}

/// A running `proflow run -c FILE`, killed on drop.
#[derive(Debug)]
pub struct Proflow {
    child: Child,
    /// The test's own directory (config, log, profiles); removed on drop.
    pub dir: TempDir,
    pub ports: Ports,
    /// Where the `file` exporter writes (`<dir>/profiles`).
    pub profiles: PathBuf,
    pub config: PathBuf,
    pub log: PathBuf,
    http: reqwest::blocking::Client,
    log_on_panic: bool,
}

impl Proflow {
    /// The standard pipeline ([`file_pipeline_config`]) with the relabel
    /// processor adding `team=core`.
    pub fn start_default(receiver_extra: &str) -> Proflow {
        Proflow::start(|ports, profiles| {
            file_pipeline_config(ports, profiles, receiver_extra, true)
        })
    }

    /// Writes the config `make_config(ports, profiles_dir)` returns into a fresh
    /// temporary directory, starts the binary and waits until `/readyz` says
    /// 200. Panics with the binary's log when it does not get ready in time.
    pub fn start(make_config: impl FnMut(&Ports, &Path) -> String) -> Proflow {
        Proflow::start_with_args(&["run"], make_config)
    }

    /// Like [`Proflow::start`], with `args` (e.g. `["run"]`, or none) before `-c FILE`.
    pub fn start_with_args(
        args: &[&str],
        mut make_config: impl FnMut(&Ports, &Path) -> String,
    ) -> Proflow {
        Proflow::start_with_env(args, |ports, profiles| {
            (make_config(ports, profiles), Vec::new())
        })
    }

    /// Like [`Proflow::start_with_args`]; `make` also gives the variables set
    /// in the binary's environment (what a config's `${env:NAME}` reads).
    pub fn start_with_env(
        args: &[&str],
        mut make: impl FnMut(&Ports, &Path) -> (String, Vec<(String, String)>),
    ) -> Proflow {
        let dir = tempfile::Builder::new()
            .prefix("proflow-e2e-")
            .tempdir()
            .expect("create a temporary directory");
        let profiles = dir.path().join("profiles");
        let config = dir.path().join("proflow.yaml");
        let mut dir = dir;
        let mut last_log = String::new();
        for attempt in 1..=3 {
            let ports = Ports::fresh();
            let (yaml, env) = make(&ports, &profiles);
            std::fs::write(&config, yaml).expect("write the config");
            let log = dir.path().join(format!("proflow-{attempt}.log"));
            let child = spawn_logged(
                Command::new(proflow_binary())
                    .envs(env)
                    .args(args)
                    .arg("-c")
                    .arg(&config),
                &log,
            );
            let mut proflow = Proflow {
                child,
                dir,
                ports,
                profiles: profiles.clone(),
                config: config.clone(),
                log,
                http: http_client(),
                log_on_panic: true,
            };
            match proflow.wait_ready() {
                Ok(()) => return proflow,
                Err(why) => {
                    last_log = proflow.log_text();
                    let port_taken = last_log.contains("in use");
                    proflow.kill();
                    if port_taken && attempt < 3 {
                        eprintln!(
                            "proflow could not bind its ports (attempt {attempt}), retrying with fresh ones"
                        );
                        dir = proflow.take_dir();
                        continue;
                    }
                    proflow.log_on_panic = false;
                    panic!(
                        "proflow did not get ready: {why}\nconfig:\n{}\nlog:\n{last_log}",
                        std::fs::read_to_string(&config).unwrap_or_default()
                    );
                }
            }
        }
        unreachable!("the loop returns or panics; last log:\n{last_log}")
    }

    fn take_dir(mut self) -> TempDir {
        // Move the directory out; Drop then has nothing left to kill.
        let replacement = tempfile::tempdir().expect("create a temporary directory");
        std::mem::replace(&mut self.dir, replacement)
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let url = format!("http://{}/readyz", self.ports.telemetry);
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("the binary exited with {status}"));
            }
            match self.http.get(&url).send() {
                Ok(resp) if resp.status().as_u16() == 200 => return Ok(()),
                Ok(resp) => last = format!("GET {url} answered {}", resp.status()),
                Err(e) => last = format!("GET {url} failed: {e}"),
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("not ready after {READY_TIMEOUT:?}; last: {last}"))
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Kills the process with SIGKILL (no shutdown at all) and reaps it; the
    /// directory stays until drop.
    pub fn sigkill(&mut self) {
        self.kill();
    }

    /// Sends SIGTERM and waits up to `timeout` for the process to exit;
    /// returns its exit code (panics with the log if it does not exit).
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let sent = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM failed");
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for proflow") {
                return status.code();
            }
            if Instant::now() >= deadline {
                panic!(
                    "proflow did not exit within {timeout:?} of SIGTERM\nlog:\n{}",
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The collector's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The collector's resident set size now, in bytes (Linux `/proc`).
    pub fn rss_bytes(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kib| kib * 1024)
    }

    /// Everything the binary wrote to stdout and stderr so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(cannot read log: {e})"))
    }

    /// `http://<receiver>` followed by `path_and_query`.
    pub fn receiver_url(&self, path_and_query: &str) -> String {
        format!("http://{}{path_and_query}", self.ports.receiver)
    }

    pub fn http(&self) -> &reqwest::blocking::Client {
        &self.http
    }

    /// POSTs `body` to the receiver with the given headers.
    pub fn post(&self, path_and_query: &str, headers: &[(&str, &str)], body: Vec<u8>) -> Reply {
        let url = self.receiver_url(path_and_query);
        let mut req = self.http.post(&url).body(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req
            .send()
            .unwrap_or_else(|e| panic!("POST {url} failed: {e}\nlog:\n{}", self.log_text()));
        Reply::read(resp)
    }

    /// The Prometheus text of `/metrics`.
    pub fn metrics(&self) -> String {
        let url = format!("http://{}/metrics", self.ports.telemetry);
        let resp = self
            .http
            .get(&url)
            .send()
            .unwrap_or_else(|e| panic!("GET {url} failed: {e:?}"));
        assert_eq!(resp.status().as_u16(), 200, "GET {url}");
        resp.text().expect("read /metrics")
    }

    /// Waits until the file exporter's index has at least `min` entries
    /// matching `pred` and their files exist; then returns them all (the
    /// matching ones). Panics with the log and the index after [`FILE_TIMEOUT`].
    pub fn wait_for_files(
        &self,
        min: usize,
        pred: impl Fn(&IndexEntry) -> bool,
    ) -> Vec<IndexEntry> {
        let deadline = Instant::now() + FILE_TIMEOUT;
        loop {
            let entries: Vec<IndexEntry> = read_index(&self.profiles)
                .into_iter()
                .filter(|e| pred(e))
                .collect();
            if entries.len() >= min && entries.iter().all(|e| e.path.is_file()) {
                return entries;
            }
            if Instant::now() >= deadline {
                panic!(
                    "after {FILE_TIMEOUT:?}, {} matching index entries (want {min}) under {}\nindex:\n{}\nfiles: {:?}\nlog:\n{}",
                    entries.len(),
                    self.profiles.display(),
                    std::fs::read_to_string(self.profiles.join("index.jsonl")).unwrap_or_default(),
                    list_files(&self.profiles),
                    self.log_text()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Proflow {
    fn drop(&mut self) {
        self.kill();
        if self.log_on_panic && std::thread::panicking() {
            eprintln!(
                "---- proflow log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// `examples/NAME` as a user copies it, with each `(from, to)` of `edits`
/// replaced (the addresses, ports and directories a test must change).
/// Panics unless each `from` occurs exactly once, so an edited example
/// fails its test rather than running with an edit that no longer applies.
pub fn example_config(name: &str, edits: &[(&str, &str)]) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples")
        .join(name);
    let mut yaml =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    for (from, to) in edits {
        let n = yaml.matches(from).count();
        assert_eq!(n, 1, "{from:?} occurs {n} times in {}", path.display());
        yaml = yaml.replace(from, to);
    }
    yaml
}

/// The binary [`Proflow::start`] runs: this build's, or the one
/// `PROFLOW_TEST_BINARY` names (to measure a release build with a test:
/// `PROFLOW_TEST_BINARY=target/release/proflow cargo test --test hostile`).
pub fn proflow_binary() -> PathBuf {
    std::env::var_os("PROFLOW_TEST_BINARY")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_proflow")))
}

/// A blocking HTTP client with a bounded timeout and no proxy.
pub fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(15))
        .no_proxy()
        .build()
        .expect("build the HTTP client")
}

/// A process's resident set size now, in bytes (Linux `/proc`); 0 once it is gone.
pub fn rss_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmRSS:")
}

/// The most a process has held resident since it started (`VmHWM`, the
/// kernel's own high-water mark: no peak between two reads is missed), in
/// bytes; 0 once it is gone.
pub fn peak_rss_bytes(pid: u32) -> u64 {
    status_bytes(pid, "VmHWM:")
}

/// A `kB` field of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// The sum of `metric`'s samples whose labels include every pair of `labels`.
pub fn metric_sum(text: &str, metric: &str, labels: &[(&str, &str)]) -> f64 {
    metric_samples(text, metric)
        .into_iter()
        .filter(|(l, _)| {
            labels
                .iter()
                .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, v)| v)
        .sum()
}

/// An HTTP answer, read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub content_type: String,
    /// `Retry-After`, if the answer had one.
    pub retry_after: Option<String>,
    pub body: Vec<u8>,
}

impl Reply {
    fn read(resp: reqwest::blocking::Response) -> Reply {
        let status = resp.status().as_u16();
        let content_type = resp
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let retry_after = resp
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = resp.bytes().map(|b| b.to_vec()).unwrap_or_default();
        Reply {
            status,
            content_type,
            retry_after,
            body,
        }
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts the status; the message shows the body.
    pub fn expect_status(&self, status: u16, what: &str) -> &Self {
        assert_eq!(
            self.status,
            status,
            "{what}: expected HTTP {status}, got {} with body {:?}",
            self.status,
            self.text()
        );
        self
    }

    /// Asserts the body is the JSON error `{"code": …, "message": …}` with a
    /// non-empty code and message; returns them.
    pub fn expect_json_error(&self, what: &str) -> (String, String) {
        let v: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{what}: error body is not JSON ({e}); content-type {:?}, body {:?}",
                self.content_type,
                self.text()
            )
        });
        let code = match v.get("code") {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            other => panic!("{what}: error body has no code (got {other:?}): {v}"),
        };
        let message = match v.get("message") {
            Some(serde_json::Value::String(s)) => s.clone(),
            other => panic!("{what}: error body has no message string (got {other:?}): {v}"),
        };
        assert!(!code.is_empty(), "{what}: empty code in {v}");
        assert!(!message.is_empty(), "{what}: empty message in {v}");
        assert!(
            self.content_type.starts_with("application/json"),
            "{what}: error content-type is {:?}, expected application/json",
            self.content_type
        );
        (code, message)
    }
}

/// One line of the file exporter's `index.jsonl`.
#[derive(Debug, Clone)]
pub struct IndexEntry {
    /// The profile file, absolute.
    pub path: PathBuf,
    pub labels: BTreeMap<String, String>,
    pub raw: serde_json::Value,
}

impl IndexEntry {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels.get(name).map(String::as_str)
    }
}

/// The entries of `<dir>/index.jsonl` (none if it does not exist yet). A
/// trailing line still being written is ignored; any other bad line panics.
pub fn read_index(dir: &Path) -> Vec<IndexEntry> {
    let Ok(text) = std::fs::read_to_string(dir.join("index.jsonl")) else {
        return Vec::new();
    };
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    complete
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let raw: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("index.jsonl line is not JSON ({e}): {line}"));
            let path = raw
                .get("path")
                .and_then(|p| p.as_str())
                .unwrap_or_else(|| panic!("index.jsonl line has no string `path`: {line}"));
            let path = if Path::new(path).is_absolute() {
                PathBuf::from(path)
            } else {
                dir.join(path)
            };
            let labels = labels_of(raw.get("labels"))
                .unwrap_or_else(|| panic!("index.jsonl line has no readable `labels`: {line}"));
            IndexEntry { path, labels, raw }
        })
        .collect()
}

/// Labels written as an object `{name: value}`, a list of `{name, value}`
/// objects, or a list of `[name, value]` pairs.
fn labels_of(v: Option<&serde_json::Value>) -> Option<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    match v? {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                out.insert(k.clone(), v.as_str()?.to_owned());
            }
        }
        serde_json::Value::Array(items) => {
            for item in items {
                let (k, v) = match item {
                    serde_json::Value::Object(o) => (o.get("name")?, o.get("value")?),
                    serde_json::Value::Array(pair) if pair.len() == 2 => (&pair[0], &pair[1]),
                    _ => return None,
                };
                out.insert(k.as_str()?.to_owned(), v.as_str()?.to_owned());
            }
        }
        _ => return None,
    }
    Some(out)
}

/// Every file under `dir`, relative, for failure messages.
pub fn list_files(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// Decodes a profile file the exporter wrote (gzipped pprof).
pub fn read_profile(path: &Path) -> proflow_pipeline::pprof::Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        proflow_pipeline::pprof::is_gzip(&bytes),
        "{} is not gzipped",
        path.display()
    );
    proflow_pipeline::pprof::decode(&bytes.into(), 256 << 20)
        .unwrap_or_else(|e| panic!("{} is not a pprof profile: {e}", path.display()))
}

/// The function names a profile's samples reference.
pub fn function_names(profile: &proflow_pipeline::pprof::Profile) -> Vec<String> {
    let mut names: Vec<String> = proflow_pipeline::pprof::stacks_root_first(profile)
        .flat_map(|(frames, _)| frames.into_iter().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// Starts `cmd` with stdin closed and stdout and stderr appended to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Child {
    let out = File::create(log).expect("create the log file");
    let err = out.try_clone().expect("clone the log file handle");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::from(out))
        .stderr(Stdio::from(err))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// A child process killed when dropped.
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `cmd` to completion within `timeout`, stdout and stderr captured to
/// `log`; kills it if it overruns. Returns its status and output.
pub fn run_bounded(cmd: &mut Command, log: &Path, timeout: Duration) -> (ExitStatus, String) {
    let mut child = KillOnDrop(spawn_logged(cmd, log));
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.0.try_wait().expect("wait for the child") {
            let mut out = String::new();
            if let Ok(mut f) = File::open(log) {
                let _ = f.read_to_string(&mut out);
            }
            return (status, out);
        }
        if Instant::now() >= deadline {
            drop(child);
            panic!(
                "{cmd:?} did not finish within {timeout:?}; output:\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

/// Parses the Prometheus text exposition: for each sample of `metric`, its
/// labels and value.
pub fn metric_samples(text: &str, metric: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let mut out = Vec::new();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
            let Some(end) = rest.rfind('}') else {
                continue;
            };
            (parse_labels(&rest[..end]), rest[end + 1..].trim())
        } else if rest.starts_with(' ') {
            (BTreeMap::new(), rest.trim())
        } else {
            continue; // a longer metric name with this prefix
        };
        let value = value.split_whitespace().next().unwrap_or("");
        if let Ok(v) = value.parse::<f64>() {
            out.push((labels, v));
        }
    }
    out
}

fn parse_labels(s: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let name: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if name.is_empty() {
            break;
        }
        if chars.next() != Some('"') {
            break;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                '"' => break,
                c => value.push(c),
            }
        }
        out.insert(name.trim().to_owned(), value);
    }
    out
}

/// A name unique among every run (a reused peer may keep older runs' data),
/// usable as a service name: `prefix-` and a unique tail.
pub fn unique_name(prefix: &str) -> String {
    names::unique(&format!("{prefix}-"))
}

/// Pyroscope's push messages as the Connect endpoint
/// `/push.v1.PusherService/Push` takes them: the pipeline's own definitions.
pub mod push {
    pub use proflow_pipeline::push_v1::PushRequest;
    use proflow_pipeline::push_v1::RawProfileSeries;

    /// One series with `labels` and one sample of `raw_profile`.
    pub fn request(labels: &[(&str, &str)], raw_profile: Vec<u8>) -> PushRequest {
        PushRequest {
            series: vec![RawProfileSeries::new(
                labels.iter().copied(),
                [raw_profile.into()],
            )],
        }
    }
}

/// Names of the functions in [`cpu_profile`].
pub const HOT_FUNCTION: &str = "e2e_hot_function";
pub const WARM_FUNCTION: &str = "e2e_warm_function";

/// A small CPU profile (plain protobuf bytes) of the last 10 s: `main` calls
/// [`HOT_FUNCTION`] (30 samples of 10 ms) and [`WARM_FUNCTION`] (10 samples).
pub fn cpu_profile() -> Vec<u8> {
    let mut b = proflow_pipeline::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", HOT_FUNCTION], vec![300_000_000])
        .sample_root_first(["main", WARM_FUNCTION], vec![100_000_000]);
    proflow_pipeline::pprof::encode(&b.build()).to_vec()
}

/// Gzip-compresses `bytes`.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    proflow_pipeline::pprof::gzip(bytes).to_vec()
}

/// `/ingest` query for a push of `name` (e.g. `app{k=v}`, percent-encoded here)
/// in `format` covering the last 10 s, `from`/`until` in unix seconds.
pub fn ingest_query(name: &str, format: Option<&str>) -> String {
    let until = now_nanos() / 1_000_000_000;
    let mut q = format!(
        "/ingest?name={}&from={}&until={until}&spyName=e2e&sampleRate=100",
        percent_encode(name),
        until - 10
    );
    if let Some(f) = format {
        q.push_str("&format=");
        q.push_str(&percent_encode(f));
    }
    q
}

pub use proflow_pipeline::url::percent_encode;

/// Standard base64 with padding (what protobuf JSON uses for bytes).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A valid raw pprof push to `/ingest` for service `app`; panics unless 200.
pub fn push_valid(proflow: &Proflow, app: &str) {
    let reply = proflow.post(
        &ingest_query(app, Some("pprof")),
        &[("content-type", "application/octet-stream")],
        gzip(&cpu_profile()),
    );
    reply.expect_status(200, "valid pprof push");
}

// ---------------------------------------------------------- exporter tests

/// The Python client program's hot and warm functions.
pub const PY_FUNCTIONS: [&str; 2] = ["py_hot_loop", "py_warm_loop"];

/// The Go push client's (`tests/peers/apps/gopush`) hot and warm functions,
/// as pprof names them.
pub const GO_FUNCTIONS: [&str; 2] = ["main.goHotLoop", "main.goWarmLoop"];

/// Per function (of [`PY_FUNCTIONS`] unless said otherwise), the sum of one
/// sample type's values of the samples whose stack contains it.
pub type Totals = std::collections::BTreeMap<String, i64>;

/// Adds one profile's [`Totals`] of [`PY_FUNCTIONS`] in its first sample type.
pub fn add_totals(totals: &mut Totals, profile: &proflow_pipeline::pprof::Profile) {
    add_function_totals(totals, profile, &PY_FUNCTIONS, None);
}

/// Adds one profile's [`Totals`] of `functions` in the sample type named
/// `sample_type` (e.g. `cpu`; the first when `None`). Panics if the profile
/// has no such sample type.
pub fn add_function_totals(
    totals: &mut Totals,
    profile: &proflow_pipeline::pprof::Profile,
    functions: &[&str],
    sample_type: Option<&str>,
) {
    let index = match sample_type {
        None => 0,
        Some(name) => profile
            .sample_type
            .iter()
            .position(|st| {
                profile
                    .string_table
                    .get(st.r#type as usize)
                    .is_some_and(|s| s == name)
            })
            .unwrap_or_else(|| panic!("the profile has no sample type {name}")),
    };
    for (frames, sample) in proflow_pipeline::pprof::stacks_root_first(profile) {
        let value = sample.value.get(index).copied().unwrap_or(0);
        for f in functions {
            if frames.contains(f) {
                *totals.entry((*f).to_owned()).or_default() += value;
            }
        }
    }
}

/// The same functions, each total within 1%.
pub fn totals_close(got: &Totals, want: &Totals) -> bool {
    got.len() == want.len()
        && want.iter().all(|(f, w)| {
            got.get(f)
                .is_some_and(|g| (g - w).abs() as f64 <= (*w as f64).abs() * 0.01)
        })
}

/// proflow with `pprof_push` fanned out to a `file` exporter and to the
/// exporter `id` whose body is `body` (YAML lines, unindented).
pub fn start_with_file_and(id: &str, body: &str) -> Proflow {
    let body: String = body
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| format!("    {l}\n"))
        .collect();
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             exporters:\n  file:\n    directory: {}\n  {id}:\n{body}\
             service:\n  telemetry:\n    address: {}\n    log_level: info\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file, {id}]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

/// What [`run_python_client_through`] saw.
pub struct ClientRun {
    /// Totals of what the `file` exporter wrote.
    pub totals: Totals,
    /// The first profile written (for its sample and period types).
    pub first: proflow_pipeline::pprof::Profile,
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

/// Polls until the `file` exporter has written every profile the receivers
/// accepted (at least one), for up to `timeout`.
pub fn wait_all_written(proflow: &Proflow, timeout: Duration) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let metrics = proflow.metrics();
        let accepted = metric_sum(&metrics, "proflow_receiver_accepted_profiles_total", &[]);
        let filed = metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "file")],
        );
        if accepted > 0.0 && filed == accepted {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the file exporter wrote {filed} of the {accepted} profiles accepted in {timeout:?}\nmetrics:\n{metrics}\nlog:\n{}",
            proflow.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The index entries of service `app` once the `file` exporter has written
/// every profile the receivers accepted ([`wait_all_written`]): a copy
/// accepted twice would be there too.
pub fn written_entries(proflow: &Proflow, app: &str, timeout: Duration) -> Vec<IndexEntry> {
    wait_all_written(proflow, timeout);
    read_index(&proflow.profiles)
        .into_iter()
        .filter(|e| e.label("service_name") == Some(app))
        .collect()
}

/// After a client pushing as `app` to `proflow` (started by
/// [`start_with_file_and`]) has exited: waits until the `file` exporter has
/// written every profile the receiver accepted (the client flushed before
/// it exited, so that count is final) and `exporter` has sent at least as
/// many, with none failed. Returns the index entries and the metrics then.
pub fn wait_exported(proflow: &Proflow, app: &str, exporter: &str) -> (Vec<IndexEntry>, String) {
    let entries = written_entries(proflow, app, Duration::from_secs(30));
    assert!(!entries.is_empty(), "nothing of {app} was written");
    let written = entries.len() as f64;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let metrics = loop {
        let metrics = proflow.metrics();
        let sent = metric_sum(
            &metrics,
            "proflow_exporter_sent_profiles_total",
            &[("exporter", exporter)],
        );
        if sent >= written {
            break metrics;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the {exporter} exporter did not send the {written} profiles the file exporter wrote\nmetrics:\n{metrics}\nlog:\n{}",
            proflow.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let failed = metric_sum(
        &metrics,
        "proflow_exporter_failed_profiles_total",
        &[("exporter", exporter)],
    );
    assert_eq!(failed, 0.0, "log:\n{}", proflow.log_text());
    (entries, metrics)
}

/// Waits (60 s at most) until each exporter of `sent` has sent exactly one
/// profile and each of `failed` has failed exactly one for good, then checks
/// that the failed ones sent none: a push fanned out to exporters some of
/// which must be refused.
pub fn wait_one_sent_one_failed(proflow: &Proflow, sent: &[&str], failed: &[&str]) {
    let count = |metrics: &str, metric: &str, exporter: &str| {
        metric_sum(metrics, metric, &[("exporter", exporter)])
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = proflow.metrics();
        let settled = sent
            .iter()
            .all(|e| count(&metrics, "proflow_exporter_sent_profiles_total", e) == 1.0)
            && failed
                .iter()
                .all(|e| count(&metrics, "proflow_exporter_failed_profiles_total", e) == 1.0);
        if settled {
            for e in failed {
                assert_eq!(
                    count(&metrics, "proflow_exporter_sent_profiles_total", e),
                    0.0,
                    "{e} sent"
                );
            }
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "want one sent by {sent:?} and one failed at {failed:?}:\n{metrics}\nlog:\n{}",
            proflow.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A cgroup named as a container runtime's systemd driver names them
/// (`docker-<id>.scope`) holding one process; removed on drop, once its
/// process has gone.
pub struct ContainerCgroup {
    dir: std::path::PathBuf,
    leaf: std::path::PathBuf,
    /// The 64-hex container id in its name.
    pub id: String,
}

impl ContainerCgroup {
    /// Moves `pid` into a new container-like cgroup (the unified hierarchy
    /// if the machine has one writable, else cgroup v1's cpu).
    pub fn enter(pid: u32) -> ContainerCgroup {
        let id = format!(
            "{:064x}",
            u128::from(std::process::id()) << 64 | u128::from(pid) << 16 | 0xfeed
        );
        let id = id[id.len() - 64..].to_owned();
        let roots = [
            "/sys/fs/cgroup/unified",
            "/sys/fs/cgroup",
            "/sys/fs/cgroup/cpu",
        ];
        for root in roots {
            let dir = std::path::Path::new(root)
                .join(format!("proflow-test-{}-{pid}", std::process::id()));
            let leaf = dir.join(format!("docker-{id}.scope"));
            if std::fs::create_dir_all(&leaf).is_ok()
                && std::fs::write(leaf.join("cgroup.procs"), pid.to_string()).is_ok()
            {
                let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
                assert!(
                    cgroups.contains(&id),
                    "the target is not in the cgroup: {cgroups}"
                );
                return ContainerCgroup { dir, leaf, id };
            }
            let _ = std::fs::remove_dir(&leaf);
            let _ = std::fs::remove_dir(&dir);
        }
        panic!("could not make a cgroup under /sys/fs/cgroup to move the target into")
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        // The cgroup can go once its process has.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.leaf).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Waits (60 s at most) until a client thread counting its answered
/// requests in `served` has had `more` answered since the call: "a moment
/// later" as the client sees it, on a machine of any speed.
pub fn wait_served_more(served: &std::sync::atomic::AtomicUsize, more: usize) {
    use std::sync::atomic::Ordering;
    let from = served.load(Ordering::SeqCst);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while served.load(Ordering::SeqCst) < from + more {
        assert!(
            std::time::Instant::now() < deadline,
            "the client got {} of {more} answers in 60 s",
            served.load(Ordering::SeqCst) - from
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
