//! The Helm chart's scraper rules (`deploy/helm/proflow`, mode `scraper`),
//! which read pods annotated as Grafana Alloy's chart reads them:
//! `profiles.grafana.com/<type>.port_name`, `.scheme` and `.path` each
//! choose how a real target (goscrape, behind nginx for TLS) is scraped.
//! The chart's config runs as rendered, but for where it finds the API
//! server (a kubeconfig, not a pod's ServiceAccount) and the CA it trusts
//! for `https` targets.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use super::{Kube, targets};
use crate::common::{self, Ports, Proflow};
use crate::{peer_env, tls_front};

/// The chart's config.yaml in mode scraper for the goroutine profile of
/// pods in `ns`, with `file` to `profiles` as its exporter; found with
/// `kubeconfig`, trusting `ca` for TLS targets.
fn chart_scraper_config(
    helm: &Path,
    kube: &Kube,
    ns: &str,
    ports: &Ports,
    profiles: &Path,
    ca: &Path,
) -> String {
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/proflow");
    let scratch = std::env::temp_dir();
    let manifest = peer_env::run_with_stdin(
        Command::new(helm)
            .env("HELM_CACHE_HOME", scratch.join("proflow-helm-cache"))
            .env("HELM_CONFIG_HOME", scratch.join("proflow-helm-config"))
            .arg("template")
            .arg("scraper")
            .arg(&chart)
            .args(["--namespace", ns, "--show-only", "templates/configmap.yaml"])
            .args([
                "--set",
                "mode=scraper",
                "--set",
                "scraper.scrapeInterval=2s",
            ])
            .args(["--set-json", &format!("scraper.namespaces=[\"{ns}\"]")])
            .args(["--set-json", "scraper.profiles=[\"goroutine\"]"])
            .args(["--set", "exporters.pyroscope=null", "--set-json"])
            .arg(format!(
                "exporters.file={{\"directory\":\"{}\"}}",
                profiles.display()
            ))
            .args([
                "--set",
                &format!("telemetryPort={}", ports.telemetry.port()),
            ]),
        "",
    );
    let json = kube.kubectl(
        &["create", "--dry-run=client", "-o", "json", "-f", "-"],
        &manifest,
    );
    let configmap: serde_json::Value =
        serde_json::from_str(&json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let rendered = configmap["data"]["config.yaml"]
        .as_str()
        .unwrap_or_else(|| panic!("no config.yaml in {configmap:#}"));
    // The telemetry listener on loopback (the chart binds 0.0.0.0).
    let rendered = rendered.replace(
        &format!("0.0.0.0:{}", ports.telemetry.port()),
        &ports.telemetry.to_string(),
    );
    let mut out = String::new();
    let (mut found, mut trusted) = (0, 0);
    for line in rendered.lines() {
        out.push_str(line);
        out.push('\n');
        let indent = &line[..line.len() - line.trim_start().len()];
        if line.trim() == "- role: pod" {
            out.push_str(&format!(
                "{indent}  kubeconfig_file: {}\n",
                kube.kubeconfig()
            ));
            found += 1;
        }
        if line.trim_start().starts_with("scrape_interval:") {
            out.push_str(&format!(
                "{indent}tls_config: {{ca_file: {}}}\n",
                ca.display()
            ));
            trusted += 1;
        }
    }
    assert_eq!((found, trusted), (1, 1), "one goroutine job:\n{rendered}");
    out
}

#[test]
fn the_charts_port_name_scheme_and_path_annotations_choose_how_a_real_target_is_scraped() {
    let Some(kube) = Kube::get() else { return };
    let helm = match common::deploy_tools() {
        Ok((helm, _)) => helm,
        Err(e) => match common::missing_peer(&format!("helm: {e}")) {
            Some(helm) => helm,
            None => return,
        },
    };
    let Some(nginx) = tls_front::nginx() else {
        return;
    };
    let Some(target) = peer_env::go_target(&[]) else {
        return;
    };
    let pki = common::pki::Pki::new();
    // Two TLS fronts of the same goscrape: one passes paths as they are,
    // one serves its profiles at the root (`/goroutine`), so only a scrape
    // that took the annotated path gets an answer there.
    let front = tls_front::TlsFront::start(
        &nginx,
        &pki,
        &[
            tls_front::Server {
                client_certs: false,
                http2: false,
                location: format!("proxy_pass http://{};", target.endpoint),
            },
            tls_front::Server {
                client_certs: false,
                http2: false,
                location: format!("proxy_pass http://{}/debug/pprof/;", target.endpoint),
            },
        ],
    );
    let (plain, as_is, at_root) = (
        target.port().to_owned(),
        front.ports[0].to_string(),
        front.ports[1].to_string(),
    );
    // A port nothing listens on, declared first: a scrape of it fails.
    let closed = common::free_port().to_string();

    let ns = kube.namespace("annot");
    let a = "profiles.grafana.com/goroutine";
    let pod = |name: &str, annotations: &str, ports: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  namespace: {ns}\n  annotations: {{{a}.scrape: \"true\", {annotations}}}\n\
             spec:\n  containers: [{{name: app, image: app:1, ports: [{ports}]}}]\n"
        )
    };
    kube.apply(
        &[
            pod(
                "by-name",
                &format!("{a}.port_name: pprof"),
                &format!("{{name: http, containerPort: {closed}}}, {{name: pprof, containerPort: {plain}}}"),
            ),
            pod(
                "by-scheme",
                &format!("{a}.port: \"{as_is}\", {a}.scheme: https"),
                &format!("{{name: http, containerPort: {closed}}}, {{name: pprof, containerPort: {as_is}}}"),
            ),
            pod(
                "by-path",
                &format!("{a}.port: \"{at_root}\", {a}.scheme: https, {a}.path: /goroutine"),
                &format!("{{name: pprof, containerPort: {at_root}}}"),
            ),
        ]
        .join("---\n"),
    );
    for name in ["by-name", "by-scheme", "by-path"] {
        kube.run_pod(&ns, name, "127.0.0.1", &[("app", "containerd://c0")]);
    }

    let ca = pki.file("ca.pem");
    let proflow = Proflow::start(|ports: &Ports, profiles: &Path| {
        chart_scraper_config(&helm, &kube, &ns, ports, profiles, &ca)
    });
    let scraped = peer_env::poll(Duration::from_secs(40), || {
        let entries = common::read_index(&proflow.profiles);
        let from = |pod: &str| entries.iter().any(|e| e.label("pod") == Some(pod));
        (from("by-name") && from("by-scheme") && from("by-path")).then_some(entries)
    });
    let active = targets(&proflow)["activeTargets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert!(
        scraped.is_some(),
        "not every pod was scraped within 40 s: {active:#?}\nlog:\n{}",
        proflow.log_text()
    );
    // One target a pod, each at the URL its annotations say, each up.
    let mut urls: Vec<(String, String, String)> = active
        .iter()
        .map(|t| {
            (
                t["labels"]["pod"].as_str().unwrap_or_default().to_owned(),
                t["scrapeUrl"].as_str().unwrap_or_default().to_owned(),
                t["health"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    urls.sort();
    let up = |pod: &str, url: String| (pod.to_owned(), url, "up".to_owned());
    assert_eq!(
        urls,
        vec![
            up(
                "by-name",
                format!("http://127.0.0.1:{plain}/debug/pprof/goroutine")
            ),
            up("by-path", format!("https://127.0.0.1:{at_root}/goroutine")),
            up(
                "by-scheme",
                format!("https://127.0.0.1:{as_is}/debug/pprof/goroutine")
            ),
        ],
        "{active:#?}"
    );
}
