//! The persistent half of an exporter queue (`sending_queue.storage`):
//! every batch the queue admits is written as one checksummed record to a
//! segment file before its receiver is told it was accepted, and a record is
//! acknowledged on disk once its export ended (delivered, or refused for
//! good). After a restart the records not acknowledged are sent again, in
//! order, before new ones.
//!
//! - Durability ([`Fsync`]): `always` syncs each record before answering,
//!   `batch` (default) runs one sync at a time for everything written before
//!   it (group commit), `never` leaves it to the kernel (survives the
//!   process being killed, not the machine losing power).
//! - Damage (a torn tail after `kill -9` or power loss, flipped bytes) is
//!   found by the checksums when the queue opens: counted, logged once per
//!   segment with the offset, and stepped over; every intact record is kept.
//! - A segment is deleted once every record in it is acknowledged and a newer
//!   segment is being written.
//! - One process owns a directory at a time (an exclusive lock on
//!   `lock`), so two collectors never interleave records.
//!
//! File layouts are in [`segment`] and [`record`].

pub mod record;
pub mod segment;

use std::collections::{BTreeMap, HashSet};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio::sync::{Notify, watch};

use crate::telemetry::ExporterTelemetry;

pub use proflow_config::{Fsync, MIN_STORAGE_SIZE as MIN_SIZE, StorageSettings};

/// A record's place on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordId {
    pub segment: u64,
    pub offset: u64,
    pub len: u32,
}

