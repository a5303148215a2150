use super::*;
use proflow_config::{Node, from_node};
use proptest::prelude::*;

fn labels(pairs: &[(&str, &str)]) -> Labels {
    Labels::from_pairs(pairs.iter().copied())
}

/// Reads a YAML list of rules through the config loader, as users write them.
fn configs(yaml: &str) -> Vec<RelabelConfig> {
    let node = Node::parse(yaml).unwrap_or_else(|e| panic!("bad test YAML {yaml}: {e}"));
    from_node(&node, "relabel_configs").unwrap_or_else(|e| panic!("{yaml}: {e}"))
}

fn relabel(yaml: &str, input: &[(&str, &str)]) -> Option<Labels> {
    let relabeler = Relabeler::new(&configs(yaml)).unwrap_or_else(|e| panic!("{yaml}: {e}"));
    let mut l = labels(input);
    relabeler.apply(&mut l).then_some(l)
}

fn paths(yaml: &str) -> Vec<String> {
    validate_configs(&configs(yaml))
        .into_iter()
        .map(|p| p.path)
        .collect()
}

struct Case {
    name: &'static str,
    rules: &'static str,
    input: &'static [(&'static str, &'static str)],
    /// `None`: the series is dropped.
    output: Option<&'static [(&'static str, &'static str)]>,
}

const KEPT_AS_IS: Option<&[(&str, &str)]> = Some(&[("env", "debug"), ("job", "api")]);

