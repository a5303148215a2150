//! A Python sampler from PyPI that writes the text formats of `/ingest`,
//! run on `tests/peers/apps/pysamplers/work.py`: py-spy 0.4.3 (speedscope,
//! `sampled` in seconds with a weight of 0.01 a sample at 100 Hz, and its
//! `raw` folded lines). Each file goes through proflow to the `file` exporter, and
//! the totals per function of what was written must be the file's own,
//! worked out here from the file, to a nanosecond per sample (the rounding
//! of a value to a nanosecond). py-spy's speedscope also goes to the real
//! Pyroscope directly and through proflow: proflow's read-back must be the
//! file's totals (Pyroscope directly, which truncates each 0.01 s weight to
//! 0, is printed beside it).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use super::common::{self, Proflow};
use super::readback;

/// Per function name: seconds (from a file) or nanoseconds (written).
type Totals = BTreeMap<String, f64>;

/// The functions of work.py compared.
const FUNCTIONS: [&str; 4] = ["main", "py_hot", "py_warm", "unit"];
/// How many rounds of py_hot and py_warm work.py does (about 2 s).
const ROUNDS: &str = "300";

/// The venv's bin directory with python and py-spy.
fn samplers() -> Option<PathBuf> {
    match common::py_samplers() {
        Ok(dir) => Some(dir),
        Err(why) => common::missing_peer(&format!("py-spy is not available: {why}")),
    }
}

fn work_py() -> PathBuf {
    common::peers_dir().join("apps/pysamplers/work.py")
}

/// Runs py-spy on work.py at 100 Hz, writing `format` (`speedscope`,
/// `raw`), and returns what it wrote.
fn py_spy(bin: &Path, format: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join(format!("py-spy.{format}"));
    let output = Command::new(bin.join("py-spy"))
        .args(["record", "--format", format, "--rate", "100", "-o"])
        .arg(&out)
        .arg("--")
        .arg(bin.join("python"))
        .arg(work_py())
        .arg(ROUNDS)
        .output()
        .expect("run py-spy");
    assert!(
        output.status.success(),
        "py-spy record --format {format}: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    std::fs::read(&out).unwrap_or_else(|e| panic!("read {}: {e}", out.display()))
}

/// A frame's function: `py_hot (work.py:18)` (py-spy's folded names) is
/// `py_hot`.
fn function(name: &str) -> &str {
    name.split(" (").next().unwrap_or(name)
}

/// Adds `value` to every function of `frames` once (a recursion counts
/// once, as a flame graph's total does).
fn add(totals: &mut Totals, frames: impl IntoIterator<Item = String>, value: f64) {
    let seen: BTreeSet<String> = frames.into_iter().collect();
    for f in seen {
        if FUNCTIONS.contains(&f.as_str()) {
            *totals.entry(f).or_default() += value;
        }
    }
}

/// A speedscope file's own totals in seconds, and how many values it has
/// (samples or intervals between events).
fn speedscope_totals(file: &[u8]) -> (Totals, usize) {
    let doc: serde_json::Value = serde_json::from_slice(file).expect("speedscope JSON");
    let names: Vec<String> = doc["shared"]["frames"]
        .as_array()
        .expect("frames")
        .iter()
        .map(|f| f["name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let (mut totals, mut values) = (Totals::new(), 0);
    for p in doc["profiles"].as_array().expect("profiles") {
        assert_eq!(p["unit"], "seconds", "both samplers write seconds");
        if p["type"] == "sampled" {
            let weights = p["weights"].as_array().expect("weights");
            for (sample, w) in p["samples"]
                .as_array()
                .expect("samples")
                .iter()
                .zip(weights)
            {
                let frames = sample
                    .as_array()
                    .expect("a sample")
                    .iter()
                    .map(|i| names[i.as_u64().expect("a frame index") as usize].clone());
                add(&mut totals, frames, w.as_f64().expect("a weight"));
                values += 1;
            }
        } else {
            let mut open: Vec<String> = Vec::new();
            let mut last = p["startValue"].as_f64().unwrap_or(0.0);
            for e in p["events"].as_array().expect("events") {
                let at = e["at"].as_f64().expect("at");
                if at > last && !open.is_empty() {
                    add(&mut totals, open.clone(), at - last);
                    values += 1;
                }
                let name = names[e["frame"].as_u64().expect("a frame") as usize].clone();
                match e["type"].as_str() {
                    Some("O") => open.push(name),
                    _ => {
                        open.pop();
                    }
                }
                last = at;
            }
        }
    }
    (totals, values)
}

/// Folded lines' own totals in samples.
fn folded_totals(file: &[u8]) -> (Totals, usize) {
    let (mut totals, mut lines) = (Totals::new(), 0);
    for line in String::from_utf8_lossy(file).lines() {
        let Some((stack, count)) = line.rsplit_once(' ') else {
            continue;
        };
        let count: f64 = count.parse().expect("a count");
        add(
            &mut totals,
            stack.split(';').map(|f| function(f).to_owned()),
            count,
        );
        lines += 1;
    }
    (totals, lines)
}

/// The totals (nanoseconds) of every profile proflow wrote for `app`.
fn written_totals(proflow: &Proflow, app: &str) -> Totals {
    let entries = common::written_entries(proflow, app, Duration::from_secs(30));
    let mut totals = Totals::new();
    for e in &entries {
        let p = common::read_profile(&e.path);
        for (frames, sample) in proflow_model::pprof::stacks_root_first(&p) {
            let value = sample.value.first().copied().unwrap_or(0) as f64;
            add(
                &mut totals,
                frames.iter().map(|f| function(f).to_owned()),
                value,
            );
        }
    }
    totals
}

/// proflow with a `file` exporter.
fn start() -> Proflow {
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file]}}\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

/// Checks that `written` (ns) is `own` (in `unit` seconds each) for every
/// function, within a nanosecond per value.
fn assert_agrees(what: &str, written: &Totals, own: &Totals, unit: f64, values: usize) {
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        own.keys().collect::<Vec<_>>(),
        "{what}: functions written {written:?}, in the file {own:?}"
    );
    for (f, seconds) in own {
        let want = seconds * unit;
        let got = written[f];
        assert!(
            (got - want).abs() <= values as f64 + 1.0,
            "{what}: {f} written {got} ns, the file's own {want} ns ({values} values)"
        );
    }
    assert!(
        own.get("main").is_some_and(|s| *s > 0.0),
        "{what}: the file has time in main: {own:?}"
    );
}

