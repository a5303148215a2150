//! From cached Kubernetes objects to target groups with Prometheus's
//! `__meta_kubernetes_*` labels, one function per role.
//!
//! Prometheus sends one group per object, with labels shared by its targets
//! and labels of each target; a [`TargetGroup`] here has shared labels only,
//! so each target becomes a group of its own: the object's labels with the
//! target's over them. The labels, their values and which targets exist
//! follow Prometheus's discovery (its docs, and its code where the docs say
//! less):
//! - object metadata: `<kind>_name`, `<kind>_label_<name>` and
//!   `<kind>_labelpresent_<name>`, `<kind>_annotation_<name>` and
//!   `<kind>_annotationpresent_<name>`, names sanitized character by
//!   character to `[a-zA-Z0-9_]`; attached namespace metadata has no name
//!   label;
//! - `pod`: a target per declared container port (containers, then init
//!   containers), or the pod IP alone for a container without ports; pods
//!   without an IP have none;
//! - `endpoints` / `endpointslice`: a target per address and port, with
//!   the backing pod's labels, and a target for each port of a backing
//!   pod's containers that no endpoint covers;
//! - `service`: a target per port at `<name>.<namespace>.svc:<port>`;
//! - `node`: the kubelet's address (InternalIP, InternalDNS, ExternalIP,
//!   ExternalDNS, LegacyHostIP, then Hostname) and port, `instance` the
//!   node's name.
//!
//! Groups come out sorted by object, so the same objects give the same list.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use proflow_kube::Store;
use proflow_kube::objects::{
    Container, EndpointSlice, Endpoints, Namespace, Node, ObjectMeta, Pod, Resource, Service,
};

use crate::scrape::discovery::TargetGroup;

const P: &str = "__meta_kubernetes_";

type Labels = BTreeMap<String, String>;
/// Pods that back endpoints, by namespace and name, with the ports the
/// endpoints named.
type BackingPods = BTreeMap<(String, String), (Arc<Pod>, BTreeSet<i32>)>;

/// The caches a role reads. Namespaced kinds have one store per watched
/// namespace (or one for all); nodes and namespaces are cluster-wide and
/// present only when the role or `attach_metadata` needs them.
#[derive(Default)]
pub struct Caches {
    pub pods: Vec<Store<Pod>>,
    pub services: Vec<Store<Service>>,
    pub endpoints: Vec<Store<Endpoints>>,
    pub slices: Vec<Store<EndpointSlice>>,
    pub nodes: Option<Store<Node>>,
    pub namespaces: Option<Store<Namespace>>,
    /// `attach_metadata.node`.
    pub attach_node: bool,
}

impl Caches {
    fn pod(&self, namespace: &str, name: &str) -> Option<Arc<Pod>> {
        self.pods.iter().find_map(|s| s.get(namespace, name))
    }

    fn service(&self, namespace: &str, name: &str) -> Option<Arc<Service>> {
        self.services.iter().find_map(|s| s.get(namespace, name))
    }

    fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.nodes.as_ref().and_then(|s| s.get("", name))
    }

    /// Every store synced once.
    pub fn synced(&self) -> bool {
        self.pods.iter().all(Store::synced)
            && self.services.iter().all(Store::synced)
            && self.endpoints.iter().all(Store::synced)
            && self.slices.iter().all(Store::synced)
            && self.nodes.as_ref().is_none_or(Store::synced)
            && self.namespaces.as_ref().is_none_or(Store::synced)
    }

    /// The namespace's metadata labels, when attached and known.
    fn namespace_labels(&self, out: &mut Labels, namespace: &str) {
        if let Some(ns) = self.namespaces.as_ref().and_then(|s| s.get("", namespace)) {
            meta_labels(out, "namespace", &ns.metadata, false);
        }
    }
}

/// Objects of `stores` sorted by namespace and name.
fn sorted<K: Resource>(stores: &[Store<K>]) -> Vec<Arc<K>> {
    let mut all: Vec<Arc<K>> = stores.iter().flat_map(Store::list).collect();
    all.sort_by(|a, b| {
        (&a.meta().namespace, &a.meta().name).cmp(&(&b.meta().namespace, &b.meta().name))
    });
    all
}