/// Why a record could not be read back.
#[derive(Debug, Clone)]
pub struct ReadError {
    /// Trying again later could succeed.
    pub transient: bool,
    pub message: String,
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A record found when the queue opened, not yet acknowledged.
#[derive(Debug, Clone, Copy)]
pub struct Replay {
    pub id: RecordId,
    pub profiles: usize,
}

#[derive(Debug)]
struct Segment {
    /// Its checksums' salt.
    salt: u64,
    /// Records written or found and not yet acknowledged.
    live: u64,
    /// The file's length.
    bytes: u64,
    /// Its acknowledgement file, opened on first use.
    acks: Option<File>,
}

struct Writer {
    segment: u64,
    salt: u64,
    file: File,
    len: u64,
}

struct Inner {
    writer: Writer,
    segments: BTreeMap<u64, Segment>,
    /// Records written so far (the sequence `synced` is compared with).
    written: u64,
    /// Bytes of every segment file.
    disk_bytes: u64,
    /// Segments sealed since the last group commit (`fsync: batch`): the
    /// next sync covers them too.
    unsynced: Vec<File>,
}

/// One exporter's persistent queue files.
pub struct Store {
    dir: PathBuf,
    fsync: Fsync,
    segment_bytes: u64,
    inner: Mutex<Inner>,
    /// The highest `written` count known durable.
    /// `(synced, failed)`: every record up to `synced` is durable; those
    /// after it up to `failed` were covered by a sync that failed.
    synced: watch::Sender<(u64, u64)>,
    /// Wakes the group-commit task.
    dirty: Notify,
    telemetry: ExporterTelemetry,
    _lock: File,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

/// Waits until a written record is durable per the fsync policy.
pub enum Durable {
    Now,
    /// Wait until `synced` reaches this count.
    Batch(u64),
    /// Sync this file (`always`).
    Sync(File),
    /// The write failed.
    Failed(String),
}

impl Store {
    /// Opens (or creates) exporter `id`'s folder, scans what is there and
    /// returns the records to send again, in order. Damage is counted and
    /// logged, never fatal; a folder another process holds is.
    pub fn open(
        settings: &StorageSettings,
        id: &str,
        telemetry: ExporterTelemetry,
    ) -> Result<(Arc<Store>, Vec<Replay>), String> {
        let dir = settings.folder(id);
        let lock = lock_folder(&dir)?;
        let max_size = settings.max_size.bytes();
        let segment_bytes = (max_size / 8).clamp(MIN_SIZE, 64 << 20);
        let numbers =
            segment::list(&dir).map_err(|e| format!("cannot list {}: {e}", dir.display()))?;
        let mut found = Scanned {
            segments: BTreeMap::new(),
            replay: Vec::new(),
            disk_bytes: 0,
            corrupt: 0,
            acked_seen: 0,
        };
        for &n in &numbers {
            found.scan_segment(&dir, n)?;
        }
        let Scanned {
            mut segments,
            replay,
            mut disk_bytes,
            corrupt,
            acked_seen,
        } = found;
        if !replay.is_empty() || corrupt > 0 {
            tracing::info!(directory = %dir.display(), records = replay.len(), profiles = replay.iter().map(|r| r.profiles).sum::<usize>(), acknowledged = acked_seen, damaged = corrupt, "persistent queue opened: sending what was left before new profiles");
        }
        telemetry.queue_corrupt(corrupt);
        telemetry.queue_replayed(replay.len() as u64);
        let next = numbers.last().map_or(1, |n| n.saturating_add(1));
        let writer = new_segment(&dir, next)?;
        disk_bytes += writer.len;
        segments.insert(
            next,
            Segment {
                salt: writer.salt,
                live: 0,
                bytes: writer.len,
                acks: None,
            },
        );
        let (synced, _) = watch::channel((0, 0));
        let store = Arc::new(Store {
            dir,
            fsync: settings.fsync,
            segment_bytes,
            inner: Mutex::new(Inner {
                writer,
                segments,
                written: 0,
                disk_bytes,
                unsynced: Vec::new(),
            }),
            synced,
            dirty: Notify::new(),
            telemetry,
            _lock: lock,
        });
        store.report();
        Ok((store, replay))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one record. Returns where it is and what to wait for before
    /// it counts as stored.
    pub fn append(&self, record: &[u8]) -> (Option<RecordId>, Durable) {
        let mut inner = self.lock();
        match self.append_locked(&mut inner, record) {
            Ok(id) => {
                inner.written += 1;
                let durable = match self.fsync {
                    Fsync::Never => Durable::Now,
                    Fsync::Batch => Durable::Batch(inner.written),
                    Fsync::Always => match inner.writer.file.try_clone() {
                        Ok(f) => Durable::Sync(f),
                        Err(e) => Durable::Failed(e.to_string()),
                    },
                };
                drop(inner);
                if matches!(durable, Durable::Batch(_)) {
                    self.dirty.notify_one();
                }
                self.report();
                (Some(id), durable)
            }
            Err(e) => {
                self.telemetry.queue_storage_error();
                (None, Durable::Failed(e))
            }
        }
    }

    fn append_locked(&self, inner: &mut Inner, record: &[u8]) -> Result<RecordId, String> {
        if inner.writer.len > segment::SEGMENT_HEADER as u64
            && inner.writer.len + record.len() as u64 > self.segment_bytes
        {
            self.rotate(inner)?;
        }
        let header = segment::frame_header(inner.writer.salt, record);
        let w = &mut inner.writer;
        let offset = w.len;
        let written = w
            .file
            .write_all(&header)
            .and_then(|()| w.file.write_all(record));
        if let Err(e) = written {
            // Part of a frame may be in the file: cut it off and write the
            // next record where this one started, so offsets stay true.
            let _ = w
                .file
                .set_len(offset)
                .and_then(|()| w.file.seek(SeekFrom::Start(offset)).map(|_| ()));
            return Err(format!(
                "cannot write to the queue directory {}: {e}",
                self.dir.display()
            ));
        }
        let n = (header.len() + record.len()) as u64;
        w.len += n;
        let segment = w.segment;
        inner.disk_bytes += n;
        if let Some(s) = inner.segments.get_mut(&segment) {
            s.live += 1;
            s.bytes += n;
        }
        Ok(RecordId {
            segment,
            offset,
            len: u32::try_from(record.len()).unwrap_or(u32::MAX),
        })
    }

    /// Seals the segment being written and starts the next. Nothing is
    /// synced here (no disk wait under the lock): with `always` each
    /// record's own sync covers it, with `batch` the next group commit
    /// syncs the sealed file too.
    fn rotate(&self, inner: &mut Inner) -> Result<(), String> {
        let next = inner.writer.segment + 1;
        let old = inner.writer.segment;
        let sealed = std::mem::replace(&mut inner.writer, new_segment(&self.dir, next)?);
        if self.fsync == Fsync::Batch {
            inner.unsynced.push(sealed.file);
        }
        inner.disk_bytes += inner.writer.len;
        inner.segments.insert(
            next,
            Segment {
                salt: inner.writer.salt,
                live: 0,
                bytes: inner.writer.len,
                acks: None,
            },
        );
        self.delete_if_done(inner, old);
        Ok(())
    }

    /// Waits until a record is stored per the policy.
    pub async fn durable(self: &Arc<Self>, d: Durable) -> Result<(), String> {
        match d {
            Durable::Now => Ok(()),
            Durable::Failed(e) => Err(e),
            Durable::Sync(file) => {
                let started = Instant::now();
                let r = tokio::task::spawn_blocking(move || file.sync_data())
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                self.telemetry.queue_fsync(started.elapsed().as_secs_f64());
                r.map_err(|e| format!("cannot sync the queue in {}: {e}", self.dir.display()))
            }
            Durable::Batch(n) => {
                let mut rx = self.synced.subscribe();
                let (synced, _) = *rx
                    .wait_for(|&(synced, failed)| synced >= n || failed >= n)
                    .await
                    .map_err(|_| "the queue stopped before the record was synced".to_owned())?;
                if synced >= n {
                    Ok(())
                } else {
                    Err(format!(
                        "the disk could not sync the queue in {}",
                        self.dir.display()
                    ))
                }
            }
        }
    }

    /// The group-commit task of `fsync: batch`, until `stop`: one sync at a
    /// time, each covering everything written before it started; writes that
    /// arrive during a sync wait for the next, which starts as soon as this
    /// one ends.
    pub async fn group_commit(self: Arc<Self>, stop: tokio_util::sync::CancellationToken) {
        if self.fsync != Fsync::Batch {
            return;
        }
        loop {
            let dirty = self.dirty.notified();
            tokio::pin!(dirty);
            dirty.as_mut().enable();
            let pending = {
                let inner = self.lock();
                let (synced, failed) = *self.synced.borrow();
                inner.written > synced.max(failed)
            };
            if !pending {
                tokio::select! {
                    _ = dirty => continue,
                    _ = stop.cancelled() => return,
                }
            };
            let (upto, file, sealed) = {
                let mut inner = self.lock();
                let sealed = std::mem::take(&mut inner.unsynced);
                (inner.written, inner.writer.file.try_clone(), sealed)
            };
            let started = Instant::now();
            let result = match file {
                Ok(f) => tokio::task::spawn_blocking(move || {
                    for s in &sealed {
                        s.sync_data()?;
                    }
                    f.sync_data()
                })
                .await
                .map_err(|e| std::io::Error::other(e.to_string()))
                .and_then(|r| r),
                Err(e) => Err(e),
            };
            self.telemetry.queue_fsync(started.elapsed().as_secs_f64());
            match result {
                Ok(()) => {
                    self.synced.send_if_modified(|(s, _)| {
                        let changed = *s < upto;
                        *s = (*s).max(upto);
                        changed
                    });
                }
                Err(e) => {
                    // A failed sync may have dropped the written pages, so a
                    // later sync proves nothing for these records: their
                    // senders are told they are not stored (and retry); the
                    // batches are still sent from memory.
                    self.telemetry.queue_storage_error();
                    tracing::error!(directory = %self.dir.display(), error = %e, "cannot sync the persistent queue; the requests waiting for it are refused so their senders retry");
                    self.synced.send_modify(|(_, f)| *f = (*f).max(upto));
                }
            }
        }
    }

    /// Marks a record finished (delivered, or refused for good): it is never
    /// sent again, and its segment goes once all its records are finished.
    pub fn ack(&self, id: RecordId) {
        let mut inner = self.lock();
        let writing = inner.writer.segment;
        let Some(s) = inner.segments.get_mut(&id.segment) else {
            return;
        };
        s.live = s.live.saturating_sub(1);
        if s.live == 0 && id.segment != writing {
            self.delete_if_done(&mut inner, id.segment);
        } else {
            if s.acks.is_none() {
                s.acks = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(segment::ack_path(&self.dir, id.segment))
                    .map_err(|e| {
                        tracing::warn!(directory = %self.dir.display(), error = %e, "cannot write the queue's acknowledgements; delivered profiles may be sent again after a restart");
                    })
                    .ok();
            }
            if let Some(f) = &mut s.acks {
                // Not synced: a lost acknowledgement sends a record twice,
                // never loses one.
                let _ = f.write_all(&segment::ack_entry(id.segment, id.offset));
            }
        }
        drop(inner);
        self.report();
    }

    fn delete_if_done(&self, inner: &mut Inner, n: u64) {
        if n == inner.writer.segment {
            return;
        }
        if let Some(s) = inner.segments.get(&n)
            && s.live == 0
        {
            inner.disk_bytes = inner.disk_bytes.saturating_sub(s.bytes);
            inner.segments.remove(&n);
            remove(&self.dir, n);
        }
    }

    /// Reads a record back. An error says whether trying again could help
    /// (`transient`: the file could not be opened or read) or not (the bytes
    /// no longer match their checksum).
    pub fn read(&self, id: RecordId) -> Result<Vec<u8>, ReadError> {
        let path = segment::segment_path(&self.dir, id.segment);
        let Some(salt) = self.lock().segments.get(&id.segment).map(|s| s.salt) else {
            return Err(ReadError {
                transient: false,
                message: format!("{} is no longer kept", path.display()),
            });
        };
        let mut file = File::open(&path).map_err(|e| ReadError {
            transient: true,
            message: format!("cannot open {}: {e}", path.display()),
        })?;
        segment::read_record(&mut file, id.offset, id.len, salt).map_err(|e| ReadError {
            transient: e.kind() != std::io::ErrorKind::InvalidData,
            message: format!("cannot read {}: {e}", path.display()),
        })
    }

    /// Bytes of the segment files.
    pub fn disk_bytes(&self) -> u64 {
        self.lock().disk_bytes
    }

    fn report(&self) {
        let (bytes, records) = {
            let inner = self.lock();
            (
                inner.disk_bytes,
                inner.segments.values().map(|s| s.live).sum::<u64>(),
            )
        };
        self.telemetry.queue_stored(bytes, records);
    }

    /// The folder of this queue.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Creates the queue folder `dir` if needed and takes its exclusive lock,
/// which is held as long as the returned file is open.
fn lock_folder(dir: &Path) -> Result<File, String> {
    std::fs::create_dir_all(dir).map_err(|e| {
        format!(
            "cannot create the queue directory {}: {e}; create it or give proflow write access",
            dir.display()
        )
    })?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(|e| format!("cannot open {}: {e}", dir.join("lock").display()))?;
    match lock.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            return Err(format!(
                "another process is using the queue directory {}; give each collector its own sending_queue.storage.directory",
                dir.display()
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("cannot lock {}: {e}", dir.join("lock").display()));
        }
    }
    Ok(lock)
}

/// What scanning a queue folder's segments found when it opened.
struct Scanned {
    /// The segments holding records not yet acknowledged.
    segments: BTreeMap<u64, Segment>,
    /// Those records, in order.
    replay: Vec<Replay>,
    /// Bytes of the segment files kept.
    disk_bytes: u64,
    /// Damaged stretches and unreadable records stepped over.
    corrupt: u64,
    /// Records found already acknowledged.
    acked_seen: u64,
}

impl Scanned {
    /// Scans segment `n` of `dir`: logs and counts its damage, gathers its
    /// records not yet acknowledged, and deletes it when it has none.
    fn scan_segment(&mut self, dir: &Path, n: u64) -> Result<(), String> {
        // A batch larger than max_size is admitted alone into an empty
        // queue, so records are not bounded by it; the scan reads whole
        // files anyway and sizes nothing by a frame's claim.
        let max_record = u32::MAX;
        let path = segment::segment_path(dir, n);
        let scan = segment::scan(&path, max_record)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        for d in &scan.damage {
            self.corrupt += 1;
            tracing::warn!(segment = %path.display(), offset = d.offset, skipped_bytes = d.skipped, "damaged bytes in the persistent queue (a torn write after a crash, or a bad disk); skipped, every intact record is kept (counted in proflow_exporter_queue_corrupt_total)");
        }
        let acks = segment::read_acks(dir, n);
        let salt = scan.salt.unwrap_or(0);
        let live = if scan.records.is_empty() {
            0
        } else {
            self.replay_records(&path, n, &scan, &acks, salt)?
        };
        if live == 0 {
            remove(dir, n);
            return Ok(());
        }
        self.disk_bytes += scan.len;
        self.segments.insert(
            n,
            Segment {
                salt,
                live,
                bytes: scan.len,
                acks: None,
            },
        );
        Ok(())
    }

