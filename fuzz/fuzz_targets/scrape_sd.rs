//! Service discovery target lists of the `scrape` receiver: bit 0 of the
//! first byte picks YAML (file SD `.yaml`/`.yml`) or JSON (file SD `.json`
//! and every HTTP SD answer). What parses stays within the limits, keeps
//! only valid label names and usable targets, and, written as JSON again,
//! parses to the same groups with nothing skipped.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_model::model::is_valid_label_name;
use proflow_receivers::scrape::discovery::{
    Format, MAX_GROUPS, MAX_LABELS, MAX_TARGETS, TargetGroup, parse_groups,
};

fuzz_target!(|data: &[u8]| {
    let Some((&flags, body)) = data.split_first() else {
        return;
    };
    let format = if flags & 1 == 1 {
        Format::Yaml
    } else {
        Format::Json
    };
    let Ok(parsed) = parse_groups(body, format) else {
        return;
    };
    let groups = &parsed.groups;
    assert!(groups.len() <= MAX_GROUPS);
    assert!(groups.iter().map(|g| g.targets.len()).sum::<usize>() <= MAX_TARGETS);
    assert!(groups.iter().map(|g| g.labels.len()).sum::<usize>() <= MAX_LABELS);
    for g in groups {
        assert!(
            g.labels.keys().all(|n| is_valid_label_name(n)),
            "an invalid label name kept"
        );
    }
    let written = json(groups);
    let again = parse_groups(written.as_bytes(), Format::Json)
        .unwrap_or_else(|e| panic!("groups written as JSON do not parse: {e}\n{written}"));
    assert!(
        again.skipped.is_empty(),
        "kept targets skipped the second time: {:?}",
        again.skipped
    );
    assert_eq!(again.groups, parsed.groups, "groups changed through JSON");
});

/// Groups as Prometheus's JSON target list.
fn json(groups: &[TargetGroup]) -> String {
    let list: Vec<serde_json::Value> = groups
        .iter()
        .map(|g| serde_json::json!({ "targets": g.targets, "labels": g.labels }))
        .collect();
    serde_json::Value::Array(list).to_string()
}
