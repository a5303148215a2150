//! The file exporter's bookkeeping: the index file, the in-memory list of
//! profile files (oldest first) with their sizes, and retention.
//!
//! The directory is scanned once at start ([`scan`]); after that every change
//! goes through [`Book::commit`], so enforcing retention never lists the tree.
//!
//! Index consistency: when retention deletes a file, its index line becomes
//! stale. Stale lines are removed by rewriting the index (temp file + rename,
//! so readers see the old or the new index, never a mix) once they outnumber the
//! live ones and there are at least [`COMPACT_MIN_STALE`]: each rewrite is paid
//! for by as many deletions as lines it keeps, so the cost per export stays
//! constant, and the index is never more than about twice the live lines.
//!
//! What retention counts is what the files take on disk: each profile file's
//! allocated blocks (a 300-byte file takes a 4 KiB block), each service
//! directory's, and the index itself. A directory whose last file retention
//! deleted is removed; while the index's stale lines keep the total over
//! `max_total_size`, the index is rewritten as soon as there are
//! [`COMPACT_MIN_STALE`] of them, so the cap holds with any number of series.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Deserialize;

use super::naming::{self, INDEX_FILE, INDEX_TEMP_FILE};
use crate::error::Error;

/// Fewest stale index lines worth a rewrite of the index.
pub(crate) const COMPACT_MIN_STALE: u64 = 16;

/// What a directory takes on disk when its size cannot be read (one block).
const DIR_BYTES: u64 = 4096;

/// What a file or directory takes on disk: its allocated blocks, or its
/// length when that is more (a sparse file, or blocks not yet counted).
pub(crate) fn disk_size(meta: &fs::Metadata) -> u64 {
    meta.len().max(meta.blocks().saturating_mul(512))
}

/// Retention limits; zero/`None` means unlimited.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Retention {
    pub max_total_bytes: u64,
    pub max_age: Option<Duration>,
}

impl Retention {
    fn enabled(&self) -> bool {
        self.max_total_bytes > 0 || self.max_age.is_some()
    }
}

/// A profile file on disk.
#[derive(Debug)]
struct Entry {
    /// Path relative to the exporter's directory, `/`-separated.
    rel: String,
    /// What it takes on disk ([`disk_size`]).
    size: u64,
    /// When it was written (mtime for files found at start).
    written: SystemTime,
}

/// A file an export just renamed into place.
#[derive(Debug)]
pub(crate) struct Written {
    pub rel: String,
    /// What it takes on disk ([`disk_size`]).
    pub size: u64,
}

/// What the start-up scan found.
#[derive(Debug, Default)]
pub(crate) struct Scan {
    entries: Vec<Entry>,
    /// Above every sequence number on disk.
    pub next_seq: u64,
    pub removed_temps: usize,
}

/// Lists the profile files under `root` (one level of service directories)
/// and removes temporary files a crash left behind. Files with other names are
/// not ours: they are neither counted nor ever deleted.
pub(crate) fn scan(root: &Path) -> Result<Scan, Error> {
    let mut scan = Scan::default();
    let mut found: Vec<(SystemTime, u64, Entry)> = Vec::new();
    for entry in fs::read_dir(root).map_err(|e| Error::io("list directory", root, e))? {
        let entry = entry.map_err(|e| Error::io("list directory", root, e))?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let kind = entry
            .file_type()
            .map_err(|e| Error::io("inspect", entry.path(), e))?;
        if kind.is_file() && naming::is_temp(name) {
            remove_temp(&entry.path(), &mut scan);
        } else if kind.is_dir() && !name.starts_with('.') {
            scan_service_dir(root, name, &mut scan, &mut found)?;
        }
    }
    // Oldest first; the sequence number orders files written in the same instant.
    found.sort_by_key(|(written, seq, _)| (*written, *seq));
    scan.entries = found.into_iter().map(|(_, _, e)| e).collect();
    Ok(scan)
}

