//! Service discovery: where a job's targets come from.
//!
//! A [`Discoverer`] sends its complete current set of [`TargetGroup`]s as an
//! [`Update`] each time it changes (and once at start); the job's target
//! manager replaces that provider's previous set with it, relabels, and
//! starts or stops scrape loops for what appeared or went away, leaving
//! unchanged targets running. The groups are Prometheus's: `targets`
//! (`host:port`, becoming `__address__`) and `labels` (SD labels, including
//! `__meta_*` ones for relabelling).
//!
//! Providers here, each one per config item: [`StaticDiscoverer`]
//! (`static_configs`), [`file::FileDiscoverer`] (`file_sd_configs`,
//! `__meta_filepath`) and [`http::HttpDiscoverer`] (`http_sd_configs`,
//! `__meta_url`) and [`kubernetes::KubernetesDiscoverer`]
//! (`kubernetes_sd_configs`, `__meta_kubernetes_*`); [`discoverers`] builds a
//! job's list. Also here: what the
//! file and HTTP providers share, [`parse_groups`] (Prometheus's JSON and
//! YAML group lists, bounded and validated) and the log-once memory that
//! keeps a lasting problem from flooding the log.
//!
//! A new kind is one more type implementing [`Discoverer`], added to
//! [`discoverers`]; nothing else changes.
//!
//! Logs name the file or URL, not the job: the caller runs each discoverer
//! inside a span that names it.

pub mod file;
pub mod http;
pub mod kubernetes;

use std::cell::Cell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

use async_trait::async_trait;
use proflow_model::model::is_valid_label_name;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::config::{ScrapeJobConfig, StaticConfig, target_problem};
use file::FileDiscoverer;
use http::HttpDiscoverer;

/// Targets that share labels, as Prometheus's SD formats carry them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TargetGroup {
    /// `host:port` of each target (its `__address__`).
    pub targets: Vec<String>,
    /// Labels every target of the group gets (SD labels and `__meta_*`).
    pub labels: BTreeMap<String, String>,
}

/// A provider's complete current set of groups; replaces its previous one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Update {
    /// Which provider of the job (its index in the job's list of
    /// discoverers).
    pub provider: usize,
    pub groups: Vec<TargetGroup>,
}

/// One source of targets.
#[async_trait]
pub trait Discoverer: Send {
    /// A short description for logs and `/targets` (`static`, `file_sd
    /// targets/*.json`, `http_sd http://…`).
    fn describe(&self) -> String;

    /// The in-flight memory budget the answers of remote sources are
    /// granted from (given before [`Discoverer::run`]); local sources
    /// (static targets, files the operator wrote) ignore it.
    fn grant_from(&mut self, _memory: &proflow_model::memory::MemoryBudget) {}

    /// Sends an [`Update`] with `provider` as soon as the first set is known
    /// and again whenever it changes, until `shutdown` (or until `updates`
    /// is closed). A provider that fails (a file that does not parse, an
    /// endpoint that does not answer) logs why and keeps its last good set.
    async fn run(
        self: Box<Self>,
        provider: usize,
        updates: mpsc::Sender<Update>,
        shutdown: CancellationToken,
    );
}

/// `static_configs`: one update at start, never another.
pub struct StaticDiscoverer {
    groups: Vec<TargetGroup>,
}

impl StaticDiscoverer {
    pub fn new(configs: &[StaticConfig]) -> Self {
        StaticDiscoverer {
            groups: configs
                .iter()
                .map(|c| TargetGroup {
                    targets: c.targets.clone(),
                    labels: c.labels.clone(),
                })
                .collect(),
        }
    }
}

#[async_trait]
impl Discoverer for StaticDiscoverer {
    fn describe(&self) -> String {
        "static_configs".to_owned()
    }

    async fn run(
        self: Box<Self>,
        provider: usize,
        updates: mpsc::Sender<Update>,
        shutdown: CancellationToken,
    ) {
        send_if_changed(&mut None, self.groups, provider, &updates, &shutdown).await;
    }
}

/// A job's discoverers, in the order their `provider` numbers follow:
/// static targets (when there are any), then one per `file_sd_configs`
/// item, then one per `http_sd_configs` item, then one per
/// `kubernetes_sd_configs` item. An error names the config
/// item (`http_sd_configs.0: …`).
pub fn discoverers(job: &ScrapeJobConfig) -> Result<Vec<Box<dyn Discoverer>>, String> {
    let mut out: Vec<Box<dyn Discoverer>> = Vec::new();
    if !job.static_configs.is_empty() {
        out.push(Box::new(StaticDiscoverer::new(&job.static_configs)));
    }
    for config in &job.file_sd_configs {
        out.push(Box::new(FileDiscoverer::new(config)));
    }
    for (i, config) in job.http_sd_configs.iter().enumerate() {
        let discoverer =
            HttpDiscoverer::new(config).map_err(|e| format!("http_sd_configs.{i}: {e}"))?;
        out.push(Box::new(discoverer));
    }
    for (i, config) in job.kubernetes_sd_configs.iter().enumerate() {
        let discoverer = kubernetes::KubernetesDiscoverer::new(config)
            .map_err(|e| format!("kubernetes_sd_configs.{i}: {e}"))?;
        out.push(Box::new(discoverer));
    }
    Ok(out)
}