#[test]
fn actions_and_defaults() {
    let cases = [
        Case {
            name: "replace with every default copies the source label",
            rules: "[{source_labels: [job], target_label: service}]",
            input: &[("job", "api")],
            output: Some(&[("job", "api"), ("service", "api")]),
        },
        Case {
            name: "constant replace needs no source",
            rules: "[{target_label: team, replacement: core}]",
            input: &[("job", "api")],
            output: Some(&[("job", "api"), ("team", "core")]),
        },
        Case {
            name: "replace overwrites an existing label",
            rules: "[{target_label: job, replacement: web}]",
            input: &[("job", "api")],
            output: Some(&[("job", "web")]),
        },
        Case {
            name: "replace with groups, braced and bare",
            rules: r#"[{source_labels: [pod], regex: "svc-(.*)-([0-9]+)", target_label: app, replacement: "x_${1}_$2"}]"#,
            input: &[("pod", "svc-cart-17")],
            output: Some(&[("app", "x_cart_17"), ("pod", "svc-cart-17")]),
        },
        Case {
            name: "replace does nothing when the regex does not match",
            rules: r#"[{source_labels: [pod], regex: "svc-(.*)", target_label: app}]"#,
            input: &[("pod", "db-1")],
            output: Some(&[("pod", "db-1")]),
        },
        Case {
            name: "the regex is anchored at both ends for replace",
            rules: r#"[{source_labels: [env], regex: "bug", target_label: x, replacement: y}]"#,
            input: &[("env", "debug")],
            output: Some(&[("env", "debug")]),
        },
        Case {
            name: "an empty result removes the target (missing source is empty)",
            rules: "[{source_labels: [absent], target_label: job}]",
            input: &[("job", "api")],
            output: Some(&[]),
        },
        Case {
            name: "an empty replacement removes the target",
            rules: r#"[{target_label: job, replacement: ""}]"#,
            input: &[("job", "api"), ("z", "1")],
            output: Some(&[("z", "1")]),
        },
        Case {
            name: "a null replacement is empty, as in Prometheus",
            rules: "[{target_label: job, replacement: }]",
            input: &[("job", "api")],
            output: Some(&[]),
        },
        Case {
            name: "named groups, bare and braced",
            rules: r#"[{source_labels: [addr], regex: "(?P<host>[^:]+):(?P<port>\\d+)", target_label: host, replacement: "$host"},
                      {source_labels: [addr], regex: "(?P<host>[^:]+):(?P<port>\\d+)", target_label: port, replacement: "p${port}"}]"#,
            input: &[("addr", "db.local:5432")],
            output: Some(&[
                ("addr", "db.local:5432"),
                ("host", "db.local"),
                ("port", "p5432"),
            ]),
        },
        Case {
            name: "a target template picks the label name from the value",
            rules: r#"[{source_labels: [tag], regex: "([a-z]+)=(.*)", target_label: "tag_${1}", replacement: "$2"}]"#,
            input: &[("tag", "zone=eu-1")],
            output: Some(&[("tag", "zone=eu-1"), ("tag_zone", "eu-1")]),
        },
        Case {
            name: "an expanded target that is not a label name skips the rule",
            rules: r#"[{source_labels: [tag], regex: "(.*)=(.*)", target_label: "$1", replacement: "$2"}]"#,
            input: &[("tag", "9lives=x")],
            output: Some(&[("tag", "9lives=x")]),
        },
        Case {
            name: "an expanded target that is empty skips the rule",
            rules: r#"[{source_labels: [tag], target_label: "${7}", replacement: "v"}]"#,
            input: &[("tag", "a")],
            output: Some(&[("tag", "a")]),
        },
        Case {
            name: "multiple sources join with the default separator",
            rules: "[{source_labels: [a, b], target_label: ab}]",
            input: &[("a", "1"), ("b", "2")],
            output: Some(&[("a", "1"), ("ab", "1;2"), ("b", "2")]),
        },
        Case {
            name: "a custom separator, and missing sources are empty strings",
            rules: "[{source_labels: [a, missing, b], separator: /, target_label: ab}]",
            input: &[("a", "1"), ("b", "2")],
            output: Some(&[("a", "1"), ("ab", "1//2"), ("b", "2")]),
        },
        Case {
            name: "an empty separator",
            rules: r#"[{source_labels: [a, b], separator: "", target_label: ab}]"#,
            input: &[("a", "1"), ("b", "2")],
            output: Some(&[("a", "1"), ("ab", "12"), ("b", "2")]),
        },
        Case {
            name: "$$ is a literal dollar",
            rules: r#"[{target_label: price, replacement: "$$1"}]"#,
            input: &[],
            output: Some(&[("price", "$1")]),
        },
        Case {
            name: "dot matches a newline (Prometheus wraps in (?s:...))",
            rules: r#"[{action: keep, source_labels: [m], regex: "a.b"}]"#,
            input: &[("m", "a\nb")],
            output: Some(&[("m", "a\nb")]),
        },
        Case {
            name: "drop matching: regex `de` must not match `debug`",
            rules: "[{action: drop, source_labels: [env], regex: de}]",
            input: &[("env", "debug"), ("job", "api")],
            output: KEPT_AS_IS,
        },
        Case {
            name: "drop on a full match",
            rules: "[{action: drop, source_labels: [env], regex: de.*}]",
            input: &[("env", "debug"), ("job", "api")],
            output: None,
        },
        Case {
            name: "drop with the default regex drops everything",
            rules: "[{action: drop}]",
            input: &[("job", "api")],
            output: None,
        },
        Case {
            name: "keep on a match",
            rules: "[{action: keep, source_labels: [env], regex: debug|prod}]",
            input: &[("env", "debug"), ("job", "api")],
            output: KEPT_AS_IS,
        },
        Case {
            name: "keep drops a non-match, anchored",
            rules: "[{action: keep, source_labels: [env], regex: bug}]",
            input: &[("env", "debug"), ("job", "api")],
            output: None,
        },
        Case {
            name: "keep drops when the source label is missing and the regex needs text",
            rules: "[{action: keep, source_labels: [zone], regex: .+}]",
            input: &[("job", "api")],
            output: None,
        },
        Case {
            name: "keep joins sources with the separator",
            rules: r#"[{action: keep, source_labels: [env, job], regex: "debug;api"}]"#,
            input: &[("env", "debug"), ("job", "api")],
            output: KEPT_AS_IS,
        },
        Case {
            name: "rules after a drop do not run",
            rules: "[{action: drop, source_labels: [env], regex: debug}, {target_label: x, replacement: y}]",
            input: &[("env", "debug")],
            output: None,
        },
        Case {
            name: "keepequal keeps equal values",
            rules: "[{action: keepequal, source_labels: [a], target_label: b}]",
            input: &[("a", "1"), ("b", "1")],
            output: Some(&[("a", "1"), ("b", "1")]),
        },
        Case {
            name: "keepequal drops different values",
            rules: "[{action: keepequal, source_labels: [a], target_label: b}]",
            input: &[("a", "1"), ("b", "2")],
            output: None,
        },
        Case {
            name: "keepequal: two missing labels are equal (both empty)",
            rules: "[{action: keepequal, source_labels: [x], target_label: y}]",
            input: &[("a", "1")],
            output: Some(&[("a", "1")]),
        },
        Case {
            name: "keepequal compares the joined sources",
            rules: "[{action: keepequal, source_labels: [a, b], target_label: c}]",
            input: &[("a", "1"), ("b", "2"), ("c", "1;2")],
            output: Some(&[("a", "1"), ("b", "2"), ("c", "1;2")]),
        },
        Case {
            name: "dropequal drops equal values",
            rules: "[{action: dropequal, source_labels: [a], target_label: b}]",
            input: &[("a", "1"), ("b", "1")],
            output: None,
        },
        Case {
            name: "dropequal keeps different values",
            rules: "[{action: dropequal, source_labels: [a], target_label: b}]",
            input: &[("a", "1"), ("b", "2")],
            output: Some(&[("a", "1"), ("b", "2")]),
        },
        // Expected buckets computed independently with Python's hashlib:
        // int.from_bytes(md5(v).digest()[8:], "big") % m
        Case {
            name: "hashmod of one source",
            rules: "[{action: hashmod, source_labels: [a], modulus: 1000, target_label: shard}]",
            input: &[("a", "foo")],
            output: Some(&[("a", "foo"), ("shard", "696")]),
        },
        Case {
            name: "hashmod of joined sources",
            rules: "[{action: hashmod, source_labels: [a, b], modulus: 7, target_label: shard}]",
            input: &[("a", "foo"), ("b", "bar")],
            output: Some(&[("a", "foo"), ("b", "bar"), ("shard", "6")]),
        },
        Case {
            name: "hashmod of a missing source hashes the empty string",
            rules: "[{action: hashmod, source_labels: [a], modulus: 1000, target_label: shard}]",
            input: &[],
            output: Some(&[("shard", "958")]),
        },
        Case {
            name: "hashmod reads a modulus given as a string",
            rules: r#"[{action: hashmod, source_labels: [addr], modulus: "1000", target_label: shard}]"#,
            input: &[("addr", "127.0.0.1:9090")],
            output: Some(&[("addr", "127.0.0.1:9090"), ("shard", "318")]),
        },
        Case {
            name: "labelmap with the default replacement $1",
            rules: "[{action: labelmap, regex: __meta_(.+)}]",
            input: &[
                ("__meta_pod", "p1"),
                ("__meta_ns", "default"),
                ("job", "api"),
            ],
            output: Some(&[
                ("__meta_ns", "default"),
                ("__meta_pod", "p1"),
                ("job", "api"),
                ("ns", "default"),
                ("pod", "p1"),
            ]),
        },
        Case {
            name: "labelmap with a template, anchored on names",
            rules: r#"[{action: labelmap, regex: "k_(.+)", replacement: "kube_${1}"}]"#,
            input: &[("k_pod", "p1"), ("xk_ns", "n")],
            output: Some(&[("k_pod", "p1"), ("kube_pod", "p1"), ("xk_ns", "n")]),
        },
        Case {
            name: "labelmap overwrites an existing label",
            rules: "[{action: labelmap, regex: tmp_(.+)}]",
            input: &[("job", "old"), ("tmp_job", "new")],
            output: Some(&[("job", "new"), ("tmp_job", "new")]),
        },
        Case {
            name: "labeldrop removes matching names, anchored",
            rules: "[{action: labeldrop, regex: tmp_.*|pid}]",
            input: &[("job", "api"), ("pid", "1"), ("pidx", "2"), ("tmp_a", "x")],
            output: Some(&[("job", "api"), ("pidx", "2")]),
        },
        Case {
            name: "labelkeep keeps only matching names",
            rules: "[{action: labelkeep, regex: __name__|service_name}]",
            input: &[("__name__", "cpu"), ("job", "api"), ("service_name", "svc")],
            output: Some(&[("__name__", "cpu"), ("service_name", "svc")]),
        },
        Case {
            name: "lowercase",
            rules: "[{action: lowercase, source_labels: [a, b], target_label: low}]",
            input: &[("a", "MiXeD"), ("b", "ÄÖ")],
            output: Some(&[("a", "MiXeD"), ("b", "ÄÖ"), ("low", "mixed;äö")]),
        },
        Case {
            name: "uppercase",
            rules: "[{action: uppercase, source_labels: [a], target_label: a}]",
            input: &[("a", "eu-west-1")],
            output: Some(&[("a", "EU-WEST-1")]),
        },
        Case {
            name: "lowercase of an empty value removes the target",
            rules: "[{action: lowercase, source_labels: [missing], target_label: a}]",
            input: &[("a", "x")],
            output: Some(&[]),
        },
        Case {
            name: "action names ignore case",
            rules: "[{action: LabelDrop, regex: a}, {action: REPLACE, target_label: b, replacement: c}]",
            input: &[("a", "1")],
            output: Some(&[("b", "c")]),
        },
        Case {
            name: "rules run in order, each seeing the previous result",
            rules: r#"[{target_label: a, replacement: x}, {source_labels: [a], target_label: b, replacement: "${1}y"}, {action: keep, source_labels: [b], regex: xy}]"#,
            input: &[],
            output: Some(&[("a", "x"), ("b", "xy")]),
        },
    ];
    for case in cases {
        let got = relabel(case.rules, case.input);
        let want = case.output.map(labels);
        assert_eq!(got, want, "{}", case.name);
    }
}

