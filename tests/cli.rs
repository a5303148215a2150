//! The command line: `validate` reports every config mistake with its line,
//! `components` lists what is compiled in, `--version`, and `-c FILE` alone runs.

mod common;

use std::process::{Command, Output, Stdio};

use common::{Ports, Proflow};

fn proflow(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_proflow"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the proflow binary")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The 1-based line of the first line of `yaml` containing `marker`.
fn line_of(yaml: &str, marker: &str) -> usize {
    yaml.lines()
        .position(|l| l.contains(marker))
        .map(|i| i + 1)
        .unwrap_or_else(|| panic!("marker {marker:?} not in the config"))
}

#[test]
fn validate_reports_every_mistake_with_its_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profiles = dir.path().join("profiles");
    let yaml = format!(
        r#"receivers:
  pprof_push:
    endpoint: 127.0.0.1:{port}
    endpoitn: 127.0.0.1:4040
processors:
  relabel/team:
    relabel_configs:
      - action: replace
        source_labels: [service_name]
        regex: "(unclosed"
        target_label: team
  frobnicate: {{}}
exporters:
  file:
    directory: {dir}
service:
  pipelines:
    profiles:
      receivers: [pprof_push]
      processors: [relabel/team, frobnicate]
      exporters: [file, nosuch]
"#,
        port = common::free_port(),
        dir = profiles.display()
    );
    let config = dir.path().join("bad.yaml");
    std::fs::write(&config, &yaml).expect("write config");
    let out = proflow(&["validate", "-c", config.to_str().expect("utf-8 path")]);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "validate of a bad config exits 1; stdout:\n{}\nstderr:\n{stderr}",
        text(&out.stdout)
    );
    let mistakes = [
        ("unknown key", "endpoitn:", "endpoitn"),
        ("bad relabel regex", "regex: \"(unclosed\"", "regex"),
        ("unknown component type", "frobnicate: {}", "frobnicate"),
        ("undefined exporter", "exporters: [file, nosuch]", "nosuch"),
    ];
    let mut missing = Vec::new();
    for (what, marker, word) in mistakes {
        let line = line_of(&yaml, marker);
        let tag = format!("line {line}:");
        // The error naming this line must also name the offending thing; an
        // error may continue on the lines after its location.
        let lines: Vec<&str> = stderr.lines().collect();
        let found = lines.iter().enumerate().any(|(i, l)| {
            l.contains(&tag)
                && lines[i..(i + 3).min(lines.len())]
                    .iter()
                    .any(|l| l.contains(word))
        });
        if !found {
            missing.push(format!("{what}: no error at `{tag}` mentioning {word:?}"));
        }
    }
    assert!(
        missing.is_empty(),
        "validate missed mistakes:\n{}\nstderr:\n{stderr}",
        missing.join("\n")
    );
}

fn good_config(dir: &std::path::Path) -> std::path::PathBuf {
    let ports = Ports {
        receiver: ([127, 0, 0, 1], common::free_port()).into(),
        telemetry: ([127, 0, 0, 1], common::free_port()).into(),
    };
    let yaml = common::file_pipeline_config(&ports, &dir.join("profiles"), "", true);
    let config = dir.join("good.yaml");
    std::fs::write(&config, yaml).expect("write config");
    config
}

#[test]
fn validate_accepts_a_good_config() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = good_config(dir.path());
    let out = proflow(&["validate", "-c", config.to_str().expect("utf-8 path")]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "validate of a good config exits 0; stdout:\n{}\nstderr:\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        !profiles_created(dir.path()),
        "validate must not start anything (the exporter directory was created)"
    );
}

fn profiles_created(dir: &std::path::Path) -> bool {
    dir.join("profiles").exists()
}

