use super::*;

/// A group of `targets` with `labels` (also used by the targets tests).
pub(crate) fn group(targets: &[&str], labels: &[(&str, &str)]) -> TargetGroup {
    TargetGroup {
        targets: targets.iter().map(|t| t.to_string()).collect(),
        labels: labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

#[test]
fn json_groups_parse() {
    let parsed = parse_groups(
        br#"[{"targets": ["a:1", "b:2"], "labels": {"env": "prod"}},
             {"targets": ["c:3"]},
             {"labels": null, "targets": null, "comment": "ignored in JSON"}]"#,
        Format::Json,
    )
    .unwrap();
    assert_eq!(
        parsed.groups,
        [
            group(&["a:1", "b:2"], &[("env", "prod")]),
            group(&["c:3"], &[]),
            group(&[], &[]),
        ]
    );
    assert!(parsed.skipped.is_empty());
    assert_eq!(parse_groups(b"null", Format::Json).unwrap().groups, []);
    assert_eq!(parse_groups(b" [] ", Format::Json).unwrap().groups, []);
}

#[test]
fn yaml_groups_parse() {
    let parsed = parse_groups(
        b"- targets: ['a:1', b:2]\n  labels:\n    env: prod\n    port: 80\n- targets:\n  labels:\n",
        Format::Yaml,
    )
    .unwrap();
    assert_eq!(
        parsed.groups,
        [
            group(&["a:1", "b:2"], &[("env", "prod"), ("port", "80")]),
            group(&[], &[]),
        ]
    );
    // An empty file is no groups, as in Prometheus.
    assert_eq!(parse_groups(b"", Format::Yaml).unwrap().groups, []);
    assert_eq!(
        parse_groups(b"# nothing yet\n", Format::Yaml)
            .unwrap()
            .groups,
        []
    );
}

#[test]
fn broken_lists_are_errors_that_say_what_to_write() {
    for (bytes, format, want) in [
        (
            &b"{\"targets\": [\"a:1\"]}"[..],
            Format::Json,
            "list of target groups",
        ),
        (b"[{\"targets\": \"a:1\"}]", Format::Json, "host:port"),
        (
            b"[{\"targets\": [\"a:1\"]}",
            Format::Json,
            "list of target groups",
        ),
        (b"[{\"labels\": {\"a\": 1}}]", Format::Json, "string"),
        (b"[null]", Format::Json, "target group"),
        (b"", Format::Json, "write [] for no targets"),
        (b"  \n", Format::Json, "write [] for no targets"),
        (b"- target: ['a:1']\n", Format::Yaml, "targets"),
        (
            b"- targets: [a:1]\n  targets: [b:2]\n",
            Format::Yaml,
            "duplicate mapping key: targets at",
        ),
        (b"targets: [a:1]\n", Format::Yaml, "list of target groups"),
        (b"- targets: [a:1\n", Format::Yaml, "list of target groups"),
        (b"\xff\xfe", Format::Yaml, "UTF-8"),
    ] {
        let error = parse_groups(bytes, format).unwrap_err();
        assert!(
            error.contains(want),
            "{:?}: {error:?} does not mention {want:?}",
            String::from_utf8_lossy(bytes)
        );
        assert!(
            error.contains("targets: [host:port")
                || error.contains("write []")
                || error.contains("UTF-8"),
            "{error:?} does not say what to write"
        );
    }
}

#[test]
fn invalid_targets_and_label_names_are_skipped_and_the_rest_kept() {
    let parsed = parse_groups(
        br#"[{"targets": ["a:1", "http://b:2/x", "c"], "labels": {"ok": "1"}},
             {"targets": ["d:4"], "labels": {"bad-name": "x", "1st": "y"}},
             {"targets": ["e:5"]}]"#,
        Format::Json,
    )
    .unwrap();
    assert_eq!(
        parsed.groups,
        [group(&["a:1"], &[("ok", "1")]), group(&["e:5"], &[])]
    );
    assert_eq!(parsed.skipped.len(), 3, "{:?}", parsed.skipped);
    assert!(
        parsed.skipped[0].contains("http://b:2/x") && parsed.skipped[0].contains("without scheme")
    );
    assert!(parsed.skipped[1].contains("needs a port"));
    assert!(
        parsed.skipped[2].contains("\"1st\", \"bad-name\" are not valid")
            && parsed.skipped[2].contains("1 targets are skipped"),
        "{}",
        parsed.skipped[2]
    );
}

