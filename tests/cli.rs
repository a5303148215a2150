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
