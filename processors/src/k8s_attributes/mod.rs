//! The `k8s_attributes` processor: adds each profile's pod, namespace,
//! node, container and owners (`k8s_pod_name`, `k8s_deployment_name`, …, the
//! label forms of the OpenTelemetry names, written back as `k8s.pod.name` by
//! OTLP exporters) and chosen Kubernetes labels and annotations, as the
//! Collector's `k8sattributes` adds them to resources.
//!
//! A profile finds its pod by the first `pod_association` rule whose
//! sources it has: a container id (the `ebpf` receiver's `container_id`
//! label, from the process's cgroup), a pod uid or IP label, namespace and
//! pod name labels, or the IP address of the connection it was pushed on.
//!
//! Identity is taken only from what a sender cannot choose. Labels are
//! trusted when proflow set them (the `ebpf` receiver on this host, scrape
//! discovery, a Kafka topic of one's own) or the profile was pushed from an
//! address of `trusted_senders`; there the label rules apply and labels the
//! profile has already are left as they are. A profile pushed from any
//! other address finds its pod by the connection only, and the identity
//! labels it carried (those this processor sets) are removed, then set
//! from that pod.
//!
//! The pods (and, as the config needs them, namespaces, nodes and
//! ReplicaSets) come from watches of the API server ([`proflow_kube`]),
//! narrowed by `filter` (a DaemonSet watches its own node's pods only).
//! The watches and an [`index::Index`] of them are kept by tasks that end
//! when the processor is dropped (a reload or the stop). Profiles never
//! wait for the API, but for the first lists with `wait_for_metadata`, and
//! then only until `wait_for_metadata_timeout` after the start.

pub mod config;
pub mod index;
pub mod telemetry;

use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_trait::async_trait;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate, no_problems,
};
use proflow_kube::objects::{Namespace, Node, Pod, ReplicaSet};
use proflow_kube::{Client, Connect, Scope, Store, WatchLimits};
use proflow_model::model::{BatchMeta, Envelope};
use proflow_model::otlp::label_name;
use tokio_util::sync::{CancellationToken, DropGuard};

pub use config::K8sAttributesProcessorConfig;
use config::{AuthType, ExtractFrom, FieldExtract, IpNet, METADATA, SourceFrom};
use index::{Caches, Extractor, Index, PodInfo};
use telemetry::K8sAttributesTelemetry;

/// How long a burst of watch events is gathered before the index is built
/// again.
const SETTLE: Duration = Duration::from_millis(100);

impl Validate for K8sAttributesProcessorConfig {
    fn validate(&self) -> Vec<FieldError> {
        self.problems()
    }
}