#[test]
fn no_rules_keep_everything() {
    let r = Relabeler::new(&[]).unwrap();
    assert!(r.is_empty());
    let mut l = labels(&[("a", "1")]);
    assert!(r.apply(&mut l));
    assert_eq!(l, labels(&[("a", "1")]));
}

#[test]
fn defaults_match_prometheus() {
    let parsed = configs("[{}]");
    assert_eq!(parsed, vec![RelabelConfig::default()]);
    let c = &parsed[0];
    assert_eq!(c.action, RelabelAction::Replace);
    assert_eq!(c.separator, ";");
    assert_eq!(c.regex, "(.*)");
    assert_eq!(c.replacement, "$1");
    assert_eq!(c.modulus, 0);
    assert!(c.source_labels.is_empty() && c.target_label.is_empty());
}

#[test]
fn null_fields_read_as_empty() {
    let c = &configs("[{separator: , regex: , replacement: , source_labels: , modulus: }]")[0];
    assert_eq!(
        (
            c.separator.as_str(),
            c.regex.as_str(),
            c.replacement.as_str()
        ),
        ("", "", "")
    );
    assert!(c.source_labels.is_empty());
    // An empty regex matches only the empty string.
    let r = relabel(r#"[{action: keep, source_labels: [a], regex: }]"#, &[]);
    assert!(r.is_some());
    assert!(
        relabel(
            r#"[{action: keep, source_labels: [a], regex: ""}]"#,
            &[("a", "x")]
        )
        .is_none()
    );
}

#[test]
fn scalars_fill_string_fields() {
    let c = &configs("[{source_labels: [a], regex: 200, target_label: ok, replacement: true}]")[0];
    assert_eq!((c.regex.as_str(), c.replacement.as_str()), ("200", "true"));
}

#[test]
fn bad_field_values_fail_to_read() {
    for (yaml, needle) in [
        ("[{action: rename}]", "unknown relabel action \"rename\""),
        ("[{action: ''}]", "cannot be empty"),
        ("[{action: }]", "expected a string"),
        ("[{regexp: a}]", "regexp"),
        ("[{action: hashmod, modulus: -1}]", "non-negative"),
        ("[{source_labels: a}]", "list"),
    ] {
        let node = Node::parse(yaml).unwrap();
        let err = from_node::<Vec<RelabelConfig>>(&node, "relabel_configs")
            .expect_err(yaml)
            .to_string();
        assert!(err.contains(needle), "{yaml}: {err}");
    }
}

#[test]
fn action_names_round_trip() {
    for a in RelabelAction::ALL {
        assert_eq!(RelabelAction::from_name(a.as_str()), Some(a));
        assert_eq!(
            RelabelAction::from_name(&a.as_str().to_uppercase()),
            Some(a)
        );
    }
    // Go's strings.ToLower maps the Kelvin sign to `k`, so Prometheus takes this too.
    assert_eq!(
        RelabelAction::from_name("\u{212A}eep"),
        Some(RelabelAction::Keep)
    );
    assert_eq!(RelabelAction::from_name("keep "), None);
}

#[test]
fn validation_errors() {
    let cases: &[(&str, &str, &[&str])] = &[
        (
            "hashmod without modulus",
            "{action: hashmod, source_labels: [a], target_label: s}",
            &["0.modulus"],
        ),
        (
            "hashmod with modulus 0",
            "{action: hashmod, modulus: 0, target_label: s}",
            &["0.modulus"],
        ),
        (
            "hashmod without target",
            "{action: hashmod, modulus: 2}",
            &["0.target_label"],
        ),
        (
            "hashmod with a templated target",
            "{action: hashmod, modulus: 2, target_label: $1}",
            &["0.target_label"],
        ),
        (
            "replace without target",
            "{source_labels: [a]}",
            &["0.target_label"],
        ),
        (
            "replace with an invalid target",
            "{target_label: foo-bar}",
            &["0.target_label"],
        ),
        (
            "replace with a target starting with a digit",
            "{target_label: 1abc}",
            &["0.target_label"],
        ),
        (
            "replace with a malformed reference",
            "{target_label: 'a${'}",
            &["0.target_label"],
        ),
        (
            "replace with an invalid templated target",
            "{target_label: 'a.${1}'}",
            &["0.target_label"],
        ),
        (
            "lowercase without target",
            "{action: lowercase, source_labels: [a]}",
            &["0.target_label"],
        ),
        (
            "uppercase without target",
            "{action: uppercase, source_labels: [a]}",
            &["0.target_label"],
        ),
        (
            "lowercase with a templated target",
            "{action: lowercase, target_label: '${1}'}",
            &["0.target_label"],
        ),
        (
            "uppercase with a replacement",
            "{action: uppercase, target_label: a, replacement: x}",
            &["0.replacement"],
        ),
        (
            "keepequal without target",
            "{action: keepequal, source_labels: [a]}",
            &["0.target_label"],
        ),
        (
            "dropequal without target",
            "{action: dropequal, source_labels: [a]}",
            &["0.target_label"],
        ),
        (
            "keepequal with an invalid target",
            "{action: keepequal, source_labels: [a], target_label: a-b}",
            &["0.target_label"],
        ),
        (
            "keepequal with a regex",
            "{action: keepequal, source_labels: [a], target_label: b, regex: x}",
            &["0.regex"],
        ),
        (
            "dropequal with a separator",
            "{action: dropequal, source_labels: [a], target_label: b, separator: ','}",
            &["0.separator"],
        ),
        (
            "dropequal with a modulus",
            "{action: dropequal, source_labels: [a], target_label: b, modulus: 3}",
            &["0.modulus"],
        ),
        (
            "keepequal with a replacement",
            "{action: keepequal, source_labels: [a], target_label: b, replacement: x}",
            &["0.replacement"],
        ),
        (
            "labeldrop with sources",
            "{action: labeldrop, regex: a, source_labels: [a]}",
            &["0.source_labels"],
        ),
        (
            "labelkeep with a target",
            "{action: labelkeep, regex: a, target_label: b}",
            &["0.target_label"],
        ),
        (
            "labelkeep with a replacement",
            "{action: labelkeep, regex: a, replacement: b}",
            &["0.replacement"],
        ),
        (
            "labeldrop with a separator and modulus",
            "{action: labeldrop, regex: a, separator: x, modulus: 1}",
            &["0.modulus", "0.separator"],
        ),
        (
            "labelmap with an invalid replacement",
            "{action: labelmap, regex: '(.*)', replacement: 'a-$1'}",
            &["0.replacement"],
        ),
        (
            "labelmap with an empty replacement",
            "{action: labelmap, regex: '(.*)', replacement: ''}",
            &["0.replacement"],
        ),
        (
            "invalid regex",
            "{action: keep, regex: '(unclosed'}",
            &["0.regex"],
        ),
        (
            "invalid regex repetition",
            "{action: drop, regex: '*'}",
            &["0.regex"],
        ),
        (
            "empty source label name",
            "{action: keep, source_labels: [a, '']}",
            &["0.source_labels.1"],
        ),
        (
            "every problem of a rule is reported",
            "{action: keepequal, source_labels: [''], regex: '(', separator: x}",
            &[
                "0.source_labels.0",
                "0.regex",
                "0.target_label",
                "0.regex",
                "0.separator",
            ],
        ),
    ];
    for (name, rule, want) in cases {
        let got = paths(&format!("[{rule}]"));
        assert_eq!(got, *want, "{name}");
    }
}

#[test]
fn valid_configs_have_no_problems() {
    let rules = r#"[
        {target_label: "${1}_x"},
        {source_labels: [a], regex: "(?P<k>[a-z]+)", target_label: "$k", replacement: "$k"},
        {action: labelmap, regex: "__meta_(.+)", replacement: "m_${1}"},
        {action: keepequal, source_labels: [a], target_label: b, replacement: "$1", separator: ";", regex: "(.*)"},
        {action: labeldrop, regex: "tmp_.*"},
        {action: hashmod, source_labels: [a], modulus: 4, target_label: __tmp_hash}
    ]"#;
    assert_eq!(validate_configs(&configs(rules)), vec![]);
}

