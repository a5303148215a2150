//! `kubernetes_sd_configs`: Prometheus's names, defaults and checks.

use std::path::PathBuf;

use proflow_core::component::FieldError;
use serde::Deserialize;

use super::{Authorization, BasicAuth, ClientTlsSettings, client_problems, default_true};

/// One `kubernetes_sd_configs` item.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KubernetesSdConfig {
    /// What becomes a target: `pod` (each container port), `endpoints`,
    /// `endpointslice` (each endpoint address and port), `service` (each
    /// service port) or `node` (each node's kubelet).
    pub role: KubernetesRole,
    /// The API server's URL. Unset (and no `kubeconfig_file`): in-cluster,
    /// with the pod's ServiceAccount.
    #[serde(default)]
    pub api_server: Option<String>,
    /// A kubeconfig file; its current context says where and how.
    #[serde(default)]
    pub kubeconfig_file: Option<PathBuf>,
    /// Which namespaces to watch; default all.
    #[serde(default)]
    pub namespaces: NamespaceDiscovery,
    /// Label and field selectors, per kind of object, passed to the API
    /// server with each list and watch.
    #[serde(default)]
    pub selectors: Vec<Selector>,
    /// Labels of related objects to add to each target.
    #[serde(default)]
    pub attach_metadata: AttachMetadata,
    /// HTTP basic authentication to `api_server`.
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization` header to `api_server` (a bearer token).
    #[serde(default)]
    pub authorization: Option<Authorization>,
    /// TLS to `api_server`.
    #[serde(default)]
    pub tls_config: Option<ClientTlsSettings>,
    /// Follow HTTP redirects. Default true.
    #[serde(default = "default_true")]
    pub follow_redirects: bool,
}

/// `role` of a Kubernetes SD config.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KubernetesRole {
    Pod,
    Endpoints,
    #[serde(rename = "endpointslice")]
    EndpointSlice,
    Service,
    Node,
}

impl KubernetesRole {
    pub fn as_str(self) -> &'static str {
        match self {
            KubernetesRole::Pod => "pod",
            KubernetesRole::Endpoints => "endpoints",
            KubernetesRole::EndpointSlice => "endpointslice",
            KubernetesRole::Service => "service",
            KubernetesRole::Node => "node",
        }
    }

    /// The selector roles this role uses (Prometheus's table).
    fn selector_roles(self) -> &'static [KubernetesRole] {
        use KubernetesRole::*;
        match self {
            Pod => &[Pod, Node],
            Endpoints => &[Pod, Service, Endpoints],
            EndpointSlice => &[Pod, Service, EndpointSlice],
            Service => &[Service],
            Node => &[Node],
        }
    }
}

/// `namespaces`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NamespaceDiscovery {
    /// Also watch the namespace proflow's own pod runs in (in-cluster
    /// only).
    #[serde(default)]
    pub own_namespace: bool,
    /// Namespaces to watch; empty (and no `own_namespace`): all.
    #[serde(default)]
    pub names: Vec<String>,
}

/// One of `selectors`.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// The kind of object it filters (`pod`, `node`, `service`,
    /// `endpoints`, `endpointslice`).
    pub role: KubernetesRole,
    /// A label selector (`app=web,tier!=db`).
    #[serde(default)]
    pub label: Option<String>,
    /// A field selector (`spec.nodeName=node-1`).
    #[serde(default)]
    pub field: Option<String>,
}

/// `attach_metadata`.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AttachMetadata {
    /// Add the node's labels and annotations (`__meta_kubernetes_node_*`)
    /// to pod, endpoints and endpointslice targets (watches nodes).
    #[serde(default)]
    pub node: bool,
    /// Add the namespace's labels and annotations
    /// (`__meta_kubernetes_namespace_label_*`, …) to every role's targets
    /// but node's (watches namespaces).
    #[serde(default)]
    pub namespace: bool,
}

impl KubernetesSdConfig {
    /// The selector of `role`, if any: `(label, field)`.
    pub fn selector(&self, role: KubernetesRole) -> (Option<&str>, Option<&str>) {
        self.selectors
            .iter()
            .find(|s| s.role == role)
            .map_or((None, None), |s| (s.label.as_deref(), s.field.as_deref()))
    }

    fn has_http_settings(&self) -> bool {
        self.basic_auth.is_some()
            || self.authorization.is_some()
            || self.tls_config.is_some()
            || !self.follow_redirects
    }

    /// Every problem, with paths relative to the item.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        match (&self.api_server, &self.kubeconfig_file) {
            (Some(_), Some(_)) => problems.push(FieldError::new(
                "api_server",
                "set `api_server` or `kubeconfig_file`, not both",
            )),
            (None, Some(_)) if self.has_http_settings() => problems.push(FieldError::new(
                "kubeconfig_file",
                "takes its TLS and credentials from the kubeconfig: remove basic_auth, authorization, tls_config and follow_redirects",
            )),
            (None, None) if self.has_http_settings() => problems.push(FieldError::new(
                "api_server",
                "basic_auth, authorization, tls_config and follow_redirects need `api_server` (in-cluster, the pod's ServiceAccount is used)",
            )),
            (Some(url), None) => {
                let ok = url.parse::<http::Uri>().is_ok_and(|u| {
                    matches!(u.scheme_str(), Some("http" | "https")) && u.host().is_some()
                });
                if !ok {
                    problems.push(FieldError::new(
                        "api_server",
                        format!("{url:?} is not an absolute http:// or https:// URL"),
                    ));
                }
            }
            _ => {}
        }
        if self.namespaces.own_namespace
            && (self.api_server.is_some() || self.kubeconfig_file.is_some())
        {
            problems.push(FieldError::new(
                "namespaces.own_namespace",
                "is known only in-cluster: list the namespace under `names` when `api_server` or `kubeconfig_file` is set",
            ));
        }
        for (i, name) in self.namespaces.names.iter().enumerate() {
            if name.is_empty() {
                problems.push(FieldError::new(
                    format!("namespaces.names.{i}"),
                    "must not be empty",
                ));
            }
        }
        let allowed = self.role.selector_roles();
        let mut seen = Vec::new();
        for (i, s) in self.selectors.iter().enumerate() {
            if !allowed.contains(&s.role) {
                problems.push(FieldError::new(
                    format!("selectors.{i}.role"),
                    format!(
                        "role {} supports only {} selectors",
                        self.role.as_str(),
                        allowed
                            .iter()
                            .map(|r| r.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                ));
            }
            if seen.contains(&s.role) {
                problems.push(FieldError::new(
                    format!("selectors.{i}.role"),
                    format!(
                        "a second selector for {}: merge them into one",
                        s.role.as_str()
                    ),
                ));
            }
            seen.push(s.role);
        }
        problems.extend(client_problems(
            "",
            self.basic_auth.as_ref(),
            self.authorization.as_ref(),
            self.tls_config.as_ref(),
        ));
        problems
    }
}
