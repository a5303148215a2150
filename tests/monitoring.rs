//! The dashboards and alerting rules the chart ships
//! (`deploy/helm/proflow/monitoring`): the rules pass `promtool check rules`
//! and their unit tests (`tests/monitoring/alerts_test.yaml`, `promtool test
//! rules`), the dashboards are what `scripts/dashboards` writes, and every
//! metric any of their expressions names is one a proflow running every
//! component exports on `/metrics`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::Proflow;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn monitoring() -> PathBuf {
    repo().join("deploy/helm/proflow/monitoring")
}

/// Runs `cmd`; its output, or a panic with it.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{cmd:?} failed:\n{text}");
    text
}

#[test]
fn the_alerting_rules_pass_promtool_and_their_unit_tests() {
    let promtool = match common::promtool() {
        Ok(p) => p,
        Err(e) => {
            common::missing_peer::<()>(&format!("promtool: {e}"));
            return;
        }
    };
    let checked = run(Command::new(&promtool)
        .args(["check", "rules"])
        .arg(monitoring().join("alerts.yaml")));
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alerts().len())),
        "{checked}"
    );
    let tested = run(Command::new(&promtool)
        .args(["test", "rules", "alerts_test.yaml"])
        .current_dir(repo().join("tests/monitoring")));
    assert!(tested.contains("SUCCESS"), "{tested}");
    // Every alert has a unit test that expects it to fire.
    let tests = std::fs::read_to_string(repo().join("tests/monitoring/alerts_test.yaml")).unwrap();
    for (name, _) in alerts() {
        assert!(
            tests.contains(&format!(
                "alertname: {name}\n        exp_alerts:\n          - "
            )),
            "no unit test in tests/monitoring/alerts_test.yaml expects {name} to fire"
        );
    }
}

#[test]
fn the_dashboards_are_what_scripts_dashboards_writes() {
    run(Command::new("python3")
        .arg(repo().join("scripts/dashboards"))
        .arg("--check"));
    let mut uids = BTreeSet::new();
    for (file, board) in dashboards() {
        let uid = board["uid"].as_str().unwrap_or_default().to_owned();
        assert!(uids.insert(uid), "{file}: uid used twice");
        let variables: Vec<&str> = board["templating"]["list"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["name"].as_str())
            .collect();
        assert_eq!(variables, ["datasource", "job", "instance"], "{file}");
        let panels = board["panels"].as_array().unwrap();
        let graphs: Vec<_> = panels.iter().filter(|p| p["type"] != "row").collect();
        assert!(graphs.len() >= 10, "{file}: {} panels", graphs.len());
        for p in graphs {
            assert_eq!(
                p["datasource"]["uid"], "${datasource}",
                "{file}: {}",
                p["title"]
            );
            for t in p["targets"].as_array().unwrap() {
                let expr = t["expr"].as_str().unwrap();
                assert!(
                    expr.contains("job=~\"$job\", instance=~\"$instance\""),
                    "{file}: {}: a query that ignores the job and instance picked: {expr}",
                    p["title"]
                );
            }
        }
    }
}

