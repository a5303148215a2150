//! Names and times the integration tests stamp their data with, so that data
//! a reused peer kept from an earlier run (or another test of this run) never
//! matches what a test looks for. Shared by `common` and `peer_env`.

use std::sync::atomic::{AtomicU32, Ordering};

/// Unix time now, in nanoseconds.
pub fn now_nanos() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as i64)
        .unwrap_or(0)
}

/// `prefix` and then this process, a sequence number and the clock: unique
/// among every run, letters, digits and `x` only after the prefix (a
/// service name, a Kafka topic or group, a label value).
pub fn unique(prefix: &str) -> String {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    format!(
        "{prefix}{}x{}x{}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed),
        now_nanos()
    )
}
