//! The `k8s_attributes` processor's config: the OpenTelemetry Collector's
//! `k8sattributes` keys (`auth_type`, `passthrough`, `filter`, `extract`,
//! `pod_association`, `wait_for_metadata`), with the defaults that suit
//! profiles (see the README beside this file).

use std::net::IpAddr;
use std::path::PathBuf;

use proflow_config::Duration;
use proflow_core::component::FieldError;
use proflow_model::otlp::SEMCONV_KEYS;
use serde::Deserialize;

/// Config of the `k8s_attributes` processor.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct K8sAttributesProcessorConfig {
    /// How to reach the API server: `serviceAccount` (default: in-cluster,
    /// the pod's ServiceAccount) or `kubeConfig` (a kubeconfig file).
    #[serde(default)]
    pub auth_type: AuthType,
    /// With `auth_type: kubeConfig`: the file. Default `$KUBECONFIG`, else
    /// `~/.kube/config`.
    #[serde(default)]
    pub kubeconfig_file: Option<PathBuf>,
    /// Only add `k8s.pod.ip` (the sender's address), without reading the
    /// API: for an agent whose profiles a gateway labels later.
    #[serde(default)]
    pub passthrough: bool,
    /// Which pods (and namespaces, nodes) to watch.
    #[serde(default)]
    pub filter: Filter,
    /// What to add to each profile.
    #[serde(default)]
    pub extract: Extract,
    /// How a profile finds its pod: rules tried in order, the first whose
    /// sources all have a value and name a known pod wins. Default:
    /// `container.id`, then `k8s.pod.uid`, then `k8s.pod.ip`, then
    /// `k8s.namespace.name` with `k8s.pod.name`, then the connection.
    /// Rules that read a label apply only to profiles whose labels are
    /// trusted (see `trusted_senders`).
    #[serde(default = "default_association")]
    pub pod_association: Vec<Association>,
    /// The senders whose pushed labels are trusted, as addresses or CIDR
    /// ranges (`10.42.0.0/16`, `fd00::/8`, `192.0.2.7`): their profiles may
    /// name their pod by labels and keep the identity labels they carry. A
    /// profile pushed by anyone else finds its pod by the connection only,
    /// and the identity labels it carried (those this processor sets) are
    /// removed and set from that pod. Profiles proflow made on this host
    /// (`ebpf`), scraped, or read from Kafka are always trusted. Default
    /// none.
    #[serde(default)]
    pub trusted_senders: Vec<String>,
    /// Hold profiles while the first lists have not arrived, for at most
    /// `wait_for_metadata_timeout` after the start; then (or with false)
    /// profiles pass as they are until the metadata is there. Default false.
    #[serde(default)]
    pub wait_for_metadata: bool,
    /// See `wait_for_metadata`. Default 10s.
    #[serde(default = "default_wait")]
    pub wait_for_metadata_timeout: Duration,
}

fn default_wait() -> Duration {
    Duration::from_secs(10)
}

/// `auth_type`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum AuthType {
    #[default]
    #[serde(rename = "serviceAccount")]
    ServiceAccount,
    #[serde(rename = "kubeConfig")]
    KubeConfig,
}

/// `filter`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Filter {
    /// Watch only the pods of this node (a DaemonSet's own node).
    #[serde(default)]
    pub node: Option<String>,
    /// Like `node`, from this environment variable (the Downward API's
    /// `spec.nodeName`, e.g. `KUBE_NODE_NAME`).
    #[serde(default)]
    pub node_from_env_var: Option<String>,
    /// Watch only this namespace's pods.
    #[serde(default)]
    pub namespace: Option<String>,
    /// Pod label conditions, sent to the API server as a label selector.
    #[serde(default)]
    pub labels: Vec<FieldFilter>,
    /// Pod field conditions (`status.phase`, …), sent as a field selector.
    #[serde(default)]
    pub fields: Vec<FieldFilter>,
}

/// One condition of `filter.labels` or `filter.fields`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FieldFilter {
    pub key: String,
    #[serde(default)]
    pub value: Option<String>,
    /// `equals` (default), `not-equals`, `exists`, `does-not-exist` (the
    /// last two for labels only).
    #[serde(default)]
    pub op: FilterOp,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum FilterOp {
    #[default]
    Equals,
    NotEquals,
    Exists,
    DoesNotExist,
}

