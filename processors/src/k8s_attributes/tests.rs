use std::sync::{Arc, RwLock};

use proflow_core::telemetry::Telemetry;
use proflow_kube::Store;
use proflow_kube::objects::{Pod, ReplicaSet};
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload, ValueType};
use tokio_util::sync::CancellationToken;

use super::config::K8sAttributesProcessorConfig;
use super::index::{self, Caches, Extractor};
use super::telemetry::K8sAttributesTelemetry;
use super::{K8sAttributesProcessor, Rules};
use proflow_core::component::Processor;

fn store<K: proflow_kube::Resource>(json: &[&str]) -> Store<K> {
    Store::from_json(json).expect("objects parse")
}

const WEB: &str = r#"{"metadata":{"name":"web-5d4f-abcde","namespace":"shop","uid":"uid-web",
  "labels":{"app.kubernetes.io/name":"web","team":"pay"},"annotations":{"owner":"alice"},
  "ownerReferences":[{"kind":"ReplicaSet","name":"web-5d4f","controller":true}]},
  "spec":{"nodeName":"node-a","containers":[{"name":"app","image":"registry:5000/shop/web:1.4"},{"name":"proxy","image":"envoy"}]},
  "status":{"podIP":"10.0.0.7","podIPs":[{"ip":"10.0.0.7"},{"ip":"fd00::7"}],
  "containerStatuses":[{"name":"app","containerID":"containerd://aaa111"},{"name":"proxy","containerID":"containerd://bbb222"}]}}"#;
const AGENT: &str = r#"{"metadata":{"name":"agent-x","namespace":"kube-system","uid":"uid-agent",
  "ownerReferences":[{"kind":"DaemonSet","name":"agent","controller":true}]},
  "spec":{"nodeName":"node-a","hostNetwork":true,"containers":[{"name":"agent","image":"agent:2"}]},
  "status":{"podIP":"192.168.1.10"}}"#;
const BACKUP: &str = r#"{"metadata":{"name":"backup-29000100-xyz","namespace":"ops","uid":"uid-backup",
  "ownerReferences":[{"kind":"Job","name":"backup-29000100","controller":true}]},
  "spec":{"containers":[{"name":"run","image":"backup"}]},"status":{"podIP":"10.0.0.9"}}"#;

fn processor(yaml: &str) -> K8sAttributesProcessor {
    processor_and_telemetry(yaml).0
}

fn processor_and_telemetry(yaml: &str) -> (K8sAttributesProcessor, Arc<Telemetry>) {
    let config: K8sAttributesProcessorConfig = serde_saphyr::from_str(yaml).expect("config");
    assert!(config.problems().is_empty(), "{:?}", config.problems());
    let caches = Caches {
        pods: store::<Pod>(&[WEB, AGENT, BACKUP]),
        namespaces: None,
        nodes: None,
        replicasets: Some(store::<ReplicaSet>(&[
            r#"{"metadata":{"name":"web-5d4f","namespace":"shop","ownerReferences":[{"kind":"Deployment","name":"web","controller":true}]}}"#,
        ])),
        indexed: Default::default(),
    };
    let extractor = Extractor::new(&config.extract).expect("extract");
    let built = extractor.index(&caches);
    let telemetry = Arc::new(Telemetry::new());
    let p = K8sAttributesProcessor {
        rules: Rules::new(&config),
        index: Arc::new(RwLock::new(Arc::new(built))),
        caches: None,
        wait_until: None,
        telemetry: K8sAttributesTelemetry::new(&telemetry, "k8s_attributes"),
        passthrough: config.passthrough,
        trusted: config
            .trusted_senders
            .iter()
            .map(|t| t.parse().expect("trusted_senders"))
            .collect(),
        _stop: CancellationToken::new().drop_guard(),
    };
    (p, telemetry)
}

fn envelope(labels: &[(&str, &str)]) -> Envelope {
    Envelope {
        labels: Labels::from_pairs(labels.iter().copied()),
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: None,
        period: 0,
        payload: Payload::from_bytes(bytes::Bytes::from_static(b"\x1f\x8b"), 1 << 20),
    }
}

fn from(ip: &str) -> BatchMeta {
    BatchMeta {
        client: Some(std::net::SocketAddr::new(ip.parse().expect("ip"), 40000)),
        ..BatchMeta::default()
    }
}