    /// Adds the records of segment `n` (at `path`) not in `acks` to the
    /// replay, reading each one's profile count; returns how many it added.
    fn replay_records(
        &mut self,
        path: &Path,
        n: u64,
        scan: &segment::Scan,
        acks: &HashSet<u64>,
        salt: u64,
    ) -> Result<u64, String> {
        let mut live = 0;
        let mut file =
            File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        for f in &scan.records {
            if acks.contains(&f.offset) {
                self.acked_seen += 1;
                continue;
            }
            // The record passed the scan; read its profile count.
            let head = segment::read_record(&mut file, f.offset, f.len, salt)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            match record::profiles(&head) {
                Ok(profiles) => {
                    live += 1;
                    self.replay.push(Replay {
                        id: RecordId {
                            segment: n,
                            offset: f.offset,
                            len: f.len,
                        },
                        profiles,
                    });
                }
                Err(e) => {
                    self.corrupt += 1;
                    tracing::warn!(segment = %path.display(), offset = f.offset, error = %e, "a queue record this proflow cannot read; skipped");
                }
            }
        }
        Ok(live)
    }
}

fn new_segment(dir: &Path, n: u64) -> Result<Writer, String> {
    let path = segment::segment_path(dir, n);
    // Never inherit acknowledgements of an earlier segment of this number.
    let _ = std::fs::remove_file(segment::ack_path(dir, n));
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    // Unpredictable to clients (the hasher's keys are random per process),
    // so no profile bytes can carry a frame that passes this segment's checks.
    let salt = {
        use std::hash::BuildHasher;
        std::collections::hash_map::RandomState::new().hash_one((
            n,
            std::process::id(),
            std::time::SystemTime::now(),
        ))
    };
    file.write_all(&segment::segment_header(salt))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    // The new file's name must survive a crash before records in it count.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(Writer {
        segment: n,
        salt,
        file,
        len: segment::SEGMENT_HEADER as u64,
    })
}

fn remove(dir: &Path, n: u64) {
    // Acknowledgements first: a crash in between leaves a segment whose
    // records are sent again, never an acknowledgement file that a new
    // segment of the same number would inherit.
    for path in [segment::ack_path(dir, n), segment::segment_path(dir, n)] {
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "cannot delete a finished queue segment");
            }
        }
    }
}

#[cfg(test)]
mod tests;
