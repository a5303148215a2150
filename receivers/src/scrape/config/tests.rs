use super::*;

fn parse(yaml: &str) -> ScrapeReceiverConfig {
    serde_saphyr::from_str(yaml).expect("config parses")
}

#[test]
fn defaults_are_alloys() {
    let c =
        parse("scrape_configs: [{job_name: a, static_configs: [{targets: ['127.0.0.1:6060']}]}]");
    let job = &c.scrape_configs[0];
    assert_eq!(job.scrape_interval, Duration::from_secs(15));
    assert_eq!(job.scrape_timeout, None);
    assert_eq!(job.timeout(), std::time::Duration::from_secs(10));
    assert!(job.follow_redirects);
    let names: Vec<_> = job
        .profiling_config
        .enabled_profiles()
        .into_iter()
        .map(|p| (p.name, p.path, p.seconds, p.cumulative))
        .collect();
    assert_eq!(
        names,
        [
            ("block".into(), "/debug/pprof/block".into(), false, true),
            (
                "goroutine".into(),
                "/debug/pprof/goroutine".into(),
                false,
                false
            ),
            ("memory".into(), "/debug/pprof/allocs".into(), false, true),
            ("mutex".into(), "/debug/pprof/mutex".into(), false, true),
            (
                "process_cpu".into(),
                "/debug/pprof/profile".into(),
                true,
                false
            ),
        ]
    );
    assert!(c.problems().is_empty(), "{:?}", c.problems());
}

#[test]
fn overrides_custom_profiles_and_prefix() {
    let c = parse(
        "scrape_configs:\n- job_name: a\n  static_configs: [{targets: ['h:1']}]\n  profiling_config:\n    path_prefix: /app/\n    pprof_config:\n      memory: {enabled: false}\n      godeltaprof_memory: {enabled: true}\n      heap: {path: /debug/pprof/heap}\n",
    );
    let got: Vec<_> = c.scrape_configs[0]
        .profiling_config
        .enabled_profiles()
        .into_iter()
        .map(|p| (p.name, p.profile_name, p.path, p.cumulative))
        .collect();
    assert!(got.contains(&(
        "godeltaprof_memory".into(),
        "memory".into(),
        "/app/debug/pprof/delta_heap".into(),
        false
    )));
    assert!(got.contains(&(
        "heap".into(),
        "heap".into(),
        "/app/debug/pprof/heap".into(),
        false
    )));
    assert!(!got.iter().any(|g| g.0 == "memory"));
}

#[test]
fn an_unset_timeout_is_capped_by_the_interval_and_a_set_one_is_not() {
    // Prometheus: a job without scrape_timeout takes min(10s, interval).
    let c = parse(
        "scrape_configs:\n- job_name: a\n  scrape_interval: 5s\n  static_configs: [{targets: ['h:1']}]\n",
    );
    assert!(c.problems().is_empty(), "{:?}", c.problems());
    assert_eq!(
        c.scrape_configs[0].timeout(),
        std::time::Duration::from_secs(5)
    );
    // An explicit timeout over the interval stays an error.
    let c = parse(
        "scrape_configs:\n- job_name: a\n  scrape_interval: 5s\n  scrape_timeout: 10s\n  static_configs: [{targets: ['h:1']}]\n",
    );
    let problems = c.problems();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "scrape_configs.0.scrape_timeout");
    assert!(
        problems[0]
            .message
            .contains("10s is longer than scrape_interval 5s"),
        "{}",
        problems[0].message
    );
}

