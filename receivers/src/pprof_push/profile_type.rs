//! The profile type (`__name__`) of a profile, by Pyroscope's rules.
//!
//! - pprof: from the sample types. `wall` anywhere wins; otherwise the first
//!   sample type whose (display) name contains `cpu` → `process_cpu`,
//!   `alloc_`/`inuse_` or exactly `space`/`objects` → `memory`, `mutex_` →
//!   `mutex`, `block_` → `block`, `goroutines` → `goroutines`; if none matches,
//!   the last name as is. The display name comes from the `sample_type_config`
//!   a multipart request carries (pyroscope-go uses it to tell block from mutex
//!   profiles, which share the `contentions`/`delay` sample types), or from
//!   Pyroscope's default mapping when the request has none.
//! - folded text: from the suffix of the application name (`app.cpu`,
//!   `app.alloc_space`, ...), which also gives the sample type and unit.

use std::collections::HashMap;

use serde::Deserialize;

/// One entry of a multipart `sample_type_config` part (JSON object keyed by
/// sample type). Only `display-name` changes what we do; the other keys
/// (`units`, `aggregation`, `cumulative`, `sampled`) are accepted and ignored,
/// as Pyroscope's pprof ingestion ignores them too.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub(crate) struct SampleTypeConfig {
    #[serde(rename = "display-name", default)]
    pub display_name: Option<String>,
}

pub(crate) type SampleTypeConfigs = HashMap<String, SampleTypeConfig>;

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
pub(crate) fn profile_name_from_sample_types<'a>(
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

/// What the suffix of a folded profile's application name says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FoldedType {
    /// The `__name__` label.
    pub profile_name: &'static str,
    pub sample_type: &'static str,
    pub unit: &'static str,
}

impl FoldedType {
    /// CPU and wall profiles count samples; with a sample rate Pyroscope turns
    /// them into nanoseconds (`cpu`/`wall` sample type, period 1s / rate).
    pub fn is_sampled(&self) -> bool {
        matches!(self.profile_name, "process_cpu" | "wall")
    }
}

const fn ft(
    profile_name: &'static str,
    sample_type: &'static str,
    unit: &'static str,
) -> FoldedType {
    FoldedType {
        profile_name,
        sample_type,
        unit,
    }
}

/// The type named by a folded profile's suffix, as Pyroscope maps them.
pub(crate) fn folded_type(suffix: &str) -> Option<FoldedType> {
    Some(match suffix {
        "cpu" | "itimer" => ft("process_cpu", "samples", "count"),
        "wall" | "seconds" | "nanoseconds" | "microseconds" | "milliseconds" => {
            ft("wall", "samples", "count")
        }
        "inuse_objects" => ft("memory", "inuse_objects", "count"),
        "inuse_space" => ft("memory", "inuse_space", "bytes"),
        "alloc_objects" => ft("memory", "alloc_objects", "count"),
        "alloc_space" => ft("memory", "alloc_space", "bytes"),
        "alloc_in_new_tlab_objects" => ft("memory", "alloc_in_new_tlab_objects", "count"),
        "alloc_in_new_tlab_bytes" => ft("memory", "alloc_in_new_tlab_bytes", "bytes"),
        "alloc_outside_tlab_objects" => ft("memory", "alloc_outside_tlab_objects", "count"),
        "alloc_outside_tlab_bytes" => ft("memory", "alloc_outside_tlab_bytes", "bytes"),
        "live" => ft("memory", "live", "count"),
        "bytes" => ft("memory", "samples", "bytes"),
        "goroutines" => ft("goroutine", "goroutines", "count"),
        "mutex_count" => ft("mutex", "contentions", "count"),
        "mutex_duration" => ft("mutex", "delay", "nanoseconds"),
        "block_count" | "lock_count" => ft("block", "contentions", "count"),
        "block_duration" | "lock_duration" => ft("block", "delay", "nanoseconds"),
        "exceptions" => ft("exceptions", "samples", "count"),
        _ => return None,
    })
}

/// Splits `app.suffix` at the last dot. A name without a dot is a CPU profile,
/// as in Pyroscope. Errors name the unknown suffix.
pub(crate) fn split_folded_app(app: &str) -> Result<(&str, FoldedType), String> {
    let Some((base, suffix)) = app.rsplit_once('.') else {
        return Ok((app, ft("process_cpu", "samples", "count")));
    };
    match folded_type(suffix) {
        Some(t) if !base.is_empty() => Ok((base, t)),
        _ => Err(format!(
            "the application name {app:?} ends in .{suffix}, which is not a profile type; for text formats end the name with one such as .cpu, .wall, .alloc_space, .inuse_objects, .mutex_count or .block_duration"
        )),
    }
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

    #[test]
    fn folded_suffixes() {
        assert_eq!(split_folded_app("app").unwrap().0, "app");
        assert_eq!(
            split_folded_app("app").unwrap().1.profile_name,
            "process_cpu"
        );
        let (base, t) = split_folded_app("my.app.alloc_space").unwrap();
        assert_eq!(base, "my.app");
        assert_eq!(t, ft("memory", "alloc_space", "bytes"));
        assert!(!t.is_sampled());
        assert!(split_folded_app("svc.wall").unwrap().1.is_sampled());
        assert_eq!(
            split_folded_app("svc.block_duration").unwrap().1,
            ft("block", "delay", "nanoseconds")
        );
        assert!(split_folded_app("my.app").unwrap_err().contains(".app"));
        assert!(split_folded_app(".cpu").is_err());
    }
}