#[test]
fn every_metric_the_dashboards_and_rules_name_is_one_proflow_exports() {
    // The name reader itself, on what the files use: functions, aggregations
    // with their label lists, matchers, ranges, Grafana variables.
    assert_eq!(
        metric_names(
            r#"histogram_quantile(0.99, sum by (exporter, le) (rate(a_bucket{job=~"$job", x="by (b)"}[$__rate_interval])))
               / on (instance) group_left (pod) max without (le) (b offset 5m) > 0.9 unless c:rule"#
        ),
        ["a_bucket", "b", "c:rule"]
    );
    // The ebpf receiver loads a BPF program.
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    assert!(
        status.lines().any(|l| l.starts_with("Uid:\t0\t")),
        "the ebpf receiver needs root: run the test command as root, as CI does"
    );
    let proflow = every_component();
    let text = proflow.metrics();
    let exported = exported_names(&text);
    // Prometheus asks for OpenMetrics first, and is told that is what it
    // gets (so it types each family by its `# TYPE` line).
    let answer = proflow
        .http()
        .get(format!("http://{}/metrics", proflow.ports.telemetry))
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .send()
        .unwrap();
    assert_eq!(
        answer.headers()["content-type"],
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert!(answer.text().unwrap().ends_with("# EOF\n"));
    assert!(
        !exported.contains("proflow_not_a_metric_total"),
        "the exported set is not everything"
    );
    let mut uses: Vec<(String, String)> = Vec::new();
    for (name, expr) in alerts() {
        uses.extend(metric_names(&expr).into_iter().map(|m| (m, name.clone())));
    }
    for (file, board) in dashboards() {
        for p in board["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().into_iter().flatten() {
                let expr = t["expr"].as_str().unwrap();
                let at = format!("{file}: {}", p["title"]);
                uses.extend(metric_names(expr).into_iter().map(|m| (m, at.clone())));
            }
        }
        for v in board["templating"]["list"].as_array().unwrap() {
            // Grafana's `label_values(<selector>, <label>)`: the selector.
            if let Some(q) = v["query"]["query"].as_str() {
                let selector = q
                    .strip_prefix("label_values(")
                    .and_then(|q| q.rsplit_once(','))
                    .map(|(selector, _)| selector)
                    .unwrap_or_else(|| {
                        panic!("{file}: a variable query Grafana reads otherwise: {q}")
                    });
                let at = format!("{file}: variable {}", v["name"]);
                uses.extend(metric_names(selector).into_iter().map(|m| (m, at.clone())));
            }
        }
    }
    let named: BTreeSet<&str> = uses.iter().map(|(m, _)| m.as_str()).collect();
    // Each mode's figures are there: not a handful of names checked.
    assert!(named.len() >= 30, "{} names: {named:?}", named.len());
    let unknown: Vec<String> = uses
        .iter()
        .filter(|(m, _)| !exported.contains(m))
        .map(|(m, at)| format!("{m} (in {at})"))
        .collect();
    assert!(
        unknown.is_empty(),
        "metrics no running proflow exports:\n{}\n\n/metrics:\n{text}",
        unknown.join("\n")
    );
    eprintln!(
        "{} metric names in {} expressions, all exported",
        named.len(),
        uses.len()
    );
}

/// Each alert's name and expression.
fn alerts() -> Vec<(String, String)> {
    #[derive(serde::Deserialize)]
    struct File {
        groups: Vec<Group>,
    }
    #[derive(serde::Deserialize)]
    struct Group {
        rules: Vec<Rule>,
    }
    #[derive(serde::Deserialize)]
    struct Rule {
        alert: String,
        expr: String,
    }
    let text = std::fs::read_to_string(monitoring().join("alerts.yaml")).unwrap();
    let file: File = serde_saphyr::from_str(&text).expect("alerts.yaml");
    let rules: Vec<(String, String)> = file
        .groups
        .into_iter()
        .flat_map(|g| g.rules)
        .map(|r| (r.alert, r.expr))
        .collect();
    assert!(rules.len() >= 10, "{} rules", rules.len());
    rules
}

/// Each dashboard's file name and JSON.
fn dashboards() -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    for mode in ["agent", "gateway", "scraper"] {
        let file = format!("proflow-{mode}.json");
        let text = std::fs::read_to_string(monitoring().join("dashboards").join(&file)).unwrap();
        out.push((file, serde_json::from_str(&text).expect("dashboard JSON")));
    }
    out
}

