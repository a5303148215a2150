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
//! Providers here: [`StaticDiscoverer`] (`static_configs`). A new kind (such
//! as Kubernetes pods with `__meta_kubernetes_*` labels) is one more type
//! implementing [`Discoverer`]; nothing else changes.

use std::collections::BTreeMap;

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::config::StaticConfig;

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
        _shutdown: CancellationToken,
    ) {
        let _ = updates
            .send(Update {
                provider,
                groups: self.groups,
            })
            .await;
    }
}