/// Waits for the next `tick`. False when the job is stopping instead: on
/// `shutdown`, or when nobody receives updates any more.
pub(crate) async fn next_tick(
    tick: &mut tokio::time::Interval,
    updates: &mpsc::Sender<Update>,
    shutdown: &CancellationToken,
) -> bool {
    tokio::select! {
        biased;
        () = shutdown.cancelled() => false,
        () = updates.closed() => false,
        _ = tick.tick() => true,
    }
}

/// Sends `groups` as the provider's update unless they equal the last set
/// sent (`last_sent`, updated here). False when the job is stopping: on
/// `shutdown`, or when nobody receives updates any more.
pub(crate) async fn send_if_changed(
    last_sent: &mut Option<Vec<TargetGroup>>,
    groups: Vec<TargetGroup>,
    provider: usize,
    updates: &mpsc::Sender<Update>,
    shutdown: &CancellationToken,
) -> bool {
    if last_sent.as_ref() == Some(&groups) {
        return true;
    }
    let update = Update {
        provider,
        groups: groups.clone(),
    };
    // A full channel must not hold up shutdown.
    tokio::select! {
        biased;
        () = shutdown.cancelled() => false,
        sent = updates.send(update) => match sent {
            Ok(()) => {
                *last_sent = Some(groups);
                true
            }
            Err(_) => false,
        }
    }
}

/// Most bytes of one SD file or HTTP SD answer. Prometheus sets no limit;
/// this holds [`MAX_TARGETS`] in groups that share labels (or tens of
/// thousands with labels each), and keeps a runaway file or endpoint from
/// taking the collector's memory.
pub const MAX_SD_BYTES: usize = 16 * 1024 * 1024;
/// Most targets of one SD file or answer.
pub const MAX_TARGETS: usize = 100_000;
/// Most groups of one SD file or answer: a group is there for its targets,
/// so more groups than targets allowed is a broken source.
pub const MAX_GROUPS: usize = MAX_TARGETS;
/// Most labels over all groups of one SD file or answer: ten for each of
/// the most targets, with one group per target (as HTTP SD endpoints often
/// answer).
pub const MAX_LABELS: usize = 10 * MAX_TARGETS;

/// The syntax of a list of target groups.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Json,
    Yaml,
}

impl Format {
    /// By extension, as Prometheus decides: `.json`, or `.yaml`/`.yml`.
    pub fn of_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "json" => Some(Format::Json),
            "yaml" | "yml" => Some(Format::Yaml),
            _ => None,
        }
    }
}

/// A parsed list of groups: the usable part, and what was left out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParsedGroups {
    /// The groups, with invalid targets taken out and groups with an invalid
    /// label name left out.
    pub groups: Vec<TargetGroup>,
    /// One line for each target or group left out, saying why and what to fix.
    pub skipped: Vec<String>,
}

/// Parses Prometheus's target group list (`[{targets: [host:port, …],
/// labels: {name: value, …}}, …]`), as file SD and HTTP SD serve it.
///
/// A list that does not parse, or holds more than [`MAX_TARGETS`] targets,
/// [`MAX_GROUPS`] groups or [`MAX_LABELS`] labels, is an error: the caller
/// keeps its last good set. A target that is not `host:port` is left out,
/// and so is a group with a label name that is not valid; both are listed
/// in [`ParsedGroups::skipped`] and the rest is used.
///
/// As Prometheus: YAML refuses keys other than `targets` and `labels`
/// (a misspelt key there is a mistake in a hand-written file), JSON ignores
/// them (an endpoint may serve more than the list); an empty YAML file is
/// no groups, an empty JSON file an error.
pub fn parse_groups(bytes: &[u8], format: Format) -> Result<ParsedGroups, String> {
    if bytes.len() > MAX_SD_BYTES {
        return Err(format!(
            "is {} bytes, more than the {} MiB allowed: split the targets over several files or endpoints",
            bytes.len(),
            MAX_SD_BYTES >> 20
        ));
    }
    let allowance = Allowance::default();
    let seed = OrNull(GroupsSeed {
        allowance: &allowance,
        strict: format == Format::Yaml,
    });
    let raw = match format {
        Format::Json => {
            if bytes.iter().all(u8::is_ascii_whitespace) {
                return Err("is empty: write [] for no targets".to_owned());
            }
            let mut de = serde_json::Deserializer::from_slice(bytes);
            seed.deserialize(&mut de)
                .and_then(|groups| de.end().map(|()| groups))
                .map_err(|e| not_groups(&e.to_string()))?
        }
        Format::Yaml => {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| format!("is not UTF-8 text ({e}): save it as UTF-8"))?;
            serde_saphyr::with_deserializer_from_str_with_options(text, yaml_options(), |de| {
                seed.deserialize(de)
            })
            .map_err(|e| {
                // The library's hint names its own option, which a user
                // cannot set: leave just the duplicate key.
                let error = e
                    .without_snippet()
                    .to_string()
                    .replace(", set DuplicateKeyPolicy in Options if acceptable", "");
                not_groups(&error)
            })?
        }
    };
    Ok(validate(raw))
}

