//! What the processor knows of each pod, indexed the ways a profile can
//! name it: IP, uid, container id, namespace and name.
//!
//! An [`Index`] is built whole from the caches each time they change (a
//! burst of changes gathered first) and swapped in; profiles read the one in
//! place without waiting. Each pod's labels to add are worked out once,
//! here: the chosen metadata (owners through the ReplicaSet cache for
//! `k8s.deployment.name`), the chosen Kubernetes labels and annotations of
//! the pod, its namespace and its node; and per container its name, id and
//! image.

use std::collections::HashMap;
use std::sync::Arc;

use proflow_kube::Store;
use proflow_kube::objects::{Namespace, Node, ObjectMeta, Pod, ReplicaSet};
use proflow_model::otlp::label_name;

use super::config::{Extract, ExtractFrom, FieldExtract};

/// Labels (name, value), already in label form.
pub type Pairs = Vec<(String, String)>;

/// One pod's labels to add.
#[derive(Debug, Default)]
pub struct PodInfo {
    pub labels: Pairs,
    /// Per container, by name: labels added when the profile names the
    /// container (by id, or by `k8s.container.name`).
    pub containers: Vec<(String, Pairs)>,
}

/// The pods, by every identifier.
#[derive(Debug, Default)]
pub struct Index {
    pub by_ip: HashMap<String, Arc<PodInfo>>,
    pub by_uid: HashMap<String, Arc<PodInfo>>,
    /// Bare container id (no `containerd://`) → pod and container position.
    pub by_container: HashMap<String, (Arc<PodInfo>, usize)>,
    pub by_name: HashMap<(String, String), Arc<PodInfo>>,
}

/// The caches an index is built from.
pub struct Caches {
    pub pods: Store<Pod>,
    pub namespaces: Option<Store<Namespace>>,
    pub nodes: Option<Store<Node>>,
    pub replicasets: Option<Store<ReplicaSet>>,
    /// Set once an index was built from caches that had all synced.
    pub indexed: std::sync::atomic::AtomicBool,
}

impl Caches {
    pub fn synced(&self) -> bool {
        self.pods.synced()
            && self.namespaces.as_ref().is_none_or(Store::synced)
            && self.nodes.as_ref().is_none_or(Store::synced)
            && self.replicasets.as_ref().is_none_or(Store::synced)
    }
}

/// `extract`, compiled.
pub struct Extractor {
    metadata: Vec<String>,
    labels: Vec<(FieldExtract, Option<regex::Regex>)>,
    annotations: Vec<(FieldExtract, Option<regex::Regex>)>,
}

impl Extractor {
    /// Compiles `extract` (already validated).
    pub fn new(extract: &Extract) -> Result<Self, String> {
        let compile = |list: &[FieldExtract]| -> Result<Vec<_>, String> {
            list.iter()
                .map(|e| {
                    let re = e
                        .key_regex
                        .as_deref()
                        .map(|r| regex::Regex::new(&format!("^(?:{r})$")))
                        .transpose()
                        .map_err(|err| err.to_string())?;
                    Ok((e.clone(), re))
                })
                .collect()
        };
        Ok(Extractor {
            metadata: extract.metadata.clone(),
            labels: compile(&extract.labels)?,
            annotations: compile(&extract.annotations)?,
        })
    }

    fn wants(&self, key: &str) -> bool {
        self.metadata.iter().any(|m| m == key)
    }

    /// Whether the pod's owners need the ReplicaSet cache.
    pub fn needs_replicasets(&self) -> bool {
        self.wants("k8s.deployment.name")
    }

    /// Whether namespace (node) metadata is extracted.
    pub fn needs(&self, from: ExtractFrom) -> bool {
        self.labels
            .iter()
            .chain(&self.annotations)
            .any(|(e, _)| e.from == from)
    }

    /// Kubernetes labels or annotations of `meta` chosen by `rules` from
    /// `from`, as (label name, value).
    fn chosen(
        out: &mut Pairs,
        rules: &[(FieldExtract, Option<regex::Regex>)],
        what: &str,
        from: ExtractFrom,
        values: &std::collections::BTreeMap<String, String>,
    ) {
        for (rule, re) in rules.iter().filter(|(r, _)| r.from == from) {
            match (&rule.key, re) {
                (Some(key), _) => {
                    if let Some(v) = values.get(key) {
                        let tag = rule
                            .tag_name
                            .clone()
                            .unwrap_or_else(|| format!("k8s.{}.{what}.{key}", from.as_str()));
                        out.push((label_name(&tag), v.clone()));
                    }
                }
                (None, Some(re)) => {
                    for (k, v) in values {
                        let Some(caps) = re.captures(k) else { continue };
                        let tag = match &rule.tag_name {
                            Some(t) => {
                                let mut expanded = String::new();
                                caps.expand(t, &mut expanded);
                                expanded
                            }
                            None => format!("k8s.{}.{what}.{k}", from.as_str()),
                        };
                        out.push((label_name(&tag), v.clone()));
                    }
                }
                (None, None) => {}
            }
        }
    }

    fn meta_labels(&self, out: &mut Pairs, from: ExtractFrom, meta: &ObjectMeta) {
        Self::chosen(out, &self.labels, "labels", from, &meta.labels);
        Self::chosen(
            out,
            &self.annotations,
            "annotations",
            from,
            &meta.annotations,
        );
    }

