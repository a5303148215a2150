//! Hot reload of the config (SIGHUP and `POST /-/reload`) under load: a
//! push loop runs the whole time and every push must get 200.
//!
//! 1. SIGHUP with a relabel rule and a second `file` exporter added, and the
//!    receiver's own config changed (so it is replaced, taking over its
//!    socket): the rule applies to every push sent once the log says the
//!    config is reloaded, and the new exporter writes.
//! 2. `POST /-/reload` back to the first config: the removed exporter's
//!    queue drains (everything it took is sent), and no push sent after the
//!    answer carries the rule.
//! 3. `POST /-/reload` with a broken config: 400 naming the problem, the
//!    running config stays.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Ports, Proflow, gzip, read_index};

fn profile() -> Vec<u8> {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "reload_hot"], vec![5_000_000]);
    gzip(&proflow_model::pprof::encode(&b.build()))
}

/// The config: `pprof_push` → relabel (`team=core`, and `stage=v2` when
/// `v2`) → `file`, plus `file/b` into `b` when `v2`. `v2` also changes the
/// receiver's own config (`read_timeout`), so it is replaced on its address.
fn config(ports: &Ports, a: &Path, b: &Path, v2: bool) -> String {
    let mut rules = "      - {action: replace, target_label: team, replacement: core}\n".to_owned();
    let mut exporters = format!("  file:\n    directory: {}\n", a.display());
    let mut list = "[file]".to_owned();
    let mut receiver = String::new();
    if v2 {
        receiver.push_str("    read_timeout: 31s\n");
        rules.push_str("      - {action: replace, target_label: stage, replacement: v2}\n");
        exporters.push_str(&format!("  file/b:\n    directory: {}\n", b.display()));
        list = "[file, file/b]".to_owned();
    }
    format!(
        "receivers:\n  pprof_push:\n    endpoint: {}\n{receiver}\
         processors:\n  relabel:\n    relabel_configs:\n{rules}\
         exporters:\n{exporters}\
         service:\n  telemetry:\n    address: {}\n    reload_endpoint: true\n  \
         pipelines:\n    profiles:\n      receivers: [pprof_push]\n      processors: [relabel]\n      exporters: {list}\n",
        ports.receiver, ports.telemetry
    )
}

