use super::*;

#[test]
fn labels_stay_sorted_unique_and_drop_empty() {
    let mut l = Labels::from_pairs([("b", "2"), ("a", "1"), ("b", "3"), ("c", "")]);
    assert_eq!(l.to_selector_string(), r#"{a="1", b="3"}"#);
    l.set("a", "");
    assert_eq!(l.get("a"), None);
    assert_eq!(l.get("b"), Some("3"));
    l.set("__name__", "process_cpu");
    assert_eq!(l.iter().next().map(|l| l.name.as_str()), Some("__name__"));
    assert_eq!(l.without_internal(&[]).get("__name__"), None);
    assert_eq!(
        l.without_internal(&["__name__"]).get("__name__"),
        Some("process_cpu")
    );
}

#[test]
fn label_name_validity() {
    assert!(is_valid_label_name("service_name"));
    assert!(is_valid_label_name("_x9"));
    assert!(!is_valid_label_name("9x"));
    assert!(!is_valid_label_name("a-b"));
    assert!(!is_valid_label_name(""));
}

#[test]
fn the_tenant_label_wins_over_the_batch_tenant() {
    let meta = BatchMeta {
        tenant: Some("header".to_owned()),
        ..Default::default()
    };
    let labelled = Labels::from_pairs([(TENANT_LABEL, "team-a")]);
    assert_eq!(meta.tenant_of(&labelled), Some("team-a"));
    assert_eq!(meta.tenant_of(&Labels::new()), Some("header"));
    let empty = Labels::from_pairs([(TENANT_LABEL, "")]);
    assert_eq!(meta.tenant_of(&empty), Some("header"), "empty is no tenant");
    assert_eq!(BatchMeta::default().tenant_of(&Labels::new()), None);
}
