//! The deployment artefacts, against the real things: the Helm chart
//! (`deploy/helm/proflow`) linted, rendered and installed in every mode on a
//! real API server (`tests/peers/up kube`), each rendered config checked by
//! `proflow validate`; and the container image (`deploy/image`) built with
//! podman and run as the chart runs it: the chart's own config, its
//! ServiceAccount's token and the API server's CA mounted where a pod has
//! them, so the node agent names the pod of a process in a container's
//! cgroup, the gateway labels a push with its sender's pod and the scraper
//! finds an annotated pod and scrapes it, with no more rights than the chart's
//! RBAC grants (and the agent no more privileges than the chart gives it).
//!
//! The image is built from the debug binary the tests use (the build script
//! builds the release binary by default; the image is the same otherwise).
//! Containers run with `--network host` on free ports, with podman's runc
//! runtime and explicit rlimits: this machine's cgroups are hybrid (crun
//! refuses them) and its open-files ceiling is below podman's default.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

struct Tools {
    helm: PathBuf,
    podman: PathBuf,
    kube: peer_env::Peer,
}

impl Tools {
    fn get() -> Option<Tools> {
        let (helm, podman) = match common::deploy_tools() {
            Ok(t) => t,
            Err(e) => return common::missing_peer(&format!("helm and podman: {e}")),
        };
        let kube = peer_env::peer("kube")?;
        Some(Tools { helm, podman, kube })
    }

    fn chart() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/helm/proflow")
    }

    fn helm(&self, args: &[&str]) -> String {
        peer_env::run_with_stdin(
            Command::new(&self.helm)
                .env("KUBECONFIG", self.kube.var("KUBECONFIG"))
                .env(
                    "HELM_CACHE_HOME",
                    std::env::temp_dir().join("proflow-helm-cache"),
                )
                .env(
                    "HELM_CONFIG_HOME",
                    std::env::temp_dir().join("proflow-helm-config"),
                )
                .args(args),
            "",
        )
    }

    fn kubectl(&self, args: &[&str], stdin: &str) -> String {
        peer_env::kubectl(&self.kube, args, stdin)
    }

    /// `helm template` of the chart with `set` (`--set` and `--set-json`
    /// pairs), sent to the API server as a server-side dry run: the objects
    /// it accepted, as it would store them.
    fn render_and_dry_run(&self, release: &str, ns: &str, set: &[&str]) -> Vec<Value> {
        self.render(release, ns, set, &["apply", "--dry-run=server"])
    }

    /// `helm template` of the chart as JSON objects, converted by kubectl
    /// alone (no API server).
    fn render_only(&self, release: &str, ns: &str, set: &[&str]) -> Vec<Value> {
        self.render(release, ns, set, &["create", "--dry-run=client"])
    }

    fn render(&self, release: &str, ns: &str, set: &[&str], how: &[&str]) -> Vec<Value> {
        let chart = Tools::chart();
        let mut args = vec![
            "template",
            release,
            chart.to_str().expect("utf-8 path"),
            "--namespace",
            ns,
        ];
        args.extend_from_slice(set);
        let manifests = self.helm(&args);
        let mut args = how.to_vec();
        args.extend_from_slice(&["-o", "json", "-f", "-"]);
        let json = self.kubectl(&args, &manifests);
        // A List (server), or one object after another (client).
        let mut objects = Vec::new();
        for parsed in serde_json::Deserializer::from_str(&json).into_iter::<Value>() {
            let parsed = parsed.unwrap_or_else(|e| panic!("{e}: {json}"));
            match parsed["kind"].as_str() {
                Some("List") => {
                    objects.extend(parsed["items"].as_array().cloned().unwrap_or_default())
                }
                _ => objects.push(parsed),
            }
        }
        objects
    }

    /// A namespace of this test with the chart installed in `mode` (the
    /// release's ServiceAccount and RBAC are what the container then uses):
    /// `(namespace, release)`.
    fn installed(&self, mode: &str) -> (String, String) {
        let ns = peer_env::unique(mode);
        self.kubectl(&["create", "namespace", &ns], "");
        let release = format!("{mode}{}", std::process::id());
        let chart = Tools::chart();
        let set = format!("mode={mode}");
        self.helm(&[
            "install",
            &release,
            chart.to_str().expect("utf-8"),
            "--namespace",
            &ns,
            "--set",
            &set,
        ]);
        (ns, release)
    }

    /// Sets a pod's status (JSON) as its kubelet would.
    fn patch_status(&self, ns: &str, pod: &str, status: &str) {
        peer_env::patch_pod_status(&self.kube, ns, pod, status);
    }

    /// A token of ServiceAccount `sa` in `ns` (the TokenRequest API), and
    /// a directory laid out as a pod's ServiceAccount mount.
    fn service_account_mount(&self, ns: &str, sa: &str) -> tempfile::TempDir {
        let token = self.kubectl(&["-n", ns, "create", "token", sa, "--duration=1h"], "");
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("token"), token.trim()).expect("token");
        std::fs::write(dir.path().join("namespace"), ns).expect("namespace");
        std::fs::copy(self.kube.var("CA_FILE"), dir.path().join("ca.crt")).expect("ca");
        open_to_all(dir.path());
        dir
    }
}

