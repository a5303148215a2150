//! File service discovery (`file_sd_configs`): target groups read from
//! JSON or YAML files, as Prometheus's file_sd reads them.
//!
//! Each configured path is one file, or a directory and a file name with
//! `*` (any run of characters) and `?` (one character) wildcards. The
//! files' metadata (the matching names, and each file's length,
//! modification time and inode) is checked every second, and a file is
//! reread when it changed; every `refresh_interval` all files are reread
//! whatever their metadata says. So a rewritten, added or removed file is
//! picked up within a second, and within one refresh at the latest.
//!
//! Every group gets `__meta_filepath`, the path of its file as matched
//! (relative when the pattern is). A file that cannot be read or parsed
//! keeps its last good groups (logged once per distinct error); a file that
//! is gone takes its groups with it.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_util::sync::CancellationToken;

use super::{
    Discoverer, Format, LogOnce, MAX_SD_BYTES, TargetGroup, Update, next_tick, parse_groups,
    send_if_changed,
};
use crate::scrape::config::FileSdConfig;

/// The label naming each group's file (Prometheus's name).
pub const FILEPATH_LABEL: &str = "__meta_filepath";

/// How often the files' metadata is checked: often enough that a change
/// shows within a second, cheap because only directory listings and
/// `stat`s are read.
const POLL: Duration = Duration::from_secs(1);

/// The discoverer of one `file_sd_configs` item.
pub struct FileDiscoverer {
    patterns: Vec<PathBuf>,
    /// Every file is reread this often, changed or not.
    refresh: Duration,
    /// Metadata is checked this often (at least as often as `refresh`).
    poll: Duration,
}

impl FileDiscoverer {
    pub fn new(config: &FileSdConfig) -> Self {
        // Validation refuses 0; tokio's interval panics on it, so never pass it.
        let refresh = config.refresh_interval.get().max(Duration::from_millis(1));
        FileDiscoverer {
            patterns: config.files.clone(),
            refresh,
            poll: POLL.min(refresh),
        }
    }
}

#[async_trait]
impl Discoverer for FileDiscoverer {
    fn describe(&self) -> String {
        let files: Vec<_> = self
            .patterns
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        format!("file_sd {}", files.join(", "))
    }

    async fn run(
        self: Box<Self>,
        provider: usize,
        updates: mpsc::Sender<Update>,
        shutdown: CancellationToken,
    ) {
        let mut files = Files::new(&self.patterns);
        let mut last_sent = None;
        let mut tick = tokio::time::interval(self.poll);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut next_full = Instant::now();
        loop {
            if !next_tick(&mut tick, &updates, &shutdown).await {
                return;
            }
            let now = Instant::now();
            let full = now >= next_full;
            if full {
                next_full = now + self.refresh;
            }
            // Listing, stat and reading block; a large file takes a while.
            let scan = tokio::task::spawn_blocking(move || {
                files.scan(full);
                files
            });
            files = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                done = scan => match done {
                    Ok(files) => files,
                    Err(e) => {
                        tracing::error!(source = %self.describe(), error = %e, "file_sd stopped: its scan failed");
                        return;
                    }
                },
            };
            // Most scans change nothing; building the whole set to find that
            // out would copy every target each second.
            if files.take_changed()
                && !send_if_changed(
                    &mut last_sent,
                    files.groups(),
                    provider,
                    &updates,
                    &shutdown,
                )
                .await
            {
                return;
            }
        }
    }
}

/// One configured path, split for matching.
struct Pattern {
    /// As configured, for logs.
    shown: String,
    kind: PatternKind,
    /// The last listing error logged, while listing fails.
    listing_error: Option<String>,
    /// "Matches no file" was logged, and nothing matched since.
    said_no_match: bool,
}

enum PatternKind {
    /// A path without wildcards: that one file.
    File(PathBuf),
    /// The files of `dir` whose names match `glob`, joined to `dir` as
    /// configured (so a relative pattern gives relative paths).
    Glob { dir: PathBuf, glob: String },
}

impl Pattern {
    fn new(path: &Path) -> Self {
        let glob = path
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| n.contains(['*', '?']));
        let kind = match glob {
            Some(glob) => PatternKind::Glob {
                dir: path.parent().map(Path::to_path_buf).unwrap_or_default(),
                glob: glob.to_owned(),
            },
            None => PatternKind::File(path.to_path_buf()),
        };
        Pattern {
            shown: path.display().to_string(),
            kind,
            listing_error: None,
            said_no_match: false,
        }
    }

    /// Whether `path` is one this pattern stands for.
    fn covers(&self, path: &Path) -> bool {
        match &self.kind {
            PatternKind::File(file) => path == file,
            PatternKind::Glob { dir, glob } => {
                path.parent() == Some(dir.as_path())
                    && path
                        .file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| glob_match(glob, n))
            }
        }
    }
}

