//! The Kubernetes objects proflow reads, with only the fields it uses.
//!
//! Field names are the API's (camelCase in JSON); every field has a default,
//! so an object that lacks one (an older server, a pod not yet scheduled)
//! still parses, and every field not named here is skipped unread into
//! memory. A [`Resource`] knows its API path and its metadata.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A kind of object proflow lists and watches.
pub trait Resource: DeserializeOwned + Send + Sync + 'static {
    /// The API group path: `api/v1` or `apis/discovery.k8s.io/v1`.
    const API: &'static str;
    /// The plural resource name in URLs (`pods`).
    const PLURAL: &'static str;
    /// Whether objects live in namespaces (nodes and namespaces do not).
    const NAMESPACED: bool;
    fn meta(&self) -> &ObjectMeta;
}

/// `metadata` of every object.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectMeta {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub resource_version: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    pub owner_references: Vec<OwnerReference>,
}

impl ObjectMeta {
    /// The owner that controls the object (`controller: true`), if any.
    pub fn controller(&self) -> Option<&OwnerReference> {
        self.owner_references
            .iter()
            .find(|o| o.controller == Some(true))
    }
}

/// One of `metadata.ownerReferences`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct OwnerReference {
    pub kind: String,
    pub name: String,
    pub uid: String,
    pub controller: Option<bool>,
}

/// A reference to another object (`targetRef` of an endpoint).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectReference {
    pub kind: String,
    pub name: String,
    pub namespace: String,
    pub uid: String,
}

