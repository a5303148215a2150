//! Debug files fetched by build id from debuginfod servers
//! (`GET <url>/buildid/<id>/debuginfo`, elfutils' protocol), kept in an
//! on-disk cache capped in bytes, with misses remembered for a while.
//!
//! The worker thread never waits longer than the processor's `timeout`
//! for a fetch: a fetch runs on the tokio runtime, the frames that needed
//! it go on unnamed (counted as `debuginfod_timeout`), and the fetch goes on
//! so that later profiles of the same build id are named once its file is
//! in the cache. At most `max_concurrent_fetches` run at once; each holds
//! the file in memory while it arrives, up to `max_file_size`.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use proflow_pipeline::http::{FetchError, HttpClient};
use proflow_pipeline::telemetry::SymbolizeTelemetry;

/// What the cache gave for a build id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The debug file, in the cache.
    Found(PathBuf),
    /// No server has it (or the fetch failed), remembered for `negative_ttl`.
    Missing,
    /// The fetch did not end by the deadline; it goes on.
    TimedOut,
}

/// How the fetches are made and kept.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Server URLs without a trailing slash, tried in order.
    pub urls: Vec<String>,
    pub cache_dir: PathBuf,
    pub max_cache_size: u64,
    pub max_file_size: usize,
    pub negative_ttl: Duration,
    pub fetch_timeout: Duration,
    pub max_concurrent_fetches: usize,
}

struct Fetches {
    in_flight: HashSet<String>,
    /// Build ids no server had, and when that was learnt.
    negative: HashMap<String, Instant>,
}

/// The debuginfod source; cheap to share.
pub struct Debuginfod {
    settings: Settings,
    client: HttpClient,
    runtime: tokio::runtime::Handle,
    fetches: Mutex<Fetches>,
    done: Condvar,
    permits: Arc<tokio::sync::Semaphore>,
    telemetry: SymbolizeTelemetry,
}

impl Debuginfod {
    pub fn new(
        settings: Settings,
        client: HttpClient,
        runtime: tokio::runtime::Handle,
        telemetry: SymbolizeTelemetry,
    ) -> Arc<Self> {
        let permits = Arc::new(tokio::sync::Semaphore::new(
            settings.max_concurrent_fetches.max(1),
        ));
        Arc::new(Debuginfod {
            settings,
            client,
            runtime,
            fetches: Mutex::new(Fetches {
                in_flight: HashSet::new(),
                negative: HashMap::new(),
            }),
            done: Condvar::new(),
            permits,
            telemetry,
        })
    }

    /// Where the debug file of `build_id` (lowercase hex) is kept.
    pub fn cached_path(&self, build_id: &str) -> PathBuf {
        self.settings.cache_dir.join(build_id).join("debuginfo")
    }

    /// The debug file of `build_id` from the cache, fetching it if no
    /// fetch is under way and it is not known to be missing, and waiting
    /// for the fetch until `deadline` at the latest.
    pub fn get(self: &Arc<Self>, build_id: &str, deadline: Instant) -> Lookup {
        let path = self.cached_path(build_id);
        if path.is_file() {
            return Lookup::Found(path);
        }
        let mut fetches = match self.fetches.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        if let Some(at) = fetches.negative.get(build_id) {
            if at.elapsed() < self.settings.negative_ttl {
                return Lookup::Missing;
            }
            fetches.negative.remove(build_id);
        }
        if fetches.in_flight.insert(build_id.to_owned()) {
            let me = self.clone();
            let id = build_id.to_owned();
            self.runtime.spawn(async move { me.fetch(id).await });
        }
        while fetches.in_flight.contains(build_id) {
            let now = Instant::now();
            if now >= deadline {
                return Lookup::TimedOut;
            }
            fetches = match self.done.wait_timeout(fetches, deadline - now) {
                Ok((f, _)) => f,
                Err(p) => p.into_inner().0,
            };
        }
        drop(fetches);
        if path.is_file() {
            Lookup::Found(path)
        } else {
            Lookup::Missing
        }
    }