#[test]
fn py_spy_speedscope_arrives_with_its_own_totals_in_pyroscope_too() {
    let Some(bin) = samplers() else { return };
    let file = py_spy(&bin, "speedscope");
    let (own, values) = speedscope_totals(&file);
    let Some(b) = super::both_ways(
        "pyspy",
        ".cpu",
        "&format=speedscope&spyName=pyspy",
        "application/json",
        file,
    ) else {
        return;
    };
    let written = written_totals(&b.proflow, &b.through);
    assert_agrees("py-spy speedscope", &written, &own, 1e9, values);
    // Pyroscope, through proflow: the same totals (each 0.01 s weight is
    // exactly 10,000,000 ns).
    let want: readback::Totals = written
        .iter()
        .map(|(f, v)| (f.clone(), *v as i64))
        .collect();
    let (ok, got, answer, direct_reads) = b.read_back(
        &FUNCTIONS,
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        &want,
    );
    eprintln!(
        "py-spy speedscope, {values} samples: the file's own {own:?} s; through proflow {got:?} ns; Pyroscope directly {direct_reads:?}"
    );
    assert!(
        ok,
        "Pyroscope read {got:?} ({answer}) through proflow, proflow wrote {want:?}"
    );
}

#[test]
fn py_spy_raw_folded_arrives_with_its_own_totals() {
    let Some(bin) = samplers() else { return };
    let file = py_spy(&bin, "raw");
    let (own, lines) = folded_totals(&file);
    let proflow = start();
    let app = common::unique_name("pyspy-raw");
    proflow
        .post(
            &format!("/ingest?name={app}.cpu&format=folded&sampleRate=100"),
            &[],
            file,
        )
        .expect_status(200, "py-spy's raw output");
    let written = written_totals(&proflow, &app);
    // A sample at 100 Hz is 10 ms.
    assert_agrees("py-spy raw", &written, &own, 1e7, lines);
    eprintln!("py-spy raw, {lines} lines: the file's own {own:?} samples; written {written:?} ns");
}
