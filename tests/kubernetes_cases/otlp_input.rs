//! The `k8s_attributes` processor on OTLP input from a real producer: the
//! official Python classes (`tests/peers/apps/otlp-python/send.py`) post
//! to proflow's OTLP/HTTP receiver from the pod's IP, and every profile of
//! the request is written with the pod's metadata.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::Kube;
use crate::common::{self, Ports, Proflow};
use crate::peer_env;

/// The resource attributes of every profile in an `otlp_json` file, as
/// `key=value` strings.
fn resource_attributes(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_default();
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", file.display()));
    let mut out = Vec::new();
    for rp in json["resourceProfiles"].as_array().into_iter().flatten() {
        for kv in rp["resource"]["attributes"]
            .as_array()
            .into_iter()
            .flatten()
        {
            if let (Some(k), Some(v)) = (kv["key"].as_str(), kv["value"]["stringValue"].as_str()) {
                out.push(format!("{k}={v}"));
            }
        }
    }
    out
}

#[test]
fn k8s_attributes_labels_otlp_profiles_from_the_python_client_by_its_pod() {
    let Some(kube) = Kube::get() else { return };
    let Some(python) = common::otlp_python_client() else {
        return;
    };
    // The sender connects from 127.0.0.1: the pod of the watched namespace
    // with that IP is the sender (no other pod of the namespace has it).
    let ns = kube.namespace("otlpin");
    kube.apply(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: shop-0\n  namespace: {ns}\n  labels: {{app: shop}}\n\
         spec:\n  nodeName: node-o\n  containers: [{{name: app, image: shop:2}}]\n"
    ));
    kube.run_pod(&ns, "shop-0", "127.0.0.1", &[("app", "containerd://e0")]);
    let http_port = common::free_port();
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}}}\n      http: {{endpoint: 127.0.0.1:{http_port}}}\n\
             processors:\n  k8s_attributes:\n    auth_type: kubeConfig\n    kubeconfig_file: {kc}\n    filter: {{namespace: {ns}}}\n    \
             wait_for_metadata: true\n    extract:\n      labels: [{{key: app}}]\n\
             exporters:\n  file:\n    directory: {}\n    format: otlp_json\n\
             service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      \
             processors: [k8s_attributes]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry,
            kc = kube.kubeconfig(),
        )
    });
    let tag = peer_env::unique("k8s-otlp-");
    let (status, output) = common::run_bounded(
        Command::new(&python)
            .arg(common::peers_dir().join("apps/otlp-python/send.py"))
            .arg("--url")
            .arg(format!(
                "http://127.0.0.1:{http_port}/v1development/profiles"
            ))
            .arg("--tag")
            .arg(&tag)
            .arg("--out")
            .arg(proflow.dir.path().join("sent.pb")),
        &proflow.dir.path().join("send.log"),
        Duration::from_secs(60),
    );
    assert!(status.success(), "send.py failed ({status}):\n{output}");
    // send.py sends three profiles of two services.
    let prefix = format!("{tag}-");
    let entries = proflow.wait_for_files(3, |e| {
        e.label("service_name")
            .is_some_and(|s| s.starts_with(&prefix))
    });
    assert_eq!(entries.len(), 3);
    for e in &entries {
        for (name, want) in [
            ("k8s_namespace_name", ns.as_str()),
            ("k8s_pod_name", "shop-0"),
            ("k8s_node_name", "node-o"),
            ("k8s_pod_labels_app", "shop"),
        ] {
            assert_eq!(e.label(name), Some(want), "{name}: {:?}", e.labels);
        }
        // Written back into the OTLP resource, with the semantic-convention
        // keys, beside what the client sent.
        let attributes = resource_attributes(&e.path);
        for want in [
            format!("k8s.namespace.name={ns}"),
            "k8s.pod.name=shop-0".to_owned(),
            "k8s.node.name=node-o".to_owned(),
        ] {
            assert!(
                attributes.contains(&want),
                "{want} not in {attributes:?} ({})",
                e.path.display()
            );
        }
        assert!(
            attributes.iter().any(|a| a.starts_with("service.name=")),
            "{attributes:?}"
        );
    }
}