/// A pod.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Pod {
    pub metadata: ObjectMeta,
    pub spec: PodSpec,
    pub status: PodStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodSpec {
    pub node_name: String,
    pub host_network: bool,
    pub containers: Vec<Container>,
    pub init_containers: Vec<Container>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Container {
    pub name: String,
    pub image: String,
    pub ports: Vec<ContainerPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerPort {
    pub name: String,
    pub container_port: i32,
    /// `TCP` (the API server's default), `UDP` or `SCTP`.
    pub protocol: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PodStatus {
    pub phase: String,
    #[serde(rename = "podIP")]
    pub pod_ip: String,
    #[serde(rename = "podIPs")]
    pub pod_ips: Vec<PodIp>,
    #[serde(rename = "hostIP")]
    pub host_ip: String,
    pub conditions: Vec<Condition>,
    /// When the kubelet started the pod (RFC 3339).
    pub start_time: String,
    pub container_statuses: Vec<ContainerStatus>,
    pub init_container_statuses: Vec<ContainerStatus>,
}

impl PodStatus {
    /// The `Ready` condition's status, lowercased (`true`, `false`), or
    /// `unknown` when the pod has none.
    pub fn ready(&self) -> String {
        self.conditions
            .iter()
            .find(|c| c.kind == "Ready")
            .map_or_else(|| "unknown".to_owned(), |c| c.status.to_lowercase())
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct PodIp {
    pub ip: String,
}

/// A pod or node condition (`Ready`, …) and its status (`True`, …).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Condition {
    #[serde(rename = "type")]
    pub kind: String,
    pub status: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ContainerStatus {
    pub name: String,
    /// `<runtime>://<id>` (`containerd://0123…`); empty until it started.
    #[serde(rename = "containerID")]
    pub container_id: String,
    pub image: String,
}

/// A service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Service {
    pub metadata: ObjectMeta,
    pub spec: ServiceSpec,
    pub status: ServiceStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceSpec {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(rename = "clusterIP")]
    pub cluster_ip: String,
    pub external_name: String,
    #[serde(rename = "externalIPs")]
    pub external_ips: Vec<String>,
    pub ports: Vec<ServicePort>,
    pub selector: BTreeMap<String, String>,
    #[serde(rename = "loadBalancerIP")]
    pub load_balancer_ip: String,
    /// `SingleStack`, `PreferDualStack` or `RequireDualStack`.
    pub ip_family_policy: String,
    /// `IPv4` and/or `IPv6`, the first being the primary.
    pub ip_families: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServicePort {
    pub name: String,
    pub protocol: String,
    pub port: i32,
    pub node_port: i32,
    pub app_protocol: Option<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ServiceStatus {
    pub load_balancer: LoadBalancerStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LoadBalancerStatus {
    pub ingress: Vec<LoadBalancerIngress>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LoadBalancerIngress {
    pub ip: String,
    pub hostname: String,
}

/// The endpoints of a service (core/v1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Endpoints {
    pub metadata: ObjectMeta,
    pub subsets: Vec<EndpointSubset>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointSubset {
    pub addresses: Vec<EndpointAddress>,
    pub not_ready_addresses: Vec<EndpointAddress>,
    pub ports: Vec<EndpointPort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointAddress {
    pub ip: String,
    pub hostname: String,
    pub node_name: Option<String>,
    pub target_ref: Option<ObjectReference>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointPort {
    pub name: String,
    pub port: i32,
    pub protocol: String,
    pub app_protocol: Option<String>,
}

/// An endpoint slice (discovery.k8s.io/v1).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EndpointSlice {
    pub metadata: ObjectMeta,
    /// `IPv4`, `IPv6` or `FQDN`.
    pub address_type: String,
    pub endpoints: Vec<SliceEndpoint>,
    pub ports: Vec<SlicePort>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SliceEndpoint {
    pub addresses: Vec<String>,
    pub conditions: SliceConditions,
    pub hostname: Option<String>,
    pub node_name: Option<String>,
    pub zone: Option<String>,
    pub target_ref: Option<ObjectReference>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct SliceConditions {
    pub ready: Option<bool>,
    pub serving: Option<bool>,
    pub terminating: Option<bool>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SlicePort {
    pub name: Option<String>,
    pub port: Option<i32>,
    pub protocol: Option<String>,
    pub app_protocol: Option<String>,
}

/// A node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Node {
    pub metadata: ObjectMeta,
    pub spec: NodeSpec,
    pub status: NodeStatus,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeSpec {
    #[serde(rename = "providerID")]
    pub provider_id: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct NodeStatus {
    pub addresses: Vec<NodeAddress>,
    pub conditions: Vec<Condition>,
    pub daemon_endpoints: DaemonEndpoints,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NodeAddress {
    /// `InternalIP`, `ExternalIP`, `Hostname`, …
    #[serde(rename = "type")]
    pub kind: String,
    pub address: String,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct DaemonEndpoints {
    pub kubelet_endpoint: DaemonEndpoint,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "PascalCase", default)]
pub struct DaemonEndpoint {
    pub port: i32,
}

/// A namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Namespace {
    pub metadata: ObjectMeta,
}

/// A ReplicaSet, read for the Deployment that owns it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ReplicaSet {
    pub metadata: ObjectMeta,
}

macro_rules! resource {
    ($ty:ty, $api:literal, $plural:literal, $namespaced:literal) => {
        impl Resource for $ty {
            const API: &'static str = $api;
            const PLURAL: &'static str = $plural;
            const NAMESPACED: bool = $namespaced;
            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }
        }
    };
}

resource!(Pod, "api/v1", "pods", true);
resource!(Service, "api/v1", "services", true);
resource!(Endpoints, "api/v1", "endpoints", true);
resource!(
    EndpointSlice,
    "apis/discovery.k8s.io/v1",
    "endpointslices",
    true
);
resource!(Node, "api/v1", "nodes", false);
resource!(Namespace, "api/v1", "namespaces", false);
resource!(ReplicaSet, "apis/apps/v1", "replicasets", true);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pod_keeps_what_proflow_uses_and_skips_the_rest() {
        let pod: Pod = serde_json::from_str(
            r#"{"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"p","namespace":"ns","uid":"u1","resourceVersion":"7",
              "labels":{"app":"x"},"annotations":{"a":"b"},
              "managedFields":[{"manager":"kubectl","fieldsV1":{"f:spec":{}}}],
              "ownerReferences":[{"kind":"ReplicaSet","name":"rs","uid":"u2","controller":true}]},
            "spec":{"nodeName":"n1","containers":[{"name":"c","image":"i:1",
              "ports":[{"name":"http","containerPort":8080,"protocol":"TCP"}],
              "env":[{"name":"X","value":"Y"}]}]},
            "status":{"phase":"Running","podIP":"10.0.0.5","hostIP":"192.168.1.2",
              "conditions":[{"type":"Ready","status":"True"}],
              "containerStatuses":[{"name":"c","containerID":"containerd://abc","image":"i:1"}]}}"#,
        )
        .expect("a pod parses");
        assert_eq!(
            pod.metadata.controller().map(|o| o.kind.as_str()),
            Some("ReplicaSet")
        );
        assert_eq!(pod.spec.containers[0].ports[0].container_port, 8080);
        assert_eq!(pod.status.ready(), "true");
        assert_eq!(
            pod.status.container_statuses[0].container_id,
            "containerd://abc"
        );
        assert_eq!(Pod::default().status.ready(), "unknown");
    }

    #[test]
    fn a_node_has_its_kubelet_port() {
        let node: Node = serde_json::from_str(
            r#"{"metadata":{"name":"n1"},"status":{"addresses":[{"type":"InternalIP","address":"10.1.1.1"}],
            "daemonEndpoints":{"kubeletEndpoint":{"Port":10250}}}}"#,
        )
        .expect("a node parses");
        assert_eq!(node.status.daemon_endpoints.kubelet_endpoint.port, 10250);
        assert_eq!(node.status.addresses[0].kind, "InternalIP");
    }
}
