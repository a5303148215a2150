//! Kubernetes discovery end to end, against a real API server
//! (`tests/peers/up kube`: kube-apiserver and etcd, no kubelet). Tests make
//! their objects with the real kubectl in a namespace of their own, and patch
//! pod status themselves (pod IPs, container ids), as a kubelet would.
//!
//! - `scrape` with `kubernetes_sd_configs`: pods found with Prometheus's
//!   `__meta_kubernetes_*` labels, annotation-driven relabelling as Prometheus
//!   and Alloy users write it, a real goscrape scraped at its pod IP, and a
//!   new or deleted pod followed within seconds;
//! - the endpoints, endpointslice, service and node roles' labels;
//! - the `k8s_attributes` processor on pushed profiles, by the sender's pod
//!   IP (tests/ebpf.rs has it on eBPF profiles, by container id), and on
//!   OTLP from the official Python classes (kubernetes_cases/otlp_input.rs);
//! - `api_server` and a client-certificate kubeconfig, `attach_metadata:
//!   {namespace: true}`, and a relist after `410 Gone`
//!   (kubernetes_cases/api_server.rs); in-cluster with `own_namespace`
//!   (kubernetes_cases/in_cluster.rs);
//! - the Helm chart's scraper rules for the `.port_name`, `.scheme` and
//!   `.path` annotations (kubernetes_cases/annotations.rs).

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/tls_front.rs"]
mod tls_front;

#[path = "kubernetes_cases/annotations.rs"]
mod annotations;
#[path = "kubernetes_cases/api_server.rs"]
mod api_server;
#[path = "kubernetes_cases/in_cluster.rs"]
mod in_cluster;
#[path = "kubernetes_cases/otlp_input.rs"]
mod otlp_input;
#[path = "kubernetes_cases/resilience.rs"]
mod resilience;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{Ports, Proflow};

/// The kube peer and kubectl pointed at it.
struct Kube {
    peer: peer_env::Peer,
}

impl Kube {
    fn get() -> Option<Kube> {
        peer_env::peer("kube").map(|peer| Kube { peer })
    }

    fn kubeconfig(&self) -> &str {
        self.peer.var("KUBECONFIG")
    }

    /// Runs kubectl with `args` and `stdin`; panics with its output on failure.
    fn kubectl(&self, args: &[&str], stdin: &str) -> String {
        peer_env::kubectl(&self.peer, args, stdin)
    }

    fn apply(&self, yaml: &str) {
        self.kubectl(&["apply", "-f", "-"], yaml);
    }

    /// Deletes a pod at once: no kubelet runs to confirm a graceful delete.
    fn delete_pod(&self, ns: &str, pod: &str) {
        self.kubectl(
            &[
                "-n",
                ns,
                "delete",
                "pod",
                pod,
                "--grace-period=0",
                "--force",
            ],
            "",
        );
    }

    /// A namespace of this test.
    fn namespace(&self, prefix: &str) -> String {
        let name = peer_env::unique(prefix);
        self.kubectl(&["create", "namespace", &name], "");
        name
    }

    /// Sets a pod's status as a kubelet would: running, ready, its IP and
    /// its containers' ids.
    fn run_pod(&self, ns: &str, pod: &str, ip: &str, containers: &[(&str, &str)]) {
        let statuses: Vec<String> = containers
            .iter()
            .map(|(name, id)| {
                format!(
                    r#"{{"name":"{name}","containerID":"{id}","image":"example/app:1","imageID":"","ready":true,"restartCount":0,"state":{{"running":{{}}}}}}"#
                )
            })
            .collect();
        let status = format!(
            r#"{{"phase":"Running","podIP":"{ip}","podIPs":[{{"ip":"{ip}"}}],"hostIP":"127.0.0.1","conditions":[{{"type":"Ready","status":"True"}}],"containerStatuses":[{}]}}"#,
            statuses.join(",")
        );
        peer_env::patch_pod_status(&self.peer, ns, pod, &status);
    }
}