fn not_groups(error: &str) -> String {
    format!(
        "is not a list of target groups ({error}): write a list of {{targets: [host:port, …], labels: {{name: value, …}}}}"
    )
}

fn yaml_options() -> serde_saphyr::Options {
    serde_saphyr::options! {
        duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
        // The default node budget (250,000) is below what 100,000 targets
        // with labels take, and the alias ratio refuses a file whose groups
        // share one `labels: *common` more than a hundred times. The
        // allowance bounds what is built instead, the input is at most
        // MAX_SD_BYTES, and alias replay keeps its default bound.
        budget: serde_saphyr::budget! {
            max_nodes: 8 * (MAX_TARGETS + MAX_LABELS),
            max_events: 16 * (MAX_TARGETS + MAX_LABELS),
            enforce_alias_anchor_ratio: false,
        },
    }
}

/// Takes out the targets and groups that cannot be used.
fn validate(raw: Vec<RawGroup>) -> ParsedGroups {
    let mut out = ParsedGroups::default();
    for (i, group) in raw.into_iter().enumerate() {
        let bad_names: Vec<&String> = group
            .labels
            .keys()
            .filter(|name| !is_valid_label_name(name))
            .collect();
        if !bad_names.is_empty() {
            out.skipped.push(format!(
                "group {i}: label name {} not valid (letters, digits and `_`, not starting with a digit): rename it; the group's {} targets are skipped",
                bad_names
                    .iter()
                    .map(|n| format!("{n:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
                    + if bad_names.len() == 1 { " is" } else { " are" },
                group.targets.len()
            ));
            continue;
        }
        let mut targets = Vec::new();
        for target in group.targets {
            match target_problem(&target) {
                Some(problem) => out
                    .skipped
                    .push(format!("group {i}: target {problem}; it is skipped")),
                None => targets.push(target),
            }
        }
        out.groups.push(TargetGroup {
            targets,
            labels: group.labels,
        });
    }
    out
}

/// A group as written, before validation.
struct RawGroup {
    targets: Vec<String>,
    labels: BTreeMap<String, String>,
}

/// What one list may still hold while it is parsed. Counting while parsing
/// (rather than after) stops an oversized list before it is built: YAML
/// aliases can make a short file a long list.
struct Allowance {
    groups: Cell<usize>,
    targets: Cell<usize>,
    labels: Cell<usize>,
}

impl Default for Allowance {
    fn default() -> Self {
        Allowance {
            groups: Cell::new(MAX_GROUPS),
            targets: Cell::new(MAX_TARGETS),
            labels: Cell::new(MAX_LABELS),
        }
    }
}

/// Counts one more item against `left`; an error once there were `max`.
fn take_one<E: de::Error>(left: &Cell<usize>, max: usize, what: &str) -> Result<(), E> {
    match left.get().checked_sub(1) {
        Some(rest) => {
            left.set(rest);
            Ok(())
        }
        None => Err(E::custom(format_args!(
            "more than {max} {what}: split them over several files or endpoints"
        ))),
    }
}

/// `null` (or nothing, in YAML) as the empty value, else what `S` reads:
/// Prometheus accepts `null` for the list, `targets` and `labels`.
struct OrNull<S>(S);

impl<'de, S> DeserializeSeed<'de> for OrNull<S>
where
    S: DeserializeSeed<'de>,
    S::Value: Default,
{
    type Value = S::Value;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_option(self)
    }
}

impl<'de, S> Visitor<'de> for OrNull<S>
where
    S: DeserializeSeed<'de>,
    S::Value: Default,
{
    type Value = S::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a value or null")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(S::Value::default())
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(S::Value::default())
    }

    fn visit_some<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        self.0.deserialize(d)
    }
}