/// Prometheus's label-name sanitizing: every character outside
/// `[a-zA-Z0-9_]` becomes `_`.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

fn set(out: &mut Labels, name: &str, value: impl Into<String>) {
    out.insert(format!("{P}{name}"), value.into());
}

/// `<kind>_name` (when `with_name`), labels and annotations with their
/// `present` twins.
fn meta_labels(out: &mut Labels, kind: &str, meta: &ObjectMeta, with_name: bool) {
    if with_name {
        set(out, &format!("{kind}_name"), meta.name.as_str());
    }
    for (k, v) in &meta.labels {
        let k = sanitize(k);
        set(out, &format!("{kind}_label_{k}"), v.as_str());
        set(out, &format!("{kind}_labelpresent_{k}"), "true");
    }
    for (k, v) in &meta.annotations {
        let k = sanitize(k);
        set(out, &format!("{kind}_annotation_{k}"), v.as_str());
        set(out, &format!("{kind}_annotationpresent_{k}"), "true");
    }
}

fn bool_text(b: bool) -> &'static str {
    if b { "true" } else { "false" }
}

/// `host:port`, with an IPv6 host in brackets.
fn join_host_port(host: &str, port: impl std::fmt::Display) -> String {
    if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

fn target(shared: &Labels, address: String, own: Labels) -> TargetGroup {
    let mut labels = shared.clone();
    labels.extend(own);
    TargetGroup {
        targets: vec![address],
        labels,
    }
}

/// The pod's own labels (Prometheus's pod group labels, without the
/// namespace and attached metadata).
fn pod_labels(out: &mut Labels, pod: &Pod) {
    meta_labels(out, "pod", &pod.metadata, true);
    set(out, "pod_ip", pod.status.pod_ip.as_str());
    set(out, "pod_ready", pod.status.ready());
    set(out, "pod_phase", pod.status.phase.as_str());
    set(out, "pod_node_name", pod.spec.node_name.as_str());
    set(out, "pod_host_ip", pod.status.host_ip.as_str());
    set(out, "pod_uid", pod.metadata.uid.as_str());
    if let Some(c) = pod.metadata.controller() {
        if !c.kind.is_empty() {
            set(out, "pod_controller_kind", c.kind.as_str());
        }
        if !c.name.is_empty() {
            set(out, "pod_controller_name", c.name.as_str());
        }
    }
}

/// A pod's containers, then its init containers, each with whether it is
/// an init container.
fn containers(pod: &Pod) -> impl Iterator<Item = (&Container, bool)> {
    pod.spec
        .containers
        .iter()
        .map(|c| (c, false))
        .chain(pod.spec.init_containers.iter().map(|c| (c, true)))
}

fn node_labels(out: &mut Labels, node: &Node) {
    meta_labels(out, "node", &node.metadata, true);
}

/// Role `pod`.
pub fn pod_groups(caches: &Caches) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for pod in sorted(&caches.pods) {
        if pod.status.pod_ip.is_empty() {
            continue;
        }
        let mut shared = Labels::new();
        set(&mut shared, "namespace", pod.metadata.namespace.as_str());
        pod_labels(&mut shared, &pod);
        if caches.attach_node {
            match caches.node(&pod.spec.node_name) {
                Some(node) => node_labels(&mut shared, &node),
                None => continue,
            }
        }
        caches.namespace_labels(&mut shared, &pod.metadata.namespace);
        for (c, init) in containers(&pod) {
            let statuses = if init {
                &pod.status.init_container_statuses
            } else {
                &pod.status.container_statuses
            };
            let id = statuses
                .iter()
                .find(|s| s.name == c.name)
                .map_or("", |s| s.container_id.as_str());
            let mut own = Labels::new();
            set(&mut own, "pod_container_name", c.name.as_str());
            set(&mut own, "pod_container_id", id);
            set(&mut own, "pod_container_image", c.image.as_str());
            set(&mut own, "pod_container_init", bool_text(init));
            if c.ports.is_empty() {
                out.push(target(&shared, pod.status.pod_ip.clone(), own));
                continue;
            }
            for port in &c.ports {
                let mut own = own.clone();
                set(&mut own, "pod_container_port_name", port.name.as_str());
                set(
                    &mut own,
                    "pod_container_port_number",
                    port.container_port.to_string(),
                );
                set(
                    &mut own,
                    "pod_container_port_protocol",
                    port.protocol.as_str(),
                );
                out.push(target(
                    &shared,
                    join_host_port(&pod.status.pod_ip, port.container_port),
                    own,
                ));
            }
        }
    }
    out
}