/// Pushes every 10 ms until stopped; records (seq, sent at, status).
struct Loop {
    stop: Arc<AtomicBool>,
    sent: Arc<Mutex<Vec<(usize, Instant, u16)>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Loop {
    fn start(p: &Proflow) -> Loop {
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(Mutex::new(Vec::new()));
        let url = p.receiver_url("");
        let (s, r) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            // A new connection per push: the receiver replaced by the first
            // reload must refuse no connection. (A kept-alive connection to
            // the replaced receiver is closed after its request in flight,
            // as at any server restart; clients reconnect. See README.)
            let http = reqwest::blocking::Client::builder()
                .timeout(Duration::from_secs(15))
                .no_proxy()
                .pool_max_idle_per_host(0)
                .build()
                .expect("build the HTTP client");
            let body = profile();
            let mut seq = 0;
            while !s.load(Ordering::SeqCst) {
                let at = Instant::now();
                let status = http
                    .post(format!(
                        "{url}{}",
                        common::ingest_query(&format!("reload-app{{seq={seq}}}"), Some("pprof"))
                    ))
                    .header("content-type", "application/octet-stream")
                    .body(body.clone())
                    .send()
                    .map_or(0, |r| r.status().as_u16());
                r.lock().unwrap().push((seq, at, status));
                seq += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Loop { stop, sent, thread }
    }

    /// Waits until `n` pushes sent at or after `from` have been answered:
    /// each stage of the test sees traffic, however slow the machine.
    fn wait_for_pushes_after(&self, from: Instant, n: usize, p: &Proflow) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen = self
                .sent
                .lock()
                .unwrap()
                .iter()
                .filter(|(_, at, _)| *at >= from)
                .count();
            if seen >= n {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{seen} of {n} pushes answered in 30 s\n{}",
                p.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn finish(self) -> Vec<(usize, Instant, u16)> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        Arc::try_unwrap(self.sent).unwrap().into_inner().unwrap()
    }
}

fn post_reload(p: &Proflow) -> (u16, String) {
    let r = common::http_client()
        .post(format!("http://{}/-/reload", p.ports.telemetry))
        .send()
        .expect("POST /-/reload");
    (r.status().as_u16(), r.text().unwrap_or_default())
}

fn metric(p: &Proflow, name: &str, exporter: &str) -> f64 {
    common::metric_sum(&p.metrics(), name, &[("exporter", exporter)])
}

#[test]
fn reloads_under_load_lose_no_request() {
    let dirs = tempfile::tempdir().unwrap();
    let (a, b) = (dirs.path().join("a"), dirs.path().join("b"));
    let p = Proflow::start(|ports, _| config(ports, &a, &b, false));
    let started = Instant::now();
    let pushes = Loop::start(&p);
    pushes.wait_for_pushes_after(started, 10, &p);

    // 1. SIGHUP with a rule and an exporter added.
    std::fs::write(&p.config, config(&p.ports, &a, &b, true)).unwrap();
    let hup = Instant::now();
    let sent = std::process::Command::new("kill")
        .args(["-HUP", &p.pid().to_string()])
        .status()
        .unwrap();
    assert!(sent.success());
    // The reload is done when it says so (the receiver replaced among the
    // components started); pushes sent from then on meet the new config.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !p
        .log_text()
        .lines()
        .any(|l| l.contains("config reloaded") && l.contains("receivers.pprof_push"))
    {
        assert!(
            Instant::now() < deadline,
            "no reload that replaced the receiver was logged\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let reloaded = Instant::now();
    pushes.wait_for_pushes_after(reloaded, 30, &p);
    let deadline = Instant::now() + Duration::from_secs(20);
    while read_index(&b).is_empty() {
        assert!(
            Instant::now() < deadline,
            "file/b never wrote\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // 2. Back to the first config over HTTP: file/b goes, and drains.
    std::fs::write(&p.config, config(&p.ports, &a, &b, false)).unwrap();
    // Taken before asking: the switch happens during the request.
    let back = Instant::now();
    let (status, body) = post_reload(&p);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("exporters.file/b"), "{body}");
    // The answer comes once the switch is done.
    let reverted = Instant::now();
    pushes.wait_for_pushes_after(reverted, 30, &p);

    // 3. A broken config: refused, the running one stays.
    let broken = config(&p.ports, &a, &b, false)
        .replace(&p.ports.receiver.to_string(), "nowhere")
        .replace("target_label: team", "target_label: 'bad label'");
    std::fs::write(&p.config, broken).unwrap();
    let (status, body) = post_reload(&p);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("endpoint") && body.contains("target_label"),
        "the refusal names every problem: {body}"
    );
    pushes.wait_for_pushes_after(Instant::now(), 10, &p);
    let pushed = pushes.finish();

    // No push failed, before, during or after the reloads.
    let failed: Vec<_> = pushed.iter().filter(|(_, _, s)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} pushes failed: {:?}",
        failed.len(),
        pushed.len(),
        &failed[..failed.len().min(10)]
    );
    // Every push was written by `file`, exactly once.
    let deadline = Instant::now() + Duration::from_secs(20);
    let written = loop {
        let index = read_index(&a);
        if index.len() >= pushed.len() || Instant::now() >= deadline {
            break index;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(written.len(), pushed.len(), "file wrote every push once");
    let seqs: std::collections::BTreeSet<String> = written
        .iter()
        .filter_map(|e| e.label("seq").map(str::to_owned))
        .collect();
    assert_eq!(
        seqs.len(),
        pushed.len(),
        "each push written once, none twice"
    );
    let stage_of = |seq: usize| {
        written
            .iter()
            .find(|e| e.label("seq") == Some(&seq.to_string()))
            .and_then(|e| e.label("stage").map(str::to_owned))
    };
    // The rule applied to every push sent between the logged reload and the
    // reload back, and to none before SIGHUP or after the reload back was
    // answered (pushes sent while a reload ran may go either way).
    let mut in_v2 = 0;
    for (seq, at, _) in &pushed {
        if *at >= reloaded && *at < back {
            in_v2 += 1;
            assert_eq!(
                stage_of(*seq).as_deref(),
                Some("v2"),
                "push {seq} after SIGHUP"
            );
        }
        if *at >= reverted || *at < hup {
            assert_eq!(stage_of(*seq), None, "push {seq} outside v2");
        }
    }
    assert!(in_v2 >= 30, "{in_v2} pushes checked under the new config");
    // The removed exporter sent everything it had taken, then closed.
    assert!(
        p.log_text().contains("drained its queue"),
        "{}",
        p.log_text()
    );
    let enqueued_b = metric(&p, "proflow_exporter_enqueued_profiles_total", "file/b");
    let sent_b = metric(&p, "proflow_exporter_sent_profiles_total", "file/b");
    let b_written = read_index(&b).len() as f64;
    assert!(enqueued_b > 0.0);
    assert_eq!(sent_b, enqueued_b, "file/b sent all it took");
    assert_eq!(b_written, sent_b);
    eprintln!(
        "{} pushes across 3 reloads, none failed; file/b wrote {b_written} before it was removed",
        pushed.len()
    );
}

#[test]
fn a_directory_never_gets_two_writers_and_a_refused_reload_changes_nothing() {
    let dirs = tempfile::tempdir().unwrap();
    let (a, b) = (dirs.path().join("a"), dirs.path().join("b"));
    let p = Proflow::start(|ports, _| config(ports, &a, &b, false));
    // The `file` exporter renamed: the new one would write `a` while the
    // old one still drains into it.
    let renamed = config(&p.ports, &a, &b, false)
        .replace("  file:\n", "  file/renamed:\n")
        .replace("exporters: [file]", "exporters: [file/renamed]");
    std::fs::write(&p.config, renamed).unwrap();
    let (status, body) = post_reload(&p);
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("restart") && body.contains("file/renamed"),
        "{body}"
    );
    // Counted, for the reload-failed alert and the status page.
    let metrics = p.metrics();
    for (metric, labels, want) in [
        (
            "proflow_config_reloads_total",
            &[("result", "failure"), ("source", "file")][..],
            1.0,
        ),
        (
            "proflow_config_reloads_total",
            &[("result", "success")][..],
            0.0,
        ),
        ("proflow_config_last_reload_successful", &[][..], 0.0),
    ] {
        assert_eq!(
            common::metric_sum(&metrics, metric, labels),
            want,
            "{metric} {labels:?}"
        );
    }
    // Still the first config: pushes are written by `file` with team=core.
    p.post(
        &common::ingest_query("after-refusal", Some("pprof")),
        &[("content-type", "application/octet-stream")],
        profile(),
    )
    .expect_status(200, "push after a refused reload");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let index = read_index(&a);
        if let Some(e) = index
            .iter()
            .find(|e| e.label("service_name") == Some("after-refusal"))
        {
            assert_eq!(e.label("team"), Some("core"));
            break;
        }
        assert!(Instant::now() < deadline, "the push was not written");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_scrape_receiver_a_reload_removes_leaves_the_targets_page() {
    let dirs = tempfile::tempdir().unwrap();
    let (a, b) = (dirs.path().join("a"), dirs.path().join("b"));
    // The first config plus a scrape job of one target (nothing answers
    // there: it is listed down, which is all this test needs).
    let with_scrape = |ports: &Ports| {
        config(ports, &a, &b, false)
            .replace(
                "receivers:\n",
                "receivers:\n  scrape:\n    scrape_configs:\n      - job_name: leaving\n        static_configs: [{targets: ['127.0.0.1:9']}]\n",
            )
            .replace("receivers: [pprof_push]", "receivers: [pprof_push, scrape]")
    };
    let p = Proflow::start(|ports, _| with_scrape(ports));
    let targets = || -> serde_json::Value {
        let text = common::http_client()
            .get(format!("http://{}/targets", p.ports.telemetry))
            .send()
            .expect("GET /targets")
            .text()
            .unwrap_or_default();
        let page: serde_json::Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(page["status"], "success", "{text}");
        page["data"].clone()
    };
    // The jobs on the page (a target per address and profile: once each).
    let jobs = |page: &serde_json::Value| -> Vec<String> {
        let mut jobs: Vec<String> = page["activeTargets"]
            .as_array()
            .map(|a| {
                a.iter()
                    .map(|t| t["labels"]["job"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default();
        jobs.dedup();
        jobs
    };
    assert_eq!(jobs(&targets()), ["leaving"], "{}", targets());
    // Reloaded with the scrape job's receiver changed: the new one's target.
    std::fs::write(
        &p.config,
        with_scrape(&p.ports).replace("leaving", "staying"),
    )
    .unwrap();
    let (status, body) = post_reload(&p);
    assert_eq!(status, 200, "{body}");
    assert_eq!(jobs(&targets()), ["staying"], "{}", targets());
    // Reloaded without it: the page is empty.
    std::fs::write(&p.config, config(&p.ports, &a, &b, false)).unwrap();
    let (status, body) = post_reload(&p);
    assert_eq!(status, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !jobs(&targets()).is_empty() {
        assert!(
            Instant::now() < deadline,
            "a removed receiver's targets stay: {}",
            targets()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