impl ProcessorConfig for K8sAttributesProcessorConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        no_problems(self.problems())?;
        let telemetry = K8sAttributesTelemetry::new(&ctx.telemetry, &ctx.id);
        let rules = Rules::new(self);
        let trusted = self
            .trusted_senders
            .iter()
            .map(|t| t.parse::<IpNet>().map_err(BuildError::new))
            .collect::<Result<Vec<_>, _>>()?;
        if self.passthrough {
            return Ok(Arc::new(K8sAttributesProcessor {
                rules,
                index: Arc::new(RwLock::new(Arc::new(Index::default()))),
                caches: None,
                wait_until: None,
                telemetry,
                passthrough: true,
                trusted,
                _stop: CancellationToken::new().drop_guard(),
            }));
        }
        tokio::runtime::Handle::try_current()
            .map_err(|_| BuildError::new("the processor must be built on proflow's runtime"))?;
        let kubeconfig = match self.auth_type {
            AuthType::ServiceAccount => None,
            AuthType::KubeConfig => Some(
                self.kubeconfig_file
                    .clone()
                    .unwrap_or_else(default_kubeconfig),
            ),
        };
        let client = Client::new(&Connect {
            kubeconfig_file: kubeconfig.as_deref(),
            follow_redirects: true,
            ..Connect::default()
        })
        .map_err(|e| BuildError::new(format!("connecting to the Kubernetes API: {e}")))?;
        let node = self.node().map_err(BuildError::new)?;
        let extractor = Extractor::new(&self.extract).map_err(BuildError::new)?;
        let stop = CancellationToken::new();
        let limits = WatchLimits::default();
        let pods = Store::<Pod>::watch(
            client.clone(),
            Scope {
                namespace: self.filter.namespace.clone(),
                label_selector: self.label_selector(),
                field_selector: self.field_selector(node.as_deref()),
            },
            limits,
            stop.clone(),
        );
        let namespaces = extractor.needs(ExtractFrom::Namespace).then(|| {
            Store::<Namespace>::watch(client.clone(), Scope::default(), limits, stop.clone())
        });
        let nodes = extractor.needs(ExtractFrom::Node).then(|| {
            Store::<Node>::watch(
                client.clone(),
                Scope {
                    field_selector: node.as_ref().map(|n| format!("metadata.name={n}")),
                    ..Scope::default()
                },
                limits,
                stop.clone(),
            )
        });
        let replicasets = extractor.needs_replicasets().then(|| {
            Store::<ReplicaSet>::watch(
                client.clone(),
                Scope {
                    namespace: self.filter.namespace.clone(),
                    ..Scope::default()
                },
                limits,
                stop.clone(),
            )
        });
        let caches = Arc::new(Caches {
            pods,
            namespaces,
            nodes,
            replicasets,
            indexed: Default::default(),
        });
        let index = Arc::new(RwLock::new(Arc::new(Index::default())));
        tokio::spawn(keep_index(
            caches.clone(),
            extractor,
            index.clone(),
            telemetry.clone(),
            stop.clone(),
        ));
        Ok(Arc::new(K8sAttributesProcessor {
            rules,
            index,
            caches: Some(caches),
            wait_until: self
                .wait_for_metadata
                .then(|| tokio::time::Instant::now() + self.wait_for_metadata_timeout.get()),
            telemetry,
            passthrough: false,
            trusted,
            _stop: stop.drop_guard(),
        }))
    }
}

/// `$KUBECONFIG` (its first file), else `~/.kube/config`, as kubectl reads.
fn default_kubeconfig() -> std::path::PathBuf {
    if let Some(first) = std::env::var_os("KUBECONFIG")
        .as_deref()
        .and_then(|v| std::env::split_paths(v).next())
        .filter(|p| !p.as_os_str().is_empty())
    {
        return first;
    }
    let home = std::env::var_os("HOME").unwrap_or_default();
    std::path::Path::new(&home).join(".kube/config")
}

/// Rebuilds the index whenever a cache changes, until `stop`.
async fn keep_index(
    caches: Arc<Caches>,
    extractor: Extractor,
    index: Arc<RwLock<Arc<Index>>>,
    telemetry: K8sAttributesTelemetry,
    stop: CancellationToken,
) {
    let notify = Arc::new(tokio::sync::Notify::new());
    caches.pods.notify_on_change(&notify, &stop);
    if let Some(s) = &caches.namespaces {
        s.notify_on_change(&notify, &stop);
    }
    if let Some(s) = &caches.nodes {
        s.notify_on_change(&notify, &stop);
    }
    if let Some(s) = &caches.replicasets {
        s.notify_on_change(&notify, &stop);
    }
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = notify.notified() => {}
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(SETTLE) => {}
        }
        let synced = caches.synced();
        let built = Arc::new(extractor.index(&caches));
        if let Ok(mut slot) = index.write() {
            *slot = built;
        }
        if synced {
            caches
                .indexed
                .store(true, std::sync::atomic::Ordering::Release);
        }
        report(&telemetry, "pods", Some(&caches.pods));
        report(&telemetry, "namespaces", caches.namespaces.as_ref());
        report(&telemetry, "nodes", caches.nodes.as_ref());
        report(&telemetry, "replicasets", caches.replicasets.as_ref());
    }
}

fn report<K: proflow_kube::Resource>(
    telemetry: &K8sAttributesTelemetry,
    kind: &str,
    store: Option<&Store<K>>,
) {
    if let Some(s) = store {
        let failures = s
            .stats()
            .failures
            .load(std::sync::atomic::Ordering::Relaxed);
        telemetry.cache(kind, s.len(), failures);
    }
}

/// `pod_association`, in label form.
struct Rules {
    rules: Vec<Vec<Source>>,
    /// The label `k8s.container.name` is in (to pick a pod's container).
    container_label: String,
    pod_ip_label: String,
    /// The labels this processor may set, which a profile of an untrusted
    /// sender may not bring.
    identity: IdentityLabels,
}