/// The paths in `dir` whose names match `glob`.
fn list(dir: &Path, glob: &str) -> io::Result<Vec<PathBuf>> {
    // `*.json` has an empty parent: the working directory.
    let listed = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut paths = Vec::new();
    for entry in fs::read_dir(listed)? {
        // A name that is not UTF-8 cannot match a UTF-8 glob meaningfully,
        // and cannot become a label value as it is.
        if let Some(name) = entry?.file_name().to_str()
            && glob_match(glob, name)
        {
            paths.push(dir.join(name));
        }
    }
    Ok(paths)
}

/// Whether `name` matches `glob`: `*` stands for any run of characters
/// (none too) and `?` for one character; everything else for itself.
pub fn glob_match(glob: &str, name: &str) -> bool {
    let glob: Vec<char> = glob.chars().collect();
    let name: Vec<char> = name.chars().collect();
    let (mut g, mut n) = (0, 0);
    // After a mismatch, go back to the last `*` and let it take one more
    // character: (the glob position after that `*`, the name position it
    // would resume at). Only the last `*` needs revisiting, so this is
    // linear in practice and never exponential.
    let mut retry: Option<(usize, usize)> = None;
    while n < name.len() {
        match glob.get(g) {
            Some('*') => {
                g += 1;
                retry = Some((g, n));
            }
            Some(&c) if c == '?' || c == name[n] => {
                g += 1;
                n += 1;
            }
            _ => match retry {
                Some((after_star, from)) => {
                    g = after_star;
                    n = from + 1;
                    retry = Some((after_star, from + 1));
                }
                None => return false,
            },
        }
    }
    glob[g..].iter().all(|&c| c == '*')
}

/// What identifies one version of a file without reading it: a rewrite
/// changes the modification time or the length, a rename over it (how
/// tools and Kubernetes replace files atomically) the inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    inode: u64,
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        let inode = std::os::unix::fs::MetadataExt::ino(meta);
        #[cfg(not(unix))]
        let inode = 0;
        Stamp {
            len: meta.len(),
            modified: meta.modified().ok(),
            inode,
        }
    }
}

/// A file last seen among the matches.
#[derive(Default)]
struct Known {
    /// The version last read (whether it parsed or not): an unchanged file
    /// is not reread until the next full refresh.
    stamp: Option<Stamp>,
    /// The groups of the last version that parsed.
    groups: Vec<TargetGroup>,
    log: LogOnce,
}

impl Known {
    fn targets(&self) -> usize {
        self.groups.iter().map(|g| g.targets.len()).sum()
    }
}

/// The files of one discoverer and what was read from them.
struct Files {
    patterns: Vec<Pattern>,
    known: BTreeMap<PathBuf, Known>,
    /// A file's groups changed, or a file went away, since
    /// [`Files::take_changed`]; true at first, so the first set is sent.
    changed: bool,
}

enum ReadError {
    /// The file went away between listing and reading.
    Gone,
    Failed(String),
}

impl Files {
    fn new(patterns: &[PathBuf]) -> Self {
        Files {
            patterns: patterns.iter().map(|p| Pattern::new(p)).collect(),
            known: BTreeMap::new(),
            changed: true,
        }
    }

    /// Whether the groups may differ from the last time this was asked.
    fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// The groups of all files, in path order.
    fn groups(&self) -> Vec<TargetGroup> {
        self.known
            .values()
            .flat_map(|k| k.groups.iter().cloned())
            .collect()
    }