/// The list of groups.
#[derive(Clone, Copy)]
struct GroupsSeed<'a> {
    allowance: &'a Allowance,
    /// Refuse keys other than `targets` and `labels`.
    strict: bool,
}

impl<'de> DeserializeSeed<'de> for GroupsSeed<'_> {
    type Value = Vec<RawGroup>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for GroupsSeed<'_> {
    type Value = Vec<RawGroup>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of target groups")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut groups = Vec::new();
        while let Some(group) = seq.next_element_seed(GroupSeed(self))? {
            take_one(&self.allowance.groups, MAX_GROUPS, "groups")?;
            groups.push(group);
        }
        Ok(groups)
    }
}

/// One group: `targets` and `labels`, each optional.
struct GroupSeed<'a>(GroupsSeed<'a>);

const GROUP_FIELDS: &[&str] = &["targets", "labels"];

impl<'de> DeserializeSeed<'de> for GroupSeed<'_> {
    type Value = RawGroup;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for GroupSeed<'_> {
    type Value = RawGroup;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a target group {targets: [...], labels: {...}}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let allowance = self.0.allowance;
        let mut targets = None;
        let mut labels = None;
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "targets" if targets.is_some() => {
                    return Err(de::Error::duplicate_field("targets"));
                }
                "labels" if labels.is_some() => return Err(de::Error::duplicate_field("labels")),
                "targets" => targets = Some(map.next_value_seed(OrNull(TargetsSeed(allowance)))?),
                "labels" => labels = Some(map.next_value_seed(OrNull(LabelsSeed(allowance)))?),
                other if self.0.strict => {
                    return Err(de::Error::unknown_field(other, GROUP_FIELDS));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(RawGroup {
            targets: targets.unwrap_or_default(),
            labels: labels.unwrap_or_default(),
        })
    }
}

/// A group's `targets`.
struct TargetsSeed<'a>(&'a Allowance);

impl<'de> DeserializeSeed<'de> for TargetsSeed<'_> {
    type Value = Vec<String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for TargetsSeed<'_> {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a list of host:port targets")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut targets = Vec::new();
        while let Some(target) = seq.next_element::<String>()? {
            take_one(&self.0.targets, MAX_TARGETS, "targets")?;
            targets.push(target);
        }
        Ok(targets)
    }
}

/// A group's `labels`.
struct LabelsSeed<'a>(&'a Allowance);

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = BTreeMap<String, String>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of label names to string values")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut labels = BTreeMap::new();
        while let Some((name, value)) = map.next_entry::<String, String>()? {
            take_one(&self.0.labels, MAX_LABELS, "labels")?;
            labels.insert(name, value);
        }
        Ok(labels)
    }
}

/// Most skipped-entry warnings logged for one read; the rest are counted
/// in one line, so a file of 100,000 bad targets does not flood the log.
const MAX_SKIPPED_LOGGED: usize = 10;

/// What one source (a file, an SD URL) has logged, so that a problem that
/// lasts over many refreshes is logged once, and its end once.
#[derive(Debug, Default)]
pub(crate) struct LogOnce {
    /// The error of the last read, while reads fail.
    failing: Option<String>,
    /// The skipped entries of the last good read.
    skipped: BTreeSet<String>,
}

impl LogOnce {
    /// A read failed and `kept` targets of the last good read stay in use:
    /// warns unless this is the error logged last.
    pub(crate) fn failed(&mut self, source: &str, error: &str, kept: usize) {
        if self.failing.as_deref() != Some(error) {
            tracing::warn!(
                source,
                error,
                kept_targets = kept,
                "service discovery failed; the last good targets are kept until it works again"
            );
            self.failing = Some(error.to_owned());
        }
    }

    /// A read succeeded: says so if reads failed before, and warns about
    /// the skipped entries not warned about at the last good read.
    pub(crate) fn succeeded(&mut self, source: &str, skipped: Vec<String>) {
        if let Some(error) = self.failing.take() {
            tracing::info!(
                source,
                previous_error = %error,
                "service discovery works again"
            );
        }
        let new: Vec<&String> = skipped
            .iter()
            .filter(|s| !self.skipped.contains(*s))
            .collect();
        for problem in new.iter().take(MAX_SKIPPED_LOGGED) {
            tracing::warn!(source, problem = %problem, "service discovery skipped an entry");
        }
        if new.len() > MAX_SKIPPED_LOGGED {
            tracing::warn!(
                source,
                more = new.len() - MAX_SKIPPED_LOGGED,
                "service discovery skipped more entries (not logged one by one)"
            );
        }
        self.skipped = skipped.into_iter().collect();
    }
}

#[cfg(test)]
pub(crate) mod tests;