/// The container labels of `pod`'s container that declares `port` (the
/// last one, as Prometheus finds it); `protocol` given overrides the
/// container port's.
fn matching_container(own: &mut Labels, pod: &Pod, port: i32, protocol: Option<&str>) -> bool {
    let Some((c, p, init)) = containers(pod)
        .flat_map(|(c, init)| c.ports.iter().map(move |p| (c, p, init)))
        .filter(|(_, p, _)| p.container_port == port)
        .last()
    else {
        return false;
    };
    set(own, "pod_container_name", c.name.as_str());
    set(own, "pod_container_image", c.image.as_str());
    set(own, "pod_container_port_name", p.name.as_str());
    set(own, "pod_container_port_number", port.to_string());
    set(
        own,
        "pod_container_port_protocol",
        protocol.unwrap_or(&p.protocol),
    );
    set(own, "pod_container_init", bool_text(init));
    true
}

/// Targets for the ports of `pods`' containers that no endpoint covered.
fn uncovered_ports(out: &mut Vec<TargetGroup>, shared: &Labels, pods: &BackingPods) {
    for (pod, covered) in pods.values() {
        if pod.status.pod_ip.is_empty() {
            continue;
        }
        for (c, init) in containers(pod) {
            for p in &c.ports {
                if covered.contains(&p.container_port) {
                    continue;
                }
                let mut own = Labels::new();
                pod_labels(&mut own, pod);
                set(&mut own, "pod_container_name", c.name.as_str());
                set(&mut own, "pod_container_image", c.image.as_str());
                set(&mut own, "pod_container_port_name", p.name.as_str());
                set(
                    &mut own,
                    "pod_container_port_number",
                    p.container_port.to_string(),
                );
                set(&mut own, "pod_container_port_protocol", p.protocol.as_str());
                set(&mut own, "pod_container_init", bool_text(init));
                out.push(target(
                    shared,
                    join_host_port(&pod.status.pod_ip, p.container_port),
                    own,
                ));
            }
        }
    }
}

/// The service's metadata labels (the endpoints roles attach only these).
fn service_meta(
    shared: &mut Labels,
    caches: &Caches,
    namespace: &str,
    name: &str,
) -> Option<Arc<Service>> {
    let service = caches.service(namespace, name)?;
    meta_labels(shared, "service", &service.metadata, true);
    Some(service)
}

/// Role `endpoints`.
pub fn endpoints_groups(caches: &Caches) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for ep in sorted(&caches.endpoints) {
        let ns = ep.metadata.namespace.as_str();
        let mut shared = Labels::new();
        set(&mut shared, "namespace", ns);
        meta_labels(&mut shared, "endpoints", &ep.metadata, true);
        service_meta(&mut shared, caches, ns, &ep.metadata.name);
        caches.namespace_labels(&mut shared, ns);
        let mut seen_pods = BackingPods::new();
        for subset in &ep.subsets {
            for port in &subset.ports {
                let addresses = subset
                    .addresses
                    .iter()
                    .map(|a| (a, true))
                    .chain(subset.not_ready_addresses.iter().map(|a| (a, false)));
                for (addr, ready) in addresses {
                    let mut own = Labels::new();
                    set(&mut own, "endpoint_port_name", port.name.as_str());
                    set(&mut own, "endpoint_port_protocol", port.protocol.as_str());
                    set(&mut own, "endpoint_ready", bool_text(ready));
                    if let Some(r) = &addr.target_ref {
                        set(&mut own, "endpoint_address_target_kind", r.kind.as_str());
                        set(&mut own, "endpoint_address_target_name", r.name.as_str());
                    }
                    if let Some(n) = &addr.node_name {
                        set(&mut own, "endpoint_node_name", n.as_str());
                    }
                    if !addr.hostname.is_empty() {
                        set(&mut own, "endpoint_hostname", addr.hostname.as_str());
                    }
                    if caches.attach_node {
                        let node = addr.node_name.clone().or_else(|| {
                            addr.target_ref
                                .as_ref()
                                .filter(|r| r.kind == "Node")
                                .map(|r| r.name.clone())
                        });
                        if let Some(node) = node.and_then(|n| caches.node(&n)) {
                            node_labels(&mut own, &node);
                        }
                    }
                    if let Some(r) = addr.target_ref.as_ref().filter(|r| r.kind == "Pod")
                        && let Some(pod) = caches.pod(ns, &r.name)
                    {
                        pod_labels(&mut own, &pod);
                        matching_container(&mut own, &pod, port.port, Some(&port.protocol));
                        seen_pods
                            .entry((ns.to_owned(), r.name.clone()))
                            .or_insert_with(|| (pod.clone(), BTreeSet::new()))
                            .1
                            .insert(port.port);
                    }
                    out.push(target(&shared, join_host_port(&addr.ip, port.port), own));
                }
            }
        }
        uncovered_ports(&mut out, &shared, &seen_pods);
    }
    out
}