/// `extract`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Extract {
    /// The attributes to add, by their OpenTelemetry names (see
    /// [`METADATA`]). Default [`DEFAULT_METADATA`].
    #[serde(default = "default_metadata")]
    pub metadata: Vec<String>,
    /// Kubernetes labels to add.
    #[serde(default)]
    pub labels: Vec<FieldExtract>,
    /// Kubernetes annotations to add.
    #[serde(default)]
    pub annotations: Vec<FieldExtract>,
}

impl Default for Extract {
    fn default() -> Self {
        Extract {
            metadata: default_metadata(),
            labels: Vec::new(),
            annotations: Vec::new(),
        }
    }
}

/// Every `extract.metadata` name the processor knows: every
/// semantic-convention key OTLP exporters write back, but `service.name`
/// (the first), which is not the processor's to add.
pub const METADATA: &[&str] = SEMCONV_KEYS.split_at(1).1;

/// The default of `extract.metadata`: the Collector's (but
/// `k8s.pod.start_time`, which would start a new series per pod start),
/// plus the container and every owner, which is what tells profiles apart.
pub const DEFAULT_METADATA: &[&str] = &[
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.pod.uid",
    "k8s.node.name",
    "k8s.container.name",
    "k8s.deployment.name",
    "k8s.statefulset.name",
    "k8s.daemonset.name",
    "k8s.job.name",
    "k8s.cronjob.name",
];

fn default_metadata() -> Vec<String> {
    DEFAULT_METADATA.iter().map(|s| (*s).to_owned()).collect()
}

/// One of `extract.labels` or `extract.annotations`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FieldExtract {
    /// The attribute name. Default `k8s.<from>.labels.<key>` (or
    /// `.annotations.`); with `key_regex`, `$1`… name its groups.
    #[serde(default)]
    pub tag_name: Option<String>,
    /// The label or annotation key.
    #[serde(default)]
    pub key: Option<String>,
    /// A regular expression every key is matched against (whole key).
    #[serde(default)]
    pub key_regex: Option<String>,
    /// `pod` (default), `namespace` or `node`.
    #[serde(default)]
    pub from: ExtractFrom,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ExtractFrom {
    #[default]
    Pod,
    Namespace,
    Node,
}

impl ExtractFrom {
    pub fn as_str(self) -> &'static str {
        match self {
            ExtractFrom::Pod => "pod",
            ExtractFrom::Namespace => "namespace",
            ExtractFrom::Node => "node",
        }
    }
}

/// One `pod_association` rule.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Association {
    /// All must have a value; together they name one pod.
    pub sources: Vec<AssociationSource>,
}

/// One source of an association rule.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AssociationSource {
    /// `resource_attribute` (a label of the profile: `k8s.pod.ip` is the
    /// label `k8s_pod_ip`) or `connection` (the sender's IP address).
    pub from: SourceFrom,
    /// With `resource_attribute`: `k8s.pod.ip`, `k8s.pod.uid`,
    /// `container.id`, `k8s.pod.name` or `k8s.namespace.name`.
    #[serde(default)]
    pub name: Option<String>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SourceFrom {
    ResourceAttribute,
    Connection,
}

/// The attributes a `resource_attribute` source may name.
pub const SOURCE_NAMES: &[&str] = &[
    "k8s.pod.ip",
    "k8s.pod.uid",
    "container.id",
    "k8s.pod.name",
    "k8s.namespace.name",
];

fn default_association() -> Vec<Association> {
    let attr = |name: &str| AssociationSource {
        from: SourceFrom::ResourceAttribute,
        name: Some(name.to_owned()),
    };
    vec![
        Association {
            sources: vec![attr("container.id")],
        },
        Association {
            sources: vec![attr("k8s.pod.uid")],
        },
        Association {
            sources: vec![attr("k8s.pod.ip")],
        },
        Association {
            sources: vec![attr("k8s.namespace.name"), attr("k8s.pod.name")],
        },
        Association {
            sources: vec![AssociationSource {
                from: SourceFrom::Connection,
                name: None,
            }],
        },
    ]
}