#[test]
fn sizes_are_bounded_while_parsing() {
    let at_most = format!(
        "[{{\"targets\": [{}]}}]",
        vec!["\"a:1\""; MAX_TARGETS].join(",")
    );
    assert_eq!(
        parse_groups(at_most.as_bytes(), Format::Json)
            .unwrap()
            .groups[0]
            .targets
            .len(),
        MAX_TARGETS
    );
    // One more, in a second group: the count is over the whole list.
    let over = format!(
        "[{{\"targets\": [{}]}}, {{\"targets\": [\"b:2\"]}}]",
        vec!["\"a:1\""; MAX_TARGETS].join(",")
    );
    let error = parse_groups(over.as_bytes(), Format::Json).unwrap_err();
    assert!(error.contains("more than 100000 targets"), "{error}");

    // Groups may share an anchor many times over…
    let mut yaml = String::from("- targets: [a:0]\n  labels: &common {env: prod, team: x}\n");
    for i in 1..2_000 {
        yaml.push_str(&format!("- targets: [a:{i}]\n  labels: *common\n"));
    }
    let parsed = parse_groups(yaml.as_bytes(), Format::Yaml).unwrap();
    assert_eq!(parsed.groups.len(), 2_000);
    assert_eq!(parsed.groups[1_999].labels["team"], "x");
    // …but aliases cannot make a short file a long list.
    let mut yaml =
        String::from("- targets: &t [a:1, a:1, a:1, a:1, a:1, a:1, a:1, a:1, a:1, a:1]\n");
    for _ in 0..20_000 {
        yaml.push_str("- targets: *t\n");
    }
    let error = parse_groups(yaml.as_bytes(), Format::Yaml).unwrap_err();
    assert!(error.contains("more than 100000 targets"), "{error}");

    let big = vec![b' '; MAX_SD_BYTES + 1];
    let error = parse_groups(&big, Format::Json).unwrap_err();
    assert!(error.contains("16 MiB"), "{error}");
}

#[test]
fn formats_follow_the_extension() {
    assert_eq!(Format::of_path(Path::new("a/t.json")), Some(Format::Json));
    assert_eq!(Format::of_path(Path::new("t.yaml")), Some(Format::Yaml));
    assert_eq!(Format::of_path(Path::new("t.yml")), Some(Format::Yaml));
    assert_eq!(Format::of_path(Path::new("t.txt")), None);
    assert_eq!(Format::of_path(Path::new("json")), None);
}

#[test]
fn a_jobs_discoverers_follow_its_config() {
    let job: ScrapeJobConfig = serde_saphyr::from_str(
        "job_name: a\nstatic_configs: [{targets: ['h:1']}]\nfile_sd_configs: [{files: ['t/*.json']}]\nhttp_sd_configs: [{url: 'http://sd:8080/targets'}, {url: 'http://sd2/t'}]\n",
    )
    .unwrap();
    let described: Vec<_> = discoverers(&job)
        .unwrap()
        .iter()
        .map(|d| d.describe())
        .collect();
    assert_eq!(
        described,
        [
            "static_configs",
            "file_sd t/*.json",
            "http_sd http://sd:8080/targets",
            "http_sd http://sd2/t"
        ]
    );

    let job: ScrapeJobConfig = serde_saphyr::from_str(
        "job_name: a\nhttp_sd_configs: [{url: 'http://sd/t'}, {url: 'sd:80'}]\n",
    )
    .unwrap();
    let error = discoverers(&job).err().unwrap();
    assert!(error.starts_with("http_sd_configs.1: url: "), "{error}");

    let job: ScrapeJobConfig = serde_saphyr::from_str(
        "job_name: a\nhttp_sd_configs: [{url: 'http://sd/t', basic_auth: {username: u, password_file: /does/not/exist}}]\n",
    )
    .unwrap();
    let error = discoverers(&job).err().unwrap();
    assert!(
        error.starts_with("http_sd_configs.0: basic_auth.password_file"),
        "{error}"
    );
}

#[tokio::test]
async fn static_sends_once_and_ends() {
    let (tx, mut rx) = mpsc::channel(4);
    let d = Box::new(StaticDiscoverer::new(&[StaticConfig {
        targets: vec!["h:1".into()],
        labels: BTreeMap::new(),
    }]));
    d.run(3, tx, CancellationToken::new()).await;
    let update = rx.recv().await.unwrap();
    assert_eq!(update.provider, 3);
    assert_eq!(update.groups, [group(&["h:1"], &[])]);
    assert!(rx.recv().await.is_none());
}

#[tokio::test]
async fn static_does_not_hold_up_shutdown_on_a_full_channel() {
    let (tx, _rx) = mpsc::channel(1);
    tx.send(Update {
        provider: 9,
        groups: Vec::new(),
    })
    .await
    .unwrap();
    let shutdown = CancellationToken::new();
    shutdown.cancel();
    let d = Box::new(StaticDiscoverer::new(&[]));
    tokio::time::timeout(std::time::Duration::from_secs(5), d.run(0, tx, shutdown))
        .await
        .unwrap();
}