    async fn fetch(self: Arc<Self>, build_id: String) {
        let result = match self.permits.clone().acquire_owned().await {
            Ok(_permit) => self.fetch_from_servers(&build_id).await,
            Err(_) => Err("the fetches were closed".to_owned()),
        };
        let found = match result {
            Ok(Some(bytes)) => {
                let me = self.clone();
                let id = build_id.clone();
                let stored = tokio::task::spawn_blocking(move || me.store(&id, &bytes)).await;
                match stored {
                    Ok(Ok(())) => {
                        self.telemetry.debuginfod_fetch("found");
                        true
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(build_id, error = %e, "debuginfod: the fetched debug file could not be stored in the cache");
                        self.telemetry.debuginfod_fetch("error");
                        false
                    }
                    Err(e) => {
                        tracing::warn!(build_id, error = %e, "debuginfod: storing the debug file failed");
                        self.telemetry.debuginfod_fetch("error");
                        false
                    }
                }
            }
            Ok(None) => {
                self.telemetry.debuginfod_fetch("not_found");
                false
            }
            Err(e) => {
                tracing::warn!(build_id, error = %e, "debuginfod: fetching a debug file failed; not asked again for negative_ttl");
                self.telemetry.debuginfod_fetch("error");
                false
            }
        };
        let mut fetches = match self.fetches.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        fetches.in_flight.remove(&build_id);
        if !found {
            fetches.negative.insert(build_id, Instant::now());
        }
        drop(fetches);
        self.done.notify_all();
    }

    /// The debug file from the first server that has it; `None` when every
    /// server answered 404; an error when none had it and one failed.
    async fn fetch_from_servers(&self, build_id: &str) -> Result<Option<bytes::Bytes>, String> {
        let mut failure = None;
        for url in &self.settings.urls {
            let uri = format!("{url}/buildid/{build_id}/debuginfo");
            let Ok(uri) = uri.parse() else {
                failure = Some(format!("{uri} is not a URL"));
                continue;
            };
            let get = self.client.get(uri, self.settings.max_file_size);
            match tokio::time::timeout(self.settings.fetch_timeout, get).await {
                Ok(Ok(bytes)) => return Ok(Some(bytes)),
                Ok(Err(FetchError::Status { status: 404, .. })) => {}
                Ok(Err(e)) => failure = Some(format!("{url}: {e}")),
                Err(_) => {
                    failure = Some(format!(
                        "{url}: no answer within fetch_timeout ({:?})",
                        self.settings.fetch_timeout
                    ))
                }
            }
        }
        match failure {
            Some(f) => Err(f),
            None => Ok(None),
        }
    }

    /// Writes the file into the cache (whole, then renamed into place), then
    /// deletes the oldest files while the cache is over its cap.
    fn store(&self, build_id: &str, bytes: &[u8]) -> std::io::Result<()> {
        let path = self.cached_path(build_id);
        let dir = path.parent().unwrap_or(&self.settings.cache_dir);
        std::fs::create_dir_all(dir)?;
        let tmp = dir.join("debuginfo.tmp");
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
        trim(&self.settings.cache_dir, self.settings.max_cache_size);
        Ok(())
    }
}

/// Deletes the least recently written debug files under `cache_dir` while
/// they add up to more than `max` bytes.
pub fn trim(cache_dir: &Path, max: u64) {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return;
    };
    let mut files: Vec<(SystemTime, u64, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let path = e.path().join("debuginfo");
            let meta = std::fs::metadata(&path).ok()?;
            Some((meta.modified().ok()?, meta.len(), path))
        })
        .collect();
    let mut total: u64 = files.iter().map(|(_, n, _)| n).sum();
    files.sort();
    for (_, size, path) in files {
        if total <= max {
            break;
        }
        if std::fs::remove_file(&path).is_ok() {
            total = total.saturating_sub(size);
            if let Some(dir) = path.parent() {
                let _ = std::fs::remove_dir(dir);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_keeps_the_newest_files_under_its_cap() {
        let dir =
            std::env::temp_dir().join(format!("proflow-debuginfod-trim-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (i, id) in ["aa01", "bb02", "cc03"].iter().enumerate() {
            std::fs::create_dir_all(dir.join(id)).unwrap();
            let f = dir.join(id).join("debuginfo");
            std::fs::write(&f, vec![0u8; 100]).unwrap();
            let t = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000 + i as u64);
            std::fs::File::options()
                .write(true)
                .open(&f)
                .unwrap()
                .set_modified(t)
                .unwrap();
        }
        trim(&dir, 250);
        assert!(!dir.join("aa01").exists(), "the oldest goes first");
        assert!(dir.join("bb02/debuginfo").is_file() && dir.join("cc03/debuginfo").is_file());
        trim(&dir, 1000);
        assert!(
            dir.join("bb02/debuginfo").is_file(),
            "under the cap nothing goes"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
