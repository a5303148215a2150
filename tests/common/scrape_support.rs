//! Helpers of the `scrape` receiver's end-to-end tests (`tests/scrape.rs`,
//! `tests/scrape_tls.rs`): a config with the receiver and a `file`
//! exporter, the built-in profiles by name, waits on what the exporter
//! wrote, and the `/targets` page.

use std::path::Path;
use std::time::Duration;

use crate::common::{self, IndexEntry, Ports, Proflow};
use crate::peer_env;

/// A config with the `scrape` receiver (`jobs`: YAML list items of
/// `scrape_configs`, unindented) and a `file` exporter, plus more exporters
/// (`exporters`: YAML, unindented, and their ids).
pub fn config(
    ports: &Ports,
    profiles: &Path,
    jobs: &str,
    receiver_extra: &str,
    exporters: &str,
    ids: &[&str],
) -> String {
    let indent = |text: &str, n: usize| -> String {
        text.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| format!("{}{l}\n", " ".repeat(n)))
            .collect()
    };
    let mut all = vec!["file"];
    all.extend_from_slice(ids);
    format!(
        "receivers:\n  scrape:\n{}    scrape_configs:\n{}exporters:\n  file:\n    directory: {}\n{}\
         service:\n  telemetry:\n    address: {}\n    log_level: info\n  pipelines:\n    profiles:\n      \
         receivers: [scrape]\n      exporters: [{}]\n",
        indent(receiver_extra, 4),
        indent(jobs, 6),
        profiles.display(),
        indent(exporters, 2),
        ports.telemetry,
        all.join(", ")
    )
}

pub fn start(jobs: &str) -> Proflow {
    Proflow::start(|ports, profiles| config(ports, profiles, jobs, "", "", &[]))
}

/// Only `keep` of the built-in profiles, as a `profiling_config` line.
pub fn only(keep: &[&str]) -> String {
    let off: Vec<String> = ["process_cpu", "memory", "goroutine", "mutex", "block"]
        .iter()
        .filter(|p| !keep.contains(p))
        .map(|p| format!("{p}: {{enabled: false}}"))
        .collect();
    format!("profiling_config: {{pprof_config: {{{}}}}}", off.join(", "))
}

/// Waits until the file exporter's index holds `n` entries that `pick`
/// takes; returns them.
pub fn wait_entries(
    proflow: &Proflow,
    n: usize,
    timeout: Duration,
    pick: impl Fn(&IndexEntry) -> bool,
) -> Vec<IndexEntry> {
    let got = peer_env::poll(timeout, || {
        let entries: Vec<IndexEntry> = common::read_index(&proflow.profiles)
            .into_iter()
            .filter(|e| pick(e))
            .collect();
        (entries.len() >= n).then_some(entries)
    });
    got.unwrap_or_else(|| {
        panic!(
            "fewer than {n} matching profiles within {timeout:?}; index:\n{}\ntargets: {}\nlog:\n{}",
            std::fs::read_to_string(proflow.profiles.join("index.jsonl")).unwrap_or_default(),
            targets(proflow),
            proflow.log_text()
        )
    })
}

/// `data` of `/targets` (Prometheus's targets API envelope), or Null.
pub fn targets(proflow: &Proflow) -> serde_json::Value {
    targets_at(proflow, "/targets")
}

pub fn targets_at(proflow: &Proflow, path: &str) -> serde_json::Value {
    let page: serde_json::Value = proflow
        .http()
        .get(format!("http://{}{path}", proflow.ports.telemetry))
        .send()
        .and_then(|r| r.text())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    if page["status"] != "success" {
        return serde_json::Value::Null;
    }
    page["data"].clone()
}
