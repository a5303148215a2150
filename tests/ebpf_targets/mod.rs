//! Programs with known CPU behaviour for the `ebpf` receiver's tests and
//! `scripts/bench-ebpf`: two hot functions at a 2:1 CPU split, in C (with
//! and without frame pointers), Rust (a release build, no frame pointers)
//! and Go, and for JIT runtimes in JavaScript (`hot.js`), Python (`hot.py`)
//! and Java (`Hot.java`), run from source. Each prints `ready PID` when it starts spinning and `rounds N`
//! when it ends.
//!
//! [`build`] compiles a target into `<target dir>/ebpf-targets/` (again only
//! when its source is newer), writing to a temporary name and renaming, so
//! tests running in parallel never see half a binary.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// C, `-O2 -g -fno-omit-frame-pointer`.
    CFp,
    /// C, `-O2 -g -fomit-frame-pointer`: needs DWARF unwinding.
    CNoFp,
    /// Rust, `-C opt-level=3 -C force-frame-pointers=no`.
    Rust,
    /// Go, `go build`.
    Go,
    /// Go, `go build`, its hot functions under pprof labels (`golabels/`).
    GoLabels,
    /// C, `-O2 -g -fomit-frame-pointer`: waits (`sleep.c`), not CPU.
    Sleep,
}

fn source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/ebpf_targets")
}

fn out_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    target.join("ebpf-targets")
}

fn newer(bin: &Path, source: &Path) -> bool {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    match (modified(bin), modified(source)) {
        (Some(b), Some(s)) => b >= s,
        _ => false,
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn go_command() -> PathBuf {
    std::env::var_os("PROFLOW_GO")
        .map(PathBuf::from)
        .or_else(|| {
            let p = PathBuf::from("/usr/local/go/bin/go");
            p.exists().then_some(p)
        })
        .unwrap_or_else(|| PathBuf::from("go"))
}

/// The target's binary, built if missing or older than its source.
pub fn build(target: Target) -> Result<PathBuf, String> {
    let src = source_dir();
    let dir = out_dir();
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let (name, source) = match target {
        Target::CFp => ("hot-fp", src.join("hot.c")),
        Target::CNoFp => ("hot-nofp", src.join("hot.c")),
        Target::Rust => ("hot-rust", src.join("hot.rs")),
        Target::Go => ("hot-go", src.join("go/main.go")),
        Target::GoLabels => ("hot-go-labels", src.join("golabels/main.go")),
        Target::Sleep => ("sleep", src.join("sleep.c")),
    };
    let bin = dir.join(name);
    if newer(&bin, &source) {
        return Ok(bin);
    }
    // Per build, not per process: two tests of one binary may build the
    // same target at once, and each renames its own file into place.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!("{name}.tmp-{}-{n}", std::process::id()));
    match target {
        Target::CFp | Target::CNoFp | Target::Sleep => {
            let fp = if matches!(target, Target::CFp) {
                "-fno-omit-frame-pointer"
            } else {
                "-fomit-frame-pointer"
            };
            run(Command::new("cc")
                .args(["-O2", "-g", fp, "-o"])
                .arg(&tmp)
                .arg(&source))?;
        }
        Target::Rust => run(Command::new("rustc")
            .args([
                "--edition",
                "2021",
                "-C",
                "opt-level=3",
                "-C",
                "debuginfo=1",
                "-C",
                "force-frame-pointers=no",
                "-o",
            ])
            .arg(&tmp)
            .arg(&source))?,
        Target::Go | Target::GoLabels => run(Command::new(go_command())
            .args(["build", "-o"])
            .arg(&tmp)
            .arg(".")
            .current_dir(src.join(if matches!(target, Target::Go) {
                "go"
            } else {
                "golabels"
            }))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local"))?,
    }
    std::fs::rename(&tmp, &bin)
        .map_err(|e| format!("cannot move {} to {}: {e}", tmp.display(), bin.display()))?;
    Ok(bin)
}

/// Starts `bin` for `seconds` and waits for its `ready PID` line.
pub fn spawn(bin: &Path, seconds: u32) -> (Child, u32) {
    let mut cmd = Command::new(bin);
    cmd.arg(seconds.to_string());
    spawn_command(cmd)
}

/// The source of a target run by its runtime (`hot.js`, `hot.py`,
/// `Hot.java`).
pub fn source(name: &str) -> PathBuf {
    source_dir().join(name)
}

/// Starts `cmd` and waits for its `ready PID` line (the PID it prints).
pub fn spawn_command(cmd: Command) -> (Child, u32) {
    let (child, pid, _rest) = spawn_with_output(cmd);
    (child, pid)
}

/// [`spawn_command`], with the lines it prints after `ready PID`.
pub fn spawn_with_output(mut cmd: Command) -> (Child, u32, std::sync::mpsc::Receiver<String>) {
    let bin = PathBuf::from(cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"));
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // Every line, read on so the target never blocks on a full pipe
        // (once nobody listens, they are dropped).
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let line = rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .unwrap_or_else(|_| panic!("{} did not print `ready PID` within 30 s", bin.display()));
    let pid = line
        .strip_prefix("ready ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("{} printed {line:?}, not `ready PID`", bin.display()));
    (child, pid, rx)
}
