//! Remote management over OpAMP (`service.opamp`) against a real OpAMP
//! server: `tests/peers/apps/goopamp`, a few lines of Go on opamp-go's
//! server package (v0.23.0), which records what each agent reports and
//! offers the remote config the test gives it.
//!
//! Over WebSocket: proflow connects with the header the server demands,
//! reports its identity, health per component and effective config; a
//! valid config from the server is applied through the hot reload (a push
//! then carries its label) and reported applied; an invalid one is refused
//! with its problems, reported failed, and the config before it runs on
//! (as is one that reads proflow's environment, whose values never reach
//! the server); a local SIGHUP is refused while the server's config runs;
//! a restarted server is reconnected to; a proflow restarted while the
//! server is down starts with the last config the server sent, under the
//! same instance uid. Over plain HTTP: the same report and an applied
//! config by polling, and a proflow without the header is turned away.
//! Over TLS (`wss`, `https`): reached with the CA given in `tls`, refused
//! with another CA's.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proflow, free_port, read_index};
use serde_json::Value;

const TOKEN: &str = "Bearer opamp-t0ken";

/// The Go OpAMP server, on fixed ports it keeps across restarts.
struct Server {
    bin: PathBuf,
    opamp: u16,
    control: u16,
    child: Option<Child>,
    log: PathBuf,
    /// More flags (`-cert`, `-key`).
    extra: Vec<String>,
}

impl Server {
    fn start(dir: &Path) -> Option<Server> {
        Server::start_with(dir, Vec::new())
    }

    fn start_with(dir: &Path, extra: Vec<String>) -> Option<Server> {
        let bin = peer_env::go_app("goopamp")?;
        let mut s = Server {
            bin,
            opamp: free_port(),
            control: free_port(),
            child: None,
            log: dir.join("goopamp.log"),
            extra,
        };
        s.run();
        Some(s)
    }

