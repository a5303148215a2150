//! `kubernetes_sd_configs` reaching the API server by `api_server` or a
//! kubeconfig with a client certificate (a private API server of the test,
//! which trusts client certificates of its CA), with `attach_metadata:
//! {namespace: true}`; and a watch whose version etcd has compacted away
//! (`410 Gone`) listing again.

use std::io::Read;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{Kube, label, pod_names as pods, start, wait_discovered};
use crate::{common, peer_env};

/// No scraping: the tests read discovery alone.
const NO_SCRAPE: &str = "  relabel_configs: [{action: drop, regex: '.*', source_labels: [__address__]}]\n  \
     profiling_config: {pprof_config: {process_cpu: {enabled: false}, memory: {enabled: false}, mutex: {enabled: false}, block: {enabled: false}}}\n";

fn private_kube(env: &[(&str, &str)]) -> Option<(peer_env::PrivatePeer, Kube)> {
    let private = peer_env::PrivatePeer::start_with("kube", env)?;
    let kube = Kube {
        peer: private.peer().clone(),
    };
    Some((private, kube))
}

/// `tls_config` with the API server's CA and, if `cert`, the client
/// certificate it trusts.
fn tls_config(kube: &Kube, cert: bool) -> String {
    let ca = kube.peer.var("CA_FILE");
    if cert {
        format!(
            "{{ca_file: {ca}, cert_file: {}, key_file: {}}}",
            kube.peer.var("CLIENT_CERT"),
            kube.peer.var("CLIENT_KEY")
        )
    } else {
        format!("{{ca_file: {ca}}}")
    }
}

#[test]
fn api_server_and_a_client_certificate_kubeconfig_find_pods_with_their_namespaces_metadata() {
    let Some((_private, kube)) = private_kube(&[]) else {
        return;
    };
    let watched = kube.namespace("certs");
    let other = kube.namespace("elsewhere");
    kube.kubectl(&["label", "namespace", &watched, "team=pay"], "");
    kube.kubectl(
        &["annotate", "namespace", &watched, "owner=ops@example"],
        "",
    );
    for ns in [&watched, &other] {
        kube.apply(&format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: {ns}}}\nspec:\n  containers: [{{name: app, image: app:1, ports: [{{containerPort: 6060}}]}}]\n"
        ));
    }
    kube.run_pod(&watched, "web", "10.7.0.1", &[("app", "containerd://a1")]);
    kube.run_pod(&other, "web", "10.7.0.2", &[("app", "containerd://a2")]);

    // A kubeconfig whose user is the client certificate alone (no token),
    // everything inline as kubeadm writes admin.conf.
    let b64 = |path: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .encode(std::fs::read(path).unwrap_or_else(|e| panic!("read {path}: {e}")))
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: cert\n\
             clusters: [{{name: peer, cluster: {{server: '{api}', certificate-authority-data: {ca}}}}}]\n\
             users: [{{name: client, user: {{client-certificate-data: {cert}, client-key-data: {key}}}}}]\n\
             contexts: [{{name: cert, context: {{cluster: peer, user: client}}}}]\n",
            api = kube.peer.var("API"),
            ca = b64(kube.peer.var("CA_FILE")),
            cert = b64(kube.peer.var("CLIENT_CERT")),
            key = b64(kube.peer.var("CLIENT_KEY")),
        ),
    )
    .expect("write the kubeconfig");

    let sd = |how: &str| {
        format!(
            "  kubernetes_sd_configs:\n  - role: pod\n    {how}\n    namespaces: {{names: [{watched}]}}\n    attach_metadata: {{namespace: true}}\n"
        )
    };
    let api = kube.peer.var("API");
    let jobs = [
        format!(
            "- job_name: by-url\n  scrape_interval: 60s\n{}{NO_SCRAPE}",
            sd(&format!(
                "api_server: {api}\n    tls_config: {}",
                tls_config(&kube, true)
            ))
        ),
        format!(
            "- job_name: by-kubeconfig\n  scrape_interval: 60s\n{}{NO_SCRAPE}",
            sd(&format!("kubeconfig_file: {}", kubeconfig.display()))
        ),
        // The same server without the certificate: anonymous, refused.
        format!(
            "- job_name: anonymous\n  scrape_interval: 60s\n{}{NO_SCRAPE}",
            sd(&format!(
                "api_server: {api}\n    tls_config: {}",
                tls_config(&kube, false)
            ))
        ),
    ]
    .concat();
    let proflow = start(&jobs);
    let of_job = |all: &[serde_json::Value], job: &str| -> Vec<serde_json::Value> {
        all.iter().filter(|l| l["job"] == job).cloned().collect()
    };
    let all = wait_discovered(&proflow, Duration::from_secs(20), |all| {
        of_job(all, "by-url").len() == 1 && of_job(all, "by-kubeconfig").len() == 1
    });
    for job in ["by-url", "by-kubeconfig"] {
        let target = &of_job(&all, job)[0];
        for (name, want) in [
            ("__address__", "10.7.0.1:6060"),
            ("__meta_kubernetes_namespace", watched.as_str()),
            ("__meta_kubernetes_pod_name", "web"),
            ("__meta_kubernetes_namespace_label_team", "pay"),
            ("__meta_kubernetes_namespace_labelpresent_team", "true"),
            (
                "__meta_kubernetes_namespace_annotation_owner",
                "ops@example",
            ),
            (
                "__meta_kubernetes_namespace_annotationpresent_owner",
                "true",
            ),
        ] {
            assert_eq!(label(target, name), want, "{job}: {name} of {target:#}");
        }
    }
    assert!(of_job(&all, "anonymous").is_empty(), "{all:#?}");
    // Without its certificate the client is anonymous, which RBAC refuses:
    // the certificate is what let the other two in.
    let refused = format!("listing pods at {api}: ");
    let log = proflow.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains(&refused) && l.contains("403") && l.contains("not allowed")),
        "the anonymous job was not refused with 403\nlog:\n{log}"
    );

    // The namespace's metadata is watched: a new label reaches the targets.
    let changed = Instant::now();
    kube.kubectl(
        &["label", "namespace", &watched, "team=search", "--overwrite"],
        "",
    );
    wait_discovered(&proflow, Duration::from_secs(10), |all| {
        ["by-url", "by-kubeconfig"].iter().all(|job| {
            of_job(all, job)
                .first()
                .is_some_and(|t| t["__meta_kubernetes_namespace_label_team"] == "search")
        })
    });
    eprintln!(
        "the namespace's new label was seen after {:?}",
        changed.elapsed()
    );
}