impl K8sAttributesProcessorConfig {
    /// Every problem of the config.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.kubeconfig_file.is_some() && self.auth_type != AuthType::KubeConfig {
            problems.push(FieldError::new(
                "kubeconfig_file",
                "is read only with `auth_type: kubeConfig`",
            ));
        }
        if self.filter.node.is_some() && self.filter.node_from_env_var.is_some() {
            problems.push(FieldError::new(
                "filter.node",
                "set `node` or `node_from_env_var`, not both",
            ));
        }
        for (i, f) in self.filter.labels.iter().enumerate() {
            problems.extend(f.problems(&format!("filter.labels.{i}"), true));
        }
        for (i, f) in self.filter.fields.iter().enumerate() {
            problems.extend(f.problems(&format!("filter.fields.{i}"), false));
        }
        for (i, m) in self.extract.metadata.iter().enumerate() {
            if !METADATA.contains(&m.as_str()) {
                problems.push(FieldError::new(
                    format!("extract.metadata.{i}"),
                    format!("{m:?} is not known; use one of {}", METADATA.join(", ")),
                ));
            }
        }
        for (kind, list) in [
            ("labels", &self.extract.labels),
            ("annotations", &self.extract.annotations),
        ] {
            for (i, e) in list.iter().enumerate() {
                let at = format!("extract.{kind}.{i}");
                match (&e.key, &e.key_regex) {
                    (Some(_), Some(_)) => {
                        problems.push(FieldError::new(&at, "set `key` or `key_regex`, not both"))
                    }
                    (None, None) => problems.push(FieldError::new(&at, "set `key` or `key_regex`")),
                    (None, Some(r)) => {
                        if let Err(err) = regex::Regex::new(r) {
                            problems.push(FieldError::new(
                                format!("{at}.key_regex"),
                                format!("is not a regular expression: {err}"),
                            ));
                        }
                    }
                    (Some(_), None) => {}
                }
            }
        }
        if self.pod_association.is_empty() {
            problems.push(FieldError::new(
                "pod_association",
                "list at least one rule, or leave it out for the default",
            ));
        }
        for (i, a) in self.pod_association.iter().enumerate() {
            if a.sources.is_empty() {
                problems.push(FieldError::new(
                    format!("pod_association.{i}.sources"),
                    "list at least one source",
                ));
            }
            for (j, s) in a.sources.iter().enumerate() {
                let at = format!("pod_association.{i}.sources.{j}");
                match (s.from, &s.name) {
                    (SourceFrom::ResourceAttribute, None) => problems.push(FieldError::new(
                        format!("{at}.name"),
                        format!("name the attribute: one of {}", SOURCE_NAMES.join(", ")),
                    )),
                    (SourceFrom::ResourceAttribute, Some(n))
                        if !SOURCE_NAMES.contains(&n.as_str()) =>
                    {
                        problems.push(FieldError::new(
                            format!("{at}.name"),
                            format!("{n:?} names no pod; use one of {}", SOURCE_NAMES.join(", ")),
                        ))
                    }
                    (SourceFrom::Connection, Some(_)) => problems.push(FieldError::new(
                        format!("{at}.name"),
                        "is not used with `from: connection`; remove it",
                    )),
                    _ => {}
                }
            }
            let names: Vec<&str> = a.sources.iter().filter_map(|s| s.name.as_deref()).collect();
            if names.contains(&"k8s.pod.name") != names.contains(&"k8s.namespace.name") {
                problems.push(FieldError::new(
                    format!("pod_association.{i}.sources"),
                    "k8s.pod.name and k8s.namespace.name name a pod only together: list both in one rule",
                ));
            }
        }
        for (i, t) in self.trusted_senders.iter().enumerate() {
            if let Err(err) = t.parse::<IpNet>() {
                problems.push(FieldError::new(format!("trusted_senders.{i}"), err));
            }
        }
        if self.passthrough && !self.trusted_senders.is_empty() {
            problems.push(FieldError::new(
                "trusted_senders",
                "is not used with `passthrough` (which reads no labels); remove it",
            ));
        }
        if self.wait_for_metadata_timeout.is_zero() && self.wait_for_metadata {
            problems.push(FieldError::new(
                "wait_for_metadata_timeout",
                "must be more than 0 with wait_for_metadata",
            ));
        }
        problems
    }

    /// The node to watch, from `filter.node` or its environment variable;
    /// an error names an unset variable.
    pub fn node(&self) -> Result<Option<String>, String> {
        match (&self.filter.node, &self.filter.node_from_env_var) {
            (Some(n), _) => Ok(Some(n.clone())),
            (None, Some(var)) => match std::env::var(var) {
                Ok(v) if !v.is_empty() => Ok(Some(v)),
                _ => Err(format!(
                    "filter.node_from_env_var: the environment variable {var} is not set (give the pod `env: [{{name: {var}, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]`)"
                )),
            },
            (None, None) => Ok(None),
        }
    }

    /// The pod label selector of `filter.labels`.
    pub fn label_selector(&self) -> Option<String> {
        selector(&self.filter.labels)
    }

    /// The pod field selector of `filter.fields` and the node.
    pub fn field_selector(&self, node: Option<&str>) -> Option<String> {
        let mut parts: Vec<String> = node
            .map(|n| format!("spec.nodeName={n}"))
            .into_iter()
            .collect();
        parts.extend(selector(&self.filter.fields));
        (!parts.is_empty()).then(|| parts.join(","))
    }
}