/// proflow with one scrape job (`job`: a YAML list item, unindented) and a
/// `file` exporter.
fn start(job: &str) -> Proflow {
    Proflow::start(|ports: &Ports, profiles: &Path| {
        let job: String = job.lines().map(|l| format!("      {l}\n")).collect();
        format!(
            "receivers:\n  scrape:\n    scrape_configs:\n{job}exporters:\n  file:\n    directory: {}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      \
             receivers: [scrape]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry
        )
    })
}

/// `data` of `/targets`.
fn targets(proflow: &Proflow) -> serde_json::Value {
    let page: serde_json::Value = proflow
        .http()
        .get(format!("http://{}/targets", proflow.ports.telemetry))
        .send()
        .and_then(|r| r.text())
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    page["data"].clone()
}

/// The discovered labels of every target (active and dropped), once
/// `done` accepts them.
fn wait_discovered(
    proflow: &Proflow,
    timeout: Duration,
    done: impl Fn(&[serde_json::Value]) -> bool,
) -> Vec<serde_json::Value> {
    let mut last = Vec::new();
    let got = peer_env::poll(timeout, || {
        let page = targets(proflow);
        let mut all: Vec<serde_json::Value> = ["activeTargets", "droppedTargets"]
            .iter()
            .flat_map(|k| page[k].as_array().cloned().unwrap_or_default())
            .map(|t| t["discoveredLabels"].clone())
            .collect();
        all.sort_by_key(|l| l["__address__"].as_str().unwrap_or_default().to_owned());
        last = all.clone();
        done(&all).then_some(all)
    });
    got.unwrap_or_else(|| {
        panic!(
            "targets not as expected within {timeout:?}: {last:#?}\nlog:\n{}",
            proflow.log_text()
        )
    })
}

/// The sorted pod names (`__meta_kubernetes_pod_name`) of discovered
/// targets' labels.
fn pod_names(all: &[serde_json::Value]) -> Vec<String> {
    let mut names: Vec<String> = all
        .iter()
        .filter_map(|l| l["__meta_kubernetes_pod_name"].as_str().map(str::to_owned))
        .collect();
    names.sort();
    names
}

fn label<'a>(labels: &'a serde_json::Value, name: &str) -> &'a str {
    labels[name].as_str().unwrap_or("<absent>")
}

#[test]
fn pods_are_found_with_prometheus_labels_scraped_by_annotation_and_followed() {
    let Some(kube) = Kube::get() else { return };
    let Some(target) = peer_env::go_target(&[]) else {
        return;
    };
    let ns = kube.namespace("sd");
    // `web` is annotated for scraping (the Alloy/Pyroscope convention) and
    // declares the pprof port; `other` is not annotated.
    kube.apply(&format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: web
  namespace: {ns}
  labels: {{app.kubernetes.io/name: web, team: pay}}
  annotations: {{profiles.grafana.com/cpu.scrape: "true", profiles.grafana.com/cpu.port: "{port}"}}
  ownerReferences:
  - {{apiVersion: apps/v1, kind: ReplicaSet, name: web-5d4f, uid: 11111111-2222-3333-4444-555555555555, controller: true}}
spec:
  nodeName: node-a
  containers:
  - name: app
    image: example/app:1
    ports: [{{name: pprof, containerPort: {port}}}]
  - name: sidecar
    image: example/sidecar:2
---
apiVersion: v1
kind: Pod
metadata: {{name: other, namespace: {ns}}}
spec:
  containers: [{{name: app, image: example/app:1, ports: [{{containerPort: 9999}}]}}]
"#,
        port = target.port()
    ));
    kube.run_pod(
        &ns,
        "web",
        "127.0.0.1",
        &[
            ("app", "containerd://aaa111"),
            ("sidecar", "containerd://bbb222"),
        ],
    );
    kube.run_pod(&ns, "other", "127.0.0.2", &[("app", "containerd://ccc333")]);

    // Relabelling as Alloy's Kubernetes examples write it: keep annotated
    // pods, take the port from the annotation, name the series by pod.
    let proflow = start(&format!(
        r#"- job_name: kubernetes-pods
  scrape_interval: 2s
  kubernetes_sd_configs:
  - role: pod
    kubeconfig_file: {kubeconfig}
    namespaces: {{names: [{ns}]}}
  relabel_configs:
  - {{source_labels: [__meta_kubernetes_pod_annotation_profiles_grafana_com_cpu_scrape], action: keep, regex: "true"}}
  - {{source_labels: [__meta_kubernetes_pod_container_port_name], action: keep, regex: pprof}}
  - {{source_labels: [__address__, __meta_kubernetes_pod_annotation_profiles_grafana_com_cpu_port], action: replace, regex: '(.+):(\d+);(\d+)', replacement: '$1:$3', target_label: __address__}}
  - {{source_labels: [__meta_kubernetes_namespace], target_label: namespace}}
  - {{source_labels: [__meta_kubernetes_pod_name], target_label: pod}}
  - {{source_labels: [__meta_kubernetes_pod_container_name], target_label: container}}
  profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}}}}}