async fn run(p: &K8sAttributesProcessor, e: Envelope, meta: &BatchMeta) -> Labels {
    p.process(vec![e], meta).await.remove(0).labels
}

#[tokio::test]
async fn an_ebpf_profile_finds_its_container_by_id() {
    let p = processor("{}");
    let l = run(
        &p,
        envelope(&[("container_id", "bbb222")]),
        &BatchMeta::default(),
    )
    .await;
    assert_eq!(l.get("k8s_pod_name"), Some("web-5d4f-abcde"));
    assert_eq!(l.get("k8s_namespace_name"), Some("shop"));
    assert_eq!(l.get("k8s_node_name"), Some("node-a"));
    assert_eq!(l.get("k8s_container_name"), Some("proxy"));
    assert_eq!(l.get("k8s_deployment_name"), Some("web"));
    assert_eq!(l.get("k8s_pod_uid"), Some("uid-web"));
    // Not in the default metadata.
    assert_eq!(l.get("k8s_replicaset_name"), None);
    assert_eq!(l.get("k8s_pod_start_time"), None);
}

#[tokio::test]
async fn a_pushed_profile_finds_its_pod_by_the_senders_address_of_either_family() {
    let p = processor("{}");
    for ip in ["10.0.0.7", "fd00::7", "::ffff:10.0.0.7"] {
        let l = run(&p, envelope(&[("service_name", "web")]), &from(ip)).await;
        assert_eq!(l.get("k8s_pod_name"), Some("web-5d4f-abcde"), "{ip}");
        // No container named: none added.
        assert_eq!(l.get("k8s_container_name"), None);
    }
    // A host-network pod's IP is its node's: it names no pod.
    let l = run(&p, envelope(&[]), &from("192.168.1.10")).await;
    assert_eq!(l.get("k8s_pod_name"), None);
}

#[tokio::test]
async fn a_trusted_senders_labels_stay_and_a_named_container_is_used() {
    let p = processor("trusted_senders: [10.0.0.0/24]");
    let l = run(
        &p,
        envelope(&[
            ("k8s_namespace_name", "mine"),
            ("k8s_container_name", "app"),
        ]),
        &from("10.0.0.7"),
    )
    .await;
    assert_eq!(l.get("k8s_namespace_name"), Some("mine"));
    assert_eq!(l.get("k8s_pod_name"), Some("web-5d4f-abcde"));
    assert_eq!(l.get("k8s_container_name"), Some("app"));
}

#[tokio::test]
async fn an_untrusted_sender_cannot_claim_another_pod() {
    let (p, telemetry) = processor_and_telemetry("{}");
    // From pod web's address, naming pod backup by its IP and uid, another
    // namespace, and another pod's container: written as web, in its own
    // namespace; the container name picks among web's containers.
    let l = run(
        &p,
        envelope(&[
            ("service_name", "web"),
            ("k8s_pod_ip", "10.0.0.9"),
            ("k8s_pod_uid", "uid-backup"),
            ("k8s_namespace_name", "payments"),
            ("k8s_container_name", "app"),
        ]),
        &from("10.0.0.7"),
    )
    .await;
    assert_eq!(l.get("k8s_pod_name"), Some("web-5d4f-abcde"));
    assert_eq!(l.get("k8s_pod_uid"), Some("uid-web"));
    assert_eq!(l.get("k8s_namespace_name"), Some("shop"));
    assert_eq!(l.get("k8s_container_name"), Some("app"));
    assert_eq!(l.get("k8s_pod_ip"), None);
    assert_eq!(l.get("service_name"), Some("web"));
    // Another pod's container id, from web's address: web, no container.
    let l = run(
        &p,
        envelope(&[("container_id", "bbb222")]),
        &from("10.0.0.7"),
    )
    .await;
    assert_eq!(l.get("k8s_pod_name"), Some("web-5d4f-abcde"));
    assert_eq!(l.get("container_id"), None);
    assert_eq!(l.get("k8s_container_name"), None);
    // From an address that names no pod, the claimed identity is removed
    // and nothing is put in its place.
    let l = run(
        &p,
        envelope(&[
            ("k8s_namespace_name", "payments"),
            ("k8s_pod_name", "billing-0"),
            ("k8s_deployment_name", "billing"),
            ("team", "pay"),
        ]),
        &from("192.0.2.1"),
    )
    .await;
    assert_eq!(l.get("k8s_namespace_name"), None);
    assert_eq!(l.get("k8s_pod_name"), None);
    assert_eq!(l.get("k8s_deployment_name"), None);
    assert_eq!(l.get("team"), Some("pay"));
    let text = telemetry.render();
    // 4 + 1 + 3 identity labels removed; the first two profiles found web.
    for want in [
        r#"untrusted_labels_removed_total{processor="k8s_attributes"} 8"#,
        r#"result="associated"} 2"#,
        r#"result="not_found"} 1"#,
    ] {
        assert!(text.contains(want), "{want} not in {text}");
    }
}