    /// Lists the files, forgets the ones gone, and reads the ones that
    /// changed (all of them when `full`).
    fn scan(&mut self, full: bool) {
        let matched = self.matches();
        let before = self.known.len();
        self.known.retain(|path, _| matched.contains(path));
        self.changed |= self.known.len() != before;
        for path in matched {
            let source = format!("file_sd {}", path.display());
            let stamp = match fs::metadata(&path) {
                Ok(meta) if meta.is_file() => Stamp::of(&meta),
                // A directory whose name matches is not a target file.
                Ok(_) => {
                    self.changed |= self.known.remove(&path).is_some();
                    continue;
                }
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    self.changed |= self.known.remove(&path).is_some();
                    continue;
                }
                Err(e) => {
                    let known = self.known.entry(path).or_default();
                    let kept = known.targets();
                    known
                        .log
                        .failed(&source, &format!("cannot stat: {e}"), kept);
                    continue;
                }
            };
            let known = self.known.entry(path.clone()).or_default();
            if !full && known.stamp == Some(stamp) {
                continue;
            }
            known.stamp = Some(stamp);
            let parsed = match read_bounded(&path) {
                Err(ReadError::Gone) => {
                    self.changed |= self.known.remove(&path).is_some();
                    continue;
                }
                Err(ReadError::Failed(e)) => Err(e),
                Ok(bytes) => match Format::of_path(&path) {
                    Some(format) => parse_groups(&bytes, format),
                    None => Err("has no .json, .yaml or .yml extension: rename it".to_owned()),
                },
            };
            match parsed {
                Ok(parsed) => {
                    let filepath = path.display().to_string();
                    let groups: Vec<TargetGroup> = parsed
                        .groups
                        .into_iter()
                        .map(|mut g| {
                            g.labels.insert(FILEPATH_LABEL.to_owned(), filepath.clone());
                            g
                        })
                        .collect();
                    if known.groups != groups {
                        known.groups = groups;
                        self.changed = true;
                    }
                    known.log.succeeded(&source, parsed.skipped);
                }
                Err(e) => {
                    let kept = known.targets();
                    known.log.failed(&source, &e, kept);
                }
            }
        }
        self.say_unmatched();
    }

    /// The paths the patterns stand for now (not yet checked to exist for
    /// patterns without wildcards).
    fn matches(&mut self) -> BTreeSet<PathBuf> {
        let mut matched = BTreeSet::new();
        for pattern in &mut self.patterns {
            let listed = match &pattern.kind {
                PatternKind::File(path) => {
                    matched.insert(path.clone());
                    continue;
                }
                PatternKind::Glob { dir, glob } => list(dir, glob),
            };
            match listed {
                Ok(paths) => {
                    if let Some(error) = pattern.listing_error.take() {
                        tracing::info!(source = %format!("file_sd {}", pattern.shown), previous_error = %error, "the directory can be listed again");
                    }
                    matched.extend(paths);
                }
                // No directory yet: nothing matches yet.
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    let error = e.to_string();
                    if pattern.listing_error.as_deref() != Some(error.as_str()) {
                        tracing::warn!(source = %format!("file_sd {}", pattern.shown), error = %error, "cannot list the directory; the files found before are kept");
                        pattern.listing_error = Some(error);
                    }
                    // A listing that fails says nothing about the files:
                    // keep those seen before rather than drop their targets.
                    matched.extend(
                        self.known
                            .keys()
                            .filter(|path| pattern.covers(path))
                            .cloned(),
                    );
                }
            }
        }
        matched
    }

    /// Logs once for each pattern that matches no file, as that is often a
    /// mistake in the path; and forgets that once it matches one.
    fn say_unmatched(&mut self) {
        for pattern in &mut self.patterns {
            let matches_some = self.known.keys().any(|path| pattern.covers(path));
            if matches_some {
                pattern.said_no_match = false;
            } else if !pattern.said_no_match {
                tracing::info!(
                    source = %format!("file_sd {}", pattern.shown),
                    "no file matches (yet); its targets appear when one is written"
                );
                pattern.said_no_match = true;
            }
        }
    }
}

/// Reads a file of at most [`MAX_SD_BYTES`], checking its length before
/// reading and reading no further than the limit should it grow meanwhile.
fn read_bounded(path: &Path) -> Result<Vec<u8>, ReadError> {
    let failed = |e: io::Error| {
        if e.kind() == io::ErrorKind::NotFound {
            ReadError::Gone
        } else {
            ReadError::Failed(format!("cannot be read: {e}"))
        }
    };
    let file = fs::File::open(path).map_err(failed)?;
    let len = file.metadata().map_err(failed)?.len();
    let too_large = || {
        ReadError::Failed(format!(
            "is larger than {} MiB: split its targets over several files",
            MAX_SD_BYTES >> 20
        ))
    };
    let len = usize::try_from(len)
        .ok()
        .filter(|&l| l <= MAX_SD_BYTES)
        .ok_or_else(too_large)?;
    let mut bytes = Vec::with_capacity(len);
    file.take(MAX_SD_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(failed)?;
    if bytes.len() > MAX_SD_BYTES {
        return Err(too_large());
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests;
