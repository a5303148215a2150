//! The `ebpf` receiver end to end, as root, against real runtimes and
//! programs that wait:
//!
//! - JIT runtimes run their own targets (`tests/ebpf_targets/hot.js`,
//!   `hot.py`, `Hot.java`, a 2:1 split) with their perf maps on: Node
//!   `--perf-basic-prof` (also in a mount and PID namespace of its own),
//!   CPython 3.12 and 3.13 `-X perf`, the JVM after `jcmd Compiler.perfmap`.
//! - CPython 3.8 to 3.13 with no flag: the receiver walks the interpreter's
//!   frames (`hot.py`, in the main thread and in a second thread), and
//!   where Python functions wait (`sleep.py`).
//! - PHP 8.2 with no flag or extension (`hot.php`): the VM's frames; Perl
//!   5.36 with no flag or module (`hot.pl`): its subs; Ruby 3.1 with no
//!   flag or gem (`hot.rb`): its control frames.
//! - Go with pprof labels and no profiling client (`golabels/main.go`):
//!   each sample carries its goroutine's labels.
//! - Off-CPU: a C program sleeping 20 ms and 10 ms in two functions
//!   (`sleep.c`), its `off_cpu` profile against the time it measured around
//!   its sleeps.
//!
//! These tests need root (CI runs as root); without it they fail, with a
//! message saying so: they never skip. They run one at a time.

mod common;
#[path = "common/ebpf_support.rs"]
mod ebpf_support;
#[allow(dead_code)] // Only the runtimes' sources and the sleeper.
mod ebpf_targets;
// Both helper modules include `peer_skip` (one copy each, same skip rules).
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{KillOnDrop, Ports, Proflow};
use ebpf_support::{
    check_split, check_split_and_stacks, holds_chain, proflow_for, proflow_for_with, pyroscope_has,
    require_root, stacks_of,
};
use ebpf_targets::Target;
use proflow_model::pprof;

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
/// `/tmp/perf-PID.map`, at the program's 2:1 split (with the receiver's own
/// naming of JavaScript frames off, `node: false`: where it is on, its
/// names win).
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
    let proflow = proflow_for_with(&[pid], "2s", "    node: false\n");
    let stacks = stacks_of(&proflow, pid, 4000);
    check_split(&stacks, "proflow_hot_two /", "proflow_hot_one /");
    // Named with their file, as Node writes them.
    assert!(
        stacks.iter().any(|(f, _)| f
            .iter()
            .any(|x| x.contains("proflow_hot_two") && x.contains("hot.js:"))),
        "{stacks:?}"
    );
}

/// CPython 3.12 and 3.13 with `-X perf` (and the receiver's own Python
/// frames off, `python: false`, so that the perf map alone names them):
/// every Python function's trampoline is named from the perf map, and
/// unwinding steps through the trampolines (which keep no frame pointer) to
/// the callers: `run` above each hot function, the interpreter's `main`
/// above all.
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
        let proflow = proflow_for_with(&[pid], "2s", "    python: false\n");
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

