//! Folded (text) profiles' types by their application name suffix, as
//! Pyroscope maps them. The `__name__` of pprof sample types is
//! [`proflow_model::profile_type`].

pub(crate) use proflow_model::profile_type::{SampleTypeConfigs, profile_name_from_sample_types};

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