#[test]
fn problem_paths_index_the_list() {
    let rules = "[{target_label: ok}, {target_label: ok}, {action: hashmod, target_label: s}]";
    let problems = validate_configs(&configs(rules));
    assert_eq!(problems.len(), 1);
    assert_eq!(problems[0].path, "2.modulus");
    assert!(problems[0].message.contains("modulus"), "{problems:?}");

    let err = Relabeler::new(&configs(rules)).expect_err("invalid");
    assert_eq!(err.problems, problems);
    let build: BuildError = err.into();
    assert!(build.to_string().contains("2.modulus"), "{build}");
}

#[test]
fn regex_errors_name_the_user_pattern() {
    let problems = validate_configs(&configs("[{action: keep, regex: 'a(b'}]"));
    let message = &problems[0].message;
    assert!(message.starts_with("invalid regex \"a(b\": "), "{message}");
    assert!(!message.contains('\n'), "{message}");
    assert!(!message.contains("(?s:"), "{message}");
}

#[test]
fn label_templates_as_prometheus_checks_them() {
    for (template, valid) in [
        ("job", true),
        ("_", true),
        ("a$1", true),
        ("$1", true),
        ("${1}", true),
        ("${name}_suffix", true),
        ("x_${a}${b}_$c9", true),
        ("$a-b", false),
        ("9a", false),
        ("$", false),
        ("$$", false),
        ("${", false),
        ("${}", false),
        ("${a", false),
        ("a$", false),
        ("a.b$1", false),
        ("", false),
        ("é$1", false),
    ] {
        assert_eq!(is_valid_label_template(template), valid, "{template:?}");
    }
}