/// CPython 3.8 to 3.13, run as they are (no flag, no restart): the receiver
/// walks each sampled thread's Python frames and puts them where the
/// interpreter ran them. The program's 2:1 split shows under its Python
/// functions, named as Python names them, with their file, at lines inside
/// their bodies; `<module>` → `main` → `run` → the hot function root-first
/// (in a thread of its own: `_bootstrap_inner` → the lambda, by its
/// qualified name `main.<locals>.<lambda>` from 3.11 on → `run`), and the interpreter's evaluation
/// function no longer in their stacks. Every version runs it in the main
/// thread, the oldest and the newest in a second thread too, and so does the
/// system's `python3` (Debian's, a stripped executable with the
/// interpreter in it).
#[test]
fn python_frames_without_a_flag_in_every_cpython_from_3_8_to_3_13() {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("hot.py");
    let text = std::fs::read_to_string(&source).unwrap();
    // The lines of each function: from its `def` to its `return`. A frame
    // is at the `def` line when it has just begun (3.8's f_lasti is -1
    // then), and also when its line could not be decoded; the loop's two
    // lines (`def` + 2 and + 3) must be there too.
    let body = |name: &str| -> std::ops::RangeInclusive<i64> {
        let lines: Vec<&str> = text.lines().collect();
        let def = lines
            .iter()
            .position(|l| l.starts_with(&format!("def {name}(")))
            .unwrap_or_else(|| panic!("hot.py defines {name}"));
        let ret = def
            + lines[def..]
                .iter()
                .position(|l| l.trim_start().starts_with("return"))
                .unwrap();
        (def as i64 + 1)..=(ret as i64 + 1)
    };
    let (two_body, one_body) = (body("proflow_hot_two"), body("proflow_hot_one"));
    // pyenv's builds (the interpreter in libpython3.X.so, with its symbol
    // table), then the system's python3 (Debian's: the interpreter in the
    // stripped executable, found by its dynamic symbols).
    let runs = ["3.8", "3.9", "3.10", "3.11", "3.12", "3.13"]
        .map(|m| (m, false))
        .into_iter()
        .chain([("3.8", true), ("3.13", true), ("system", false)]);
    for (minor, threaded) in runs {
        let python = if minor == "system" {
            std::path::PathBuf::from("/usr/bin/python3")
        } else {
            let Some(python) = pyenv_python(minor) else {
                continue;
            };
            python
        };
        let version = Command::new(&python)
            .args(["-c", "import sys; print(sys.version_info[1])"])
            .output()
            .unwrap_or_else(|e| panic!("{}: {e} (apt-get install python3)", python.display()));
        let version: u32 = String::from_utf8_lossy(&version.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{}: {version:?}", python.display()));
        assert!(
            (8..=13).contains(&version),
            "{} is CPython 3.{version}; this test wants 3.8 to 3.13",
            python.display()
        );
        let mut cmd = Command::new(&python);
        cmd.arg(&source).arg("30");
        if threaded {
            cmd.arg("thread");
        }
        let lambda = if version >= 11 {
            "main.<locals>.<lambda>"
        } else {
            "<lambda>"
        };
        let chain = if threaded {
            ["_bootstrap_inner", lambda, "run"]
        } else {
            ["<module>", "main", "run"]
        };
        let (child, pid) = ebpf_targets::spawn_command(cmd);
        let _child = KillOnDrop(child);
        // Shown if a check below fails (the split's messages do not say
        // which interpreter ran).
        eprintln!(
            "CPython {minor} ({}, thread: {threaded}): pid {pid}",
            python.display()
        );
        let proflow = proflow_for(&[pid], "2s");
        let stacks = stacks_of(&proflow, pid, 4000);
        let dump = check_split(&stacks, "proflow_hot_two", "proflow_hot_one");
        let (mut hot, mut in_order, mut with_eval) = (0, 0, 0);
        for (frames, n) in &stacks {
            let at = |name: &str| frames.iter().position(|f| f == name);
            let Some(leaf) = at("proflow_hot_two").or_else(|| at("proflow_hot_one")) else {
                continue;
            };
            hot += n;
            // Each of `chain` root-first, the hot function after them.
            let mut from = 0;
            let ordered = chain.iter().all(|want| {
                // By name, or a method by its qualified name (3.11 on).
                let named = |f: &String| f == want || f.ends_with(&format!(".{want}"));
                match frames[from..leaf].iter().position(named) {
                    Some(i) => {
                        from += i + 1;
                        true
                    }
                    None => false,
                }
            });
            if ordered {
                in_order += n;
            }
            if frames.iter().any(|f| f == "_PyEval_EvalFrameDefault") {
                with_eval += n;
            }
        }
        assert!(
            in_order as f64 >= 0.95 * hot as f64,
            "CPython {minor} (thread: {threaded}): only {in_order} of {hot} hot samples read {chain:?} → hot function: {dump:#?}"
        );
        assert!(
            with_eval as f64 <= 0.05 * hot as f64,
            "CPython {minor}: {with_eval} of {hot} hot samples still show the evaluation function: {dump:#?}"
        );
        // Names, files and lines as the profile carries them.
        let (mut lines_two, mut lines_one) = (Vec::new(), Vec::new());
        for e in common::read_index(&proflow.profiles) {
            if e.label("pid") != Some(pid.to_string().as_str()) || !e.path.is_file() {
                continue;
            }
            let p = common::read_profile(&e.path);
            for f in &p.function {
                let name = p.string(f.name);
                if name.starts_with("proflow_hot_") {
                    assert_eq!(
                        p.string(f.filename),
                        source.to_string_lossy(),
                        "CPython {minor}: the file of {name}"
                    );
                }
            }
            for loc in &p.location {
                for line in &loc.line {
                    let Some(f) = p.function.iter().find(|f| f.id == line.function_id) else {
                        continue;
                    };
                    match p.string(f.name) {
                        "proflow_hot_two" => lines_two.push(line.line),
                        "proflow_hot_one" => lines_one.push(line.line),
                        _ => {}
                    }
                }
            }
        }
        assert!(
            lines_two.iter().all(|l| two_body.contains(l))
                && [2, 3]
                    .iter()
                    .all(|d| lines_two.contains(&(two_body.start() + d))),
            "CPython {minor}: proflow_hot_two's lines {lines_two:?}, its body {two_body:?}"
        );
        assert!(
            lines_one.iter().all(|l| one_body.contains(l))
                && [2, 3]
                    .iter()
                    .all(|d| lines_one.contains(&(one_body.start() + d))),
            "CPython {minor}: proflow_hot_one's lines {lines_one:?}, its body {one_body:?}"
        );
        eprintln!(
            "CPython {minor} (thread: {threaded}): {hot} hot samples, lines {:?} and {:?}",
            lines_two.iter().collect::<std::collections::BTreeSet<_>>(),
            lines_one.iter().collect::<std::collections::BTreeSet<_>>()
        );
    }
}

/// What [`interpreter_split`] checks of one interpreter's program.
struct Interpreted<'a> {
    /// The interpreter, as the test runs it.
    name: &'a str,
    cmd: Command,
    /// The program (every named frame's file).
    source: &'a Path,
    /// The hot functions' names (2:1).
    hot: [&'a str; 2],
    /// Root first: the frames every hot sample has above its hot function.
    chain: &'a [&'a str],
    /// The interpreter's evaluation function, gone from the stacks.
    eval: &'a str,
}

/// Runs `run.cmd` (its program prints `ready PID`), profiles it, checks the
/// 2:1 split of its hot functions, that at least 95% of their samples read
/// `chain` → hot function, that at most 5% still show the evaluation
/// function, and that each named frame of the program is in its file;
/// returns the lines each of those frames was at.
fn interpreter_split(
    run: Interpreted<'_>,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> {
    let (child, pid) = ebpf_targets::spawn_command(run.cmd);
    let _child = KillOnDrop(child);
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    let [two, one] = run.hot;
    let dump = check_split(&stacks, two, one);
    let (mut hot, mut in_order, mut with_eval) = (0, 0, 0);
    for (frames, n) in &stacks {
        let at = |name: &str| frames.iter().position(|f| f == name);
        let Some(leaf) = at(two).or_else(|| at(one)) else {
            continue;
        };
        hot += n;
        let mut from = 0;
        if run.chain.iter().all(
            |want| match frames[from..leaf].iter().position(|f| f == want) {
                Some(i) => {
                    from += i + 1;
                    true
                }
                None => false,
            },
        ) {
            in_order += n;
        }
        if frames.iter().any(|f| f == run.eval) {
            with_eval += n;
        }
    }
    let (name, chain, eval) = (run.name, run.chain, run.eval);
    assert!(
        in_order as f64 >= 0.95 * hot as f64,
        "{name}: only {in_order} of {hot} hot samples read {chain:?} → hot function: {dump:#?}"
    );
    assert!(
        with_eval as f64 <= 0.05 * hot as f64,
        "{name}: {with_eval} of {hot} hot samples still show {eval}: {dump:#?}"
    );
    let source = run.source.to_string_lossy();
    let lines = lines_of(
        &proflow,
        pid,
        |f| chain.contains(&f) || run.hot.contains(&f),
        &source,
        name,
    );
    eprintln!("{name}: {hot} hot samples; lines {lines:?}");
    lines
}

