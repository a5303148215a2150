//! Discovery through trouble: the API server gone and back (targets kept,
//! then resynced), and a list page the memory budget cannot hold (refused,
//! then listed again).

use std::path::Path;
use std::time::{Duration, Instant};

use super::{Kube, pod_names as pods, start, targets, wait_discovered};
use crate::common::{Ports, Proflow};
use crate::peer_env;

#[test]
fn discovery_keeps_its_targets_while_the_api_server_is_gone_and_resyncs_when_it_is_back() {
    // An API server of this test's own: it is killed and started again.
    let Some(mut private) = peer_env::PrivatePeer::start("kube") else {
        return;
    };
    let kube = Kube {
        peer: private.peer().clone(),
    };
    let ns = kube.namespace("resync");
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  containers: [{{name: app, image: app:1, ports: [{{containerPort: 6060}}]}}]\n"
        )
    };
    kube.apply(&pod("before"));
    kube.run_pod(&ns, "before", "10.9.0.1", &[("app", "containerd://0a")]);
    let proflow = start(&format!(
        "- job_name: resync\n  scrape_interval: 60s\n  kubernetes_sd_configs:\n  - role: pod\n    kubeconfig_file: {kc}\n    namespaces: {{names: [{ns}]}}\n  \
         relabel_configs: [{{action: drop, regex: '.*', source_labels: [__address__]}}]\n  \
         profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}}}}}\n",
        kc = kube.kubeconfig()
    ));
    wait_discovered(&proflow, Duration::from_secs(20), |all| {
        pods(all) == ["before"]
    });

    // Gone (killed, as a crash would): the watch fails, the targets stay.
    private.kill();
    let failed = peer_env::poll(Duration::from_secs(20), || {
        proflow
            .log_text()
            .contains("Kubernetes watch failed")
            .then_some(())
    });
    assert!(
        failed.is_some(),
        "no watch failure logged\nlog:\n{}",
        proflow.log_text()
    );
    // The watch tries again while the server is gone: a listener of this
    // test's own on the server's address takes each retry's connection and
    // closes it. The second retry comes after the first one's failure was
    // handled (1 s, then 2 s of backoff); the targets are still there.
    // The killed server's socket may outlive the kill briefly.
    let mut last_error = String::new();
    let stand_in = peer_env::poll(Duration::from_secs(30), || {
        std::net::TcpListener::bind(private.endpoint())
            .map_err(|e| last_error = e.to_string())
            .ok()
    })
    .unwrap_or_else(|| {
        panic!(
            "bind {} in the 30 s after the kill: {last_error}",
            private.endpoint()
        )
    });
    stand_in.set_nonblocking(true).unwrap();
    let mut retries = 0;
    let retried = peer_env::poll(Duration::from_secs(90), || {
        while let Ok((conn, _)) = stand_in.accept() {
            drop(conn);
            retries += 1;
        }
        (retries >= 2).then_some(())
    });
    assert!(
        retried.is_some(),
        "the watch tried {retries} times in 90 s, not twice\nlog:\n{}",
        proflow.log_text()
    );
    drop(stand_in);
    wait_discovered(&proflow, Duration::from_secs(1), |all| {
        pods(all) == ["before"]
    });

    // Back, with the same data; what changed after it came back is seen.
    private.start_again();
    kube.delete_pod(&ns, "before");
    kube.apply(&pod("after"));
    kube.run_pod(&ns, "after", "10.9.0.2", &[("app", "containerd://0b")]);
    let back = Instant::now();
    wait_discovered(&proflow, Duration::from_secs(45), |all| {
        pods(all) == ["after"]
    });
    eprintln!(
        "resynced {:?} after the API server was back",
        back.elapsed()
    );
    assert!(
        proflow.log_text().contains("Kubernetes watch works again"),
        "no recovery logged\nlog:\n{}",
        proflow.log_text()
    );
}

#[test]
fn a_list_page_the_memory_budget_cannot_hold_is_refused_then_listed_again() {
    let Some(kube) = Kube::get() else { return };
    let ns = kube.namespace("budget");
    // 40 pods with a 200 KB annotation each: a list page of about 8 MB,
    // more than an 8 MiB budget lets one read hold (three quarters of it).
    let big = "x".repeat(200 * 1024);
    let pods: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: p{i}, namespace: {ns}, annotations: {{blob: {big}}}}}\nspec: {{containers: [{{name: app, image: app:1, ports: [{{containerPort: 6060}}]}}]}}\n"
            )
        })
        .collect();
    // `create`, not `apply`: apply would keep the blob in its
    // last-applied-configuration annotation after the blob is replaced.
    kube.kubectl(&["create", "-f", "-"], &pods.join("---\n"));
    for i in 0..40 {
        kube.run_pod(
            &ns,
            &format!("p{i}"),
            &format!("10.8.0.{}", i + 1),
            &[("app", "containerd://0c")],
        );
    }
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        format!(
            "receivers:\n  scrape:\n    scrape_configs:\n    - job_name: budget\n      scrape_interval: 60s\n      kubernetes_sd_configs:\n      \
             - {{role: pod, kubeconfig_file: {kc}, namespaces: {{names: [{ns}]}}}}\n      \
             relabel_configs: [{{action: drop, regex: '.*', source_labels: [__address__]}}]\n      \
             profiling_config: {{pprof_config: {{process_cpu: {{enabled: false}}, memory: {{enabled: false}}, mutex: {{enabled: false}}, block: {{enabled: false}}}}}}\n\
             exporters:\n  file:\n    directory: {}\n\
             service:\n  limits:\n    max_in_flight_bytes: 8MiB\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [scrape]\n      exporters: [file]\n",
            profiles.display(),
            ports.telemetry,
            kc = kube.kubeconfig(),
        )
    });
    let refused = peer_env::poll(Duration::from_secs(20), || {
        proflow
            .log_text()
            .contains("need more memory than the in-flight budget has for one read")
            .then_some(())
    });
    assert!(
        refused.is_some(),
        "the page was not refused\nlog:\n{}",
        proflow.log_text()
    );
    assert_eq!(
        targets(&proflow)["droppedTargets"]
            .as_array()
            .map(Vec::len)
            .unwrap_or(0),
        0
    );
    // Smaller pods: the next list (retried with backoff) fits.
    for i in 0..40 {
        kube.kubectl(
            &[
                "-n",
                &ns,
                "annotate",
                "pod",
                &format!("p{i}"),
                "blob=small",
                "--overwrite",
            ],
            "",
        );
    }
    wait_discovered(&proflow, Duration::from_secs(45), |all| all.len() == 40);
}