#[tokio::test]
async fn untrusted_senders_lose_the_names_extract_rules_give() {
    let p = processor(
        "extract:\n  metadata: [k8s.pod.name]\n  labels:\n  - {key: team}\n  - {tag_name: 'app.$1', key_regex: 'app\\.kubernetes\\.io/(.*)'}\n  - {key_regex: 'tier.*'}\n  annotations:\n  - {tag_name: owner, key: owner}\n",
    );
    let l = run(
        &p,
        envelope(&[
            ("k8s_pod_labels_team", "other"),
            ("app_name", "other"),
            ("k8s_pod_labels_tier_x", "other"),
            ("owner", "mallory"),
            ("region", "eu"),
        ]),
        &from("192.0.2.1"),
    )
    .await;
    let left: Vec<&str> = l.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(left, ["region"]);
}

#[test]
fn trusted_sender_ranges() {
    let net = |s: &str| s.parse::<super::config::IpNet>().expect(s);
    let ip = |s: &str| s.parse::<std::net::IpAddr>().expect(s);
    assert!(net("10.42.0.0/16").contains(ip("10.42.200.1")));
    assert!(!net("10.42.0.0/16").contains(ip("10.43.0.1")));
    assert!(net("10.42.0.0/16").contains(ip("::ffff:10.42.0.1")));
    assert!(net("192.0.2.7").contains(ip("192.0.2.7")));
    assert!(!net("192.0.2.7").contains(ip("192.0.2.8")));
    assert!(net("0.0.0.0/0").contains(ip("203.0.113.1")));
    assert!(!net("0.0.0.0/0").contains(ip("fd00::1")));
    assert!(net("fd00::/8").contains(ip("fd12::1")));
    assert!(!net("fd00::/8").contains(ip("fe80::1")));
    assert!(net("::/0").contains(ip("fe80::1")));
    assert!(net("::ffff:10.42.0.0/112").contains(ip("10.42.7.1")));
    assert!(net("::ffff:10.42.0.0/112").contains(ip("::ffff:10.42.7.1")));
    assert!(!net("::ffff:10.42.0.0/112").contains(ip("10.43.0.1")));
    for bad in [
        "10.0.0.0/33",
        "fd00::/129",
        "10.0.0/8",
        "",
        "10.0.0.1/x",
        "host",
    ] {
        assert!(bad.parse::<super::config::IpNet>().is_err(), "{bad}");
    }
}

#[tokio::test]
async fn owners_jobs_cronjobs_and_images_are_named() {
    let p = processor(
        "extract: {metadata: [k8s.job.name, k8s.cronjob.name, k8s.daemonset.name, container.image.name, container.image.tag, k8s.replicaset.name]}",
    );
    let l = run(
        &p,
        envelope(&[("k8s_pod_uid", "uid-backup")]),
        &BatchMeta::default(),
    )
    .await;
    assert_eq!(l.get("k8s_job_name"), Some("backup-29000100"));
    assert_eq!(l.get("k8s_cronjob_name"), Some("backup"));
    let l = run(
        &p,
        envelope(&[
            ("k8s_namespace_name", "kube-system"),
            ("k8s_pod_name", "agent-x"),
        ]),
        &BatchMeta::default(),
    )
    .await;
    assert_eq!(l.get("k8s_daemonset_name"), Some("agent"));
    let l = run(
        &p,
        envelope(&[("container_id", "containerd://aaa111")]),
        &BatchMeta::default(),
    )
    .await;
    assert_eq!(
        l.get("container_image_name"),
        Some("registry:5000/shop/web")
    );
    assert_eq!(l.get("container_image_tag"), Some("1.4"));
    assert_eq!(l.get("k8s_replicaset_name"), Some("web-5d4f"));
}

