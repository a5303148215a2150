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
    assert_eq!(job.scrape_timeout, Duration::from_secs(10));
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
fn unknown_fields_are_refused() {
    let r: Result<ScrapeReceiverConfig, _> = serde_saphyr::from_str(
        "scrape_configs: [{job_name: a, scrape_intervall: 5s, static_configs: []}]",
    );
    assert!(r.is_err());
}