fn scan_service_dir(
    root: &Path,
    dir_name: &str,
    scan: &mut Scan,
    found: &mut Vec<(SystemTime, u64, Entry)>,
) -> Result<(), Error> {
    let dir = root.join(dir_name);
    for entry in fs::read_dir(&dir).map_err(|e| Error::io("list directory", &dir, e))? {
        let entry = entry.map_err(|e| Error::io("list directory", &dir, e))?;
        let file_name = entry.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        let meta = entry
            .metadata()
            .map_err(|e| Error::io("inspect", entry.path(), e))?;
        if !meta.is_file() {
            continue;
        }
        if naming::is_temp(name) {
            remove_temp(&entry.path(), scan);
        } else if let Some(seq) = naming::profile_seq(name) {
            scan.next_seq = scan.next_seq.max(seq.saturating_add(1));
            let written = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            let rel = format!("{dir_name}/{name}");
            let size = disk_size(&meta);
            found.push((written, seq, Entry { rel, size, written }));
        }
    }
    Ok(())
}

fn remove_temp(path: &Path, scan: &mut Scan) {
    match fs::remove_file(path) {
        Ok(()) => scan.removed_temps += 1,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        // Not fatal: the name is never reused (sequence numbers only grow) and
        // readers ignore it; writing will report the real permission problem.
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a stale temporary file")
        }
    }
}

#[derive(Deserialize)]
struct PathOnly {
    path: String,
}

/// The `path` of an index line, `None` if the line is not valid JSON.
fn line_path(line: &[u8]) -> Option<String> {
    serde_json::from_slice::<PathOnly>(line)
        .ok()
        .map(|p| p.path)
}

/// The index and the list of profile files, behind the exporter's one lock.
#[derive(Debug)]
pub(crate) struct Book {
    root: PathBuf,
    fsync: bool,
    retention: Retention,
    /// `index.jsonl`, opened for appending.
    index: File,
    /// The index length after the last whole line we wrote.
    index_len: u64,
    /// Oldest first.
    files: VecDeque<Entry>,
    live: HashSet<String>,
    /// What the live profile files take on disk.
    total_bytes: u64,
    /// Per service directory holding live files: how many, and what the
    /// directory itself takes on disk.
    dirs: HashMap<String, (u64, u64)>,
    /// What those directories take, summed.
    dir_bytes: u64,
    /// Index lines naming files that exist / that retention deleted.
    live_lines: u64,
    stale_lines: u64,
}