/// Role `endpointslice`.
pub fn endpointslice_groups(caches: &Caches) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for slice in sorted(&caches.slices) {
        let ns = slice.metadata.namespace.as_str();
        let mut shared = Labels::new();
        set(&mut shared, "namespace", ns);
        set(
            &mut shared,
            "endpointslice_address_type",
            slice.address_type.as_str(),
        );
        meta_labels(&mut shared, "endpointslice", &slice.metadata, true);
        let service = slice
            .metadata
            .labels
            .get("kubernetes.io/service-name")
            .and_then(|name| service_meta(&mut shared, caches, ns, name));
        caches.namespace_labels(&mut shared, ns);
        // A dual-stack service's slice of its second family gives no
        // targets: the first family's slice has the same endpoints.
        if let Some(s) = &service
            && matches!(
                s.spec.ip_family_policy.as_str(),
                "PreferDualStack" | "RequireDualStack"
            )
            && s.spec
                .ip_families
                .first()
                .is_some_and(|f| *f != slice.address_type)
        {
            continue;
        }
        let mut seen_pods = BackingPods::new();
        for endpoint in &slice.endpoints {
            for port in &slice.ports {
                for addr in &endpoint.addresses {
                    let mut own = Labels::new();
                    if let Some(n) = &port.name {
                        set(&mut own, "endpointslice_port_name", n.as_str());
                    }
                    if let Some(p) = &port.protocol {
                        set(&mut own, "endpointslice_port_protocol", p.as_str());
                    }
                    if let Some(p) = port.port {
                        set(&mut own, "endpointslice_port", p.to_string());
                    }
                    if let Some(p) = &port.app_protocol {
                        set(&mut own, "endpointslice_port_app_protocol", p.as_str());
                    }
                    let c = &endpoint.conditions;
                    for (name, value) in [
                        ("ready", c.ready),
                        ("serving", c.serving),
                        ("terminating", c.terminating),
                    ] {
                        if let Some(v) = value {
                            set(
                                &mut own,
                                &format!("endpointslice_endpoint_conditions_{name}"),
                                bool_text(v),
                            );
                        }
                    }
                    if let Some(h) = &endpoint.hostname {
                        set(&mut own, "endpointslice_endpoint_hostname", h.as_str());
                    }
                    if let Some(r) = &endpoint.target_ref {
                        set(
                            &mut own,
                            "endpointslice_address_target_kind",
                            r.kind.as_str(),
                        );
                        set(
                            &mut own,
                            "endpointslice_address_target_name",
                            r.name.as_str(),
                        );
                    }
                    if let Some(n) = &endpoint.node_name {
                        set(&mut own, "endpointslice_endpoint_node_name", n.as_str());
                    }
                    if let Some(z) = &endpoint.zone {
                        set(&mut own, "endpointslice_endpoint_zone", z.as_str());
                    }
                    if caches.attach_node {
                        let node = endpoint
                            .target_ref
                            .as_ref()
                            .filter(|r| r.kind == "Node")
                            .map(|r| r.name.clone())
                            .or_else(|| endpoint.node_name.clone());
                        if let Some(node) = node.and_then(|n| caches.node(&n)) {
                            node_labels(&mut own, &node);
                        }
                    }
                    if let Some(r) = endpoint.target_ref.as_ref().filter(|r| r.kind == "Pod")
                        && let Some(pod) = caches.pod(ns, &r.name)
                    {
                        pod_labels(&mut own, &pod);
                        let entry = seen_pods
                            .entry((ns.to_owned(), r.name.clone()))
                            .or_insert_with(|| (pod.clone(), BTreeSet::new()));
                        if let Some(p) = port.port {
                            matching_container(&mut own, &pod, p, None);
                            entry.1.insert(p);
                        }
                    }
                    let address = match port.port {
                        Some(p) => join_host_port(addr, p),
                        None => addr.clone(),
                    };
                    out.push(target(&shared, address, own));
                }
            }
        }
        uncovered_ports(&mut out, &shared, &seen_pods);
    }
    out
}