#[test]
fn components_lists_kind_and_stability() {
    let out = proflow(&["components"]);
    let stdout = text(&out.stdout);
    assert!(
        out.status.success(),
        "components failed: {}\n{stdout}{}",
        out.status,
        text(&out.stderr)
    );
    const STABILITY: [&str; 6] = [
        "development",
        "alpha",
        "beta",
        "stable",
        "deprecated",
        "unmaintained",
    ];
    for (ty, kind) in [
        ("pprof_push", "receiver"),
        ("relabel", "processor"),
        ("file", "exporter"),
        ("nop", "exporter"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == ty))
            .unwrap_or_else(|| panic!("components does not list {ty}:\n{stdout}"));
        let words: Vec<String> = line.split_whitespace().map(str::to_lowercase).collect();
        assert!(
            words.iter().any(|w| w == kind),
            "{ty} is not listed as a {kind}: {line:?}"
        );
        assert!(
            words.iter().any(|w| STABILITY.contains(&w.as_str())),
            "{ty} has no stability level ({STABILITY:?}): {line:?}"
        );
    }
}

#[test]
fn version_prints_the_package_version() {
    let out = proflow(&["--version"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "--version failed: {}", out.status);
    assert!(
        stdout.contains("proflow") && stdout.contains(env!("CARGO_PKG_VERSION")),
        "--version printed {stdout:?}"
    );
}

#[test]
fn config_flag_alone_runs_the_collector() {
    // `proflow -c FILE` is `proflow run -c FILE`: it gets ready and accepts a push.
    let proflow = Proflow::start_with_args(&[], |ports, profiles| {
        common::file_pipeline_config(ports, profiles, "", false)
    });
    let app = common::unique_name("bare-c");
    common::push_valid(&proflow, &app);
    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app.as_str()));
    assert_eq!(
        entries[0].label("team"),
        None,
        "no relabel in this pipeline"
    );
}

#[test]
fn validate_refuses_an_in_flight_budget_smaller_than_one_request() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("c.yaml");
    std::fs::write(
        &config,
        "receivers:\n  pprof_push:\n    endpoint: 127.0.0.1:0\nexporters:\n  nop: {}\nservice:\n  limits:\n    max_in_flight_bytes: 32MiB\n  pipelines:\n    profiles: {receivers: [pprof_push], exporters: [nop]}\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_proflow"))
        .args(["validate", "-c"])
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("service.limits.max_in_flight_bytes")
            && stderr.contains("receiver `pprof_push`")
            && stderr.contains("83886080 bytes"),
        "{stderr}"
    );
}

/// Every config under `examples/` is valid as shipped (README points users
/// at them).
#[test]
fn every_example_config_validates() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("read examples/") {
        let path = entry.expect("examples/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        let out = proflow(&["validate", "-c", path.to_str().expect("utf-8 path")]);
        assert!(
            out.status.success(),
            "{} does not validate:\n{}{}",
            path.display(),
            text(&out.stdout),
            text(&out.stderr)
        );
        checked += 1;
    }
    assert!(
        checked >= 3,
        "only {checked} example configs found in {}",
        dir.display()
    );
}

/// `examples/tenants.yaml` as a user runs it (`PROFLOW_PORT` and
/// `PROFLOW_DIR` set, the telemetry address moved to a free port): tenant
/// `noisy` gets its 0.2 MiB at once and then 429 with `Retry-After`; tenant
/// `quiet` beside it has every push written, under its own tenant.
#[test]
fn the_tenants_example_refuses_a_noisy_tenant_and_not_a_quiet_one() {
    let proflow = Proflow::start_with_env(&["run"], |ports, profiles| {
        let yaml = common::example_config(
            "tenants.yaml",
            &[(
                "address: 127.0.0.1:8888",
                &format!("address: {}", ports.telemetry),
            )],
        );
        let port = ports.receiver.port().to_string();
        (
            yaml,
            vec![
                ("PROFLOW_PORT".to_owned(), port),
                ("PROFLOW_DIR".to_owned(), profiles.display().to_string()),
            ],
        )
    });
    let app = common::unique_name("tenants-example");
    // 64 KiB a push (folded lines): the noisy tenant's 0.2 MiB holds three.
    let mut body = String::from("main;work 1\n");
    let mut i = 0;
    while body.len() < 64 << 10 {
        body.push_str(&format!("pad;frame{i} 0\n"));
        i += 1;
    }
    let (mut noisy, mut refused) = (0, None);
    let started = std::time::Instant::now();
    for _ in 0..6 {
        let r = proflow.post(
            &common::ingest_query(&app, Some("folded")),
            &[("X-Scope-OrgID", "noisy")],
            body.clone().into_bytes(),
        );
        match r.status {
            200 => noisy += 1,
            429 => refused = Some(r),
            other => panic!("noisy: {other} {}", String::from_utf8_lossy(&r.body)),
        }
        proflow
            .post(
                &common::ingest_query(&app, Some("folded")),
                &[("X-Scope-OrgID", "quiet")],
                body.clone().into_bytes(),
            )
            .expect_status(200, "the quiet tenant's push");
    }
    // 0.2 MiB at once holds three 64 KiB pushes (8 KiB left); 0.1 MiB/s
    // refills another every 0.64 s the rounds took.
    let refilled = (started.elapsed().as_secs_f64() * 102.4 / 64.0).ceil() as usize;
    assert!(
        (3..=3 + refilled).contains(&noisy),
        "0.2 MiB at once holds three 64 KiB pushes, plus {refilled} refilled, took {noisy}"
    );
    let refused = refused.expect("the noisy tenant was refused");
    assert!(refused.retry_after.is_some(), "a 429 says when to retry");
    let entries =
        proflow.wait_for_files(6 + noisy, |e| e.label("service_name") == Some(app.as_str()));
    let count = |t: &str| {
        entries
            .iter()
            .filter(|e| e.raw["tenant"].as_str() == Some(t))
            .count()
    };
    assert_eq!((count("quiet"), count("noisy")), (6, noisy));
}