/// The 1-based line of `source`'s text that first contains `needle`.
fn line_of(text: &str, needle: &str) -> i64 {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("no line has {needle:?}")) as i64
        + 1
}

/// Checks that each hot function's lines are within its body (`def` and
/// the 8 lines after), and that `caller`'s include both calls, all within
/// `within`.
fn check_hot_lines(
    lines: &std::collections::BTreeMap<String, std::collections::BTreeSet<i64>>,
    hot: [(&str, i64); 2],
    caller: &str,
    calls: [i64; 2],
    within: std::ops::RangeInclusive<i64>,
) {
    for (name, def) in hot {
        let got = &lines[name];
        let body = def..=def + 8;
        assert!(
            !got.is_empty() && got.iter().all(|l| body.contains(l)),
            "{name}'s lines {got:?}, its body {body:?}"
        );
    }
    let got = &lines[caller];
    assert!(
        calls.iter().all(|c| got.contains(c)) && got.iter().all(|l| within.contains(l)),
        "{caller}'s lines {got:?}: its calls {calls:?}, all within {within:?}"
    );
}

/// PHP 8.2 (Debian's `php8.2`, the CLI) with no flag or extension: the
/// receiver walks the VM's frames from `executor_globals`, and the 2:1 split
/// of `hot.php` is named, each hot sample's stack reading `{main} → main →
/// Runner::run → hot function` with the VM's loop (`execute_ex`) gone, at
/// lines of `hot.php` (callers at their call's line).
#[test]
fn php_frames_without_a_flag() {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("hot.php");
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    let mut cmd = Command::new("php8.2");
    cmd.arg(&source).arg("30");
    let lines = interpreter_split(Interpreted {
        name: "PHP",
        cmd,
        source: &source,
        hot: ["proflow_hot_two", "proflow_hot_one"],
        chain: &["{main}", "main", "Runner::run"],
        eval: "execute_ex",
    });
    // The method at its two calls (and at lines of its own where a C
    // function it calls, `hrtime`, `mt_rand`, was running).
    check_hot_lines(
        &lines,
        [
            ("proflow_hot_two", at("function proflow_hot_two(")),
            ("proflow_hot_one", at("function proflow_hot_one(")),
        ],
        "Runner::run",
        [at("proflow_hot_two($k);"), at("proflow_hot_one($k);")],
        at("public function run(")..=at("return $rounds;"),
    );
    assert_eq!(
        lines["main"],
        [at("(new Runner())->run(")].into(),
        "main at its call of run"
    );
}

/// Perl 5.36 (Debian's `perl`) with no flag or module: the receiver walks
/// the main interpreter's context stacks, and the 2:1 split of `hot.pl` is
/// named, each hot sample reading `main::RUNTIME → main::main → Runner::run
/// → main::proflow_hot_two` with `Perl_runops_standard` gone, at lines of
/// `hot.pl` (callers at their call's line).
#[test]
fn perl_subs_without_a_flag() {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("hot.pl");
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    let mut cmd = Command::new("/usr/bin/perl");
    cmd.arg(&source).arg("30");
    let lines = interpreter_split(Interpreted {
        name: "Perl",
        cmd,
        source: &source,
        hot: ["main::proflow_hot_two", "main::proflow_hot_one"],
        chain: &["main::RUNTIME", "main::main", "Runner::run"],
        eval: "Perl_runops_standard",
    });
    check_hot_lines(
        &lines,
        [
            ("main::proflow_hot_two", at("sub proflow_hot_two")),
            ("main::proflow_hot_one", at("sub proflow_hot_one")),
        ],
        "Runner::run",
        [
            at("main::proflow_hot_two($k);"),
            at("main::proflow_hot_one($k);"),
        ],
        at("sub run {")..=at("return $rounds;"),
    );
    assert_eq!(
        lines["main::main"],
        [at("Runner->new->run(")].into(),
        "main::main at its call of run"
    );
    assert_eq!(
        lines["main::RUNTIME"],
        [at("main();")].into(),
        "the file's code at its call of main"
    );
}

/// Ruby 3.1 (Debian's `ruby`) with no flag or gem: the receiver walks the
/// VM's control frames, and the 2:1 split of `hot.rb` is named, each hot
/// sample reading `<main> → main → run → proflow_hot_two` with `rb_vm_exec`
/// gone, at lines of `hot.rb` from the iseqs' line tables (callers at their
/// call's line).
#[test]
fn ruby_frames_without_a_flag() {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("hot.rb");
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    let mut cmd = Command::new("ruby3.1");
    cmd.arg(&source).arg("30");
    let lines = interpreter_split(Interpreted {
        name: "Ruby",
        cmd,
        source: &source,
        hot: ["proflow_hot_two", "proflow_hot_one"],
        chain: &["<main>", "main", "run"],
        eval: "rb_vm_exec",
    });
    check_hot_lines(
        &lines,
        [
            ("proflow_hot_two", at("def proflow_hot_two(")),
            ("proflow_hot_one", at("def proflow_hot_one(")),
        ],
        "run",
        [at("  proflow_hot_two(k)"), at("  proflow_hot_one(k)")],
        at("def run(")..=at("def main"),
    );
    assert_eq!(
        lines["main"],
        [at("Runner.new.run(")].into(),
        "main at its call of run"
    );
    assert_eq!(
        lines["<main>"],
        [text.lines().count() as i64].into(),
        "the script at its call of main, its last line"
    );
}