/// The labels this processor may set: every `extract.metadata` name it
/// knows, and the names `extract.labels` and `extract.annotations` give
/// (exactly, or by the prefix before a `$` group of a `key_regex` rule).
struct IdentityLabels {
    names: std::collections::HashSet<String>,
    prefixes: Vec<String>,
}

impl IdentityLabels {
    fn new(config: &K8sAttributesProcessorConfig) -> Self {
        let mut names: std::collections::HashSet<String> =
            METADATA.iter().map(|m| label_name(m)).collect();
        let mut prefixes = Vec::new();
        for (what, list) in [
            ("labels", &config.extract.labels),
            ("annotations", &config.extract.annotations),
        ] {
            for FieldExtract {
                tag_name,
                key,
                from,
                ..
            } in list
            {
                match (tag_name, key) {
                    (Some(tag), _) => match tag.split_once('$') {
                        None => {
                            names.insert(label_name(tag));
                        }
                        Some(("", _)) => {}
                        Some((prefix, _)) => prefixes.push(label_name(prefix)),
                    },
                    (None, Some(key)) => {
                        names.insert(label_name(&format!("k8s.{}.{what}.{key}", from.as_str())));
                    }
                    (None, None) => {
                        prefixes.push(label_name(&format!("k8s.{}.{what}.", from.as_str())))
                    }
                }
            }
        }
        IdentityLabels { names, prefixes }
    }

