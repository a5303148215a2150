//! Debug files fetched by build id from debuginfod servers
//! (`GET <url>/buildid/<id>/debuginfo`, elfutils' protocol), kept in an
//! on-disk cache capped in bytes, with misses remembered for a while.
//!
//! The worker thread never waits longer than the processor's `timeout`
//! for a fetch, and only the batch that starts a fetch waits at all: a
//! fetch runs on the tokio runtime, the frames that needed it go on unnamed
//! (counted as `debuginfod_timeout`), and the fetch goes on so that later
//! profiles of the same build id are named once its file is in the cache.
//! At most `max_concurrent_fetches` run at once, each holding the file in
//! memory while it arrives (up to `max_file_size`, every byte granted from
//! the collector's in-flight budget first: a fetch the budget has no room
//! for ends without a file, is not remembered as a miss, and is counted as
//! `over_budget`); at most
//! [`MAX_IN_FLIGHT`] build ids wait for one, and at most [`MAX_NEGATIVE`]
//! misses are remembered, so build ids from untrusted profiles cannot grow
//! either without bound. A fetched file is kept only if its build id is the
//! one asked for.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

use super::telemetry::SymbolizeTelemetry;
use proflow_model::memory::{MemoryBudget, MemoryGrant};
use proflow_net::http::{FetchError, HttpClient};
use proflow_symbolize::elf::ElfInfo;

/// Most build ids being fetched or waiting for a fetch; more are answered
/// as timed out, without a fetch, and asked again later.
pub const MAX_IN_FLIGHT: usize = 64;
/// Most misses remembered; past it the expired ones are dropped, and all of
/// them if that is not enough.
pub const MAX_NEGATIVE: usize = 10_000;

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
    /// The in-flight budget each fetched file is granted from while it is
    /// in memory.
    pub memory: MemoryBudget,
}

/// Why no server gave a file.
enum Failure {
    /// Worth remembering as a miss for `negative_ttl`.
    Lasting(String),
    /// The budget had no room: asked again by the next profile that needs
    /// it.
    OverBudget(String),
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
        if fetches.in_flight.contains(build_id) {
            // Another batch started it and waited; this one does not.
            return Lookup::TimedOut;
        }
        if fetches.in_flight.len() >= MAX_IN_FLIGHT {
            return Lookup::TimedOut;
        }
        fetches.in_flight.insert(build_id.to_owned());
        let guard = InFlight {
            me: self.clone(),
            build_id: build_id.to_owned(),
            found: false,
            remember: true,
        };
        self.runtime.spawn(async move { guard.fetch().await });
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

    /// The debug file from the first server that has it, with the grant
    /// that holds its bytes; `None` when every server answered 404; a
    /// failure when none had it and one failed.
    async fn fetch_from_servers(
        &self,
        build_id: &str,
    ) -> Result<Option<(bytes::Bytes, MemoryGrant)>, Failure> {
        let mut failure = None;
        for url in &self.settings.urls {
            let uri = format!("{url}/buildid/{build_id}/debuginfo");
            let Ok(uri) = uri.parse() else {
                failure = Some(Failure::Lasting(format!("{uri} is not a URL")));
                continue;
            };
            // A file more than one grant can ever hold is too large, like
            // one over max_file_size (a miss to remember), not a shortage.
            // Half of it: a buffer that grows is granted for both copies.
            let limit = self
                .settings
                .max_file_size
                .min(self.settings.memory.max_grant() / 2);
            let mut grant = self.settings.memory.grant();
            let get = self.client.get_granted(uri, limit, &mut grant);
            match tokio::time::timeout(self.settings.fetch_timeout, get).await {
                Ok(Ok(bytes)) => return Ok(Some((bytes, grant))),
                Ok(Err(FetchError::Status { status: 404, .. })) => {}
                Ok(Err(FetchError::TooLarge { limit })) => {
                    failure = Some(Failure::Lasting(format!(
                        "{url}: the debug file is larger than max_file_size or than one fetch may hold of service.limits.max_in_flight_bytes ({limit} bytes)"
                    )))
                }
                Ok(Err(FetchError::Memory(e))) => {
                    // Nothing is learnt about the server: do not try the
                    // next one with the same budget, nor remember a miss.
                    return Err(Failure::OverBudget(format!(
                        "{url}: the in-flight budget (service.limits.max_in_flight_bytes) has no room for the debug file: {e}"
                    )));
                }
                Ok(Err(e)) => failure = Some(Failure::Lasting(format!("{url}: {e}"))),
                Err(_) => {
                    failure = Some(Failure::Lasting(format!(
                        "{url}: no answer within fetch_timeout ({:?})",
                        self.settings.fetch_timeout
                    )))
                }
            }
        }
        match failure {
            Some(f) => Err(f),
            None => Ok(None),
        }
    }