fn selector(filters: &[FieldFilter]) -> Option<String> {
    let parts: Vec<String> = filters
        .iter()
        .map(|f| {
            let v = f.value.as_deref().unwrap_or_default();
            match f.op {
                FilterOp::Equals => format!("{}={v}", f.key),
                FilterOp::NotEquals => format!("{}!={v}", f.key),
                FilterOp::Exists => f.key.clone(),
                FilterOp::DoesNotExist => format!("!{}", f.key),
            }
        })
        .collect();
    (!parts.is_empty()).then(|| parts.join(","))
}

impl FieldFilter {
    fn problems(&self, at: &str, label: bool) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.key.is_empty() || self.key.contains([',', '=', '!', ' ']) {
            problems.push(FieldError::new(
                format!("{at}.key"),
                format!("{:?} is not a key", self.key),
            ));
        }
        match self.op {
            FilterOp::Equals | FilterOp::NotEquals => {
                if self.value.as_deref().is_none_or(|v| v.contains(',')) {
                    problems.push(FieldError::new(
                        format!("{at}.value"),
                        "needs a value without commas",
                    ));
                }
            }
            FilterOp::Exists | FilterOp::DoesNotExist => {
                if !label {
                    problems.push(FieldError::new(
                        format!("{at}.op"),
                        "fields take `equals` or `not-equals` only",
                    ));
                }
                if self.value.is_some() {
                    problems.push(FieldError::new(
                        format!("{at}.value"),
                        "is not used with exists / does-not-exist; remove it",
                    ));
                }
            }
        }
        problems
    }
}

/// An address range of `trusted_senders`: an address and how many of its
/// leading bits a sender's address must share (all of them for a bare
/// address).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpNet {
    addr: IpAddr,
    bits: u8,
}

impl std::str::FromStr for IpNet {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (addr, bits) = match s.split_once('/') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let addr: IpAddr = addr.parse().map_err(|_| {
            format!("{s:?} is not an address or CIDR range (like 10.42.0.0/16 or fd00::/8)")
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let bits = match bits {
            None => max,
            Some(b) => match b.parse::<u8>() {
                Ok(b) if b <= max => b,
                _ => return Err(format!("{s:?}: the prefix length must be 0 to {max}")),
            },
        };
        // An IPv4 range written IPv4-mapped (`::ffff:10.0.0.0/104`) is the
        // IPv4 range, as senders' addresses are compared.
        match addr {
            IpAddr::V6(v6) if bits >= 96 && v6.to_ipv4_mapped().is_some() => Ok(IpNet {
                addr: addr.to_canonical(),
                bits: bits - 96,
            }),
            _ => Ok(IpNet { addr, bits }),
        }
    }
}

impl IpNet {
    /// Whether `ip` is in the range (an IPv4 address mapped into IPv6 is
    /// taken as the IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        let (net, ip, width) = match (self.addr, ip) {
            (IpAddr::V4(n), IpAddr::V4(a)) => {
                (u128::from(n.to_bits()), u128::from(a.to_bits()), 32)
            }
            (IpAddr::V6(n), IpAddr::V6(a)) => (n.to_bits(), a.to_bits(), 128),
            _ => return false,
        };
        if self.bits == 0 {
            return true;
        }
        let shift = width - u32::from(self.bits);
        (net >> shift) == (ip >> shift)
    }
}