    /// What to add for `pod`.
    pub fn pod_info(&self, pod: &Pod, caches: &Caches) -> PodInfo {
        let mut labels = Pairs::new();
        let mut add = |key: &str, value: &str| {
            if self.wants(key) && !value.is_empty() {
                labels.push((label_name(key), value.to_owned()));
            }
        };
        let meta = &pod.metadata;
        add("k8s.namespace.name", &meta.namespace);
        add("k8s.pod.name", &meta.name);
        add("k8s.pod.uid", &meta.uid);
        add("k8s.pod.ip", &pod.status.pod_ip);
        add("k8s.pod.start_time", &pod.status.start_time);
        add("k8s.node.name", &pod.spec.node_name);
        if let Some(owner) = meta.controller() {
            match owner.kind.as_str() {
                "ReplicaSet" => {
                    add("k8s.replicaset.name", &owner.name);
                    let deployment = caches
                        .replicasets
                        .as_ref()
                        .and_then(|s| s.get(&meta.namespace, &owner.name))
                        .and_then(|rs| {
                            rs.metadata
                                .controller()
                                .filter(|o| o.kind == "Deployment")
                                .map(|o| o.name.clone())
                        });
                    if let Some(d) = deployment {
                        add("k8s.deployment.name", &d);
                    }
                }
                "StatefulSet" => add("k8s.statefulset.name", &owner.name),
                "DaemonSet" => add("k8s.daemonset.name", &owner.name),
                "Job" => {
                    add("k8s.job.name", &owner.name);
                    // A CronJob names its Jobs `<cronjob>-<scheduled minute>`
                    // (the Collector's rule too).
                    if let Some((cron, n)) = owner.name.rsplit_once('-')
                        && !n.is_empty()
                        && n.bytes().all(|b| b.is_ascii_digit())
                    {
                        add("k8s.cronjob.name", cron);
                    }
                }
                _ => {}
            }
        }
        self.meta_labels(&mut labels, ExtractFrom::Pod, meta);
        if let Some(ns) = caches
            .namespaces
            .as_ref()
            .and_then(|s| s.get("", &meta.namespace))
        {
            self.meta_labels(&mut labels, ExtractFrom::Namespace, &ns.metadata);
        }
        if let Some(node) = caches
            .nodes
            .as_ref()
            .and_then(|s| s.get("", &pod.spec.node_name))
        {
            self.meta_labels(&mut labels, ExtractFrom::Node, &node.metadata);
        }
        let statuses = pod
            .status
            .container_statuses
            .iter()
            .chain(&pod.status.init_container_statuses);
        let containers = pod
            .spec
            .containers
            .iter()
            .chain(&pod.spec.init_containers)
            .map(|c| {
                let mut own = Pairs::new();
                let mut add = |key: &str, value: &str| {
                    if self.wants(key) && !value.is_empty() {
                        own.push((label_name(key), value.to_owned()));
                    }
                };
                add("k8s.container.name", &c.name);
                let id = statuses
                    .clone()
                    .find(|s| s.name == c.name)
                    .map_or("", |s| bare_container_id(&s.container_id));
                add("container.id", id);
                let (image, tag) = image_name_and_tag(&c.image);
                add("container.image.name", image);
                add("container.image.tag", tag);
                (c.name.clone(), own)
            })
            .collect();
        PodInfo { labels, containers }
    }

    /// A new index of every cached pod.
    pub fn index(&self, caches: &Caches) -> Index {
        let mut index = Index::default();
        for pod in caches.pods.list() {
            let info = Arc::new(self.pod_info(&pod, caches));
            let meta = &pod.metadata;
            // A host-network pod has its node's IP, shared by every other
            // such pod and the node itself: it names no one pod.
            if !pod.spec.host_network {
                for ip in std::iter::once(&pod.status.pod_ip)
                    .chain(pod.status.pod_ips.iter().map(|p| &p.ip))
                    .filter(|ip| !ip.is_empty())
                {
                    index.by_ip.insert(ip.clone(), info.clone());
                }
            }
            if !meta.uid.is_empty() {
                index.by_uid.insert(meta.uid.clone(), info.clone());
            }
            index
                .by_name
                .insert((meta.namespace.clone(), meta.name.clone()), info.clone());
            let statuses = pod
                .status
                .container_statuses
                .iter()
                .chain(&pod.status.init_container_statuses);
            for s in statuses {
                let id = bare_container_id(&s.container_id);
                if id.is_empty() {
                    continue;
                }
                if let Some(pos) = info.containers.iter().position(|(name, _)| *name == s.name) {
                    index
                        .by_container
                        .insert(id.to_owned(), (info.clone(), pos));
                }
            }
        }
        index
    }
}

/// `containerd://0123…` → `0123…` (the id a cgroup path carries).
pub fn bare_container_id(id: &str) -> &str {
    id.split_once("://").map_or(id, |(_, bare)| bare)
}

/// `registry:5000/team/app:1.2@sha256:…` → (`registry:5000/team/app`, `1.2`);
/// no tag: `latest`, as the Collector says.
pub fn image_name_and_tag(image: &str) -> (&str, &str) {
    let without_digest = image.split_once('@').map_or(image, |(i, _)| i);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    match without_digest[last_slash..].rfind(':') {
        Some(colon) => {
            let at = last_slash + colon;
            (&without_digest[..at], &without_digest[at + 1..])
        }
        None if without_digest.is_empty() => ("", ""),
        None => (without_digest, "latest"),
    }
}