#[tokio::test]
async fn chosen_labels_and_annotations_are_added_by_key_or_regex() {
    let p = processor(
        "extract:\n  metadata: [k8s.pod.name]\n  labels:\n  - {key: team}\n  - {tag_name: 'app.$1', key_regex: 'app\\.kubernetes\\.io/(.*)'}\n  annotations:\n  - {tag_name: owner, key: owner}\n",
    );
    let l = run(&p, envelope(&[]), &from("10.0.0.7")).await;
    assert_eq!(l.get("k8s_pod_labels_team"), Some("pay"));
    assert_eq!(l.get("app_name"), Some("web"));
    assert_eq!(l.get("owner"), Some("alice"));
    assert_eq!(l.get("k8s_namespace_name"), None);
}

#[tokio::test]
async fn rules_are_tried_in_order_and_misses_are_counted_apart() {
    let (p, telemetry) = processor_and_telemetry(
        "pod_association:\n- sources: [{from: resource_attribute, name: k8s.pod.ip}]\n",
    );
    // The connection is not a source here.
    let l = run(&p, envelope(&[]), &from("10.0.0.7")).await;
    assert_eq!(l.get("k8s_pod_name"), None);
    let l = run(
        &p,
        envelope(&[("k8s_pod_ip", "10.0.0.9")]),
        &BatchMeta::default(),
    )
    .await;
    assert_eq!(l.get("k8s_pod_name"), Some("backup-29000100-xyz"));
    run(
        &p,
        envelope(&[("k8s_pod_ip", "10.9.9.9")]),
        &BatchMeta::default(),
    )
    .await;
    let text = telemetry.render();
    for want in [
        r#"result="associated"} 1"#,
        r#"result="not_found"} 1"#,
        r#"result="no_identifier"} 1"#,
    ] {
        assert!(text.contains(want), "{want} not in {text}");
    }
}

#[tokio::test]
async fn passthrough_adds_only_the_senders_address() {
    let p = processor("passthrough: true");
    let l = run(&p, envelope(&[]), &from("10.0.0.7")).await;
    assert_eq!(l.get("k8s_pod_ip"), Some("10.0.0.7"));
    assert_eq!(l.get("k8s_pod_name"), None);
}

#[test]
fn image_names_and_tags() {
    assert_eq!(index::image_name_and_tag("nginx"), ("nginx", "latest"));
    assert_eq!(index::image_name_and_tag("nginx:1.27"), ("nginx", "1.27"));
    assert_eq!(
        index::image_name_and_tag("registry:5000/a/b@sha256:00"),
        ("registry:5000/a/b", "latest")
    );
    assert_eq!(index::bare_container_id("cri-o://abc"), "abc");
    assert_eq!(index::bare_container_id("abc"), "abc");
}

#[test]
fn config_problems_name_their_fields() {
    let config: K8sAttributesProcessorConfig = serde_saphyr::from_str(
        "kubeconfig_file: /k\nfilter: {node: a, node_from_env_var: B, labels: [{key: 'a=b', op: exists, value: x}], fields: [{key: f, op: exists}]}\n\
         extract: {metadata: [k8s.pod.nope], labels: [{}], annotations: [{key_regex: '('}]}\n\
         pod_association: [{sources: [{from: resource_attribute}]}, {sources: [{from: resource_attribute, name: k8s.pod.name}]}, {sources: [{from: connection, name: x}]}, {sources: []}]\n\
         trusted_senders: [10.0.0.0/8, '10.0.0.0/40']\n",
    )
    .expect("parses");
    let paths: Vec<String> = config.problems().into_iter().map(|p| p.path).collect();
    for want in [
        "kubeconfig_file",
        "filter.node",
        "filter.labels.0.key",
        "filter.labels.0.value",
        "filter.fields.0.op",
        "extract.metadata.0",
        "extract.labels.0",
        "extract.annotations.0.key_regex",
        "pod_association.0.sources.0.name",
        "pod_association.1.sources",
        "pod_association.2.sources.0.name",
        "pod_association.3.sources",
        "trusted_senders.1",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
    }
    assert!(!paths.iter().any(|p| p == "trusted_senders.0"), "{paths:?}");
}
