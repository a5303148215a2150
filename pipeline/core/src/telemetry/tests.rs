//! Metric names, labels and the shutdown losses.

use super::*;

#[test]
fn rfc3339_formats_known_instants() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
    assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
    assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
    assert_eq!(rfc3339(-1), "1969-12-31T23:59:59Z");
}

#[test]
fn a_component_family_is_declared_once_and_shared_by_every_instance() {
    let t = Telemetry::new();
    let first = t.counters("thing_seen", "Things seen, by kind");
    // A second instance (or the same component after a reload) gets the
    // same family: both write one series set, shown once.
    let second = t.counters("thing_seen", "Things seen, by kind");
    first
        .get_or_create(&with_label(&vec![("receiver", "a".into())], "kind", "x"))
        .inc();
    second
        .get_or_create(&with_label(&vec![("receiver", "a".into())], "kind", "x"))
        .inc_by(2);
    let page = t.render();
    assert!(
        page.contains("proflow_thing_seen_total{receiver=\"a\",kind=\"x\"} 3"),
        "{page}"
    );
    assert_eq!(
        page.matches("# HELP proflow_thing_seen Things seen, by kind.")
            .count(),
        1
    );
    // The same name as another type is not shown twice (and the first
    // family keeps counting).
    let clash = t.gauges("thing_seen", "Things seen now");
    clash.get_or_create(&vec![("receiver", "a".into())]).set(7);
    let page = t.render();
    assert_eq!(
        page.matches("# TYPE proflow_thing_seen ").count(),
        1,
        "{page}"
    );
    assert!(
        !page.contains("proflow_thing_seen{receiver=\"a\"} 7"),
        "{page}"
    );
    // A core family's name is taken too.
    let core = t.gauges("memory_limit_bytes", "not this");
    core.get_or_create(&Vec::new()).set(1);
    assert_eq!(
        t.render()
            .matches("# TYPE proflow_memory_limit_bytes ")
            .count(),
        1
    );
}

#[test]
fn targets_page_tags_each_receivers_targets() {
    let t = Arc::new(Telemetry::new());
    t.register_targets(
        "scrape",
        Arc::new(|| {
            (
                vec![serde_json::json!({"scrapeUrl": "http://h:1/x"})],
                Vec::new(),
            )
        }),
    );
    let page = t.targets_json(None);
    assert_eq!(page["status"], "success");
    let page = &page["data"];
    assert_eq!(page["activeTargets"][0]["receiver"], "scrape");
    assert_eq!(page["activeTargets"][0]["scrapeUrl"], "http://h:1/x");
    assert_eq!(page["droppedTargets"].as_array().map(Vec::len), Some(0));
    // A reload replaces the receiver: the new one registers, then the
    // old one stops, leaving the new one's targets; stopping for good
    // takes them off.
    let view = |url: &'static str| -> TargetsView {
        Arc::new(move || (vec![serde_json::json!({ "scrapeUrl": url })], Vec::new()))
    };
    let (old, new) = (view("http://old"), view("http://new"));
    t.register_targets("scrape", old.clone());
    t.register_targets("scrape", new.clone());
    t.unregister_targets("scrape", &old);
    assert_eq!(
        t.targets_json(None)["data"]["activeTargets"][0]["scrapeUrl"],
        "http://new"
    );
    t.unregister_targets("scrape", &new);
    assert_eq!(
        t.targets_json(None)["data"]["activeTargets"]
            .as_array()
            .map(Vec::len),
        Some(0)
    );
}