/// A TCP relay in front of the API server that the test can cut: open, it
/// passes connections through (TLS and all); closed, it ends the ones it
/// carries and drops new ones at once, as a network partition would.
struct Relay {
    port: u16,
    open: Arc<AtomicBool>,
    live: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    fn start(upstream: &str) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the relay");
        let port = listener.local_addr().expect("relay address").port();
        let open = Arc::new(AtomicBool::new(true));
        let live = Arc::new(Mutex::new(Vec::<TcpStream>::new()));
        let (o, l, upstream) = (open.clone(), live.clone(), upstream.to_owned());
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                if !o.load(Ordering::SeqCst) {
                    let _ = conn.shutdown(Shutdown::Both);
                    continue;
                }
                let Ok(server) = TcpStream::connect(&upstream) else {
                    continue;
                };
                let pairs = [
                    (conn.try_clone(), server.try_clone()),
                    (server.try_clone(), conn.try_clone()),
                ];
                if let Ok(mut held) = l.lock() {
                    held.extend([conn, server]);
                }
                for pair in pairs {
                    if let (Ok(mut from), Ok(mut to)) = pair {
                        std::thread::spawn(move || {
                            let _ = std::io::copy(&mut from, &mut to);
                            let _ = to.shutdown(Shutdown::Write);
                        });
                    }
                }
            }
        });
        Relay { port, open, live }
    }

    fn cut(&self) {
        self.open.store(false, Ordering::SeqCst);
        if let Ok(mut held) = self.live.lock() {
            for s in held.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }

    fn reopen(&self) {
        self.open.store(true, Ordering::SeqCst);
    }
}