/// `examples/gateway.yaml` as a user copies it (only its addresses and
/// directories moved to free ports and a temporary directory, `CLUSTER`
/// set): a push labelled `pod_template_hash` is written as the gzip pprof it
/// arrived as and as folded text, labelled with the cluster and without the
/// hash.
#[test]
fn the_gateway_example_writes_a_push_as_pprof_and_as_folded_text() {
    let cluster = common::unique_name("cluster");
    let proflow = Proflow::start_with_env(&["run"], |ports, profiles| {
        let folded = profiles.with_file_name("folded");
        let yaml = common::example_config(
            "gateway.yaml",
            &[
                (
                    "endpoint: 0.0.0.0:4040",
                    &format!("endpoint: {}", ports.receiver),
                ),
                (
                    "address: 0.0.0.0:8888",
                    &format!("address: {}", ports.telemetry),
                ),
                (
                    "directory: /var/lib/proflow/pprof",
                    &format!("directory: {}", profiles.display()),
                ),
                (
                    "directory: /var/lib/proflow/folded",
                    &format!("directory: {}", folded.display()),
                ),
            ],
        );
        (yaml, vec![("CLUSTER".to_owned(), cluster.clone())])
    });
    let app = common::unique_name("gateway");
    let body = common::gzip(&common::cpu_profile());
    proflow
        .post(
            &common::ingest_query(
                &format!("{app}{{pod_template_hash=5d8f9c,env=prod}}"),
                Some("pprof"),
            ),
            &[("content-type", "application/octet-stream")],
            body.clone(),
        )
        .expect_status(200, "a push to the gateway example");
    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app.as_str()));
    assert_eq!(entries.len(), 1, "one push, one pprof file: {entries:?}");
    let e = &entries[0];
    assert_eq!(e.label("cluster"), Some(cluster.as_str()), "{:?}", e.labels);
    assert_eq!(e.label("env"), Some("prod"), "{:?}", e.labels);
    assert_eq!(e.label("pod_template_hash"), None, "{:?}", e.labels);
    assert!(
        std::fs::read(&e.path).expect("read the pprof file") == body,
        "the pprof file is not the gzip body that was pushed"
    );
    // The folded copy: the pushed profile's two stacks with their values.
    let folded = proflow.profiles.with_file_name("folded");
    let deadline = std::time::Instant::now() + common::FILE_TIMEOUT;
    let entry = loop {
        let found: Vec<common::IndexEntry> = common::read_index(&folded)
            .into_iter()
            .filter(|e| e.label("service_name") == Some(app.as_str()) && e.path.is_file())
            .collect();
        if let Some(first) = found.first() {
            assert_eq!(
                found.len(),
                1,
                "one sample type, one folded file: {found:?}"
            );
            break first.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no folded file for {app} under {}: {:?}\nlog:\n{}",
            folded.display(),
            common::list_files(&folded),
            proflow.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(entry.label("cluster"), Some(cluster.as_str()));
    let text = std::fs::read_to_string(&entry.path).expect("read the folded file");
    assert_eq!(
        text,
        format!(
            "main;{} 300000000\nmain;{} 100000000\n",
            common::HOT_FUNCTION,
            common::WARM_FUNCTION
        ),
        "{}",
        entry.path.display()
    );
}

/// The keys that an object of `text` (valid JSON) repeats: serde_json
/// keeps the last of them silently; other readers keep the first or refuse
/// the line.
fn repeated_keys(text: &str) -> Vec<String> {
    enum Frame {
        /// The keys so far, and whether a key comes next.
        Object(std::collections::HashSet<String>, bool),
        Array,
    }
    let mut stack = Vec::new();
    let mut repeated = Vec::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '{' => stack.push(Frame::Object(Default::default(), true)),
            '[' => stack.push(Frame::Array),
            '}' | ']' => {
                stack.pop();
            }
            ',' => {
                if let Some(Frame::Object(_, key_next)) = stack.last_mut() {
                    *key_next = true;
                }
            }
            '"' => {
                let mut string = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => {
                            string.push(c);
                            string.extend(chars.next());
                        }
                        _ => string.push(c),
                    }
                }
                if let Some(Frame::Object(keys, key_next)) = stack.last_mut()
                    && std::mem::take(key_next)
                    && !keys.insert(string.clone())
                {
                    repeated.push(string);
                }
            }
            _ => {}
        }
    }
    repeated
}

