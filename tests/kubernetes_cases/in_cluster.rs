//! `kubernetes_sd_configs` in-cluster, as in a pod: neither `api_server`
//! nor `kubeconfig_file`, the service host and port in the environment and a
//! ServiceAccount mount at `/var/run/secrets/kubernetes.io/serviceaccount`.
//! proflow runs in a mount namespace of its own (`unshare`), where a tmpfs
//! on /run holds that mount, so nothing of the host's /run is touched;
//! `own_namespace` is the namespace file of that mount.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::Kube;
use crate::{common, peer_env};

/// proflow in its own mount namespace, killed on drop.
struct InCluster {
    child: Child,
    telemetry: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl InCluster {
    fn start(kube: &Kube, namespace: &str, sd: &str) -> InCluster {
        let dir = tempfile::tempdir().expect("tempdir");
        let sa = dir.path().join("serviceaccount");
        std::fs::create_dir(&sa).expect("mkdir");
        std::fs::write(sa.join("token"), kube.peer.var("TOKEN")).expect("token");
        std::fs::write(sa.join("namespace"), namespace).expect("namespace");
        std::fs::copy(kube.peer.var("CA_FILE"), sa.join("ca.crt")).expect("ca.crt");
        let telemetry = format!("127.0.0.1:{}", common::free_port());
        let config = dir.path().join("proflow.yaml");
        std::fs::write(
            &config,
            format!(
                "receivers:\n  scrape:\n    scrape_configs:\n    - job_name: in-cluster\n      scrape_interval: 60s\n      \
                 kubernetes_sd_configs: [{sd}]\n      \
                 relabel_configs: [{{action: drop, regex: '.*', source_labels: [__address__]}}]\n      \
                 profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}}}}}\n\
                 exporters:\n  file:\n    directory: {}\n\
                 service:\n  telemetry:\n    address: {telemetry}\n  pipelines:\n    profiles:\n      receivers: [scrape]\n      exporters: [file]\n",
                dir.path().join("profiles").display()
            ),
        )
        .expect("config");
        let (host, port) = kube.peer.endpoint().rsplit_once(':').expect("host:port");
        let log = dir.path().join("proflow.log");
        let out = std::fs::File::create(&log).expect("log");
        let script = format!(
            "mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount && \
             mount --bind {sa} /run/secrets/kubernetes.io/serviceaccount && exec {bin} run -c {config}",
            sa = sa.display(),
            bin = env!("CARGO_BIN_EXE_proflow"),
            config = config.display(),
        );
        let child = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .env("KUBERNETES_SERVICE_HOST", host)
            .env("KUBERNETES_SERVICE_PORT", port)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .spawn()
            .expect("start unshare");
        let mut proflow = InCluster {
            child,
            telemetry,
            log,
            _dir: dir,
        };
        let ready = peer_env::poll(Duration::from_secs(30), || {
            if let Ok(Some(status)) = proflow.child.try_wait() {
                panic!("proflow exited with {status}:\n{}", proflow.log_text());
            }
            common::http_client()
                .get(format!("http://{}/readyz", proflow.telemetry))
                .send()
                .ok()
                .filter(|r| r.status().is_success())
        });
        assert!(
            ready.is_some(),
            "proflow in-cluster not ready:\n{}",
            proflow.log_text()
        );
        proflow
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The discovered labels of every target, once `done` accepts them.
    fn wait_discovered(
        &self,
        timeout: Duration,
        done: impl Fn(&[serde_json::Value]) -> bool,
    ) -> Vec<serde_json::Value> {
        let mut last = Vec::new();
        peer_env::poll(timeout, || {
            let page: serde_json::Value = common::http_client()
                .get(format!("http://{}/targets", self.telemetry))
                .send()
                .and_then(|r| r.text())
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
            last = ["activeTargets", "droppedTargets"]
                .iter()
                .flat_map(|k| page["data"][k].as_array().cloned().unwrap_or_default())
                .map(|t| t["discoveredLabels"].clone())
                .collect();
            done(&last).then(|| last.clone())
        })
        .unwrap_or_else(|| {
            panic!(
                "targets not as expected within {timeout:?}: {last:#?}\nlog:\n{}",
                self.log_text()
            )
        })
    }
}

impl Drop for InCluster {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- in-cluster proflow log ----\n{}", self.log_text());
        }
    }
}

#[test]
fn in_cluster_own_namespace_is_the_service_accounts_namespace_with_its_metadata() {
    let Some(kube) = Kube::get() else { return };
    let own = kube.namespace("own");
    let listed = kube.namespace("listed");
    let neither = kube.namespace("neither");
    kube.kubectl(&["label", "namespace", &own, "team=own"], "");
    for (i, ns) in [&own, &listed, &neither].into_iter().enumerate() {
        kube.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: app, namespace: {ns}}}\nspec:\n  containers: [{{name: app, image: app:1, ports: [{{containerPort: 6060}}]}}]\n"
        ));
        kube.run_pod(
            ns,
            "app",
            &format!("10.5.0.{}", i + 1),
            &[("app", "containerd://d0")],
        );
    }
    let proflow = InCluster::start(
        &kube,
        &own,
        &format!(
            "{{role: pod, namespaces: {{own_namespace: true, names: [{listed}]}}, attach_metadata: {{namespace: true}}}}"
        ),
    );
    let namespaces = |all: &[serde_json::Value]| -> Vec<String> {
        let mut n: Vec<String> = all
            .iter()
            .filter_map(|l| l["__meta_kubernetes_namespace"].as_str().map(str::to_owned))
            .collect();
        n.sort();
        n
    };
    let mut want = vec![own.clone(), listed.clone()];
    want.sort();
    let all = proflow.wait_discovered(Duration::from_secs(20), |all| namespaces(all) == want);
    let mine = all
        .iter()
        .find(|l| l["__meta_kubernetes_namespace"] == own.as_str())
        .expect("the own namespace's pod");
    assert_eq!(
        mine["__meta_kubernetes_namespace_label_team"], "own",
        "{mine:#}"
    );
    assert_eq!(mine["__address__"], "10.5.0.1:6060", "{mine:#}");
}