/// Go with pprof labels and no profiling client (`golabels/main.go`, built
/// by this machine's Go): each sample carries the labels of the goroutine
/// it ran, so `hotTwo`'s samples have span_id 00000000000000aa, route /two
/// and a 32-character trace_id, `hotOne`'s span_id 00000000000000bb and a
/// 150-byte note cut to 112 bytes and `…`, at the 2:1 split.
#[test]
fn go_samples_carry_their_goroutines_pprof_labels() {
    let _one_at_a_time = require_root();
    let bin = ebpf_targets::build(Target::GoLabels).unwrap_or_else(|e| panic!("{e}"));
    let (child, pid) = ebpf_targets::spawn(&bin, 30);
    let _child = KillOnDrop(child);
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    check_split(&stacks, "main.hotTwo", "main.hotOne");
    // Per hot function: samples by their labels.
    type Labels = Vec<(String, String)>;
    let mut by: std::collections::BTreeMap<(&str, Labels), i64> = Default::default();
    for e in common::read_index(&proflow.profiles) {
        if e.label("pid") != Some(pid.to_string().as_str()) || !e.path.is_file() {
            continue;
        }
        let p = common::read_profile(&e.path);
        for (frames, s) in pprof::stacks_root_first(&p) {
            let hot = if frames.iter().any(|f| f.contains("main.hotTwo")) {
                "hotTwo"
            } else if frames.iter().any(|f| f.contains("main.hotOne")) {
                "hotOne"
            } else {
                continue;
            };
            let mut labels: Labels = s
                .label
                .iter()
                .map(|l| (p.string(l.key).to_owned(), p.string(l.str).to_owned()))
                .collect();
            labels.sort();
            *by.entry((hot, labels)).or_default() += s.value[1];
        }
    }
    let pair = |k: &str, v: &str| (k.to_owned(), v.to_owned());
    let total = |hot: &str| {
        by.iter()
            .filter(|((h, _), _)| *h == hot)
            .map(|(_, n)| n)
            .sum::<i64>()
    };
    // A value longer than the receiver keeps (112 bytes) ends in `…`.
    let note = format!("{}…", "x".repeat(112));
    let two = by
        .get(&(
            "hotTwo",
            vec![
                pair("route", "/two"),
                pair("span_id", "00000000000000aa"),
                pair("trace_id", "0123456789abcdef0123456789abcdef"),
            ],
        ))
        .copied()
        .unwrap_or(0);
    let one = by
        .get(&(
            "hotOne",
            vec![pair("note", &note), pair("span_id", "00000000000000bb")],
        ))
        .copied()
        .unwrap_or(0);
    eprintln!("Go labels: {by:?}");
    assert!(
        two as f64 >= 0.95 * total("hotTwo") as f64 && one as f64 >= 0.95 * total("hotOne") as f64,
        "hotTwo {two} of {} and hotOne {one} of {} samples carry their own labels: {by:#?}",
        total("hotTwo"),
        total("hotOne")
    );
}

/// The JVM: after `jcmd PID Compiler.perfmap`, its compiled methods are
/// named from the perf map, at the program's 2:1 split (with the receiver's
/// own walk of Java frames off: where it is on, its names win).
#[test]
fn jvm_compiled_methods_named_after_compiler_perfmap() {
    let _one_at_a_time = require_root();
    let java = std::env::var_os("JAVA").unwrap_or_else(|| "java".into());
    // The JIT says what it compiled, at which tier: the map is asked for
    // once both methods have their final (C2, tier 4) code, so the code
    // that runs from then on is the code the map names.
    let jit = tempfile::tempdir().unwrap();
    let jit_log = jit.path().join("jit.log");
    let mut cmd = Command::new(&java);
    cmd.arg(format!(
        "-Xlog:jit+compilation=debug:file={}",
        jit_log.display()
    ))
    .arg(ebpf_targets::source("Hot.java"))
    .arg("40");
    let (child, pid) = ebpf_targets::spawn_command(cmd);
    let _map = PerfMapFile::of(pid);
    let _child = KillOnDrop(child);
    let compiled = peer_env::poll(Duration::from_secs(60), || {
        let log = std::fs::read_to_string(&jit_log).unwrap_or_default();
        ["Hot::proflow_hot_two", "Hot::proflow_hot_one"]
            .iter()
            .all(|m| log.lines().any(|l| final_compilation_of(l, m)))
            .then_some(())
    });
    assert!(
        compiled.is_some(),
        "the JIT did not compile both methods at tier 4 in 60 s:\n{}",
        std::fs::read_to_string(&jit_log).unwrap_or_default()
    );
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
    let proflow = proflow_for_with(&[pid], "2s", "    jvm: false\n");
    let stacks = stacks_of(&proflow, pid, 4000);
    check_split(
        &stacks,
        "Hot.proflow_hot_two(long)",
        "Hot.proflow_hot_one(long)",
    );
}

/// Java 17 (Debian's) with no flag, agent or perf map: the receiver walks
/// the Java frames from HotSpot's own description of its structs.
#[test]
fn jvm_17_frames_without_a_flag() {
    let java = std::env::var_os("JAVA").unwrap_or_else(|| "java".into());
    java_frames_without_a_flag(Path::new(&java), "Java 17");
}

/// Java 25 (the Temurin build on the test machine) with no flag: HotSpot's
/// structs moved (code blobs, method flags, the line tables' integers), its
/// tables say where.
#[test]
fn jvm_25_frames_without_a_flag() {
    let java = Path::new("/usr/lib/jvm/temurin-25-jdk-amd64/bin/java");
    assert!(
        java.is_file(),
        "{} is not installed (the test machine's Temurin 25)",
        java.display()
    );
    java_frames_without_a_flag(java, "Java 25");
}