    fn run(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(&self.bin)
            .args(["-listen", &format!("127.0.0.1:{}", self.opamp)])
            .args(["-control", &format!("127.0.0.1:{}", self.control)])
            .args(["-require-header", &format!("Authorization: {TOKEN}")])
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start goopamp");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.agents_now().is_none() {
            assert!(Instant::now() < deadline, "goopamp did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn endpoint(&self, scheme: &str) -> String {
        format!("{scheme}://127.0.0.1:{}/v1/opamp", self.opamp)
    }

    fn agents_now(&self) -> Option<Vec<Value>> {
        let url = format!("http://127.0.0.1:{}/agents", self.control);
        let body = reqwest::blocking::get(url).ok()?.text().ok()?;
        serde_json::from_str(&body).ok()
    }

    /// Whether an agent with instance uid `uid` ever reported.
    fn knows(&self, uid: &str) -> bool {
        self.agents_now()
            .unwrap_or_default()
            .iter()
            .any(|a| a["identifying"]["service.instance.id"] == uid)
    }

    /// Waits until some agent's state satisfies `ok`; that state.
    fn wait_for(&self, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let agents = self.agents_now().unwrap_or_default();
            if let Some(a) = agents.iter().find(|a| ok(a)) {
                return a.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no agent {what} within 30 s; the server has:\n{agents:#?}\nits log:\n{}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Offers `yaml` to every agent; its hash (SHA-256, hex).
    fn offer(&self, yaml: &str) -> String {
        let url = format!("http://127.0.0.1:{}/config", self.control);
        let hash = reqwest::blocking::Client::new()
            .post(url)
            .body(yaml.to_owned())
            .send()
            .expect("POST /config")
            .text()
            .unwrap();
        hash.trim().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A proflow config: pprof_push into a file exporter, with `processors`,
/// and (for the local file) `service.opamp`.
fn config(receiver: &str, telemetry: &str, files: &Path, relabel: bool, opamp: &str) -> String {
    let (processors, chain) = if relabel {
        (
            "processors:\n  relabel: {relabel_configs: [{action: replace, target_label: fleet, replacement: remote}]}\n",
            "[relabel]",
        )
    } else {
        ("", "[]")
    };
    format!(
        "receivers:\n  pprof_push: {{endpoint: \"{receiver}\"}}\n{processors}\
         exporters:\n  file: {{directory: \"{}\"}}\n\
         service:\n  telemetry: {{address: \"{telemetry}\"}}\n{opamp}  pipelines:\n    profiles: {{receivers: [pprof_push], processors: {chain}, exporters: [file]}}\n",
        files.display()
    )
}

fn opamp_section(
    transport: &str,
    endpoint: &str,
    storage: &Path,
    header: bool,
    extra: &str,
) -> String {
    let headers = if header {
        format!("headers: {{Authorization: \"{TOKEN}\"}}, ")
    } else {
        String::new()
    };
    format!(
        "  opamp:\n    server:\n      {transport}: {{{headers}endpoint: \"{endpoint}\"{extra}}}\n    storage: \"{}\"\n    accepts_remote_config: true\n",
        storage.display()
    )
}

/// Waits until `p`'s log says `text`.
fn wait_for_log(p: &Proflow, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p.log_text().contains(text) {
        assert!(
            Instant::now() < deadline,
            "no {text:?} in:\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The instance uid kept in `storage`.
fn uid_in(storage: &Path) -> String {
    std::fs::read_to_string(storage.join("instance_uid"))
        .unwrap()
        .trim()
        .to_owned()
}

/// proflow with the local file: no processor, `section` as `service.opamp`.
fn start_local(files: &Path, section: &str) -> Proflow {
    Proflow::start(|ports, _| {
        config(
            &ports.receiver.to_string(),
            &ports.telemetry.to_string(),
            files,
            false,
            section,
        )
    })
}

fn push(p: &Proflow, service: &str) {
    p.post(
        &common::ingest_query(service, Some("pprof")),
        &[("content-type", "application/octet-stream")],
        common::cpu_profile(),
    )
    .expect_status(200, "push");
}

/// The labels the file exporter wrote for `service`'s profile.
fn written(files: &Path, service: &str) -> std::collections::BTreeMap<String, String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(e) = read_index(files)
            .into_iter()
            .find(|e| e.label("service_name") == Some(service))
        {
            return e.labels;
        }
        assert!(Instant::now() < deadline, "{service} was not written");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA256, bytes)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn a_websocket_server_sees_reconfigures_and_is_refused_by_proflow() {
    let dir = tempfile::tempdir().unwrap();
    let Some(mut server) = Server::start(dir.path()) else {
        return;
    };
    let storage = dir.path().join("opamp");
    let files = dir.path().join("files");
    let section = opamp_section("ws", &server.endpoint("ws"), &storage, true, "");
    let mut proflow = start_local(&files, &section);
    let local_text = std::fs::read_to_string(&proflow.config).unwrap();
    let receiver = proflow.ports.receiver.to_string();
    let telemetry = proflow.ports.telemetry.to_string();

    // Identity, health and the effective config.
    let agent = server.wait_for("connected over WebSocket with its health", |a| {
        a["connected"] == true && a["transport"] == "ws" && a["health"]["healthy"] == true
    });
    let uid = uid_in(&storage);
    let uid = uid.as_str();
    assert_eq!(agent["uid"], uid.replace('-', ""));
    assert_eq!(agent["identifying"]["service.name"], "proflow");
    assert_eq!(agent["identifying"]["service.instance.id"], uid);
    assert_eq!(
        agent["identifying"]["service.version"],
        env!("CARGO_PKG_VERSION")
    );
    assert_eq!(agent["non_identifying"]["proflow.mode"], "gateway");
    assert!(
        agent["non_identifying"]["host.name"]
            .as_str()
            .is_some_and(|h| !h.is_empty()),
        "{agent:#}"
    );
    let parts = &agent["health"]["components"]["pipeline:profiles"]["components"];
    assert_eq!(parts["receiver:pprof_push"]["healthy"], true, "{agent:#}");
    assert_eq!(parts["exporter:file"]["status"], "running", "{agent:#}");
    assert_eq!(agent["effective_config"], local_text.as_str());
    // Reports status, effective config, health, remote config status, and
    // accepts remote configs.
    assert_eq!(agent["capabilities"], 0x1 | 0x2 | 0x4 | 0x800 | 0x1000);

    // A valid config: applied through the hot reload, reported applied.
    let remote = config(&receiver, &telemetry, &files, true, "");
    let hash = server.offer(&remote);
    assert_eq!(hash, sha256_hex(remote.as_bytes()));
    let agent = server.wait_for("reporting the config applied", |a| {
        a["remote_status"] == "RemoteConfigStatuses_APPLIED" && a["remote_hash"] == hash.as_str()
    });
    assert_eq!(agent["effective_config"], remote.as_str());
    push(&proflow, "after-remote");
    assert_eq!(
        written(&files, "after-remote")
            .get("fleet")
            .map(String::as_str),
        Some("remote"),
        "the remote config's relabel rule runs"
    );
    let page = proflow
        .http()
        .get(format!("http://{telemetry}/"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        page.contains(&format!("Config <code>{hash}</code> (SHA-256) from opamp")),
        "{page}"
    );

    // An invalid one: refused with its problems, the config before runs on.
    let invalid = remote.replace("file: {directory", "file: {no_such_key: 1, directory");
    let bad_hash = server.offer(&invalid);
    let agent = server.wait_for("reporting the config failed", |a| {
        a["remote_status"] == "RemoteConfigStatuses_FAILED" && a["remote_hash"] == bad_hash.as_str()
    });
    let error = agent["remote_error"].as_str().unwrap();
    assert!(
        error.contains("no_such_key") && error.contains("the running config stays"),
        "{error}"
    );
    assert_eq!(agent["effective_config"], remote.as_str());
    push(&proflow, "after-refusal");
    assert_eq!(
        written(&files, "after-refusal")
            .get("fleet")
            .map(String::as_str),
        Some("remote")
    );
    // A config that reads proflow's environment: refused, and the value
    // never reaches the server.
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    let reads_env = remote.replace(
        &format!("directory: \"{}\"", files.display()),
        "directory: \"${env:HOME}/profiles\"",
    );
    assert_ne!(reads_env, remote);
    let env_hash = server.offer(&reads_env);
    let agent = server.wait_for("refusing a config that reads the environment", |a| {
        a["remote_status"] == "RemoteConfigStatuses_FAILED" && a["remote_hash"] == env_hash.as_str()
    });
    let error = agent["remote_error"].as_str().unwrap();
    assert!(error.contains("HOME") && !error.contains(&home), "{error}");
    // A local reload while the server's config runs: refused, with why.
    let hup = Command::new("kill")
        .args(["-HUP", &proflow.pid().to_string()])
        .status()
        .unwrap();
    assert!(hup.success());
    wait_for_log(&proflow, "the running config is the OpAMP server's");
    let metrics = proflow.metrics();
    for (result, want) in [("success", 1.0), ("failure", 2.0)] {
        assert_eq!(
            common::metric_sum(
                &metrics,
                "proflow_config_reloads_total",
                &[("source", "opamp"), ("result", result)]
            ),
            want,
            "{result}"
        );
    }

    // The server restarted: proflow connects again and reports in full.
    server.stop();
    server.run();
    let again = server.wait_for("connected again after the server's restart", |a| {
        a["connected"] == true && a["identifying"]["service.instance.id"] == uid
    });
    assert_eq!(again["remote_hash"], env_hash.as_str());
    assert_eq!(again["effective_config"], remote.as_str());

    // proflow stopped says goodbye; started again while the server is
    // down, it runs the last config the server sent, under the same uid.
    assert_eq!(proflow.terminate(Duration::from_secs(20)), Some(0));
    server.wait_for("saying goodbye", |a| a["said_goodbye"] == true);
    server.stop();
    let restarted = start_local(&files, &section);
    // The kept config's receiver is the one it named; telemetry is the
    // local file's (the helper found it ready there).
    restarted
        .http()
        .post(format!(
            "http://{receiver}{}",
            common::ingest_query("after-restart", Some("pprof"))
        ))
        .header("content-type", "application/octet-stream")
        .body(common::cpu_profile())
        .send()
        .map(|r| assert_eq!(r.status(), 200))
        .expect("push to the kept config's receiver");
    assert_eq!(
        written(&files, "after-restart")
            .get("fleet")
            .map(String::as_str),
        Some("remote"),
        "started with the kept remote config"
    );
    assert!(
        restarted
            .log_text()
            .contains("starting with the last config the OpAMP server sent"),
        "{}",
        restarted.log_text()
    );
    server.run();
    let back = server.wait_for("back with the kept config", |a| {
        a["connected"] == true && a["remote_status"] == "RemoteConfigStatuses_APPLIED"
    });
    assert_eq!(back["identifying"]["service.instance.id"], uid);
    assert_eq!(back["remote_hash"], hash.as_str());
}

#[test]
fn a_plain_http_server_is_polled_and_a_proflow_without_its_header_is_turned_away() {
    let dir = tempfile::tempdir().unwrap();
    let Some(server) = Server::start(dir.path()) else {
        return;
    };
    let files = dir.path().join("files");
    let section = opamp_section(
        "http",
        &server.endpoint("http"),
        &dir.path().join("opamp"),
        true,
        ", polling_interval: 1s",
    );
    let proflow = start_local(&files, &section);
    server.wait_for("polling over plain HTTP", |a| {
        a["transport"] == "http"
            && a["health"]["healthy"] == true
            && a["messages"].as_u64() >= Some(2)
    });
    let remote = config(
        &proflow.ports.receiver.to_string(),
        &proflow.ports.telemetry.to_string(),
        &files,
        true,
        "",
    );
    let hash = server.offer(&remote);
    server.wait_for("applying by polling", |a| {
        a["remote_status"] == "RemoteConfigStatuses_APPLIED" && a["remote_hash"] == hash.as_str()
    });
    push(&proflow, "polled");
    assert_eq!(
        written(&files, "polled").get("fleet").map(String::as_str),
        Some("remote")
    );

    // Without the header: refused by the server, and proflow says so.
    let other = dir.path().join("other");
    let section = opamp_section(
        "http",
        &server.endpoint("http"),
        &other,
        false,
        ", polling_interval: 1s",
    );
    let turned_away = Proflow::start(|ports, profiles| {
        config(
            &ports.receiver.to_string(),
            &ports.telemetry.to_string(),
            profiles,
            false,
            &section,
        )
    });
    wait_for_log(&turned_away, "401");
    assert!(
        !server.knows(&uid_in(&other)),
        "the server took an agent without its header"
    );
}

#[test]
fn a_tls_server_is_reached_with_its_ca_and_refused_with_another() {
    let dir = tempfile::tempdir().unwrap();
    let pki = common::pki::Pki::new();
    let flags = vec![
        "-cert".to_owned(),
        pki.file("server.pem").display().to_string(),
        "-key".to_owned(),
        pki.file("server-key.pem").display().to_string(),
    ];
    let Some(server) = Server::start_with(dir.path(), flags) else {
        return;
    };
    let files = dir.path().join("files");
    for (scheme, transport) in [("wss", "ws"), ("https", "http")] {
        let ca = format!(", tls: {{ca_file: \"{}\"}}", pki.file("ca.pem").display());
        let storage = dir.path().join(format!("opamp-{transport}"));
        let section = opamp_section(transport, &server.endpoint(scheme), &storage, true, &ca);
        let _proflow = start_local(&files, &section);
        let uid = uid_in(&storage);
        server.wait_for(&format!("connected over {scheme}"), |a| {
            a["identifying"]["service.instance.id"] == uid.as_str() && a["transport"] == transport
        });
    }
    // A certificate of another CA: refused by proflow, never seen by the server.
    let other = format!(
        ", tls: {{ca_file: \"{}\"}}",
        pki.file("other-ca.pem").display()
    );
    let storage = dir.path().join("opamp-other");
    let section = opamp_section("ws", &server.endpoint("wss"), &storage, true, &other);
    let refused = start_local(&files, &section);
    wait_for_log(&refused, "UnknownIssuer");
    assert!(
        !server.knows(&uid_in(&storage)),
        "the server saw a proflow that should not trust it"
    );
}
