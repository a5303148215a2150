//! Secrets never leave: a password in a URL or a token in scrape `params`
//! shows nowhere proflow writes (its log, `/targets`, the labels it
//! exports, its error messages).
//!
//! Before, an exporter `endpoint: http://user:PASS@…` put the password in
//! every failure log line; a scrape target `user:PASS@host` was scraped and
//! its password went into the log, `/targets` and the `instance` label; and
//! `params` values showed on `/targets`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use super::common::{self, Proflow};

const PASSWORD: &str = "Hunter2Pass";
const TOKEN: &str = "tok3nS3cret";

/// `proflow validate -c config` of `yaml`, written to `config` first:
/// whether it passed, and what it printed.
fn validate(config: &Path, yaml: &str) -> (bool, String) {
    std::fs::write(config, yaml).expect("write the config");
    let out = Command::new(env!("CARGO_BIN_EXE_proflow"))
        .args(["validate", "-c"])
        .arg(config)
        .output()
        .expect("run proflow validate");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), said)
}

#[test]
fn passwords_and_tokens_show_nowhere() {
    // An exporter endpoint with a password: refused, shown redacted.
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("exporter.yaml");
    let (ok, said) = validate(
        &config,
        &format!(
            "receivers:\n  pprof_push:\n    endpoint: 127.0.0.1:0\nexporters:\n  pyroscope:\n    endpoint: http://user:{PASSWORD}@127.0.0.1:1\nservice:\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [pyroscope]}}\n"
        ),
    );
    assert!(!ok, "a password in the endpoint: {said}");
    assert!(
        said.contains("user:<secret>@127.0.0.1:1") && !said.contains(PASSWORD),
        "{said}"
    );

    // SASL without TLS: refused unless the config says the network is
    // trusted (the credentials would cross it in clear).
    let (ok, said) = validate(
        &config,
        &format!(
            "receivers:\n  pprof_push:\n    endpoint: 127.0.0.1:0\nexporters:\n  kafka:\n    brokers: ['127.0.0.1:9092']\n    topic: profiles\n    sasl: {{mechanism: PLAIN, username: u, password: {PASSWORD}}}\nservice:\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [kafka]}}\n"
        ),
    );
    assert!(
        !ok && said.contains("allow_plaintext") && !said.contains(PASSWORD),
        "SASL without TLS: {said}"
    );

    // A scrape job with a token in its params, one target with a password
    // (from file_sd, so it is found while running) and one that refuses
    // connections (so its failure is logged with its URL).
    let sd = tempfile::tempdir().expect("tempdir");
    let dead = common::free_port();
    std::fs::write(
        sd.path().join("targets.json"),
        format!(r#"[{{"targets": ["user:{PASSWORD}@127.0.0.1:{dead}", "127.0.0.1:{dead}"]}}]"#),
    )
    .expect("write the file_sd targets");
    let proflow = Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  scrape:\n    scrape_configs:\n      - job_name: secretive\n        scrape_interval: 2s\n        params: {{token: ['{TOKEN}']}}\n        file_sd_configs: [{{files: ['{}/*.json'], refresh_interval: 1s}}]\nexporters:\n  file:\n    directory: {}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [scrape], exporters: [file]}}\n",
            sd.path().display(),
            profiles.display(),
            ports.telemetry
        )
    });
    let targets_url = format!("http://{}/targets", proflow.ports.telemetry);
    let mut page;
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        page = proflow
            .http()
            .get(&targets_url)
            .send()
            .and_then(|r| r.text())
            .unwrap_or_default();
        let log = proflow.log_text();
        if page.contains("\"health\":\"down\"")
            && log.contains("scrape failed")
            && log.contains("it is skipped")
        {
            break true;
        }
        if Instant::now() > deadline {
            break false;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let log = proflow.log_text();
    assert!(
        seen,
        "the live target failed and the one with a password was skipped\n/targets: {page}\nlog:\n{log}"
    );
    for (what, text) in [("/targets", &page), ("the log", &log)] {
        assert!(
            !text.contains(PASSWORD) && !text.contains(TOKEN),
            "{what} shows a secret:\n{text}"
        );
    }
    assert!(page.contains("token=<secret>"), "{page}");
    assert!(
        log.contains(&format!("user:<secret>@127.0.0.1:{dead}")),
        "{log}"
    );
    // Nothing was exported with a secret in a label either (the target that
    // had one was never scraped).
    for entry in common::read_index(&proflow.profiles) {
        let line = format!("{entry:?}");
        assert!(!line.contains(PASSWORD) && !line.contains(TOKEN), "{line}");
    }
}