/// Node 20 with no flag and no perf map: the receiver names each frame V8
/// runs from the `v8dbg_*` metadata in the binary, and the 2:1 split of
/// `hot.js` is named; at least 95% of hot samples read, root first, Node's
/// `node::Start`, V8's entry into JavaScript (`Builtins_JSEntry`), the
/// module loader (`Module._compile`), `run` and the hot function, each
/// function of `hot.js` with its file and at lines of its body.
#[test]
fn node_frames_without_a_flag() {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("hot.js");
    let mut cmd = Command::new(std::env::var_os("NODE").unwrap_or_else(|| "node".into()));
    cmd.arg(&source).arg("30");
    let (child, pid) = ebpf_targets::spawn_command(cmd);
    let _child = KillOnDrop(child);
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    let (two, one) = ("proflow_hot_two", "proflow_hot_one");
    check_runtime_stacks(
        &stacks,
        [two, one],
        &["node::Start", "Builtins_JSEntry", "Module._compile", "run"],
        "Node",
    );
    let files = files_of(&proflow, pid, &["run", two, one]);
    assert_eq!(
        files,
        [source.to_string_lossy().into_owned()].into(),
        "the files of run and the hot functions"
    );
    // Lines: the hot functions (optimized, sampled in their loops) within
    // their bodies, `run` within its own and at both calls.
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    let lines = lines_of(
        &proflow,
        pid,
        |f| [two, one, "run"].contains(&f),
        &source.to_string_lossy(),
        "Node",
    );
    check_node_lines(
        &lines,
        [
            (
                two,
                at("function proflow_hot_two"),
                at("i < 2 * k * N; i++) s += i;"),
            ),
            (
                one,
                at("function proflow_hot_one"),
                at("i < k * N; i++) s += i;"),
            ),
        ],
        4,
    );
    let within = at("function run(")..=at("return rounds;");
    let calls = [at("    proflow_hot_two(k);"), at("    proflow_hot_one(k);")];
    assert!(
        lines["run"].iter().all(|l| within.contains(l))
            && calls.iter().all(|c| lines["run"].contains(c)),
        "run's lines {:?}: its calls {calls:?}, its body {within:?}",
        lines["run"]
    );
}

/// Functions V8's optimizing compiler inlined are frames of their own:
/// `inline.js`'s two hot functions, inlined into `step` (as
/// `--trace-turbo-inlining` prints; the flag only traces, it changes
/// nothing), are named from the optimized code's inlining positions, each
/// at a line of its body, and `step` at its calls.
#[test]
fn node_inlined_functions_named_from_the_optimized_code() {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("inline.js");
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    let mut cmd = Command::new(std::env::var_os("NODE").unwrap_or_else(|| "node".into()));
    cmd.arg("--trace-turbo-inlining").arg(&source).arg("40");
    let (child, pid, out) = ebpf_targets::spawn_with_output(cmd);
    let _child = KillOnDrop(child);
    let (two, one) = ("proflow_inlined_two", "proflow_inlined_one");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let mut inlined = std::collections::BTreeSet::new();
    while inlined.len() < 2 {
        let line = out
            .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
            .unwrap_or_else(|_| panic!("V8 did not inline both into step in 60 s: {inlined:?}"));
        for f in [two, one] {
            if line.starts_with("Inlining")
                && line.contains(&format!("<SharedFunctionInfo {f}>"))
                && line.contains("<SharedFunctionInfo step>")
            {
                inlined.insert(f);
            }
        }
    }
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    check_runtime_stacks(&stacks, [two, one], &["run", "step"], "Node");
    let lines = lines_of(
        &proflow,
        pid,
        |f| [two, one, "step"].contains(&f),
        &source.to_string_lossy(),
        "Node",
    );
    check_node_lines(
        &lines,
        [
            (
                two,
                at("function proflow_inlined_two("),
                at("i < 200; i++)"),
            ),
            (
                one,
                at("function proflow_inlined_one("),
                at("i < 100; i++)"),
            ),
        ],
        3,
    );
    let calls = [
        at("s = proflow_inlined_two(s);"),
        at("s = proflow_inlined_one(s);"),
    ];
    check_calls(&lines, "step", calls, "Node");
}

/// Checks that `caller`'s lines hold both its calls of the hot functions.
fn check_calls(
    lines: &std::collections::BTreeMap<String, std::collections::BTreeSet<i64>>,
    caller: &str,
    calls: [i64; 2],
    name: &str,
) {
    assert!(
        calls.iter().all(|c| lines[caller].contains(c)),
        "{name}: {caller}'s lines {:?} hold its calls {calls:?}",
        lines[caller]
    );
}

/// Checks that each of Node's two hot functions (name, first line, loop
/// line) is at lines of its body (its first line and the `body` after) and
/// at its loop's line: where it ran, not only the first-line fallback.
fn check_node_lines(
    lines: &std::collections::BTreeMap<String, std::collections::BTreeSet<i64>>,
    hot: [(&str, i64, i64); 2],
    body: i64,
) {
    check_bodies(lines, hot.map(|(f, def, _)| (f, def)), body, "Node");
    for (f, _, l) in hot {
        assert!(
            lines[f].contains(&l),
            "{f}'s lines {:?} hold its loop, {l}",
            lines[f]
        );
    }
}

/// The files of the functions named `names` in `pid`'s profiles.
fn files_of(proflow: &Proflow, pid: u32, names: &[&str]) -> std::collections::BTreeSet<String> {
    let mut files = std::collections::BTreeSet::new();
    for e in common::read_index(&proflow.profiles) {
        if e.label("pid") != Some(pid.to_string().as_str()) || !e.path.is_file() {
            continue;
        }
        let p = common::read_profile(&e.path);
        for f in &p.function {
            if names.contains(&p.string(f.name)) {
                files.insert(p.string(f.filename).to_owned());
            }
        }
    }
    files
}

