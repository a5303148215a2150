//! Names of everything the file exporter writes under its directory:
//!
//! ```text
//! <directory>/index.jsonl                                   one JSON line per profile file
//! <directory>/<service>/<start>-<name>-<seq>.pb.gz          format: pprof
//! <directory>/<service>/<start>-<name>-<seq>-<type>.folded  format: folded, one per sample type
//! <directory>/<service>/<start>-<name>-<seq>.otlp.json      format: otlp_json
//! <directory>/**/.proflow-<seq>.tmp                         being written; removed at start
//! ```
//!
//! `<start>` is the profile's start in unix nanoseconds, `<name>` its `__name__`
//! label, `<seq>` a counter of this directory that starts above every sequence
//! number found on disk, so names never repeat, across restarts too. `<name>` and
//! `<type>` never contain `-`, which keeps the parts separable.

/// The index of written files, directly under the directory.
pub(crate) const INDEX_FILE: &str = "index.jsonl";
/// Temporary index written during compaction.
pub(crate) const INDEX_TEMP_FILE: &str = ".proflow-index.tmp";
pub(crate) const PPROF_SUFFIX: &str = ".pb.gz";
pub(crate) const FOLDED_SUFFIX: &str = ".folded";
pub(crate) const OTLP_JSON_SUFFIX: &str = ".otlp.json";
/// Temporary files start with a dot (hidden, never a service directory name,
/// which [`service_dir`] guarantees) and never end in a profile suffix, so a
/// reader globbing `*.pb.gz` never sees a partial file.
const TEMP_PREFIX: &str = ".proflow-";
const TEMP_SUFFIX: &str = ".tmp";
/// The directory of profiles without a `service_name` label.
pub(crate) use proflow_model::model::UNKNOWN_SERVICE;
/// The `<name>` part of profiles without a `__name__` label.
const UNKNOWN_NAME: &str = "profile";
/// Longest part taken from a label, in bytes: keeps whole names well under the
/// 255-byte limit of common filesystems.
const MAX_PART: usize = 96;

/// `raw` made into a safe single path component: only `[A-Za-z0-9_.]` (and `-`
/// when `allow_dash`), other characters become `_`, no leading dot (so never
/// `.`, `..` or a hidden name), at most [`MAX_PART`] bytes; `fallback` if empty.
fn sanitize(raw: &str, allow_dash: bool, fallback: &str) -> String {
    let mut out = String::with_capacity(raw.len().min(MAX_PART));
    for c in raw.chars() {
        if out.len() >= MAX_PART {
            break;
        }
        let keep = c.is_ascii_alphanumeric() || c == '_' || c == '.' || (allow_dash && c == '-');
        out.push(if keep { c } else { '_' });
    }
    if out.starts_with('.') {
        out.replace_range(0..1, "_");
    }
    if out.is_empty() {
        fallback.to_owned()
    } else {
        out
    }
}

/// The directory name for a service (`-` is common in service names and safe here).
pub(crate) fn service_dir(service_name: Option<&str>) -> String {
    let dir = sanitize(service_name.unwrap_or(""), true, UNKNOWN_SERVICE);
    // The index is a file directly under the directory; a service of that name
    // must not collide with it.
    if dir == INDEX_FILE {
        format!("_{dir}")
    } else {
        dir
    }
}

/// The file name of one written profile file.
pub(crate) fn profile_file(
    start_unix_nanos: i64,
    name: Option<&str>,
    seq: u64,
    sample_type: Option<&str>,
) -> String {
    // A negative start (a broken sender) would put a `-` where the parser
    // expects digits; clamp it, the index keeps the real value.
    let start = start_unix_nanos.max(0);
    let name = sanitize(name.unwrap_or(""), false, UNKNOWN_NAME);
    match sample_type {
        None => format!("{start}-{name}-{seq}{PPROF_SUFFIX}"),
        Some(ty) => {
            let ty = sanitize(ty, false, "values");
            format!("{start}-{name}-{seq}-{ty}{FOLDED_SUFFIX}")
        }
    }
}

