//! Certificates, keys and credential files watched for change by content
//! ([`stamps`], [`watch_files`]), for the listeners' TLS and auth.

use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the files are checked for changes.
pub const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// A hash of each file's contents (`None` when it cannot be read, so its
/// return is noticed). Contents, not times: a rotated token of the same
/// length written within the clock's resolution, or a copy that keeps the
/// old time, is still seen. The files are small (certificates, keys,
/// credentials).
pub(crate) type Stamps = Vec<Option<u64>>;

pub(crate) fn stamps(files: &[&std::path::Path]) -> Stamps {
    use std::hash::{Hash, Hasher};
    files
        .iter()
        .map(|f| {
            let bytes = std::fs::read(f).ok()?;
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut h);
            Some(h.finish())
        })
        .collect()
}

/// Calls `reload` whenever `files` change (checked every
/// [`RELOAD_EVERY`]), starting from `seen`, until `stop`.
pub(crate) fn watch_files(
    files: &[&std::path::Path],
    mut seen: Stamps,
    stop: CancellationToken,
    reload: impl Fn() + Send + 'static,
) {
    let files: Vec<std::path::PathBuf> = files.iter().map(|p| p.to_path_buf()).collect();
    tokio::spawn(async move {
        let paths: Vec<&std::path::Path> = files.iter().map(|p| p.as_path()).collect();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(RELOAD_EVERY) => {}
                _ = stop.cancelled() => return,
            }
            let now = stamps(&paths);
            if now != seen {
                seen = now;
                reload();
            }
        }
    });
}