/// Expected values produced by Go's `regexp.ExpandString` (Go 1.26) on the
/// same pattern and input.
#[test]
fn templates_expand_like_go() {
    let pattern = Pattern::compile("(?P<first>[a-z]+)-(?P<second>[0-9]+)(x)?").unwrap();
    let input = "abc-42";
    let Pattern::Regex(re) = &pattern else {
        panic!("not a regex")
    };
    let caps = Groups::Captured(re.captures(input).unwrap());
    for (template, want) in [
        ("$1", "abc"),
        ("${1}", "abc"),
        ("$1x", ""),
        ("${1}x", "abcx"),
        ("$01", ""),
        ("$$", "$"),
        ("$", "$"),
        ("a$", "a$"),
        ("${", "${"),
        ("${1", "${1"),
        ("${}", "${}"),
        ("$first", "abc"),
        ("${first}", "abc"),
        ("$first_", ""),
        ("$first.", "abc."),
        ("${second}${first}", "42abc"),
        ("$3", ""),
        ("$9", ""),
        ("$0", "abc-42"),
        ("$2$1", "42abc"),
        ("$-", "$-"),
        ("$100000000", ""),
        ("$1é", ""),
        ("$é", ""),
        ("${first}é", "abcé"),
        ("$$1", "$1"),
        ("$$$1", "$abc"),
        ("x${2}y", "x42y"),
    ] {
        let t = Template::compile(template, &pattern);
        assert_eq!(t.expand(&caps), want, "{template:?}");
    }
}

