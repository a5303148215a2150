//! What the file exporter wrote: its index, its files, and waits until
//! what was accepted is written.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::metrics::metric_sum;
use super::process::Proflow;

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
pub fn read_profile(path: &Path) -> proflow_model::pprof::Profile {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        proflow_model::pprof::is_gzip(&bytes),
        "{} is not gzipped",
        path.display()
    );
    proflow_model::pprof::decode(&bytes.into(), 256 << 20)
        .unwrap_or_else(|e| panic!("{} is not a pprof profile: {e}", path.display()))
}

/// The function names a profile's samples reference.
pub fn function_names(profile: &proflow_model::pprof::Profile) -> Vec<String> {
    let mut names: Vec<String> = proflow_model::pprof::stacks_root_first(profile)
        .flat_map(|(frames, _)| frames.into_iter().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    names.sort();
    names.dedup();
    names
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