#[test]
fn every_problem_is_reported() {
    let c = parse(
        "scrape_configs:\n- job_name: a\n  scrape_interval: 1s\n  scrape_timeout: 5s\n  static_configs: [{targets: ['http://h:1/x', 'nohost']}]\n  file_sd_configs: [{files: ['dir*/t.json', 'x.txt']}]\n  http_sd_configs: [{url: 'ftp://x'}]\n  params: {seconds: ['3']}\n  basic_auth: {username: u, password: p, password_file: /f}\n  profiling_config: {pprof_config: {custom: {}}}\n- job_name: a\n  static_configs: [{targets: ['h:1']}]\n",
    );
    let paths: Vec<_> = c.problems().into_iter().map(|p| p.path).collect();
    for want in [
        "scrape_configs.0.scrape_interval",
        "scrape_configs.0.scrape_timeout",
        "scrape_configs.0.static_configs.0.targets.0",
        "scrape_configs.0.static_configs.0.targets.1",
        "scrape_configs.0.file_sd_configs.0.files.0",
        "scrape_configs.0.file_sd_configs.0.files.1",
        "scrape_configs.0.http_sd_configs.0.url",
        "scrape_configs.0.params.seconds",
        "scrape_configs.0.basic_auth",
        "scrape_configs.0.profiling_config.pprof_config.custom.path",
        "scrape_configs.1.job_name",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
    }
}

#[test]
fn tls_config_without_https_is_refused_unless_relabelling_sets_the_scheme() {
    let job = |relabel: &str| {
        parse(&format!(
            "scrape_configs:\n- job_name: a\n  tls_config: {{insecure_skip_verify: true}}\n  static_configs: [{{targets: ['h:1']}}]\n  relabel_configs: [{relabel}]\n"
        ))
        .problems()
        .into_iter()
        .map(|p| p.path)
        .collect::<Vec<_>>()
    };
    assert_eq!(
        job("{target_label: team, replacement: x}"),
        ["scrape_configs.0.tls_config"]
    );
    for sets_scheme in [
        "{source_labels: [s], regex: '(https?)', target_label: __scheme__}",
        "{source_labels: [s], regex: '(.+)', target_label: '__${1}__'}",
        "{action: labelmap, regex: '__meta_(scheme)', replacement: '__$1__'}",
    ] {
        assert_eq!(job(sets_scheme), Vec::<String>::new(), "{sets_scheme}");
    }
}

#[test]
fn unknown_fields_are_refused() {
    let r: Result<ScrapeReceiverConfig, _> = serde_saphyr::from_str(
        "scrape_configs: [{job_name: a, scrape_intervall: 5s, static_configs: []}]",
    );
    assert!(r.is_err());
}

#[test]
fn kubernetes_sd_configs_are_checked_as_prometheus_checks_them() {
    let c = parse(
        "scrape_configs:\n- job_name: k\n  kubernetes_sd_configs:\n  \
         - {role: pod, api_server: 'https://k:6443', kubeconfig_file: /k, namespaces: {own_namespace: true}}\n  \
         - {role: service, selectors: [{role: pod, label: 'a=b'}]}\n  \
         - {role: pod, tls_config: {insecure_skip_verify: true}}\n  \
         - {role: endpoints, selectors: [{role: pod}, {role: pod}]}\n  \
         - {role: node, api_server: 'nota url'}\n",
    );
    let paths: Vec<_> = c.problems().into_iter().map(|p| p.path).collect();
    for want in [
        "scrape_configs.0.kubernetes_sd_configs.0.api_server",
        "scrape_configs.0.kubernetes_sd_configs.0.namespaces.own_namespace",
        "scrape_configs.0.kubernetes_sd_configs.1.selectors.0.role",
        "scrape_configs.0.kubernetes_sd_configs.2.api_server",
        "scrape_configs.0.kubernetes_sd_configs.3.selectors.1.role",
        "scrape_configs.0.kubernetes_sd_configs.4.api_server",
    ] {
        assert!(paths.iter().any(|p| p == want), "{want} not in {paths:?}");
    }
    // A job with only Kubernetes discovery has targets.
    let c = parse("scrape_configs:\n- job_name: k\n  kubernetes_sd_configs: [{role: pod}]\n");
    assert!(c.problems().is_empty(), "{:?}", c.problems());
    let r: Result<ScrapeReceiverConfig, _> = serde_saphyr::from_str(
        "scrape_configs:\n- job_name: k\n  kubernetes_sd_configs: [{role: ingress}]\n",
    );
    assert!(r.is_err());
}