/// Methods the JIT inlined into the loop that calls them, in Java 17 and
/// 25: their samples land in the caller's compiled code, and are named from
/// the compiled method's scopes (`Inline.main → Inline.run →
/// Inline.proflow_inlined_two`), each at a line of its body and `run` at
/// its calls. The JIT records a scope at calls and safepoints only, unless
/// the JVM runs with `-XX:+DebugNonSafepoints` (as JFR and async-profiler
/// use it): without it, a sample in an inlined loop is the enclosing
/// method's at its next safepoint. This test gives the flag, to check the
/// scopes are read right; the JIT's log shows both methods were inlined.
#[test]
fn jvm_inlined_methods_named_from_the_compiled_scopes() {
    let _one_at_a_time = require_root();
    let java17 = std::env::var_os("JAVA").unwrap_or_else(|| "java".into());
    let java25 = std::ffi::OsString::from("/usr/lib/jvm/temurin-25-jdk-amd64/bin/java");
    let source = ebpf_targets::source("Inline.java");
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    for (java, name) in [(java17, "Java 17"), (java25, "Java 25")] {
        let jit = tempfile::tempdir().unwrap();
        let jit_log = jit.path().join("jit.log");
        let mut cmd = Command::new(&java);
        cmd.args(["-XX:+UnlockDiagnosticVMOptions", "-XX:+DebugNonSafepoints"])
            .arg(format!(
                "-Xlog:jit+inlining=debug:file={}",
                jit_log.display()
            ))
            .arg(&source)
            .arg("40");
        let (child, pid) = ebpf_targets::spawn_command(cmd);
        let _child = KillOnDrop(child);
        let (two, one) = ("Inline.proflow_inlined_two", "Inline.proflow_inlined_one");
        let inlined = peer_env::poll(Duration::from_secs(60), || {
            let log = std::fs::read_to_string(&jit_log).unwrap_or_default();
            ["Inline::proflow_inlined_two", "Inline::proflow_inlined_one"]
                .iter()
                .all(|m| {
                    log.lines()
                        .any(|l| l.contains(m) && l.contains("inline (hot)"))
                })
                .then_some(())
        });
        assert!(
            inlined.is_some(),
            "{name}: the JIT did not inline both in 60 s"
        );
        let proflow = proflow_for(&[pid], "2s");
        let stacks = stacks_of(&proflow, pid, 4000);
        check_runtime_stacks(&stacks, [two, one], &["Inline.main", "Inline.run"], name);
        let lines = lines_of(
            &proflow,
            pid,
            |f| f.starts_with("Inline."),
            "Inline.java",
            name,
        );
        check_bodies(
            &lines,
            [
                (two, at("static long proflow_inlined_two(")),
                (one, at("static long proflow_inlined_one(")),
            ],
            2,
            name,
        );
        let calls = [
            at("s = proflow_inlined_two(s);"),
            at("s = proflow_inlined_one(s);"),
        ];
        check_calls(&lines, "Inline.run", calls, name);
    }
}

/// Checks the 2:1 split between `two` and `one` (frames named exactly so)
/// and that at least 95% of their samples' stacks hold `chain`, root first,
/// its last the hot function's caller; returns the hot samples.
fn check_runtime_stacks(
    stacks: &[(Vec<String>, i64)],
    [two, one]: [&str; 2],
    chain: &[&str],
    name: &str,
) -> i64 {
    let dump = check_split(stacks, two, one);
    let caller = chain.last().copied().unwrap_or_default();
    let (mut hot, mut whole) = (0, 0);
    for (frames, n) in stacks {
        let Some(leaf) = frames.iter().position(|f| f == two || f == one) else {
            continue;
        };
        hot += n;
        if holds_chain(&frames[..leaf], chain) && frames[leaf - 1] == caller {
            whole += n;
        }
    }
    assert!(
        whole as f64 >= 0.95 * hot as f64,
        "{name}: only {whole} of {hot} hot samples read {chain:?} → hot function: {dump:#?}"
    );
    hot
}

/// Checks that each of `hot` (a method and the line it starts at) was at
/// lines, all within its body (its first line and the `body` after it).
fn check_bodies(
    lines: &std::collections::BTreeMap<String, std::collections::BTreeSet<i64>>,
    hot: [(&str, i64); 2],
    body: i64,
    name: &str,
) {
    for (method, def) in hot {
        let within = def..=def + body;
        let got = &lines[method];
        assert!(
            !got.is_empty() && got.iter().all(|l| within.contains(l)),
            "{name}: {method}'s lines {got:?}, its body {within:?}"
        );
    }
}

/// The lines each function of `pid`'s profiles that `keep` takes was at,
/// checking each is in `file`.
fn lines_of(
    proflow: &Proflow,
    pid: u32,
    keep: impl Fn(&str) -> bool,
    file: &str,
    name: &str,
) -> std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> {
    let mut lines: std::collections::BTreeMap<String, std::collections::BTreeSet<i64>> =
        Default::default();
    for e in common::read_index(&proflow.profiles) {
        if e.label("pid") != Some(pid.to_string().as_str()) || !e.path.is_file() {
            continue;
        }
        let p = common::read_profile(&e.path);
        for line in p.location.iter().flat_map(|l| &l.line) {
            let Some(f) = p.function.iter().find(|f| f.id == line.function_id) else {
                continue;
            };
            let fname = p.string(f.name);
            if keep(fname) {
                assert_eq!(p.string(f.filename), file, "{name}: the file of {fname}");
                lines.entry(fname.to_owned()).or_default().insert(line.line);
            }
        }
    }
    eprintln!("{name}: lines {lines:?}");
    lines
}

/// Runs `Hot.java` with `java` (the source launcher; no other argument),
/// and checks: the 2:1 split of its two hot methods named
/// `Hot.proflow_hot_two` and `Hot.proflow_hot_one`; that at least 95% of
/// their samples' stacks read, root first, the launcher's `JavaMain`, the
/// JVM's call into Java (`JavaCalls::call_helper`), `Hot.main`, `Hot.run`
/// and the hot method (interpreted and compiled frames alike, through the
/// launcher's reflection); that each is in `Hot.java`; that `Hot.run` is at
/// its two calls' lines (and only lines of its own) and `Hot.main` at its
/// call of `run`.
fn java_frames_without_a_flag(java: &Path, name: &str) {
    let _one_at_a_time = require_root();
    let source = ebpf_targets::source("Hot.java");
    let text = std::fs::read_to_string(&source).unwrap();
    let at = |needle: &str| line_of(&text, needle);
    let mut cmd = Command::new(java);
    cmd.arg(&source).arg("40");
    let (child, pid) = ebpf_targets::spawn_command(cmd);
    let _child = KillOnDrop(child);
    let proflow = proflow_for(&[pid], "2s");
    let stacks = stacks_of(&proflow, pid, 4000);
    let (two, one) = ("Hot.proflow_hot_two", "Hot.proflow_hot_one");
    let hot = check_runtime_stacks(
        &stacks,
        [two, one],
        &["JavaMain", "JavaCalls::call_helper", "Hot.main", "Hot.run"],
        name,
    );
    eprintln!("{name}: {hot} hot samples");
    let lines = lines_of(&proflow, pid, |f| f.starts_with("Hot."), "Hot.java", name);
    // `Hot.run` at its two calls, and at lines of its own where what it
    // calls between them (`nanoTime`, `nextLong`) ran.
    let calls = [at("proflow_hot_two(k);"), at("proflow_hot_one(k);")];
    let body = at("static long run(")..=at("return rounds;");
    let run = &lines["Hot.run"];
    assert!(
        calls.iter().all(|c| run.contains(c)) && run.iter().all(|l| body.contains(l)),
        "{name}: Hot.run's lines {run:?}: its calls {calls:?}, all within {body:?}"
    );
    assert_eq!(
        lines["Hot.main"],
        [at("run(args.length")].into(),
        "{name}: Hot.main at its call of run"
    );
    // A hot method, interpreted or compiled (its scope at the pc), at lines
    // of its body.
    check_bodies(
        &lines,
        [
            (two, at("static void proflow_hot_two(")),
            (one, at("static void proflow_hot_one(")),
        ],
        4,
        name,
    );
}