#[test]
fn default_regex_shortcut_expands_like_the_regex() {
    let shortcut = Pattern::compile(DEFAULT_REGEX).unwrap();
    assert!(matches!(shortcut, Pattern::Everything));
    let real = Pattern::Regex(Regex::new("^(?s:(.*))$").unwrap());
    for input in ["", "abc", "a\nb"] {
        for template in ["$0", "$1", "${1}x", "$2", "$name", "a$$"] {
            let want = Template::compile(template, &real)
                .expand(&real.run(input, true).unwrap())
                .into_owned();
            let got = Template::compile(template, &shortcut)
                .expand(&shortcut.run(input, true).unwrap())
                .into_owned();
            assert_eq!(got, want, "{template:?} on {input:?}");
        }
    }
}

/// Expected values from Go's `strings.ToLower`/`ToUpper` (simple case mapping).
#[test]
fn case_mapping_matches_go() {
    let input = "İSTANBUL Σ ß ᾳ ǅ ﬁ ᾀ";
    assert_eq!(go_to_lower(input), "istanbul σ ß ᾳ ǆ ﬁ ᾀ");
    assert_eq!(go_to_upper(input), "İSTANBUL Σ ß ᾼ Ǆ ﬁ ᾈ");
    assert_eq!(go_to_lower("ÀB"), "àb");
    assert_eq!(go_to_upper("àb"), "ÀB");
    // Rust's `to_lowercase` would give a final sigma here; Go does not.
    assert_eq!(go_to_lower("ΟΔΟΣ"), "οδοσ");
}