impl Book {
    /// Opens the index (cutting a partial last line a crash may have left),
    /// then applies retention to what the scan found.
    pub(crate) fn open(
        root: &Path,
        scan: Scan,
        retention: Retention,
        fsync: bool,
    ) -> Result<Book, Error> {
        let index_path = root.join(INDEX_FILE);
        cut_partial_last_line(&index_path)?;
        let index = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&index_path)
            .map_err(|e| Error::io("open", &index_path, e))?;
        let index_len = index
            .metadata()
            .map_err(|e| Error::io("inspect", &index_path, e))?
            .len();
        let mut book = Book {
            root: root.to_path_buf(),
            fsync,
            retention,
            index,
            index_len,
            live: scan.entries.iter().map(|e| e.rel.clone()).collect(),
            total_bytes: scan.entries.iter().map(|e| e.size).sum(),
            dirs: HashMap::new(),
            dir_bytes: 0,
            files: VecDeque::new(),
            live_lines: 0,
            stale_lines: 0,
        };
        for e in &scan.entries {
            book.add_to_dir(&e.rel);
        }
        book.files = scan.entries.into();
        // Line counts only steer compaction, which only retention needs; skip
        // reading a possibly large index otherwise.
        if retention.enabled() {
            let text = fs::read(&index_path).map_err(|e| Error::io("read", &index_path, e))?;
            for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
                if line_path(line).is_some_and(|p| book.live.contains(&p)) {
                    book.live_lines += 1;
                } else {
                    book.stale_lines += 1;
                }
            }
        }
        book.enforce_retention(SystemTime::now());
        book.maybe_compact();
        Ok(book)
    }

    /// Records files just renamed into place: appends their index `lines`
    /// (whole lines, written at once while the caller holds the lock, so lines
    /// of concurrent exports never interleave), then applies retention. On error
    /// nothing is recorded and the index is as before.
    pub(crate) fn commit(&mut self, written: Vec<Written>, lines: &[u8]) -> Result<(), Error> {
        if !lines.is_empty() {
            if let Err(e) = self.append(lines) {
                // Cut what may have been written so the next append starts on a
                // line boundary and the index names no file the caller removes.
                if let Err(cut) = self.index.set_len(self.index_len) {
                    tracing::warn!(error = %cut, "could not cut a failed append from the index");
                }
                return Err(Error::io("append to", self.root.join(INDEX_FILE), e));
            }
            self.index_len += lines.len() as u64;
        }
        let now = SystemTime::now();
        for w in written {
            self.total_bytes += w.size;
            self.add_to_dir(&w.rel);
            self.live_lines += 1;
            self.live.insert(w.rel.clone());
            self.files.push_back(Entry {
                rel: w.rel,
                size: w.size,
                written: now,
            });
        }
        self.enforce_retention(now);
        self.maybe_compact();
        Ok(())
    }

    fn append(&mut self, lines: &[u8]) -> io::Result<()> {
        // On a regular file `write_all` is one `write` call unless the kernel
        // writes short; either way we hold the lock, so nothing comes between.
        self.index.write_all(lines)?;
        if self.fsync {
            self.index.sync_data()?;
        }
        Ok(())
    }

    /// Flushes the index to disk (at shutdown, when `fsync` is off).
    pub(crate) fn sync_index(&self) {
        if let Err(e) = self.index.sync_all() {
            tracing::warn!(error = %e, "could not flush the index to disk");
        }
    }

    /// Everything retention counts: the live files, their directories and
    /// the index.
    fn used_bytes(&self) -> u64 {
        self.total_bytes + self.dir_bytes + self.index_len
    }

    /// Counts a live file in its service directory (the directory's own
    /// size the first time).
    fn add_to_dir(&mut self, rel: &str) {
        let Some((dir, _)) = rel.split_once('/') else {
            return;
        };
        if let Some((files, _)) = self.dirs.get_mut(dir) {
            *files += 1;
            return;
        }
        let size = fs::metadata(self.root.join(dir)).map_or(DIR_BYTES, |m| disk_size(&m));
        self.dir_bytes += size;
        self.dirs.insert(dir.to_owned(), (1, size));
    }

    /// Forgets a deleted file in its directory, and removes the directory
    /// once it holds no live file (a directory that is not empty, e.g. an
    /// export is writing into it, stays and is counted again by its next file).
    fn remove_from_dir(&mut self, rel: &str) {
        let Some((dir, _)) = rel.split_once('/') else {
            return;
        };
        let Some((files, size)) = self.dirs.get_mut(dir) else {
            return;
        };
        *files = files.saturating_sub(1);
        if *files > 0 {
            return;
        }
        self.dir_bytes = self.dir_bytes.saturating_sub(*size);
        self.dirs.remove(dir);
        let _ = fs::remove_dir(self.root.join(dir));
    }

    /// Deletes the oldest files while over `max_total_size` (always keeping the
    /// newest, so one profile larger than the limit is still written),
    /// rewriting the index when its stale lines keep it over, and every file
    /// older than `max_age`.
    fn enforce_retention(&mut self, now: SystemTime) {
        let max_bytes = self.retention.max_total_bytes;
        if max_bytes > 0 {
            while self.used_bytes() > max_bytes && self.files.len() > 1 {
                self.delete_oldest();
                if self.used_bytes() > max_bytes && self.stale_lines >= COMPACT_MIN_STALE {
                    self.compact_or_warn();
                }
            }
        }
        if let Some(max_age) = self.retention.max_age {
            while let Some(oldest) = self.files.front() {
                // A clock that went backwards makes nothing expire.
                let expired = now
                    .duration_since(oldest.written)
                    .is_ok_and(|age| age > max_age);
                if !expired {
                    break;
                }
                self.delete_oldest();
            }
        }
    }

    fn delete_oldest(&mut self) {
        let Some(entry) = self.files.pop_front() else {
            return;
        };
        self.total_bytes = self.total_bytes.saturating_sub(entry.size);
        self.live.remove(&entry.rel);
        self.live_lines = self.live_lines.saturating_sub(1);
        self.stale_lines += 1;
        let path = self.root.join(&entry.rel);
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            // Forget it anyway: keeping it would make every later export retry
            // the same failing delete and stop retention from making progress.
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "retention could not delete a profile file; it is no longer accounted for")
            }
        }
        self.remove_from_dir(&entry.rel);
    }

    fn maybe_compact(&mut self) {
        if self.stale_lines < COMPACT_MIN_STALE || self.stale_lines <= self.live_lines {
            return;
        }
        self.compact_or_warn();
    }

    fn compact_or_warn(&mut self) {
        if let Err(e) = self.compact() {
            // The index stays valid, only longer; try again after as many
            // deletions as it takes to pass the threshold anew.
            tracing::warn!(error = %e, "could not rewrite the index without the lines of deleted files");
            self.stale_lines = 0;
        }
    }

    /// Rewrites the index with the lines of live files only.
    fn compact(&mut self) -> Result<(), Error> {
        let index_path = self.root.join(INDEX_FILE);
        let temp_path = self.root.join(INDEX_TEMP_FILE);
        let old = fs::read(&index_path).map_err(|e| Error::io("read", &index_path, e))?;
        let mut kept = Vec::with_capacity(old.len() / 2);
        let mut live_lines = 0;
        for line in old.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if line_path(line).is_some_and(|p| self.live.contains(&p)) {
                kept.extend_from_slice(line);
                kept.push(b'\n');
                live_lines += 1;
            }
        }
        let _ = fs::remove_file(&temp_path);
        // The new handle is opened before the rename and follows the file, so
        // there is no moment where appends would go to the replaced index.
        let written = OpenOptions::new()
            .append(true)
            .create_new(true)
            .open(&temp_path)
            .and_then(|mut f| {
                f.write_all(&kept)?;
                if self.fsync {
                    f.sync_all()?;
                }
                Ok(f)
            });
        let new_index = match written {
            Ok(f) => f,
            Err(e) => {
                let _ = fs::remove_file(&temp_path);
                return Err(Error::io("write", &temp_path, e));
            }
        };
        if let Err(e) = fs::rename(&temp_path, &index_path) {
            let _ = fs::remove_file(&temp_path);
            return Err(Error::io("replace", &index_path, e));
        }
        if self.fsync {
            sync_dir(&self.root)?;
        }
        self.index = new_index;
        self.index_len = kept.len() as u64;
        self.live_lines = live_lines;
        self.stale_lines = 0;
        Ok(())
    }
}

/// Makes a rename in `dir` durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), Error> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::io("sync directory", dir, e))
}

/// Cuts the index back to its last complete line: a crash during an append can
/// leave a partial line, and the next append would otherwise be glued to it.
fn cut_partial_last_line(index_path: &Path) -> Result<(), Error> {
    let mut file = match OpenOptions::new().read(true).write(true).open(index_path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(Error::io("open", index_path, e)),
    };
    let io_err = |e: io::Error| Error::io("repair", index_path, e);
    let len = file.metadata().map_err(io_err)?.len();
    if len == 0 {
        return Ok(());
    }
    let mut last = [0u8; 1];
    file.seek(SeekFrom::End(-1)).map_err(io_err)?;
    file.read_exact(&mut last).map_err(io_err)?;
    if last[0] == b'\n' {
        return Ok(());
    }
    let text = fs::read(index_path).map_err(io_err)?;
    let keep = text
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i as u64 + 1);
    tracing::warn!(
        path = %index_path.display(),
        dropped_bytes = len - keep,
        "cut a partial last line from the index (left by a crash)"
    );
    file.set_len(keep).map_err(io_err)
}