/// Whether `line` of the JVM's `jit+compilation` log is `method`'s
/// compilation at tier 4 (C2) as a whole method, not on-stack replacement
/// (`%`) nor an old version being retired ("made not entrant"):
/// `[1.474s][debug][jit,compilation] 1373       4       Hot::proflow_hot_two (47 bytes)`.
fn final_compilation_of(line: &str, method: &str) -> bool {
    let Some((_, rest)) = line.split_once("[jit,compilation]") else {
        return false;
    };
    let words: Vec<&str> = rest.split_whitespace().collect();
    !rest.contains("made not entrant")
        && matches!(words.as_slice(), [_, "4", m, ..] if *m == method)
}

/// A process in its own mount and PID namespaces with a /tmp of its own,
/// as in a container: its perf map is `/tmp/perf-1.map` there, found
/// through `/proc/PID/root` and its pid in its namespace (Node's own
/// naming off, so that the map names its functions).
#[test]
fn a_containers_perf_map_is_read_inside_its_root() {
    let _one_at_a_time = require_root();
    let node = std::env::var_os("NODE").unwrap_or_else(|| "node".into());
    // The program is read before /tmp is covered (the checkout may be under
    // it) and run from the namespace's own /tmp.
    let script = format!(
        "js=$(cat '{}') && mount -t tmpfs tmpfs /tmp && cd /tmp && printf '%s\\n' \"$js\" > hot.js && exec {} --perf-basic-prof hot.js 30",
        ebpf_targets::source("hot.js").display(),
        Path::new(&node).display(),
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
    let proflow = proflow_for_with(&[pid], "2s", "    node: false\n");
    let stacks = stacks_of(&proflow, pid, 2000);
    check_split(&stacks, "proflow_hot_two /", "proflow_hot_one /");
}

/// Off-CPU: a program that sleeps 20 ms in one function and 10 ms in
/// another shows both in its `off_cpu` profile with the time it measured
/// around its sleeps (within 20%), with the kernel's sleep and the whole
/// user stack (unwound from .eh_frame) of where it waited; the real
/// Pyroscope shows the same times under `off_cpu`.
#[test]
fn off_cpu_time_is_where_a_thread_waited_and_how_long() {
    let _one_at_a_time = require_root();
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let app = common::unique_name("ebpf-off-cpu");
    let bin = ebpf_targets::build(Target::Sleep).unwrap_or_else(|e| panic!("{e}"));
    let mut cmd = Command::new(&bin);
    cmd.arg("3");
    let (child, pid, lines) = ebpf_targets::spawn_with_output(cmd);
    let mut child = KillOnDrop(child);
    let keep = pid.to_string();
    // A rate far above the target's 67 waits a second, and a ring of 16MiB:
    // beside a parallel build, new processes' waits counted against the
    // default rate (100 a second per CPU) until relabelling dropped each,
    // and took a quarter of the target's waits with them; a reader that
    // lags must not lose records to a full ring either.
    let mut proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  ebpf:\n    collect_interval: 2s\n    off_cpu: {{threshold: 1ms, max_rate: 5000}}\n    ring_buffer_size: 16MiB\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{keep}', action: keep}}\n      - {{target_label: service_name, replacement: '{app}'}}\nexporters:\n  file:\n    directory: {}\n  pyroscope:\n    endpoint: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file, pyroscope]\n",
            profiles.display(),
            pyroscope.http_base(),
            ports.telemetry
        )
    });
    let measured = signal_and_read_slept(&proflow, &keep, &lines, false);
    let _ = child.0.wait();
    // The receiver's own counts (stacks by how they were unwound, samples
    // dropped or lost), up to the last interval it ended: the report's
    // clue when a wait's stack is missing.
    let ebpf_metrics: Vec<String> = proflow
        .metrics()
        .lines()
        .filter(|l| !l.starts_with('#') && (l.contains("ebpf") || l.contains("dropped")))
        .map(str::to_owned)
        .collect();
    proflow.terminate(Duration::from_secs(20));
    let (mut two, mut one, mut waits) = (0.0, 0.0, 0);
    let mut stacks = Vec::new();
    let mut unnamed = Vec::new();
    let mut written = common::Totals::new();
    for e in common::read_index(&proflow.profiles) {
        if e.label("pid") != Some(keep.as_str()) || e.label("__name__") != Some("off_cpu") {
            continue;
        }
        let p = common::read_profile(&e.path);
        unnamed.extend(unnamed_locations(&p));
        common::add_function_totals(&mut written, &p, &SLEEPERS, Some("off_cpu"));
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
        "measured by the target: {measured:?} ns; off_cpu: {two} and {one} ns in {waits} waits; stacks: {stacks:#?}\nunnamed locations: {unnamed:#?}\nthe receiver's counts: {ebpf_metrics:#?}"
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
    assert!(
        SLEEPERS
            .iter()
            .all(|f| written.get(*f).is_some_and(|&ns| ns > 0)),
        "{written:?}"
    );
    // The same waits in the real Pyroscope, under the profile type the
    // `off_cpu` name and sample type make.
    pyroscope_has(
        &pyroscope,
        &app,
        (&SLEEPERS, "off_cpu:off_cpu:nanoseconds:off_cpu:nanoseconds"),
        &written,
        &proflow,
    );
}