#[test]
fn hashmod_matches_independent_md5() {
    // int.from_bytes(hashlib.md5(v).digest()[8:], "big"), from Python.
    assert_eq!(hash_mod("", u64::MAX), 16825458760271544958);
    assert_eq!(hash_mod("foo", u64::MAX), 17145033699835028696);
    assert_eq!(hash_mod("foo;bar", u64::MAX), 15973639978189266750);
    assert_eq!(hash_mod("foo", 1000), 696);
    assert_eq!(hash_mod("foo", 0), 0, "a zero modulus never panics");
}

#[test]
fn source_values_borrow_for_one_label() {
    let rule = Rule::compile(&RelabelConfig {
        source_labels: vec!["a".into()],
        action: RelabelAction::Keep,
        ..RelabelConfig::default()
    })
    .unwrap();
    let l = labels(&[("a", "x")]);
    assert!(matches!(rule.source_value(&l), Cow::Borrowed("x")));
}

fn arb_labels() -> impl Strategy<Value = Vec<(String, String)>> {
    let name = prop::sample::select(vec!["a", "b", "job", "__name__", "tmp_x", "Zz", "9"]);
    let value = prop::sample::select(vec![
        "", "x", "foo", "Bar", "a;b", "İß", "debug", "1", "a\nb",
    ]);
    prop::collection::vec((name, value), 0..8).prop_map(|v| {
        v.into_iter()
            .map(|(n, v)| (n.to_owned(), v.to_owned()))
            .collect()
    })
}