    /// Writes the file into the cache (whole, under a name of its own, then
    /// renamed into place), then deletes the oldest files while the cache
    /// is over its cap.
    fn store(&self, build_id: &str, bytes: &[u8]) -> std::io::Result<()> {
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let path = self.cached_path(build_id);
        let dir = path.parent().unwrap_or(&self.settings.cache_dir);
        std::fs::create_dir_all(dir)?;
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!("debuginfo.tmp.{}.{n}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &path)?;
        trim(&self.settings.cache_dir, self.settings.max_cache_size);
        Ok(())
    }
}

/// One build id being fetched. However the fetch ends (a result, a panic,
/// the runtime dropping the task at shutdown), dropping this clears it from
/// the fetches, remembers a miss unless the file was stored, and wakes the
/// waiting batch.
struct InFlight {
    me: Arc<Debuginfod>,
    build_id: String,
    found: bool,
    /// Whether a fetch that found nothing is remembered as a miss.
    remember: bool,
}

impl InFlight {
    async fn fetch(mut self) {
        let me = self.me.clone();
        let id = self.build_id.clone();
        let result = match me.permits.clone().acquire_owned().await {
            Ok(_permit) => me.fetch_from_servers(&id).await,
            Err(_) => Err(Failure::Lasting("the fetches were closed".to_owned())),
        };
        let result = match result {
            Err(Failure::OverBudget(e)) => {
                tracing::warn!(build_id = id, error = %e, "debuginfod: no debug file for now; asked again when a profile needs it");
                me.telemetry.debuginfod_fetch("over_budget");
                self.remember = false;
                return;
            }
            Err(Failure::Lasting(e)) => Err(e),
            Ok(None) => Ok(None),
            Ok(Some(fetched)) => Ok(Some(fetched)),
        };
        let result = match result {
            Ok(Some((bytes, _grant))) => {
                let info = ElfInfo::parse(&bytes);
                if info.as_ref().and_then(|i| i.build_id.as_deref()) == Some(id.as_str()) {
                    let store = me.clone();
                    let sid = id.clone();
                    match tokio::task::spawn_blocking(move || store.store(&sid, &bytes)).await {
                        Ok(Ok(())) => Ok(true),
                        Ok(Err(e)) => Err(format!("storing it in the cache failed: {e}")),
                        Err(e) => Err(format!("storing it in the cache failed: {e}")),
                    }
                } else {
                    Err("the server sent a file that is not ELF with this build id".to_owned())
                }
            }
            Ok(None) => Ok(false),
            Err(e) => Err(e),
        };
        match result {
            Ok(true) => {
                self.found = true;
                me.telemetry.debuginfod_fetch("found");
            }
            Ok(false) => me.telemetry.debuginfod_fetch("not_found"),
            Err(e) => {
                tracing::warn!(build_id = id, error = %e, "debuginfod: no debug file; not asked again for negative_ttl");
                me.telemetry.debuginfod_fetch("error");
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut fetches = match self.me.fetches.lock() {
            Ok(f) => f,
            Err(p) => p.into_inner(),
        };
        fetches.in_flight.remove(&self.build_id);
        if !self.found && self.remember {
            if fetches.negative.len() >= MAX_NEGATIVE {
                let ttl = self.me.settings.negative_ttl;
                fetches.negative.retain(|_, at| at.elapsed() < ttl);
                if fetches.negative.len() >= MAX_NEGATIVE {
                    fetches.negative.clear();
                }
            }
            fetches
                .negative
                .insert(std::mem::take(&mut self.build_id), Instant::now());
        }
        drop(fetches);
        self.me.done.notify_all();
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
            // Only what a fetch makes: a directory holding a regular file,
            // never followed through a symbolic link (one planted in the
            // cache could make trimming delete a file elsewhere).
            if !e.file_type().ok()?.is_dir() {
                return None;
            }
            let path = e.path().join("debuginfo");
            let meta = std::fs::symlink_metadata(&path).ok()?;
            if !meta.is_file() {
                return None;
            }
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

    /// A fresh directory of this test's own under the temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("proflow-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn trimming_never_follows_a_symbolic_link() {
        let dir = scratch("trim-links");
        let elsewhere = scratch("trim-elsewhere");
        let victim = elsewhere.join("victim");
        std::fs::write(&victim, vec![0u8; 1000]).unwrap();
        std::fs::create_dir(dir.join("aa01")).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("aa01/debuginfo")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.join("bb02")).unwrap();
        trim(&dir, 0);
        assert!(victim.is_file(), "a file outside the cache was deleted");
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&elsewhere);
    }

    #[test]
    fn the_fallback_directory_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = scratch("private");
        let fresh = dir.join("mine");
        crate::symbolize::config::private_dir(&fresh).unwrap();
        let mode = std::fs::metadata(&fresh).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        // Open to others, or a symbolic link to one: refused.
        let open = dir.join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(crate::symbolize::config::private_dir(&open).is_err());
        let link = dir.join("link");
        std::os::unix::fs::symlink(&fresh, &link).unwrap();
        let err = crate::symbolize::config::private_dir(&link).unwrap_err();
        assert!(err.contains("debuginfod.cache_dir"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }

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