/// Off-CPU with Python frames: `sleep.py` under CPython 3.9 and 3.13 (one of
/// each frame layout) sleeps 20 ms in one Python function and 10 ms in
/// another; its `off_cpu` profile has each function with the time it
/// measured around its sleeps (within 20%), `<module>` → `main` → the
/// function above the kernel's `schedule`.
#[test]
fn off_cpu_waits_of_python_functions() {
    let _one_at_a_time = require_root();
    for minor in ["3.9", "3.13"] {
        let Some(python) = pyenv_python(minor) else {
            continue;
        };
        let mut cmd = Command::new(&python);
        cmd.arg(ebpf_targets::source("sleep.py")).arg("3");
        let (child, pid, lines) = ebpf_targets::spawn_with_output(cmd);
        let mut child = KillOnDrop(child);
        let keep = pid.to_string();
        // At the default sample rate: at 997 Hz the ring buffer would also
        // carry CPU samples of every process. The wait rate and ring as in
        // the C test above (a parallel build took a quarter of the waits
        // at the default rate).
        let mut proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
            format!(
                "receivers:\n  ebpf:\n    collect_interval: 2s\n    off_cpu: {{threshold: 1ms, max_rate: 5000}}\n    ring_buffer_size: 16MiB\n    relabel_configs:\n      - {{source_labels: [__meta_process_pid], regex: '{keep}', action: keep}}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [ebpf]\n      exporters: [file]\n",
                profiles.display(),
                ports.telemetry
            )
        });
        let measured = signal_and_read_slept(&proflow, &keep, &lines, true);
        let _ = child.0.wait();
        proflow.terminate(Duration::from_secs(20));
        let (mut two, mut one) = (0.0, 0.0);
        let mut stacks = Vec::new();
        for e in common::read_index(&proflow.profiles) {
            if e.label("pid") != Some(keep.as_str()) || e.label("__name__") != Some("off_cpu") {
                continue;
            }
            let p = common::read_profile(&e.path);
            for (frames, s) in pprof::stacks_root_first(&p) {
                let names: Vec<String> = frames.iter().map(|f| f.to_string()).collect();
                if names.iter().any(|f| f == "proflow_sleep_two") {
                    two += s.value[0] as f64;
                } else if names.iter().any(|f| f == "proflow_sleep_one") {
                    one += s.value[0] as f64;
                }
                stacks.push((names, s.value[0]));
            }
        }
        let report = format!(
            "CPython {minor}: measured by the target: {measured:?} ns; off_cpu: {two} and {one} ns; stacks: {stacks:#?}"
        );
        eprintln!(
            "CPython {minor} off_cpu: the target measured {measured:?} ns, its profile has {two} and {one} ns"
        );
        for (got, want) in [(two, measured[0]), (one, measured[1])] {
            assert!(
                (got - want).abs() <= 0.2 * want,
                "off-CPU time within 20% of what the target slept: {report}"
            );
        }
        for (names, _) in stacks
            .iter()
            .filter(|(f, _)| f.iter().any(|x| x.starts_with("proflow_sleep_")))
        {
            let mut at = 0;
            for want in ["<module>", "main", "proflow_sleep_", "schedule"] {
                match names[at..].iter().position(|f| f.starts_with(want)) {
                    Some(i) => at += i + 1,
                    None => {
                        panic!("a wait's stack misses {want} after frame {at}: {names:?}\n{report}")
                    }
                }
            }
        }
    }
}

/// Lets a sleeping target (`sleep.c`, `sleep.py`) begin once `proflow` samples
/// (its programs are attached before it reports ready, and it logs so), and
/// returns what the target says it slept in each function (nanoseconds).
/// `sleep.py` first waits in `proflow_warm_up` until a second signal, sent
/// once `proflow` has written a wait of it with that Python frame: from then
/// on the receiver walks its frames (a Python process is known from its
/// first sample on, which a loaded machine reads late), so the measured
/// waits all have theirs.
fn signal_and_read_slept(
    proflow: &Proflow,
    pid: &str,
    lines: &std::sync::mpsc::Receiver<String>,
    python: bool,
) -> Vec<f64> {
    assert!(
        proflow.log_text().contains("sampling every CPU"),
        "the ebpf receiver is not sampling\nlog:\n{}",
        proflow.log_text()
    );
    let signal = || {
        let signalled = Command::new("kill")
            .args(["-USR1", pid])
            .status()
            .expect("run kill");
        assert!(signalled.success());
    };
    signal();
    if python {
        let walked = peer_env::poll(Duration::from_secs(60), || {
            common::read_index(&proflow.profiles)
                .iter()
                .filter(|e| e.label("pid") == Some(pid) && e.path.is_file())
                .any(|e| {
                    common::function_names(&common::read_profile(&e.path))
                        .iter()
                        .any(|f| f == "proflow_warm_up")
                })
                .then_some(())
        });
        assert!(
            walked.is_some(),
            "no wait in proflow_warm_up with its Python frame in 60 s\nlog:\n{}",
            proflow.log_text()
        );
        signal();
    }
    let slept = lines
        .recv_timeout(Duration::from_secs(30))
        .expect("the target prints what it slept");
    slept
        .strip_prefix("slept ")
        .unwrap_or_else(|| panic!("{slept:?}"))
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect()
}

/// Where each location of `p` without a function points: its address and
/// its mapping's file and build id (a report's clue to why it is unnamed).
fn unnamed_locations(p: &pprof::Profile) -> Vec<String> {
    p.location
        .iter()
        .filter(|l| l.line.is_empty())
        .map(|l| match p.mapping.iter().find(|m| m.id == l.mapping_id) {
            Some(m) => format!(
                "{:#x} in {} [{:#x}, {:#x}) at offset {:#x}, build id {:?}",
                l.address,
                p.string(m.filename),
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                p.string(m.build_id)
            ),
            None => format!("{:#x} in no mapping", l.address),
        })
        .collect()
}

/// The functions `sleep.c` waits in.
const SLEEPERS: [&str; 2] = ["proflow_sleep_two", "proflow_sleep_one"];