fn arb_config() -> impl Strategy<Value = RelabelConfig> {
    let action = prop::sample::select(RelabelAction::ALL.to_vec());
    let sources = prop::collection::vec(
        prop::sample::select(vec!["a", "b", "job", "missing", "__name__"]),
        0..3,
    );
    let separator = prop::sample::select(vec![";", "", "/"]);
    let regex = prop::sample::select(vec![
        "(.*)",
        "",
        "f(.*)",
        "(?P<n>[a-z]+)",
        ".*o.*",
        "a|b",
        "__(.*)",
        "(.)(.)",
        "(.*);(.*)",
        "tmp_.*",
    ]);
    let modulus = 0u64..4;
    let target = prop::sample::select(vec!["x", "a", "${1}", "${n}_z", "t$2", "", "job"]);
    let replacement = prop::sample::select(vec!["$1", "", "${n}", "v$2", "$$", "x", "${9}"]);
    (
        action,
        sources,
        separator,
        regex,
        modulus,
        target,
        replacement,
    )
        .prop_map(
            |(action, sources, separator, regex, modulus, target, replacement)| RelabelConfig {
                source_labels: sources.into_iter().map(str::to_owned).collect(),
                separator: separator.to_owned(),
                regex: regex.to_owned(),
                modulus,
                target_label: target.to_owned(),
                replacement: replacement.to_owned(),
                action,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn apply_never_panics_and_keeps_labels_sorted_unique(
        input in arb_labels(),
        rules in prop::collection::vec(arb_config(), 1..5),
    ) {
        // Validation and compilation agree on what is valid.
        prop_assert_eq!(validate_configs(&rules).is_empty(), Relabeler::new(&rules).is_ok());
        // Keep the valid rules so that most cases exercise apply().
        let rules: Vec<RelabelConfig> = rules
            .into_iter()
            .filter(|r| validate_configs(std::slice::from_ref(r)).is_empty())
            .collect();
        let relabeler = Relabeler::new(&rules);
        prop_assert!(relabeler.is_ok(), "{:?}", relabeler.err());
        let Ok(relabeler) = relabeler else { return Ok(()) };
        let mut l = Labels::from_pairs(input);
        if relabeler.apply(&mut l) {
            let names: Vec<&str> = l.iter().map(|l| l.name.as_str()).collect();
            prop_assert!(names.windows(2).all(|w| w[0] < w[1]), "{:?}", names);
            prop_assert!(l.iter().all(|l| !l.value.is_empty()));
        }
    }
}
