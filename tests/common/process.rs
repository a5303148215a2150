//! The `proflow` process under test: free ports, configs in a temporary
//! directory, start and wait until ready, talk HTTP to it, its memory, and
//! other processes run with a bound and killed on drop.

use std::collections::HashSet;
use std::fs::File;
use std::io::Read as _;
use std::io::Write as _;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tempfile::TempDir;

use super::files::{IndexEntry, list_files, read_index};
use super::names;

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

/// A name unique among every run (a reused peer may keep older runs' data),
/// usable as a service name: `prefix-` and a unique tail.
pub fn unique_name(prefix: &str) -> String {
    names::unique(&format!("{prefix}-"))
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