    fn contains(&self, name: &str) -> bool {
        self.names.contains(name) || self.prefixes.iter().any(|p| name.starts_with(p.as_str()))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Source {
    /// A label, by the attribute it is the label form of.
    Label {
        attribute: String,
        label: String,
    },
    Connection,
}

impl Rules {
    fn new(config: &K8sAttributesProcessorConfig) -> Self {
        Rules {
            rules: config
                .pod_association
                .iter()
                .map(|a| {
                    a.sources
                        .iter()
                        .map(|s| match s.from {
                            SourceFrom::Connection => Source::Connection,
                            SourceFrom::ResourceAttribute => {
                                let attribute = s.name.clone().unwrap_or_default();
                                Source::Label {
                                    label: label_name(&attribute),
                                    attribute,
                                }
                            }
                        })
                        .collect()
                })
                .collect(),
            container_label: label_name("k8s.container.name"),
            pod_ip_label: label_name("k8s.pod.ip"),
            identity: IdentityLabels::new(config),
        }
    }
}

/// Why a profile got no pod.
enum Miss {
    NoIdentifier,
    NotFound,
}

/// The running `k8s_attributes` processor.
pub struct K8sAttributesProcessor {
    rules: Rules,
    index: Arc<RwLock<Arc<Index>>>,
    caches: Option<Arc<Caches>>,
    /// With `wait_for_metadata`: until when profiles wait for the first lists.
    wait_until: Option<tokio::time::Instant>,
    telemetry: K8sAttributesTelemetry,
    passthrough: bool,
    /// `trusted_senders`.
    trusted: Vec<IpNet>,
    /// Stops the watches and the index task when the processor goes.
    _stop: DropGuard,
}

impl K8sAttributesProcessor {
    /// Whether the labels of profiles in a batch with `meta` may name their
    /// pod: those proflow set (no sender's address: this host, scrape,
    /// Kafka) or pushed from an address of `trusted_senders`.
    fn trusts_labels(&self, meta: &BatchMeta) -> bool {
        meta.client
            .is_none_or(|a| self.trusted.iter().any(|t| t.contains(a.ip())))
    }

    /// The pod (and its container's position, when the profile names one).
    /// With `labels_trusted` false, only rules of connection sources apply.
    fn find(
        &self,
        index: &Index,
        envelope: &Envelope,
        meta: &BatchMeta,
        labels_trusted: bool,
    ) -> Result<(Arc<PodInfo>, Option<usize>), Miss> {
        let mut had_identifier = false;
        'rules: for rule in &self.rules.rules {
            if !labels_trusted && rule.iter().any(|s| matches!(s, Source::Label { .. })) {
                continue;
            }
            let mut values = Vec::with_capacity(rule.len());
            for source in rule {
                let value = match source {
                    Source::Connection => meta.client.map(|a| a.ip().to_canonical().to_string()),
                    Source::Label { label, .. } => envelope
                        .labels
                        .get(label)
                        .filter(|v| !v.is_empty())
                        .map(str::to_owned),
                };
                match value {
                    Some(v) => values.push((source, v)),
                    None => continue 'rules,
                }
            }
            had_identifier = true;
            let found = match values.as_slice() {
                [(Source::Connection, ip)] => index.by_ip.get(ip).map(|p| (p.clone(), None)),
                [(Source::Label { attribute, .. }, v)] => match attribute.as_str() {
                    "k8s.pod.ip" => index.by_ip.get(v).map(|p| (p.clone(), None)),
                    "k8s.pod.uid" => index.by_uid.get(v).map(|p| (p.clone(), None)),
                    "container.id" => index
                        .by_container
                        .get(index::bare_container_id(v))
                        .map(|(p, c)| (p.clone(), Some(*c))),
                    _ => None,
                },
                _ => {
                    let of = |name: &str| {
                        values.iter().find_map(|(s, v)| match s {
                            Source::Label { attribute, .. } if attribute == name => Some(v.clone()),
                            _ => None,
                        })
                    };
                    match (of("k8s.namespace.name"), of("k8s.pod.name")) {
                        (Some(ns), Some(name)) => {
                            index.by_name.get(&(ns, name)).map(|p| (p.clone(), None))
                        }
                        _ => None,
                    }
                }
            };
            if let Some(found) = found {
                return Ok(found);
            }
        }
        Err(if had_identifier {
            Miss::NotFound
        } else {
            Miss::NoIdentifier
        })
    }

    /// Waits for the first lists while `wait_for_metadata` allows.
    async fn wait_for_metadata(&self) {
        let (Some(until), Some(caches)) = (self.wait_until, &self.caches) else {
            return;
        };
        while !caches.indexed.load(std::sync::atomic::Ordering::Acquire) {
            if tokio::time::Instant::now() >= until {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Adds `pairs` to the profile: only those it has no value for, or all of
/// them (`overwrite`).
fn add(envelope: &mut Envelope, pairs: &[(String, String)], overwrite: bool) {
    for (name, value) in pairs {
        if overwrite || envelope.labels.get(name).is_none() {
            envelope.labels.set(name.clone(), value.clone());
        }
    }
}

#[async_trait]
impl Processor for K8sAttributesProcessor {
    async fn process(&self, mut batch: Vec<Envelope>, meta: &BatchMeta) -> Vec<Envelope> {
        if self.passthrough {
            if let Some(ip) = meta.client.map(|a| a.ip().to_canonical().to_string()) {
                for e in &mut batch {
                    if e.labels.get(&self.rules.pod_ip_label).is_none() {
                        e.labels.set(self.rules.pod_ip_label.clone(), ip.clone());
                    }
                }
            }
            return batch;
        }
        self.wait_for_metadata().await;
        let index = match self.index.read() {
            Ok(i) => i.clone(),
            Err(_) => return batch,
        };
        let trusted = self.trusts_labels(meta);
        let (mut associated, mut not_found, mut none, mut removed) = (0, 0, 0, 0);
        for envelope in &mut batch {
            // An untrusted sender's container name picks among the
            // containers of the pod its connection names, nothing more.
            let container_name = envelope
                .labels
                .get(&self.rules.container_label)
                .map(str::to_owned);
            if !trusted {
                let before = envelope.labels.len();
                envelope
                    .labels
                    .retain(|l| !self.rules.identity.contains(&l.name));
                removed += (before - envelope.labels.len()) as u64;
            }
            match self.find(&index, envelope, meta, trusted) {
                Ok((pod, container)) => {
                    associated += 1;
                    add(envelope, &pod.labels, !trusted);
                    let container = container.or_else(|| {
                        let name = container_name.as_deref()?;
                        pod.containers.iter().position(|(n, _)| n == name)
                    });
                    if let Some((_, labels)) = container.and_then(|c| pod.containers.get(c)) {
                        add(envelope, labels, !trusted);
                    }
                }
                Err(Miss::NotFound) => not_found += 1,
                Err(Miss::NoIdentifier) => none += 1,
            }
        }
        self.telemetry.profiles("associated", associated);
        self.telemetry.profiles("not_found", not_found);
        self.telemetry.profiles("no_identifier", none);
        self.telemetry.untrusted_labels_removed(removed);
        batch
    }
}

#[cfg(test)]
mod tests;