/// Lets the image's user (65532) read a directory of this test (and write
/// it: the file exporter's output).
fn open_to_all(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777));
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let _ = std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o644));
    }
}

fn object<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} among {:?}", kinds(objects)))
}

fn kinds(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o["kind"].as_str().unwrap_or("?"),
                o["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// `proflow validate` of every ConfigMap's config.yaml among `objects`.
fn validate_configs(objects: &[Value]) -> usize {
    let mut n = 0;
    // Every ConfigMap but the dashboards' holds a config.
    for cm in objects.iter().filter(|o| {
        o["kind"] == "ConfigMap"
            && !o["metadata"]["name"]
                .as_str()
                .is_some_and(|n| n.ends_with("-dashboards"))
    }) {
        let config = cm["data"]["config.yaml"].as_str().expect("config.yaml");
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("config.yaml");
        std::fs::write(&file, config).expect("write config");
        let out = Command::new(env!("CARGO_BIN_EXE_proflow"))
            .args(["validate", "-c"])
            .arg(&file)
            .output()
            .expect("run proflow validate");
        assert!(
            out.status.success(),
            "the chart's config of {} is not valid: {}{}\n{config}",
            cm["metadata"]["name"],
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        n += 1;
    }
    n
}

fn container(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]["containers"][0]
}

#[test]
fn the_chart_lints_and_a_real_api_server_takes_every_mode_with_valid_configs() {
    let Some(tools) = Tools::get() else { return };
    let chart = Tools::chart();
    let chart = chart.to_str().expect("utf-8 path");
    for mode in ["agent", "gateway", "scraper"] {
        tools.helm(&["lint", chart, "--set", &format!("mode={mode}")]);
    }
    let ns = peer_env::unique("chart");
    tools.kubectl(&["create", "namespace", &ns], "");

    // Node agent: a DaemonSet with hostPID, root, and only the capabilities
    // eBPF needs; RBAC to read pods and ReplicaSets.
    let agent = tools.render_and_dry_run("agent", &ns, &["--set", "mode=agent"]);
    assert_eq!(validate_configs(&agent), 1);
    let ds = object(&agent, "DaemonSet");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true, "{ds:#}");
    assert_eq!(pod["securityContext"]["runAsUser"], 0);
    let caps = &container(ds)["securityContext"]["capabilities"];
    assert_eq!(
        caps["add"],
        serde_json::json!(["BPF", "PERFMON", "SYS_PTRACE"])
    );
    assert_eq!(caps["drop"], serde_json::json!(["ALL"]));
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "Unconfined"
    );
    assert_eq!(pod["tolerations"][0]["operator"], "Exists");
    let role = object(&agent, "ClusterRole");
    let resources: Vec<&Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .map(|r| &r["resources"])
        .collect();
    assert_eq!(
        resources,
        [
            &serde_json::json!(["pods"]),
            &serde_json::json!(["replicasets"])
        ]
    );
    for rule in role["rules"].as_array().expect("rules") {
        assert_eq!(rule["verbs"], serde_json::json!(["get", "list", "watch"]));
    }

    // Gateway: a Deployment and its Service, not root, no capabilities.
    let gateway = tools.render_and_dry_run("gateway", &ns, &["--set", "mode=gateway"]);
    assert_eq!(validate_configs(&gateway), 1);
    let deploy = object(&gateway, "Deployment");
    assert_eq!(
        deploy["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"],
        true
    );
    assert_eq!(
        container(deploy)["securityContext"]["capabilities"]["add"],
        Value::Null
    );
    let ports: Vec<i64> = object(&gateway, "Service")["spec"]["ports"]
        .as_array()
        .expect("ports")
        .iter()
        .filter_map(|p| p["port"].as_i64())
        .collect();
    assert_eq!(ports, [4040, 4317, 4318]);
    // By default the gateway trusts no sender's pod labels; agents of the
    // chart that push to it can be trusted by their addresses.
    let config_of = |objects: &[Value]| {
        object(objects, "ConfigMap")["data"]["config.yaml"]
            .as_str()
            .expect("config.yaml")
            .to_owned()
    };
    assert!(!config_of(&gateway).contains("trusted_senders"));
    let trusting = tools.render_only(
        "trusting",
        &ns,
        &[
            "--set",
            "mode=gateway",
            "--set-json",
            "gateway.trustedSenders=[\"10.42.0.0/16\",\"fd00::/8\"]",
        ],
    );
    assert_eq!(validate_configs(&trusting), 1);
    let config = config_of(&trusting);
    assert!(
        config.contains(r#"trusted_senders: ["10.42.0.0/16","fd00::/8"]"#),
        "{config}"
    );

    // Gateway with a Kafka fleet: the pushing gateways write to Kafka, the
    // consumers read and export.
    let fleet = tools.render_and_dry_run(
        "fleet",
        &ns,
        &[
            "--set",
            "mode=gateway",
            "--set",
            "gateway.kafka.enabled=true",
            "--set-json",
            "gateway.kafka.brokers=[\"kafka-0:9092\"]",
        ],
    );
    assert_eq!(validate_configs(&fleet), 2);
    let deployments: Vec<&str> = fleet
        .iter()
        .filter(|o| o["kind"] == "Deployment")
        .filter_map(|o| o["metadata"]["name"].as_str())
        .collect();
    assert_eq!(deployments, ["fleet-proflow-consumer", "fleet-proflow"]);

    // Every mode ships a NetworkPolicy: telemetry only from the monitoring
    // namespace; the gateway's receivers from everyone.
    for (mode, objects) in [("agent", &agent), ("gateway", &gateway)] {
        let policy = object(objects, "NetworkPolicy");
        let ingress = policy["spec"]["ingress"].as_array().expect("ingress rules");
        assert_eq!(
            ingress[0]["ports"][0]["port"], "telemetry",
            "{mode}: {policy:#}"
        );
        assert_eq!(
            ingress[0]["from"][0]["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"],
            "monitoring",
            "{mode}: {policy:#}"
        );
        assert_eq!(
            ingress.len(),
            if mode == "gateway" { 2 } else { 1 },
            "{policy:#}"
        );
        if mode == "gateway" {
            assert_eq!(
                ingress[1]["from"],
                Value::Null,
                "receivers open to all: {policy:#}"
            );
            assert_eq!(ingress[1]["ports"].as_array().map(Vec::len), Some(3));
        }
    }

    // Scraper: a Deployment with RBAC to read pods only.
    let scraper = tools.render_and_dry_run("scraper", &ns, &["--set", "mode=scraper"]);
    assert_eq!(validate_configs(&scraper), 1);
    object(&scraper, "Deployment");
    assert_eq!(
        object(&scraper, "ClusterRole")["rules"]
            .as_array()
            .map(Vec::len),
        Some(1)
    );

    // `helm install` of each mode, as a user runs it.
    for mode in ["agent", "gateway", "scraper"] {
        let release = format!("{mode}-{}", std::process::id());
        tools.helm(&[
            "install",
            &release,
            chart,
            "--namespace",
            &ns,
            "--set",
            &format!("mode={mode}"),
        ]);
        let kind = if mode == "agent" {
            "daemonset"
        } else {
            "deployment"
        };
        let name = format!("{release}-proflow");
        let got = tools.kubectl(
            &[
                "-n",
                &ns,
                "get",
                kind,
                &name,
                "-o",
                "jsonpath={.metadata.name}",
            ],
            "",
        );
        assert_eq!(got, name);
        tools.helm(&["uninstall", &release, "--namespace", &ns]);
    }
}

/// The image, built once per test process: its name. Building it removes
/// the test images of earlier runs, with any container that uses them, so
/// the tests of this file run one at a time (cargo nextest runs each test in
/// a process of its own; `.config/nextest.toml` puts them in the `podman`
/// group).
fn image(tools: &Tools) -> String {
    static IMAGE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    IMAGE
        .get_or_init(|| {
            // Images of earlier runs go first (each is ~90 MB).
            let old = Command::new(&tools.podman)
                .args([
                    "images",
                    "--filter",
                    "reference=localhost/proflow-test",
                    "--format",
                    "{{.Repository}}:{{.Tag}}",
                ])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            for image in old.lines().filter(|l| !l.is_empty()) {
                let _ = Command::new(&tools.podman)
                    .args(["rmi", "--force", image])
                    .output();
            }
            let tag = format!("localhost/proflow-test:{}", std::process::id());
            let build = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/image/build");
            let out = peer_env::run_with_stdin(
                Command::new(build).env("PODMAN", &tools.podman).args([
                    "--binary",
                    env!("CARGO_BIN_EXE_proflow"),
                    "--tag",
                    &tag,
                ]),
                "",
            );
            assert_eq!(out.trim(), tag);
            tag
        })
        .clone()
}

/// A container of the image, removed on drop.
struct Container {
    podman: PathBuf,
    name: String,
    _config: tempfile::TempDir,
    /// Directories mounted into the container, kept while it runs (proflow
    /// reads the ServiceAccount token when it lists, not only at start).
    mounts: Vec<tempfile::TempDir>,
}

impl Container {
    /// Runs the image with `config` as /etc/proflow/config.yaml, `sa` as the
    /// ServiceAccount mount and the API server as the in-cluster service,
    /// `out` as /out; read-only root as the chart runs it.
    /// `extra`: more `podman run` options.
    fn start_with(tools: &Tools, config: &str, sa: &Path, out: &Path, extra: &[&str]) -> Container {
        let image = image(tools);
        let config_dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(config_dir.path().join("config.yaml"), config).expect("config");
        open_to_all(config_dir.path());
        open_to_all(out);
        let name = peer_env::unique("proflow-test-");
        let api = tools.kube.var("ENDPOINT");
        let (host, port) = api.rsplit_once(':').expect("host:port");
        let mount = |from: &Path, to: &str, mode: &str| format!("{}:{to}:{mode}", from.display());
        peer_env::run_with_stdin(
            Command::new(&tools.podman)
                .args([
                    "--runtime",
                    "runc",
                    "run",
                    "--detach",
                    "--name",
                    &name,
                    "--network",
                    "host",
                    "--ulimit",
                    "nofile=1024:4096",
                    "--ulimit",
                    "nproc=1024:1024",
                    "--read-only",
                    "--env",
                    &format!("KUBERNETES_SERVICE_HOST={host}"),
                    "--env",
                    &format!("KUBERNETES_SERVICE_PORT={port}"),
                    "--volume",
                    &mount(config_dir.path(), "/etc/proflow", "ro"),
                    "--volume",
                    &mount(sa, "/var/run/secrets/kubernetes.io/serviceaccount", "ro"),
                    "--volume",
                    &mount(out, "/out", "rw"),
                ])
                .args(extra)
                .arg(&image),
            "",
        );
        Container {
            podman: tools.podman.clone(),
            name,
            _config: config_dir,
            mounts: Vec::new(),
        }
    }

    fn logs(&self) -> String {
        Command::new(&self.podman)
            .args(["logs", &self.name])
            .output()
            .map(|o| {
                format!(
                    "{}{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&o.stderr)
                )
            })
            .unwrap_or_default()
    }

    /// SIGTERM, then the exit code.
    fn stop(&self) -> i64 {
        peer_env::run_with_stdin(
            Command::new(&self.podman).args(["stop", "--time", "20", &self.name]),
            "",
        );
        let code = peer_env::run_with_stdin(
            Command::new(&self.podman).args([
                "inspect",
                "--format",
                "{{.State.ExitCode}}",
                &self.name,
            ]),
            "",
        );
        code.trim().parse().unwrap_or(-1)
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new(&self.podman)
            .args(["rm", "--force", &self.name])
            .output();
    }
}

/// A container of the image running the chart's `config` as `release`'s
/// pod would (its ServiceAccount mounted), with `extra` podman options,
/// ready on `telemetry`; and the directory its `file` exporter writes.
fn run_as_chart(
    tools: &Tools,
    config: &str,
    (ns, release): (&str, &str),
    telemetry: u16,
    extra: &[&str],
) -> (Container, tempfile::TempDir) {
    let sa = tools.service_account_mount(ns, &format!("{release}-proflow"));
    let out = tempfile::tempdir().expect("tempdir");
    let mut container = Container::start_with(tools, config, sa.path(), out.path(), extra);
    container.mounts.push(sa);
    wait_ready(&format!("127.0.0.1:{telemetry}"), &container);
    (container, out)
}

/// The chart's config.yaml for `set`, with a `file` exporter to /out as
/// the only exporter.
fn chart_config(tools: &Tools, release: &str, ns: &str, set: &[&str]) -> String {
    let mut all = vec![
        "--set",
        "exporters.pyroscope=null",
        "--set-json",
        "exporters.file={\"directory\":\"/out\"}",
    ];
    all.extend_from_slice(set);
    let objects = tools.render_only(release, ns, &all);
    object(&objects, "ConfigMap")["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml")
        .to_owned()
}

fn wait_ready(telemetry: &str, container: &Container) {
    let ready = peer_env::poll(Duration::from_secs(30), || {
        common::http_client()
            .get(format!("http://{telemetry}/readyz"))
            .send()
            .ok()
            .filter(|r| r.status().is_success())
    });
    assert!(
        ready.is_some(),
        "the container never became ready:\n{}",
        container.logs()
    );
}

#[test]
fn the_image_runs_the_charts_gateway_which_labels_a_push_with_its_senders_pod() {
    let Some(tools) = Tools::get() else { return };
    let (ns, release) = tools.installed("gateway");
    let release = &release;
    // The sender: a pod with a loopback address of this test (127.220/14:
    // tests/kubernetes.rs takes its addresses below that).
    let n = peer_env::now_nanos() as u32 ^ std::process::id();
    let ip = std::net::Ipv4Addr::new(
        127,
        220 + (n % 30) as u8,
        (n >> 8) as u8,
        2 + ((n >> 16) % 250) as u8,
    );
    tools.kubectl(
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: sender, namespace: {ns}}}\nspec: {{containers: [{{name: app, image: app:1}}]}}\n"),
    );
    tools.patch_status(&ns, "sender", &format!(r#"{{"podIP":"{ip}"}}"#));
    let (pprof, grpc, http, telemetry) = (
        common::free_port(),
        common::free_port(),
        common::free_port(),
        common::free_port(),
    );
    let config = chart_config(
        &tools,
        release,
        &ns,
        &[
            "--set",
            "mode=gateway",
            "--set",
            &format!("gateway.ports.pprof={pprof}"),
            "--set",
            &format!("gateway.ports.otlpGrpc={grpc}"),
            "--set",
            &format!("gateway.ports.otlpHttp={http}"),
            "--set",
            &format!("telemetryPort={telemetry}"),
        ],
    );
    let (container, out) = run_as_chart(&tools, &config, (&ns, release), telemetry, &[]);

    let client = reqwest::blocking::Client::builder()
        .local_address(std::net::IpAddr::V4(ip))
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("client");
    // The pod may reach the gateway's cache a moment after it starts.
    let labelled = peer_env::poll(Duration::from_secs(20), || {
        let status = client
            .post(format!(
                "http://127.0.0.1:{pprof}{}",
                common::ingest_query("sender-app", Some("pprof"))
            ))
            .body(common::gzip(&common::cpu_profile()))
            .send()
            .map(|r| r.status().as_u16())
            .unwrap_or(0);
        assert_eq!(status, 200, "push to the container:\n{}", container.logs());
        std::thread::sleep(Duration::from_millis(500));
        common::read_index(out.path())
            .into_iter()
            .find(|e| e.label("k8s_pod_name") == Some("sender"))
    });
    let entry = labelled
        .unwrap_or_else(|| panic!("no push was labelled with its pod:\n{}", container.logs()));
    assert_eq!(entry.label("k8s_namespace_name"), Some(ns.as_str()));
    assert_eq!(entry.label("service_name"), Some("sender-app"));
    assert_eq!(
        container.stop(),
        0,
        "exit after SIGTERM:\n{}",
        container.logs()
    );
}

#[test]
fn the_image_runs_the_charts_scraper_which_finds_and_scrapes_an_annotated_pod() {
    let Some(tools) = Tools::get() else { return };
    let Some(target) = peer_env::go_target(&[]) else {
        return;
    };
    let (ns, release) = tools.installed("scraper");
    let release = &release;
    // Two pods: one annotated as Alloy's chart reads it, one not.
    tools.kubectl(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata:\n  name: api\n  namespace: {ns}\n  annotations: {{profiles.grafana.com/goroutine.scrape: \"true\", profiles.grafana.com/goroutine.port: \"{port}\"}}\n\
             spec:\n  containers:\n  - {{name: server, image: api:1, ports: [{{name: http, containerPort: 8080}}, {{name: pprof, containerPort: {port}}}]}}\n  - {{name: proxy, image: envoy:1}}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {{name: quiet, namespace: {ns}}}\nspec: {{containers: [{{name: app, image: app:1, ports: [{{containerPort: {port}}}]}}]}}\n",
            port = target.port()
        ),
    );
    for pod in ["api", "quiet"] {
        tools.patch_status(&ns, pod, r#"{"phase":"Running","podIP":"127.0.0.1"}"#);
    }
    let telemetry = common::free_port();
    let config = chart_config(
        &tools,
        release,
        &ns,
        &[
            "--set",
            "mode=scraper",
            "--set",
            "scraper.scrapeInterval=2s",
            "--set-json",
            &format!("scraper.namespaces=[\"{ns}\"]"),
            "--set-json",
            "scraper.profiles=[\"goroutine\",\"cpu\"]",
            "--set",
            &format!("telemetryPort={telemetry}"),
        ],
    );
    let (container, out) = run_as_chart(&tools, &config, (&ns, release), telemetry, &[]);
    let entry = peer_env::poll(Duration::from_secs(30), || {
        common::read_index(out.path()).into_iter().next()
    })
    .unwrap_or_else(|| panic!("nothing was scraped:\n{}", container.logs()));
    for (name, want) in [
        ("__name__", "goroutine"),
        ("namespace", ns.as_str()),
        ("pod", "api"),
        ("container", "server"),
        ("service_name", format!("{ns}/server").as_str()),
        ("instance", format!("127.0.0.1:{}", target.port()).as_str()),
        ("job", "kubernetes-pods-goroutine"),
    ] {
        assert_eq!(entry.label(name), Some(want), "{name}: {:?}", entry.labels);
    }
    // Only the annotated pod's pprof port, only its goroutine profile.
    let text = common::http_client()
        .get(format!(
            "http://127.0.0.1:{telemetry}/api/v1/targets?state=active"
        ))
        .send()
        .and_then(|r| r.text())
        .expect("targets");
    let page: Value = serde_json::from_str(&text).expect("targets JSON");
    let active = page["data"]["activeTargets"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(active.len(), 1, "{page:#}");
    assert_eq!(
        container.stop(),
        0,
        "exit after SIGTERM:\n{}",
        container.logs()
    );
}

#[test]
fn the_image_runs_the_charts_node_agent_which_names_the_pod_of_every_profiled_process() {
    let Some(tools) = Tools::get() else { return };
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Uid:"))
                .map(|v| v.split_whitespace().next().unwrap_or("?").to_owned())
        });
    assert_eq!(
        uid.as_deref(),
        Some("0"),
        "the node agent loads a BPF program: run the test command as root, as CI does"
    );
    let (ns, release) = tools.installed("agent");
    let release = &release;
    // A busy process in a container's cgroup, and the pod the kubelet would
    // report for that container, on this "node".
    let node = peer_env::unique("node");
    let child = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("start a busy shell");
    let child = common::KillOnDrop(child);
    let cgroup = common::ContainerCgroup::enter(child.0.id());
    tools.kubectl(
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: busy-0, namespace: {ns}}}\n\
             spec: {{nodeName: {node}, containers: [{{name: main, image: busy:1}}]}}\n"
        ),
    );
    tools.patch_status(
        &ns,
        "busy-0",
        &format!(
            r#"{{"phase":"Running","podIP":"10.77.0.7","containerStatuses":[{{"name":"main","containerID":"containerd://{}","image":"busy:1","imageID":"","ready":true,"restartCount":0,"state":{{"running":{{}}}}}}]}}"#,
            cgroup.id
        ),
    );
    let telemetry = common::free_port();
    let config = chart_config(
        &tools,
        release,
        &ns,
        &[
            "--set",
            "mode=agent",
            "--set",
            "agent.collectInterval=2s",
            "--set",
            &format!("telemetryPort={telemetry}"),
        ],
    );
    // As the chart runs it: root, the host's PIDs, the capabilities it adds,
    // no seccomp profile (agent.seccompProfile).
    let (container, out) = run_as_chart(
        &tools,
        &config,
        (&ns, release),
        telemetry,
        &[
            "--pid",
            "host",
            "--user",
            "0:0",
            "--cap-drop",
            "all",
            "--security-opt",
            "seccomp=unconfined",
            "--cap-add",
            "CAP_BPF,CAP_PERFMON,CAP_SYS_PTRACE",
            "--env",
            &format!("KUBE_NODE_NAME={node}"),
        ],
    );
    let pid = child.0.id().to_string();
    let entry = peer_env::poll(Duration::from_secs(40), || {
        common::read_index(out.path())
            .into_iter()
            .find(|e| e.label("pid") == Some(pid.as_str()))
    })
    .unwrap_or_else(|| panic!("no profile of the busy process:\n{}", container.logs()));
    for (name, want) in [
        ("container_id", cgroup.id.as_str()),
        ("k8s_namespace_name", ns.as_str()),
        ("k8s_pod_name", "busy-0"),
        ("k8s_container_name", "main"),
        ("k8s_node_name", node.as_str()),
        ("service_name", format!("{ns}/main").as_str()),
    ] {
        assert_eq!(entry.label(name), Some(want), "{name}: {:?}", entry.labels);
    }
    assert_eq!(
        container.stop(),
        0,
        "exit after SIGTERM:\n{}",
        container.logs()
    );
    drop(child);
}