"#,
        kubeconfig = kube.kubeconfig()
    ));

    // Three targets: web's pprof port, web's sidecar (no port: the pod IP
    // alone) and other's port.
    let all = wait_discovered(&proflow, Duration::from_secs(20), |all| all.len() == 3);
    let web = all
        .iter()
        .find(|l| l["__address__"] == format!("127.0.0.1:{}", target.port()))
        .expect("web's pprof port is a target");
    for (name, want) in [
        ("__meta_kubernetes_namespace", ns.as_str()),
        ("__meta_kubernetes_pod_name", "web"),
        ("__meta_kubernetes_pod_ip", "127.0.0.1"),
        ("__meta_kubernetes_pod_ready", "true"),
        ("__meta_kubernetes_pod_phase", "Running"),
        ("__meta_kubernetes_pod_node_name", "node-a"),
        ("__meta_kubernetes_pod_host_ip", "127.0.0.1"),
        ("__meta_kubernetes_pod_label_app_kubernetes_io_name", "web"),
        (
            "__meta_kubernetes_pod_labelpresent_app_kubernetes_io_name",
            "true",
        ),
        ("__meta_kubernetes_pod_label_team", "pay"),
        (
            "__meta_kubernetes_pod_annotation_profiles_grafana_com_cpu_scrape",
            "true",
        ),
        (
            "__meta_kubernetes_pod_annotationpresent_profiles_grafana_com_cpu_port",
            "true",
        ),
        ("__meta_kubernetes_pod_controller_kind", "ReplicaSet"),
        ("__meta_kubernetes_pod_controller_name", "web-5d4f"),
        ("__meta_kubernetes_pod_container_name", "app"),
        ("__meta_kubernetes_pod_container_id", "containerd://aaa111"),
        ("__meta_kubernetes_pod_container_image", "example/app:1"),
        ("__meta_kubernetes_pod_container_init", "false"),
        ("__meta_kubernetes_pod_container_port_name", "pprof"),
        ("__meta_kubernetes_pod_container_port_number", target.port()),
        ("__meta_kubernetes_pod_container_port_protocol", "TCP"),
    ] {
        assert_eq!(label(web, name), want, "{name} of {web:#}");
    }
    assert!(
        !label(web, "__meta_kubernetes_pod_uid").is_empty()
            && label(web, "__meta_kubernetes_pod_uid") != "<absent>"
    );
    let sidecar = all
        .iter()
        .find(|l| l["__meta_kubernetes_pod_container_name"] == "sidecar")
        .expect("the sidecar is a target");
    assert_eq!(label(sidecar, "__address__"), "127.0.0.1");
    assert_eq!(
        label(sidecar, "__meta_kubernetes_pod_container_id"),
        "containerd://bbb222"
    );
    assert_eq!(
        label(sidecar, "__meta_kubernetes_pod_container_port_number"),
        "<absent>"
    );

    // Only web's pprof port is scraped; its profile carries the pod's labels.
    let entry = peer_env::poll(Duration::from_secs(20), || {
        common::read_index(&proflow.profiles)
            .into_iter()
            .find(|e| e.label("pod") == Some("web"))
    })
    .unwrap_or_else(|| panic!("no profile from pod web\nlog:\n{}", proflow.log_text()));
    assert_eq!(entry.label("namespace"), Some(ns.as_str()));
    assert_eq!(entry.label("container"), Some("app"));
    assert_eq!(entry.label("job"), Some("kubernetes-pods"));
    assert_eq!(
        entry.label("instance"),
        Some(format!("127.0.0.1:{}", target.port()).as_str())
    );
    let active = targets(&proflow)["activeTargets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(active.len(), 1, "{active:#?}");

    // Changes are followed: a pod deleted goes, a pod added comes.
    let changed = Instant::now();
    kube.delete_pod(&ns, "other");
    kube.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: late, namespace: {ns}}}\nspec:\n  containers: [{{name: app, image: example/app:1, ports: [{{containerPort: 7777}}]}}]\n"
    ));
    kube.run_pod(&ns, "late", "127.0.0.3", &[("app", "containerd://ddd444")]);
    let all = wait_discovered(&proflow, Duration::from_secs(10), |all| {
        all.iter()
            .any(|l| l["__meta_kubernetes_pod_name"] == "late")
            && !all
                .iter()
                .any(|l| l["__meta_kubernetes_pod_name"] == "other")
    });
    eprintln!("the change was seen after {:?}", changed.elapsed());
    assert_eq!(all.len(), 3, "{all:#?}");
}