/// proflow running every receiver, processor and exporter of the build,
/// each with the least config it takes; peers it cannot reach are fine
/// (their failures are counted, which is all the names need).
fn every_component() -> Proflow {
    Proflow::start(|ports, profiles| {
        let kubeconfig = profiles.parent().unwrap().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: \"http://127.0.0.1:9\"}}]\n\
             users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n",
        )
        .unwrap();
        format!(
            "receivers:
  pprof_push: {{endpoint: \"{receiver}\"}}
  otlp:
    protocols:
      grpc: {{endpoint: 127.0.0.1:0}}
      http: {{endpoint: 127.0.0.1:0}}
  scrape:
    scrape_configs:
      - job_name: unreachable
        scrape_interval: 2s
        static_configs: [{{targets: [\"127.0.0.1:9\"]}}]
  kafka: {{brokers: [\"127.0.0.1:9\"], topics: [t]}}
  ebpf: {{}}
processors:
  relabel: {{relabel_configs: [{{action: labeldrop, regex: nothing}}]}}
  symbolize: {{}}
  trace_link: {{span_index: {{window: 1m}}}}
  aggregate: {{}}
  k8s_attributes: {{auth_type: kubeConfig, kubeconfig_file: \"{kubeconfig}\"}}
exporters:
  file: {{directory: \"{profiles}\"}}
  pyroscope: {{endpoint: \"http://127.0.0.1:9\"}}
  parca: {{endpoint: \"127.0.0.1:9\", tls: {{insecure: true}}}}
  otlp: {{endpoint: \"127.0.0.1:9\", tls: {{insecure: true}}}}
  kafka: {{brokers: [\"127.0.0.1:9\"], topic: t}}
  nop: {{}}
service:
  telemetry: {{address: \"{telemetry}\"}}
  pipelines:
    profiles:
      receivers: [pprof_push, otlp, scrape, kafka, ebpf]
      processors: [relabel, symbolize, k8s_attributes, aggregate, trace_link]
      exporters: [file, pyroscope, parca, otlp, kafka, nop]
    traces:
      receivers: [otlp]
      processors: [trace_link]
",
            receiver = ports.receiver,
            telemetry = ports.telemetry,
            profiles = profiles.display(),
            kubeconfig = kubeconfig.display(),
        )
    })
}

/// Every sample name `/metrics` can show: a family's samples as the text
/// format names them (`_total` of a counter; `_bucket`, `_sum`, `_count` of
/// a histogram), whether or not it has a series yet.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split(' ');
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                continue;
            };
            match kind {
                "counter" => {
                    names.insert(format!("{name}_total"));
                }
                "histogram" => {
                    for suffix in ["_bucket", "_sum", "_count"] {
                        names.insert(format!("{name}{suffix}"));
                    }
                }
                _ => {
                    names.insert(name.to_owned());
                }
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_owned());
        }
    }
    names
}

/// The metric names a PromQL expression selects: identifiers outside label
/// matchers, ranges and strings that are not functions, aggregations,
/// keywords, label lists (`by (...)`) or Grafana variables.
fn metric_names(expr: &str) -> Vec<String> {
    const WORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "group",
        "limitk",
        "limit_ratio",
        "inf",
        "nan",
    ];
    const LABEL_LISTS: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let b: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    // The index of the character after the one closing what opens at `i`.
    let closing = |i: usize, close: char| -> usize {
        let mut j = i + 1;
        while j < b.len() && b[j] != close {
            if b[j] == '"' || b[j] == '\'' {
                let q = b[j];
                j += 1;
                while j < b.len() && b[j] != q {
                    j += if b[j] == '\\' { 2 } else { 1 };
                }
            }
            j += 1;
        }
        j + 1
    };
    let next_char = |mut j: usize| -> Option<char> {
        while j < b.len() && b[j].is_whitespace() {
            j += 1;
        }
        b.get(j).copied()
    };
    while i < b.len() {
        let c = b[i];
        if c == '"' || c == '\'' || c == '`' {
            i = closing(i, c);
        } else if c == '{' {
            i = closing(i, '}');
        } else if c == '[' {
            i = closing(i, ']');
        } else if c == '$' || c.is_ascii_digit() || c == '.' {
            // A variable, a number or a duration: all of its word.
            i += 1;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '_' || b[i] == '.') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == '_' || b[i] == ':') {
                i += 1;
            }
            let word: String = b[start..i].iter().collect();
            if LABEL_LISTS.contains(&word.as_str()) {
                let mut j = i;
                while j < b.len() && b[j].is_whitespace() {
                    j += 1;
                }
                if b.get(j) == Some(&'(') {
                    i = closing(j, ')');
                }
            } else if !WORDS.contains(&word.as_str()) && next_char(i) != Some('(') {
                names.push(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The status page of a proflow with a working exporter and a failing one,
/// after three pushes: what it says, and what headless Chromium draws of it
/// (the failing exporter's row in its warning colour, no script needed).
#[test]
fn the_status_page_shows_what_flows_and_what_fails_and_chromium_draws_it() {
    let proflow = Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push: {{endpoint: \"{}\"}}\n\
             exporters:\n  file: {{directory: \"{}\"}}\n  pyroscope/down:\n    endpoint: \"http://127.0.0.1:9\"\n    \
             retry_on_failure: {{initial_interval: 100ms, max_interval: 100ms, max_elapsed_time: 1s}}\n\
             service:\n  telemetry: {{address: \"{}\"}}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file, pyroscope/down]}}\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    for i in 0..3 {
        proflow
            .post(
                &common::ingest_query(&format!("status{{seq={i}}}"), Some("pprof")),
                &[("content-type", "application/octet-stream")],
                common::cpu_profile(),
            )
            .expect_status(200, "push");
    }
    // Until the failing exporter has given up on all three.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while common::metric_sum(
        &proflow.metrics(),
        "proflow_exporter_failed_profiles_total",
        &[("exporter", "pyroscope/down")],
    ) < 3.0
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            proflow.metrics()
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let url = format!("http://{}/", proflow.ports.telemetry);
    let page = proflow.http().get(&url).send().expect("GET /");
    assert_eq!(page.headers()["content-type"], "text/html; charset=utf-8");
    let page = page.text().expect("the page");
    let config = std::fs::read(proflow.dir.path().join("proflow.yaml")).expect("config");
    let hash: String = ring::digest::digest(&ring::digest::SHA256, &config)
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    for want in [
        format!("<h1>proflow {}</h1>", env!("CARGO_PKG_VERSION")),
        format!("Config <code>{hash}</code> (SHA-256) from file"),
        "<tr><td>profiles</td><td>pprof_push</td><td>none</td><td>file → pyroscope/down</td></tr>"
            .to_owned(),
        "<tr class=\"ok\"><td>pprof_push</td><td class=\"n\">3</td>".to_owned(),
        "<tr class=\"ok\"><td>file</td><td class=\"n\">3</td>".to_owned(),
        "<tr class=\"bad\"><td>pyroscope/down</td><td class=\"n\">0</td>".to_owned(),
        "<a href=\"/targets\">/targets</a>".to_owned(),
        "<a href=\"/metrics\">/metrics</a>".to_owned(),
    ] {
        assert!(page.contains(&want), "no {want:?} in:\n{page}");
    }
    let failing = page
        .lines()
        .find(|l| l.contains("<td>pyroscope/down</td>"))
        .unwrap();
    assert!(
        failing.contains("127.0.0.1:9") && failing.contains(" ago)"),
        "the last error names the peer: {failing}"
    );
    assert!(!page.contains("<script"), "{page}");
    assert_eq!(
        proflow
            .http()
            .get(format!("{url}status"))
            .send()
            .unwrap()
            .text()
            .unwrap()
            .lines()
            .count(),
        page.lines().count()
    );

    // Headless Chromium, scripts off: the page as a person sees it.
    let shot = proflow.dir.path().join("status.png");
    let (width, height) = (1280u32, 1000u32);
    let chromium = match common::chromium() {
        Ok(c) => c,
        Err(e) => {
            common::missing_peer::<()>(&format!("chromium: {e}"));
            return;
        }
    };
    let profile_dir = proflow.dir.path().join("chromium");
    run(Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-javascript",
            "--hide-scrollbars",
            "--no-first-run",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .arg(format!("--window-size={width},{height}"))
        .arg(format!("--screenshot={}", shot.display()))
        .arg(&url));
    let decoder = png::Decoder::new(std::io::BufReader::new(
        std::fs::File::open(&shot).expect("the screenshot"),
    ));
    let mut reader = decoder.read_info().expect("a PNG");
    let mut pixels = vec![0; reader.output_buffer_size().expect("size")];
    let frame = reader.next_frame(&mut pixels).expect("its pixels");
    assert_eq!((frame.width, frame.height), (width, height));
    let channels = frame.color_type.samples();
    let pixels = &pixels[..frame.buffer_size()];
    let count = |rgb: [u8; 3]| {
        pixels
            .chunks_exact(channels)
            .filter(|p| p[..3].iter().zip(rgb).all(|(a, b)| a.abs_diff(b) <= 2))
            .count()
    };
    // The failing row's background (#fde2e1) and its red edge (#cc3333),
    // the working rows' green edge (#33aa77), and dark text.
    let (warning, red, green) = (
        count([0xfd, 0xe2, 0xe1]),
        count([0xcc, 0x33, 0x33]),
        count([0x33, 0xaa, 0x77]),
    );
    let dark = pixels
        .chunks_exact(channels)
        .filter(|p| p[..3].iter().all(|&c| c < 80))
        .count();
    assert!(
        warning > 5_000 && red > 50 && green > 100 && dark > 2_000,
        "the screenshot ({}) shows {warning} warning, {red} red, {green} green and {dark} dark pixels",
        shot.display()
    );
    eprintln!(
        "status page drawn at {width}x{height}: {warning} warning-row pixels, {red} red, {green} green, {dark} dark"
    );
}