/// Role `service`.
pub fn service_groups(caches: &Caches) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    for svc in sorted(&caches.services) {
        let ns = svc.metadata.namespace.as_str();
        let mut shared = Labels::new();
        set(&mut shared, "namespace", ns);
        meta_labels(&mut shared, "service", &svc.metadata, true);
        caches.namespace_labels(&mut shared, ns);
        let host = format!("{}.{ns}.svc", svc.metadata.name);
        for port in &svc.spec.ports {
            let mut own = Labels::new();
            set(&mut own, "service_port_name", port.name.as_str());
            set(&mut own, "service_port_number", port.port.to_string());
            set(&mut own, "service_port_protocol", port.protocol.as_str());
            set(&mut own, "service_type", svc.spec.kind.as_str());
            match svc.spec.kind.as_str() {
                "ExternalName" => {
                    set(
                        &mut own,
                        "service_external_name",
                        svc.spec.external_name.as_str(),
                    );
                }
                kind => {
                    set(&mut own, "service_cluster_ip", svc.spec.cluster_ip.as_str());
                    if kind == "LoadBalancer" {
                        let ips: Vec<&str> = svc
                            .status
                            .load_balancer
                            .ingress
                            .iter()
                            .map(|i| i.ip.as_str())
                            .filter(|ip| !ip.is_empty())
                            .collect();
                        let ip = if ips.is_empty() {
                            svc.spec.load_balancer_ip.clone()
                        } else {
                            ips.join(",")
                        };
                        set(&mut own, "service_loadbalancer_ip", ip);
                    }
                }
            }
            out.push(target(&shared, join_host_port(&host, port.port), own));
        }
    }
    out
}

/// The order in which a node's address types are tried.
const NODE_ADDRESS_ORDER: &[&str] = &[
    "InternalIP",
    "InternalDNS",
    "ExternalIP",
    "ExternalDNS",
    "LegacyHostIP",
    "Hostname",
];

/// Role `node`.
pub fn node_groups(caches: &Caches) -> Vec<TargetGroup> {
    let mut out = Vec::new();
    let Some(nodes) = &caches.nodes else {
        return out;
    };
    for node in sorted(std::slice::from_ref(nodes)) {
        let addresses = &node.status.addresses;
        let Some(address) = NODE_ADDRESS_ORDER
            .iter()
            .find_map(|kind| addresses.iter().find(|a| a.kind == *kind))
        else {
            tracing::warn!(node = %node.metadata.name, "node has no address; it is not a target");
            continue;
        };
        let mut shared = Labels::new();
        node_labels(&mut shared, &node);
        set(
            &mut shared,
            "node_provider_id",
            node.spec.provider_id.as_str(),
        );
        for c in &node.status.conditions {
            set(
                &mut shared,
                &format!("node_condition_{}", sanitize(&c.kind.to_lowercase())),
                c.status.to_lowercase(),
            );
        }
        let mut own = Labels::new();
        own.insert("instance".to_owned(), node.metadata.name.clone());
        for a in addresses {
            own.entry(format!("{P}node_address_{}", sanitize(&a.kind)))
                .or_insert_with(|| a.address.clone());
        }
        let port = node.status.daemon_endpoints.kubelet_endpoint.port;
        out.push(target(&shared, join_host_port(&address.address, port), own));
    }
    out
}