/// The name of an OTLP JSON file (`format: otlp_json`).
pub(crate) fn otlp_json_file(start_unix_nanos: i64, name: Option<&str>, seq: u64) -> String {
    let pprof = profile_file(start_unix_nanos, name, seq, None);
    let stem = pprof.strip_suffix(PPROF_SUFFIX).unwrap_or(&pprof);
    format!("{stem}{OTLP_JSON_SUFFIX}")
}

/// The sequence number of a profile file this exporter wrote, `None` for any
/// other name.
pub(crate) fn profile_seq(file_name: &str) -> Option<u64> {
    let stem = file_name
        .strip_suffix(PPROF_SUFFIX)
        .or_else(|| file_name.strip_suffix(FOLDED_SUFFIX))
        .or_else(|| file_name.strip_suffix(OTLP_JSON_SUFFIX))?;
    let mut parts = stem.split('-');
    let start = parts.next()?;
    let _name = parts.next()?;
    let seq = parts.next()?;
    if start.is_empty() || !start.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !seq.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    seq.parse().ok()
}

/// The temporary name a file with sequence number `seq` is written under.
pub(crate) fn temp_file(seq: u64) -> String {
    format!("{TEMP_PREFIX}{seq}{TEMP_SUFFIX}")
}

/// True for names of temporary files (profile or index) left by a crash.
pub(crate) fn is_temp(file_name: &str) -> bool {
    file_name.starts_with(TEMP_PREFIX) && file_name.ends_with(TEMP_SUFFIX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_names_become_one_safe_component() {
        assert_eq!(service_dir(Some("checkout-api")), "checkout-api");
        assert_eq!(service_dir(None), UNKNOWN_SERVICE);
        assert_eq!(service_dir(Some("")), UNKNOWN_SERVICE);
        for hostile in [
            "..",
            ".",
            "../../etc",
            "/abs/path",
            "a/b",
            "a\\b",
            ".hidden",
            "é\0x",
        ] {
            let dir = service_dir(Some(hostile));
            assert!(
                !dir.contains('/') && !dir.contains('\\'),
                "{hostile} -> {dir}"
            );
            assert!(!dir.starts_with('.'), "{hostile} -> {dir}");
            assert!(
                dir.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b)),
                "{hostile} -> {dir}"
            );
        }
        assert_eq!(service_dir(Some(&"x".repeat(1000))).len(), MAX_PART);
        assert_eq!(service_dir(Some(INDEX_FILE)), "_index.jsonl");
    }

    #[test]
    fn profile_names_round_trip_their_sequence() {
        let n = profile_file(1_700_000_000_000_000_000, Some("process_cpu"), 42, None);
        assert_eq!(n, "1700000000000000000-process_cpu-42.pb.gz");
        assert_eq!(profile_seq(&n), Some(42));
        let n = profile_file(-5, Some("go-mem"), 7, Some("alloc-space"));
        assert_eq!(n, "0-go_mem-7-alloc_space.folded");
        assert_eq!(profile_seq(&n), Some(7));
        assert_eq!(profile_file(1, None, 0, None), "1-profile-0.pb.gz");
        let otlp = otlp_json_file(5, Some("process_cpu"), 9);
        assert_eq!(otlp, "5-process_cpu-9.otlp.json");
        assert_eq!(profile_seq(&otlp), Some(9));
        for other in [
            "notes.txt",
            "x.pb.gz",
            "a-b-c.pb.gz",
            ".proflow-3.tmp",
            "-x-1.pb.gz",
        ] {
            assert_eq!(profile_seq(other), None, "{other}");
        }
    }

    #[test]
    fn temp_names_are_never_profile_names() {
        let t = temp_file(9);
        assert!(is_temp(&t));
        assert!(is_temp(INDEX_TEMP_FILE));
        assert!(!t.ends_with(PPROF_SUFFIX) && !t.ends_with(FOLDED_SUFFIX));
        assert_eq!(profile_seq(&t), None);
        assert!(!is_temp("1-cpu-1.pb.gz"));
    }
}