#[test]
fn endpoints_endpointslice_service_and_node_roles_label_as_prometheus_does() {
    let Some(kube) = Kube::get() else { return };
    let ns = kube.namespace("roles");
    let node = peer_env::unique("node");
    kube.apply(&format!(
        r#"apiVersion: v1
kind: Node
metadata: {{name: {node}, labels: {{topology.kubernetes.io/zone: z1}}}}
---
apiVersion: v1
kind: Pod
metadata: {{name: api-0, namespace: {ns}, labels: {{app: api}}}}
spec:
  nodeName: {node}
  containers:
  - name: api
    image: example/api:3
    ports: [{{name: http, containerPort: 8080}}, {{name: pprof, containerPort: 6060}}]
---
apiVersion: v1
kind: Service
metadata: {{name: api, namespace: {ns}, labels: {{tier: backend}}, annotations: {{owner: pay}}}}
spec:
  selector: {{app: api}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: v1
kind: Endpoints
metadata: {{name: api, namespace: {ns}}}
subsets:
- addresses: [{{ip: 10.1.0.5, nodeName: {node}, targetRef: {{kind: Pod, name: api-0, namespace: {ns}}}}}]
  notReadyAddresses: [{{ip: 10.1.0.6}}]
  ports: [{{name: http, port: 8080, protocol: TCP}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {{name: api-abc, namespace: {ns}, labels: {{kubernetes.io/service-name: api}}}}
addressType: IPv4
endpoints:
- addresses: [10.1.0.5]
  conditions: {{ready: true, serving: true, terminating: false}}
  nodeName: {node}
  zone: z1
  targetRef: {{kind: Pod, name: api-0, namespace: {ns}}}
ports: [{{name: http, port: 8080, protocol: TCP}}]
"#
    ));
    kube.run_pod(&ns, "api-0", "10.1.0.5", &[("api", "containerd://eee555")]);
    // The node's status (addresses, kubelet port) as a kubelet reports it.
    kube.kubectl(
        &[
            "patch", "node", &node, "--subresource=status", "--type=merge", "-p",
            r#"{"status":{"addresses":[{"type":"Hostname","address":"host-a"},{"type":"InternalIP","address":"192.168.7.7"}],"daemonEndpoints":{"kubeletEndpoint":{"Port":10250}},"conditions":[{"type":"Ready","status":"True","lastHeartbeatTime":null,"lastTransitionTime":null,"reason":"KubeletReady","message":"ready"}]}}"#,
        ],
        "",
    );

    let job = |name: &str, role: &str, extra: &str| {
        format!(
            "- job_name: {name}\n  scrape_interval: 60s\n  kubernetes_sd_configs:\n  - role: {role}\n    kubeconfig_file: {kc}\n{extra}  relabel_configs: [{{action: drop, regex: '.*', source_labels: [__address__]}}]\n  profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}}}}}\n",
            kc = kube.kubeconfig()
        )
    };
    let in_ns = format!("    namespaces: {{names: [{ns}]}}\n    attach_metadata: {{node: true}}\n");
    let node_selector = format!("    selectors: [{{role: node, field: metadata.name={node}}}]\n");
    let jobs = [
        job("ep", "endpoints", &in_ns),
        job("eps", "endpointslice", &in_ns),
        job(
            "svc",
            "service",
            &format!("    namespaces: {{names: [{ns}]}}\n"),
        ),
        job("nodes", "node", &node_selector),
    ]
    .concat();
    let proflow = start(&jobs);
    // endpoints: 2 addresses + the pod's uncovered pprof port; endpointslice:
    // 1 address + the uncovered port; service: 1 port; node: 1.
    let all = wait_discovered(&proflow, Duration::from_secs(20), |all| all.len() == 7);
    let by = |job: &str, address: &str| {
        all.iter()
            .find(|l| l["job"] == job && l["__address__"] == address)
            .unwrap_or_else(|| panic!("no {job} target {address}: {all:#?}"))
    };
    let ready = by("ep", "10.1.0.5:8080");
    for (name, want) in [
        ("__meta_kubernetes_namespace", ns.as_str()),
        ("__meta_kubernetes_endpoints_name", "api"),
        ("__meta_kubernetes_service_name", "api"),
        ("__meta_kubernetes_service_label_tier", "backend"),
        ("__meta_kubernetes_service_annotation_owner", "pay"),
        ("__meta_kubernetes_endpoint_port_name", "http"),
        ("__meta_kubernetes_endpoint_port_protocol", "TCP"),
        ("__meta_kubernetes_endpoint_ready", "true"),
        ("__meta_kubernetes_endpoint_node_name", node.as_str()),
        ("__meta_kubernetes_endpoint_address_target_kind", "Pod"),
        ("__meta_kubernetes_endpoint_address_target_name", "api-0"),
        ("__meta_kubernetes_pod_name", "api-0"),
        ("__meta_kubernetes_pod_container_name", "api"),
        ("__meta_kubernetes_pod_container_port_name", "http"),
        ("__meta_kubernetes_node_name", node.as_str()),
        (
            "__meta_kubernetes_node_label_topology_kubernetes_io_zone",
            "z1",
        ),
    ] {
        assert_eq!(label(ready, name), want, "{name} of {ready:#}");
    }
    let not_ready = by("ep", "10.1.0.6:8080");
    assert_eq!(
        label(not_ready, "__meta_kubernetes_endpoint_ready"),
        "false"
    );
    assert_eq!(label(not_ready, "__meta_kubernetes_pod_name"), "<absent>");
    // The pod's pprof port, which no endpoint names, is a target at the pod IP.
    let uncovered = by("ep", "10.1.0.5:6060");
    assert_eq!(
        label(uncovered, "__meta_kubernetes_pod_container_port_name"),
        "pprof"
    );
    assert_eq!(
        label(uncovered, "__meta_kubernetes_endpoint_ready"),
        "<absent>"
    );

    let slice = by("eps", "10.1.0.5:8080");
    for (name, want) in [
        ("__meta_kubernetes_endpointslice_name", "api-abc"),
        ("__meta_kubernetes_endpointslice_address_type", "IPv4"),
        ("__meta_kubernetes_endpointslice_port", "8080"),
        ("__meta_kubernetes_endpointslice_port_name", "http"),
        (
            "__meta_kubernetes_endpointslice_endpoint_conditions_ready",
            "true",
        ),
        (
            "__meta_kubernetes_endpointslice_endpoint_conditions_serving",
            "true",
        ),
        (
            "__meta_kubernetes_endpointslice_endpoint_conditions_terminating",
            "false",
        ),
        ("__meta_kubernetes_endpointslice_endpoint_zone", "z1"),
        (
            "__meta_kubernetes_endpointslice_endpoint_node_name",
            node.as_str(),
        ),
        ("__meta_kubernetes_endpointslice_address_target_kind", "Pod"),
        ("__meta_kubernetes_service_name", "api"),
        ("__meta_kubernetes_pod_container_port_number", "8080"),
        ("__meta_kubernetes_node_name", node.as_str()),
    ] {
        assert_eq!(label(slice, name), want, "{name} of {slice:#}");
    }
    by("eps", "10.1.0.5:6060");

    let svc = by("svc", &format!("api.{ns}.svc:80"));
    for (name, want) in [
        ("__meta_kubernetes_service_name", "api"),
        ("__meta_kubernetes_service_port_name", "http"),
        ("__meta_kubernetes_service_port_number", "80"),
        ("__meta_kubernetes_service_port_protocol", "TCP"),
        ("__meta_kubernetes_service_type", "ClusterIP"),
        ("__meta_kubernetes_service_labelpresent_tier", "true"),
    ] {
        assert_eq!(label(svc, name), want, "{name} of {svc:#}");
    }
    assert!(
        label(svc, "__meta_kubernetes_service_cluster_ip").starts_with("10.96."),
        "{svc:#}"
    );

    let n = by("nodes", "192.168.7.7:10250");
    for (name, want) in [
        ("__meta_kubernetes_node_name", node.as_str()),
        (
            "__meta_kubernetes_node_label_topology_kubernetes_io_zone",
            "z1",
        ),
        ("__meta_kubernetes_node_address_InternalIP", "192.168.7.7"),
        ("__meta_kubernetes_node_address_Hostname", "host-a"),
        ("__meta_kubernetes_node_condition_ready", "true"),
        ("instance", node.as_str()),
    ] {
        assert_eq!(label(n, name), want, "{name} of {n:#}");
    }
}

/// A loopback address of this test to push from (Linux answers on all of
/// 127.0.0.0/8), as a pod IP no other test's pod has.
fn own_loopback_ip() -> std::net::Ipv4Addr {
    let n = peer_env::now_nanos() as u32 ^ std::process::id().rotate_left(16);
    std::net::Ipv4Addr::new(
        127,
        10 + (n % 200) as u8,
        (n >> 8) as u8,
        2 + (n >> 16) as u8 % 250,
    )
}

/// Pushes a small CPU profile for `app` from `from` to proflow's `/ingest`.
fn push_from(proflow: &Proflow, from: std::net::Ipv4Addr, app: &str) {
    let client = reqwest::blocking::Client::builder()
        .local_address(std::net::IpAddr::V4(from))
        .timeout(Duration::from_secs(15))
        .no_proxy()
        .build()
        .expect("client");
    let url = proflow.receiver_url(&common::ingest_query(app, Some("pprof")));
    let status = client
        .post(&url)
        .body(common::gzip(&common::cpu_profile()))
        .send()
        .map(|r| r.status().as_u16())
        .unwrap_or_else(|e| panic!("push from {from}: {e}"));
    assert_eq!(status, 200, "push from {from}");
}

#[test]
fn k8s_attributes_labels_a_pushed_profile_by_its_senders_pod_and_follows_a_new_ip() {
    let Some(kube) = Kube::get() else { return };
    let ns = kube.namespace("attr");
    let ip = own_loopback_ip();
    kube.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: checkout-0\n  namespace: {ns}\n  labels: {{app: checkout}}\n  \
         ownerReferences: [{{apiVersion: apps/v1, kind: StatefulSet, name: checkout, uid: 00000000-0000-0000-0000-0000000000aa, controller: true}}]\n\
         spec:\n  nodeName: node-b\n  containers: [{{name: app, image: checkout:3}}]\n"
    ));
    kube.run_pod(
        &ns,
        "checkout-0",
        &ip.to_string(),
        &[("app", "containerd://fff666")],
    );
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n\
             processors:\n  k8s_attributes:\n    auth_type: kubeConfig\n    kubeconfig_file: {kc}\n    filter: {{namespace: {ns}}}\n    \
             wait_for_metadata: true\n    extract:\n      labels: [{{key: app}}]\n\
             exporters:\n  file:\n    directory: {}\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      \
             processors: [k8s_attributes]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry,
            kc = kube.kubeconfig(),
        )
    });
    push_from(&proflow, ip, "checkout");
    // A sender that is no pod of the namespace, claiming checkout's IP and
    // uid and another namespace in its labels: no pod is found, and the
    // claimed identity is removed (only the connection names a pod).
    push_from(
        &proflow,
        std::net::Ipv4Addr::new(127, 0, 0, 1),
        &format!("stranger{{k8s_pod_ip={ip},k8s_pod_uid=x,k8s_namespace_name=payments,team=a}}"),
    );
    let entries = proflow.wait_for_files(2, |_| true);
    let checkout = entries
        .iter()
        .find(|e| e.label("service_name") == Some("checkout"))
        .expect("checkout's profile");
    for (name, want) in [
        ("k8s_namespace_name", ns.as_str()),
        ("k8s_pod_name", "checkout-0"),
        ("k8s_node_name", "node-b"),
        ("k8s_statefulset_name", "checkout"),
        ("k8s_pod_labels_app", "checkout"),
    ] {
        assert_eq!(
            checkout.label(name),
            Some(want),
            "{name}: {:?}",
            checkout.labels
        );
    }
    assert!(checkout.label("k8s_pod_uid").is_some_and(|u| !u.is_empty()));
    // Pushed without a container: none is named.
    assert_eq!(checkout.label("k8s_container_name"), None);
    let stranger = entries
        .iter()
        .find(|e| e.label("service_name") == Some("stranger"))
        .expect("the stranger's profile");
    for name in [
        "k8s_pod_name",
        "k8s_pod_ip",
        "k8s_pod_uid",
        "k8s_namespace_name",
    ] {
        assert_eq!(stranger.label(name), None, "{name}: {:?}", stranger.labels);
    }
    assert_eq!(stranger.label("team"), Some("a"), "{:?}", stranger.labels);

    // The pod gets a new IP (rescheduled): profiles from it are its own
    // within seconds of the change.
    let moved = std::net::Ipv4Addr::new(
        ip.octets()[0],
        ip.octets()[1],
        ip.octets()[2],
        ip.octets()[3] ^ 1,
    );
    let changed = Instant::now();
    kube.run_pod(
        &ns,
        "checkout-0",
        &moved.to_string(),
        &[("app", "containerd://fff666")],
    );
    let mut pushes = 0;
    let found = peer_env::poll(Duration::from_secs(10), || {
        pushes += 1;
        let app = format!("moved{pushes}");
        push_from(&proflow, moved, &app);
        std::thread::sleep(Duration::from_millis(300));
        common::read_index(&proflow.profiles).into_iter().find(|e| {
            e.label("service_name")
                .is_some_and(|s| s.starts_with("moved"))
                && e.label("k8s_pod_name") == Some("checkout-0")
        })
    });
    assert!(
        found.is_some(),
        "no profile from the new IP was labelled\nlog:\n{}",
        proflow.log_text()
    );
    eprintln!(
        "the new IP was used after {:?} ({pushes} pushes)",
        changed.elapsed()
    );
    let metrics = proflow.metrics();
    for (result, at_least) in [("associated", 2.0), ("not_found", 1.0)] {
        let n = common::metric_sum(
            &metrics,
            "proflow_k8s_attributes_profiles_total",
            &[("result", result)],
        );
        assert!(n >= at_least, "{result}: {n}\n{metrics}");
    }
    let removed = common::metric_sum(
        &metrics,
        "proflow_k8s_attributes_untrusted_labels_removed_total",
        &[],
    );
    assert_eq!(removed, 3.0, "{metrics}");
    let pods = common::metric_sum(
        &metrics,
        "proflow_k8s_attributes_cache_objects",
        &[("kind", "pods")],
    );
    assert_eq!(pods, 1.0, "{metrics}");
}
