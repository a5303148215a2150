//! The profile type (`__name__`) of a profile, by Pyroscope's rules: from
//! pprof sample types, and from an OTLP profile's sample type (the same rules
//! applied to its one sample type).
//!
//! `wall` anywhere wins; otherwise the first
//! sample type whose (display) name contains `cpu` → `process_cpu`,
//! `alloc_`/`inuse_` or exactly `space`/`objects` → `memory`, `mutex_` →
//! `mutex`, `block_` → `block`, `goroutines` → `goroutines`; if none matches,
//! the last name as is. The display name comes from the `sample_type_config`
//! a multipart request carries (pyroscope-go uses it to tell block from mutex
//! profiles, which share the `contentions`/`delay` sample types), or from
//! Pyroscope's default mapping when the request has none.

use std::collections::HashMap;

use serde::Deserialize;

/// One entry of a multipart `sample_type_config` part (JSON object keyed by
/// sample type). Only `display-name` changes what we do; the other keys
/// (`units`, `aggregation`, `cumulative`, `sampled`) are accepted and ignored,
/// as Pyroscope's pprof ingestion ignores them too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct SampleTypeConfig {
    #[serde(rename = "display-name", default)]
    pub display_name: Option<String>,
}

pub type SampleTypeConfigs = HashMap<String, SampleTypeConfig>;

/// Pyroscope's display names for Go sample types, used when a request brings
/// no `sample_type_config`.
fn default_display_name(sample_type: &str) -> Option<&'static str> {
    match sample_type {
        "samples" => Some("cpu"),
        "goroutine" => Some("goroutines"),
        "contentions" => Some("mutex_count"),
        "delay" => Some("mutex_duration"),
        _ => None,
    }
}

/// The `__name__` of a pprof profile with these sample types, or `None` when
/// it has none.
pub fn profile_name_from_sample_types<'a>(
    sample_types: impl IntoIterator<Item = &'a str> + Clone,
    configs: Option<&SampleTypeConfigs>,
) -> Option<String> {
    if sample_types.clone().into_iter().any(|t| t == "wall") {
        return Some("wall".to_owned());
    }
    let mut last: Option<&str> = None;
    for sample_type in sample_types {
        let display = match configs {
            Some(configs) => configs
                .get(sample_type)
                .and_then(|c| c.display_name.as_deref())
                .filter(|d| !d.is_empty()),
            None => default_display_name(sample_type),
        }
        .unwrap_or(sample_type);
        let name = if display.contains("cpu") {
            "process_cpu"
        } else if display.contains("alloc_")
            || display.contains("inuse_")
            || display == "space"
            || display == "objects"
        {
            "memory"
        } else if display.contains("mutex_") {
            "mutex"
        } else if display.contains("block_") {
            "block"
        } else if display.contains("goroutines") {
            "goroutines"
        } else {
            last = Some(display);
            continue;
        };
        return Some(name.to_owned());
    }
    last.filter(|s| !s.is_empty()).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(types: &[&str], configs: Option<&SampleTypeConfigs>) -> Option<String> {
        profile_name_from_sample_types(types.iter().copied(), configs)
    }

    #[test]
    fn pprof_sample_types_like_pyroscope() {
        // Go CPU, Node CPU and wall, Go heap, Node heap, Go goroutines.
        assert_eq!(
            name(&["samples", "cpu"], None).as_deref(),
            Some("process_cpu")
        );
        assert_eq!(name(&["cpu"], None).as_deref(), Some("process_cpu"));
        assert_eq!(name(&["samples", "wall"], None).as_deref(), Some("wall"));
        assert_eq!(
            name(
                &[
                    "alloc_objects",
                    "alloc_space",
                    "inuse_objects",
                    "inuse_space"
                ],
                None
            )
            .as_deref(),
            Some("memory")
        );
        assert_eq!(name(&["objects", "space"], None).as_deref(), Some("memory"));
        assert_eq!(name(&["goroutine"], None).as_deref(), Some("goroutines"));
        // Without config, contentions/delay read as mutex (Pyroscope's default).
        assert_eq!(
            name(&["contentions", "delay"], None).as_deref(),
            Some("mutex")
        );
        assert_eq!(name(&["exceptions"], None).as_deref(), Some("exceptions"));
        assert_eq!(name(&[], None), None);
    }

    #[test]
    fn sample_type_config_renames() {
        let block: SampleTypeConfigs = serde_json::from_str(
            r#"{"contentions":{"display-name":"block_count","units":"lock_samples"},
                "delay":{"display-name":"block_duration","units":"lock_nanoseconds","cumulative":false}}"#,
        )
        .unwrap();
        assert_eq!(
            name(&["contentions", "delay"], Some(&block)).as_deref(),
            Some("block")
        );
        // A config replaces the default mapping entirely, as in Pyroscope.
        let heap: SampleTypeConfigs =
            serde_json::from_str(r#"{"alloc_objects":{"units":"objects"}}"#).unwrap();
        assert_eq!(
            name(&["alloc_objects"], Some(&heap)).as_deref(),
            Some("memory")
        );
        let leak: SampleTypeConfigs =
            serde_json::from_str(r#"{"goroutineleak":{"display-name":"goroutine_leak"}}"#).unwrap();
        assert_eq!(
            name(&["goroutineleak"], Some(&leak)).as_deref(),
            Some("goroutine_leak")
        );
    }
}