/// etcd's current revision, and a compaction of everything before it,
/// through etcd's own JSON gateway.
fn compact_etcd(kube: &Kube) -> u64 {
    let base = format!("http://{}", kube.peer.var("ETCD_ENDPOINT"));
    let http = common::http_client();
    let post = |path: &str, body: String| -> serde_json::Value {
        let mut text = String::new();
        http.post(format!("{base}{path}"))
            .body(body)
            .send()
            .unwrap_or_else(|e| panic!("etcd {path}: {e}"))
            .read_to_string(&mut text)
            .expect("etcd answer");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("etcd {path}: {e}: {text}"))
    };
    let range = post("/v3/kv/range", r#"{"key":"AA=="}"#.to_owned());
    let revision: u64 = range["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {range}"));
    let compacted = post(
        "/v3/kv/compaction",
        format!(r#"{{"revision":"{revision}","physical":true}}"#),
    );
    assert!(
        compacted.get("code").is_none(),
        "compaction at {revision}: {compacted}"
    );
    revision
}

/// Lists of pods in a namespace the API server has answered (its own
/// request counter).
fn pod_lists(kube: &Kube) -> f64 {
    let metrics = kube.kubectl(&["get", "--raw", "/metrics"], "");
    common::metric_sum(
        &metrics,
        "apiserver_request_total",
        &[
            ("resource", "pods"),
            ("verb", "LIST"),
            ("scope", "namespace"),
            ("code", "200"),
        ],
    )
}

#[test]
fn a_watch_whose_version_etcd_compacted_away_lists_again_and_sees_what_changed_meanwhile() {
    // Without the watch cache the API server serves each watch from etcd,
    // which answers a compacted version with 410 Gone (the cache would
    // replay from its own window instead).
    let Some((_private, kube)) =
        private_kube(&[("PROFLOW_KUBE_APISERVER_FLAGS", "--watch-cache=false")])
    else {
        return;
    };
    let ns = kube.namespace("gone");
    let pod = |name: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}, namespace: {ns}}}\nspec:\n  containers: [{{name: app, image: app:1, ports: [{{containerPort: 6060}}]}}]\n"
        )
    };
    kube.apply(&pod("before"));
    kube.run_pod(&ns, "before", "10.6.0.1", &[("app", "containerd://b1")]);
    let relay = Relay::start(kube.peer.endpoint());
    let proflow = start(&format!(
        "- job_name: gone\n  scrape_interval: 60s\n  kubernetes_sd_configs:\n  - role: pod\n    \
         api_server: https://127.0.0.1:{port}\n    tls_config: {tls}\n    namespaces: {{names: [{ns}]}}\n{NO_SCRAPE}",
        port = relay.port,
        tls = tls_config(&kube, true),
    ));
    wait_discovered(&proflow, Duration::from_secs(20), |all| {
        pods(all) == ["before"]
    });
    let lists_before = pod_lists(&kube);
    let known = kube.kubectl(
        &[
            "-n",
            &ns,
            "get",
            "pod",
            "before",
            "-o",
            "jsonpath={.metadata.resourceVersion}",
        ],
        "",
    );

    // The watch is cut; while proflow cannot reach the server, the pod it
    // knows goes, another comes, and etcd forgets every version before now.
    relay.cut();
    let failed = peer_env::poll(Duration::from_secs(20), || {
        proflow
            .log_text()
            .contains("Kubernetes watch failed")
            .then_some(())
    });
    assert!(
        failed.is_some(),
        "the cut watch was not seen to fail\nlog:\n{}",
        proflow.log_text()
    );
    kube.kubectl(
        &[
            "-n",
            &ns,
            "delete",
            "pod",
            "before",
            "--grace-period=0",
            "--force",
            "--wait=false",
        ],
        "",
    );
    kube.apply(&pod("after"));
    kube.run_pod(&ns, "after", "10.6.0.2", &[("app", "containerd://b2")]);
    let revision = compact_etcd(&kube);
    // A watch from the version proflow last had (the `before` pod's, or a
    // bookmark's since) is refused now.
    let expired = kube.kubectl(
        &[
            "get",
            "--raw",
            &format!(
                "/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={known}&timeoutSeconds=1"
            ),
        ],
        "",
    );
    assert!(
        expired.contains("\"code\":410"),
        "a watch from {known} (etcd compacted at {revision}) was not refused with 410: {expired}"
    );

    relay.reopen();
    let back = Instant::now();
    wait_discovered(&proflow, Duration::from_secs(45), |all| {
        pods(all) == ["after"]
    });
    eprintln!(
        "listed again {:?} after the server was reachable",
        back.elapsed()
    );
    let lists_after = pod_lists(&kube);
    assert_eq!(
        lists_after,
        lists_before + 1.0,
        "pod lists the API server answered: {lists_before} before the cut, {lists_after} after"
    );
}