/// With `monitoring.enabled=true` each mode ships a PodMonitor (the gateway
/// a ServiceMonitor on its Service instead, when asked), the alerting rules
/// as a PrometheusRule and the dashboards in a ConfigMap for Grafana's
/// sidecar; the API server, given the Prometheus Operator's CRDs as the
/// operator publishes them, takes them all and keeps every field (its
/// schemas prune what they do not know, so a field the chart got wrong
/// would be missing from the answer).
#[test]
fn the_charts_monitoring_is_taken_by_a_real_api_server_with_the_operators_crds() {
    let Some(tools) = Tools::get() else { return };
    let crds = match common::monitoring_crds() {
        Ok(c) => c,
        Err(e) => {
            common::missing_peer::<()>(&format!("the Prometheus Operator's CRDs: {e}"));
            return;
        }
    };
    // Cluster-wide and the same for every test: applied server-side, again
    // by whichever test comes next.
    for crd in &crds {
        tools.kubectl(
            &[
                "apply",
                "--server-side",
                "--force-conflicts",
                "-f",
                crd.to_str().expect("utf-8"),
            ],
            "",
        );
    }
    tools.kubectl(
        &[
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd/servicemonitors.monitoring.coreos.com",
            "crd/podmonitors.monitoring.coreos.com",
            "crd/prometheusrules.monitoring.coreos.com",
        ],
        "",
    );
    let ns = peer_env::unique("monitoring");
    tools.kubectl(&["create", "namespace", &ns], "");
    let monitoring = Tools::chart().join("monitoring");
    let alerts: Value = serde_saphyr::from_str(
        &std::fs::read_to_string(monitoring.join("alerts.yaml")).expect("alerts.yaml"),
    )
    .expect("alerts.yaml is YAML");
    for mode in ["agent", "gateway", "scraper"] {
        let objects = tools.render_and_dry_run(
            mode,
            &ns,
            &[
                "--set",
                &format!("mode={mode}"),
                "--set",
                "monitoring.enabled=true",
                "--set",
                "monitoring.labels.release=kps",
            ],
        );
        let monitor = object(&objects, "PodMonitor");
        assert_eq!(monitor["metadata"]["labels"]["release"], "kps");
        let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
        assert_eq!(
            (&endpoint["port"], &endpoint["path"], &endpoint["interval"]),
            (
                &Value::from("telemetry"),
                &Value::from("/metrics"),
                &Value::from("30s")
            ),
            "{monitor:#}"
        );
        assert_eq!(
            monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
            mode
        );
        // The pods it selects serve that port.
        let workload = objects
            .iter()
            .find(|o| o["kind"] == "DaemonSet" || o["kind"] == "Deployment")
            .expect("a workload");
        let ports = &container(workload)["ports"];
        assert!(
            ports
                .as_array()
                .expect("ports")
                .iter()
                .any(|p| p["name"] == "telemetry"),
            "{ports:#}"
        );
        let rule = object(&objects, "PrometheusRule");
        assert_eq!(rule["metadata"]["labels"]["release"], "kps");
        assert_eq!(
            rule["spec"]["groups"], alerts["groups"],
            "the rules as the API server keeps them are not monitoring/alerts.yaml"
        );
        let dashboards = objects
            .iter()
            .find(|o| {
                o["kind"] == "ConfigMap" && o["metadata"]["labels"]["grafana_dashboard"] == "1"
            })
            .expect("the dashboards' ConfigMap");
        for file in [
            "proflow-agent.json",
            "proflow-gateway.json",
            "proflow-scraper.json",
        ] {
            let want = std::fs::read_to_string(monitoring.join("dashboards").join(file)).unwrap();
            assert_eq!(
                dashboards["data"][file].as_str().map(str::trim_end),
                Some(want.trim_end()),
                "{file} in the ConfigMap"
            );
        }
        assert!(
            !objects.iter().any(|o| o["kind"] == "ServiceMonitor"),
            "{:?}",
            kinds(&objects)
        );
    }
    // The gateway on its Service, which then serves the telemetry port.
    let gateway = tools.render_and_dry_run(
        "gateway",
        &ns,
        &[
            "--set",
            "mode=gateway",
            "--set",
            "monitoring.enabled=true",
            "--set",
            "monitoring.scrape.kind=ServiceMonitor",
        ],
    );
    let monitor = object(&gateway, "ServiceMonitor");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "telemetry");
    let service = object(&gateway, "Service");
    assert!(
        service["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .any(|p| p["name"] == "telemetry" && p["port"] == 8888),
        "{service:#}"
    );
    // With monitoring, the release's config is still one proflow takes.
    assert_eq!(validate_configs(&gateway), 1);
    // OpAMP from the chart's values, its storage on the data volume.
    let managed = tools.render_only(
        "gateway",
        &ns,
        &[
            "--set",
            "mode=gateway",
            "--set",
            "opamp.server.ws.endpoint=wss://opamp.example.com/v1/opamp",
            "--set",
            "opamp.accepts_remote_config=true",
        ],
    );
    assert_eq!(validate_configs(&managed), 1);
    let config = object(&managed, "ConfigMap")["data"]["config.yaml"]
        .as_str()
        .unwrap();
    assert!(
        config.contains("storage: /var/lib/proflow/opamp")
            && config.contains("endpoint: wss://opamp.example.com/v1/opamp"),
        "{config}"
    );
    let env = &container(object(&managed, "Deployment"))["env"];
    assert!(
        env.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "POD_NAME"
                && e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"),
        "{env:#}"
    );
    // Off by default: none of it.
    let plain = tools.render_only("gateway", &ns, &["--set", "mode=gateway"]);
    for kind in ["PodMonitor", "ServiceMonitor", "PrometheusRule"] {
        assert!(!plain.iter().any(|o| o["kind"] == kind), "{kind}");
    }
}