#[test]
fn a_replaced_queue_leaves_the_gauges_to_its_successor() {
    let t = Arc::new(Telemetry::new());
    let (old, new) = (t.exporter("file"), t.exporter("file"));
    old.mute_gauges();
    new.queue_level(1, 100);
    old.queue_level(7, 700);
    old.queue_stored(9, 9);
    old.enqueued(3);
    let text = t.render();
    assert!(
        text.contains(r#"proflow_exporter_queue_profiles{exporter="file"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"proflow_exporter_queue_bytes{exporter="file"} 100"#),
        "{text}"
    );
    assert!(
        !text.contains("proflow_exporter_queue_stored_records{"),
        "{text}"
    );
    assert!(
        text.contains(r#"proflow_exporter_enqueued_profiles_total{exporter="file"} 3"#),
        "counters go on: {text}"
    );
}

#[test]
fn renders_component_metrics() {
    let t = Arc::new(Telemetry::new());
    t.receiver("pprof_push").accepted(2, 100);
    t.receiver("pprof_push").refused("bad_request", 0);
    t.exporter("file").queue_level(3, 300);
    let text = t.render();
    assert!(
        text.contains(r#"proflow_receiver_accepted_profiles_total{receiver="pprof_push"} 2"#),
        "{text}"
    );
    assert!(text.contains(r#"proflow_receiver_refused_requests_total{receiver="pprof_push",reason="bad_request"} 1"#), "{text}");
    assert!(
        text.contains(r#"proflow_exporter_queue_bytes{exporter="file"} 300"#),
        "{text}"
    );
    let help: Vec<&str> = text.lines().filter(|l| l.starts_with("# HELP")).collect();
    assert!(!help.is_empty(), "{text}");
    for line in help {
        assert!(
            line.ends_with('.') && !line.ends_with(".."),
            "one period per help text: {line}"
        );
    }
}

#[test]
fn tenants_on_the_metrics_are_bounded() {
    let t = Arc::new(Telemetry::new());
    let r = t.receiver("pprof_push");
    for i in 0..super::handles::MAX_TENANT_LABELS + 5 {
        r.tenant_refused(Some(&format!("t{i}")), "rate_limited");
    }
    r.tenant_refused(Some("t0"), "rate_limited");
    r.tenant_refused(None, "label_name_too_long");
    let text = t.render();
    let line = |tenant: &str, reason: &str| {
        format!(
            r#"proflow_receiver_tenant_refused_requests_total{{receiver="pprof_push",tenant="{tenant}",reason="{reason}"}}"#
        )
    };
    assert!(
        text.contains(&format!("{} 2", line("t0", "rate_limited"))),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} 1", line("t99", "rate_limited"))),
        "{text}"
    );
    assert!(!text.contains(&line("t100", "rate_limited")), "{text}");
    // The five past the bound, and the tenant of no name once the names ran out.
    assert!(
        text.contains(&format!("{} 5", line("other", "rate_limited"))),
        "{text}"
    );
    assert!(
        text.contains(&format!("{} 1", line("other", "label_name_too_long"))),
        "{text}"
    );
}

#[test]
fn tenants_volume_is_shown_by_rate() {
    let t = Arc::new(Telemetry::new());
    t.tenant_accepted(Some("team-a"), 60, 6_000);
    t.tenant_accepted(None, 6, 60);
    t.receiver("pprof_push")
        .tenant_refused(Some("team-b"), "rate_limited");
    let text = t.render();
    assert!(
        text.contains(r#"proflow_tenant_received_profiles_per_second{tenant="team-a"} 1.0"#),
        "{text}"
    );
    assert!(
        text.contains(r#"proflow_tenant_received_bytes_per_second{tenant="anonymous"} 1.0"#),
        "{text}"
    );
    // Refused, never accepted: on /tenants, not on the gauges.
    assert!(!text.contains(r#"tenant="team-b"} 0"#), "{text}");
    let page = t.tenants_json();
    let rows = page["tenants"].as_array().unwrap();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["tenant"], "team-a");
    assert_eq!(rows[0]["bytes_total"], 6_000);
    assert!((rows[0]["share"].as_f64().unwrap() - 6_000.0 / 6_060.0).abs() < 1e-9);
    let b = rows.iter().find(|r| r["tenant"] == "team-b").unwrap();
    assert_eq!(b["refused"]["rate_limited"], 1);
}