/// `service.telemetry.log_format: json`: every line the collector writes is
/// one JSON object, with the timestamp, level, target and fields
/// (`message` and the event's own) of tracing-subscriber's JSON format:
/// the start, a refused push (logged at debug) and the stop.
#[test]
fn json_logs_are_one_object_a_line() {
    let mut proflow = Proflow::start(|ports, profiles| {
        common::file_pipeline_config(ports, profiles, "", false).replace(
            "    log_level: info\n",
            "    log_level: debug\n    log_format: json\n",
        )
    });
    proflow
        .post(
            &common::ingest_query("json-logs", Some("pprof")),
            &[("content-type", "application/octet-stream")],
            b"not a profile".to_vec(),
        )
        .expect_status(400, "a body that is not pprof");
    assert_eq!(
        proflow.terminate(std::time::Duration::from_secs(20)),
        Some(0)
    );
    let log = proflow.log_text();
    let mut events = Vec::new();
    for line in log.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not one JSON object ({e}): {line:?}\nlog:\n{log}"));
        let repeated = repeated_keys(line);
        assert!(
            repeated.is_empty(),
            "the line repeats the keys {repeated:?} in one object (readers differ on which they keep): {line}"
        );
        let level = v["level"].as_str().unwrap_or_default();
        assert!(
            ["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level),
            "level {level:?}: {line}"
        );
        let timestamp = v["timestamp"].as_str().unwrap_or_default();
        assert!(
            timestamp.len() >= 20 && timestamp.as_bytes()[10] == b'T' && timestamp.ends_with('Z'),
            "timestamp {timestamp:?}: {line}"
        );
        assert!(
            v["target"].as_str().is_some_and(|t| !t.is_empty()),
            "no target: {line}"
        );
        assert!(
            v["fields"]["message"]
                .as_str()
                .is_some_and(|m| !m.is_empty()),
            "no fields.message: {line}"
        );
        events.push(v);
    }
    let find = |message: &str| {
        events
            .iter()
            .find(|v| v["fields"]["message"] == message)
            .unwrap_or_else(|| panic!("no {message:?} line in the log:\n{log}"))
    };
    assert_eq!(find("proflow is running")["level"], "INFO");
    assert_eq!(
        find("proflow is running")["fields"]["version"],
        env!("CARGO_PKG_VERSION")
    );
    let refused = find("request refused");
    assert_eq!(refused["level"], "DEBUG", "{refused}");
    assert_eq!(refused["fields"]["status"], 400, "{refused}");
    assert_eq!(refused["fields"]["receiver"], "pprof_push", "{refused}");
    assert_eq!(refused["fields"]["reason"], "bad_request", "{refused}");
    assert!(
        refused["fields"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("not a valid pprof")),
        "{refused}"
    );
    find("SIGTERM received");
}
