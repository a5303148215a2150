//! The `file` exporter: writes each profile under a local directory, for
//! debugging, air-gapped sites and replay.
//!
//! Layout (see [`naming`] for the exact names):
//! - `format: pprof` (default): `<directory>/<service>/<start>-<name>-<seq>.pb.gz`,
//!   the gzip bytes exactly as they arrived (`Payload::gzipped`): the payload is
//!   never decoded and never re-encoded. A profile that arrived as OTLP was
//!   converted once by the pipeline (the exporter wants pprof).
//! - `format: folded`: one `<start>-<name>-<seq>-<sample type>.folded` file per
//!   sample type (a per-type header inside one file would break flame-graph
//!   tools), made from the decoded profile.
//! - `format: otlp_json`: one `<start>-<name>-<seq>.otlp.json` per profile,
//!   an OTLP profiles JSON `ExportProfilesServiceRequest` from the payload's
//!   OTLP form (the exporter wants OTLP, so the pipeline converted a pprof
//!   profile once), with a dictionary of only what the profile uses and the
//!   resource and scope of `OtlpProfiles::resource_and_scope`.
//! - `<directory>/index.jsonl`: one JSON object per written file:
//!   `{"path": "<service>/<file>", "labels": {...}, "start": ns, "end": ns,
//!   "sample_types": [{"type": "cpu", "unit": "nanoseconds"}]}`, and
//!   `"tenant"` when the profile arrived with one. The lines of one
//!   export are appended with one write under one lock, so lines of concurrent
//!   exports never interleave.
//!
//! Atomicity: each file is written to a hidden `.proflow-<seq>.tmp` in its final
//! directory, optionally fsynced, then renamed, so a crash never leaves a
//! partial `*.pb.gz`/`*.folded`; temporary files left by a crash are removed at
//! start. A file is renamed before its index line is appended: a crash between
//! the two leaves a profile without an index line (never a line without a file).
//! If the append fails, the export's files are removed again and the error is
//! retryable, so a retry writes no duplicates.
//!
//! Retention: `max_total_size` and `max_age` delete the oldest profile files
//! after each export (and once at start), using an in-memory list built by one
//! scan at start; `max_total_size` counts what the files, their service
//! directories and the index take on disk. Index lines of deleted files are
//! dropped by rewriting the index once they outnumber the live ones or keep
//! the total over the cap (see [`book`]); until then readers must tolerate
//! index lines whose file is gone.

mod book;
mod config;
mod folded;
mod naming;
#[cfg(test)]
mod tests;

pub use config::{FileExporterConfig, FileFormat, RetentionSettings};

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use proflow_core::component::{ExportError, Exporter};
use proflow_model::model::{
    Envelope, ExportBatch, Labels, NAME_LABEL, PayloadError, SERVICE_NAME_LABEL,
};
use proflow_model::otlp;
use serde::Serialize;

use self::book::{Book, Retention, Written};
use crate::error::Error;

/// The running `file` exporter. Cheap to call from many tasks at once: file
/// writes run on the blocking pool and only the index append and retention run
/// under the lock.
#[derive(Debug)]
pub struct FileExporter {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    id: String,
    root: PathBuf,
    format: FileFormat,
    fsync: bool,
    /// Sequence number of the next file; unique within the directory.
    next_seq: AtomicU64,
    book: Mutex<Book>,
}

/// A file rendered in memory, waiting to be written.
struct Pending {
    service_dir: String,
    file_name: String,
    seq: u64,
    bytes: Bytes,
    /// Its index line, newline included.
    line: Vec<u8>,
}

/// A file written under its temporary name.
struct Staged {
    temp: PathBuf,
    dest: PathBuf,
    rel: String,
    size: u64,
    line: Vec<u8>,
}

impl FileExporter {
    /// Creates the directory if needed, removes temporary files a crash left,
    /// scans the existing profile files once and applies retention to them.
    /// `id` names the exporter in logs and errors.
    pub fn open(config: &FileExporterConfig, id: &str) -> Result<Self, Error> {
        let root = config.directory.clone();
        fs::create_dir_all(&root).map_err(|e| Error::io("create directory", &root, e))?;
        let scan = book::scan(&root)?;
        if scan.removed_temps > 0 {
            tracing::info!(
                exporter = id,
                removed = scan.removed_temps,
                "removed temporary files left by an earlier crash"
            );
        }
        let next_seq = scan.next_seq;
        let retention = Retention {
            max_total_bytes: config.retention.max_total_size.bytes(),
            max_age: Some(config.retention.max_age.get()).filter(|d| !d.is_zero()),
        };
        let book = Book::open(&root, scan, retention, config.fsync)?;
        Ok(FileExporter {
            shared: Arc::new(Shared {
                id: id.to_owned(),
                root,
                format: config.format,
                fsync: config.fsync,
                next_seq: AtomicU64::new(next_seq),
                book: Mutex::new(book),
            }),
        })
    }

    /// Writes a batch synchronously (what [`Exporter::export`] runs on the
    /// blocking pool); for benchmarks and tools without a runtime.
    pub fn write_batch(&self, batch: &[Envelope]) -> Result<(), Error> {
        self.shared.write_batch(batch, &[])
    }
}

#[async_trait]
impl Exporter for FileExporter {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let shared = Arc::clone(&self.shared);
        // Envelope clones share their payloads, so this copies no profile bytes.
        let tenants: Vec<Option<String>> = batch
            .sources()
            .flat_map(|(meta, run)| {
                run.iter()
                    .map(|e| meta.tenant_of(&e.labels).map(str::to_owned))
            })
            .collect();
        let batch = batch.envelopes().to_vec();
        match tokio::task::spawn_blocking(move || shared.write_batch(&batch, &tenants)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(e.into_export_error()),
            Err(join) => Err(ExportError::retryable(
                "io",
                format!(
                    "the write task of exporter `{}` did not finish ({join}); the batch will be retried",
                    self.shared.id
                ),
            )),
        }
    }

    async fn shutdown(&self) {
        if self.shared.fsync {
            return;
        }
        let shared = Arc::clone(&self.shared);
        let _ = tokio::task::spawn_blocking(move || shared.lock_book().sync_index()).await;
    }
}

impl Shared {
    fn lock_book(&self) -> MutexGuard<'_, Book> {
        // No Book method panics; if one did, its state is still a valid (at
        // worst slightly miscounted) book, better than failing every export.
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn take_seq(&self) -> u64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    /// Writes what it can of `batch`. Profiles that cannot be rendered (folded
    /// output of an undecodable payload) are skipped and reported after the
    /// others are written, as a permanent error.
    /// `tenants`: each profile's tenant, in batch order (empty: none).
    fn write_batch(&self, batch: &[Envelope], tenants: &[Option<String>]) -> Result<(), Error> {
        let mut pending = Vec::new();
        let mut rendered = 0;
        let mut refused = Vec::new();
        let mut first_failure = None;
        for (i, envelope) in batch.iter().enumerate() {
            let tenant = tenants.get(i).and_then(|t| t.as_deref());
            match self.render(envelope, tenant) {
                Ok(files) => {
                    pending.extend(files);
                    rendered += 1;
                }
                Err(e) => {
                    tracing::warn!(exporter = %self.id, error = %e, "dropping a profile that cannot be written");
                    refused.push(i);
                    first_failure.get_or_insert(e);
                }
            }
        }
        self.write_files(pending)?;
        match first_failure {
            Some(Error::Decode {
                series,
                format,
                source,
                ..
            }) => Err(Error::Decode {
                series,
                format,
                source,
                written: rendered,
                refused,
            }),
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// One file holding the whole envelope (every sample type), named by
    /// `file_name(start, seq)`, with its index line.
    fn whole_file(
        &self,
        envelope: &Envelope,
        tenant: Option<&str>,
        service_dir: String,
        bytes: Bytes,
        file_name: impl FnOnce(i64, u64) -> String,
    ) -> Result<Vec<Pending>, Error> {
        let seq = self.take_seq();
        let file_name = file_name(envelope.start_unix_nanos, seq);
        let types = envelope
            .sample_types
            .iter()
            .map(|t| (t.r#type.as_str(), t.unit.as_str()));
        let line = index_line(&service_dir, &file_name, envelope, tenant, types)?;
        Ok(vec![Pending {
            service_dir,
            file_name,
            seq,
            bytes,
            line,
        }])
    }

    /// The files one envelope becomes, with their index lines.
    fn render(&self, envelope: &Envelope, tenant: Option<&str>) -> Result<Vec<Pending>, Error> {
        let labels = &envelope.labels;
        let service_dir = naming::service_dir(labels.get(SERVICE_NAME_LABEL));
        let name = labels.get(NAME_LABEL);
        let decode_error = |format: &'static str| {
            move |source| Error::Decode {
                series: labels.to_selector_string(),
                format,
                written: 0,
                refused: Vec::new(),
                source,
            }
        };
        match self.format {
            // The gzip bytes as they arrived: never decoded, never re-encoded.
            FileFormat::Pprof => {
                let bytes = envelope.payload.gzipped().map_err(decode_error("pprof"))?;
                self.whole_file(envelope, tenant, service_dir, bytes, |start, seq| {
                    naming::profile_file(start, name, seq, None)
                })
            }
            FileFormat::OtlpJson => {
                let o = envelope.payload.otlp().map_err(decode_error("otlp_json"))?;
                let bytes = otlp_json(&envelope.labels, &o)
                    .map_err(|e| decode_error("otlp_json")(PayloadError::Convert(e)))?;
                self.whole_file(
                    envelope,
                    tenant,
                    service_dir,
                    Bytes::from(bytes),
                    |start, seq| naming::otlp_json_file(start, name, seq),
                )
            }
            FileFormat::Folded => {
                let profile = envelope.payload.decoded().map_err(decode_error("folded"))?;
                let mut files = Vec::new();
                for text in folded::render(&profile) {
                    let seq = self.take_seq();
                    let file_name = naming::profile_file(
                        envelope.start_unix_nanos,
                        name,
                        seq,
                        Some(&text.sample_type),
                    );
                    let types = [(text.sample_type.as_str(), text.unit.as_str())];
                    let line = index_line(&service_dir, &file_name, envelope, tenant, types)?;
                    files.push(Pending {
                        service_dir: service_dir.clone(),
                        file_name,
                        seq,
                        bytes: Bytes::from(text.text),
                        line,
                    });
                }
                Ok(files)
            }
        }
    }

    /// Writes every pending file under a temporary name, renames them all into
    /// place, then records them. On any error, the files of this call are
    /// removed again, so a retry of the batch makes no duplicates.
    fn write_files(&self, pending: Vec<Pending>) -> Result<(), Error> {
        if pending.is_empty() {
            return Ok(());
        }
        let mut staged = Vec::with_capacity(pending.len());
        for p in pending {
            match self.stage(p) {
                Ok(s) => staged.push(s),
                Err(e) => {
                    remove_all(staged.iter().map(|s| &s.temp));
                    return Err(e);
                }
            }
        }
        for (i, s) in staged.iter().enumerate() {
            if let Err(e) = fs::rename(&s.temp, &s.dest) {
                remove_all(staged[..i].iter().map(|s| &s.dest));
                remove_all(staged[i..].iter().map(|s| &s.temp));
                return Err(Error::io("rename into place", &s.temp, e));
            }
        }
        let dests: Vec<PathBuf> = staged.iter().map(|s| s.dest.clone()).collect();
        if self.fsync {
            let mut dirs: Vec<&Path> = dests.iter().filter_map(|d| d.parent()).collect();
            dirs.sort();
            dirs.dedup();
            for dir in dirs {
                if let Err(e) = book::sync_dir(dir) {
                    remove_all(dests.iter());
                    return Err(e);
                }
            }
        }
        let mut lines = Vec::new();
        let mut written = Vec::with_capacity(staged.len());
        for s in staged {
            lines.extend_from_slice(&s.line);
            written.push(Written {
                rel: s.rel,
                size: s.size,
            });
        }
        let committed = self.lock_book().commit(written, &lines);
        if committed.is_err() {
            remove_all(dests.iter());
        }
        committed
    }

    /// Writes one file under its temporary name in its final directory (same
    /// filesystem, so the rename is atomic).
    fn stage(&self, p: Pending) -> Result<Staged, Error> {
        let dir = self.root.join(&p.service_dir);
        let temp = dir.join(naming::temp_file(p.seq));
        let mut attempts = 0;
        let written = loop {
            fs::create_dir_all(&dir).map_err(|e| Error::io("create directory", &dir, e))?;
            let written = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&temp)
                .and_then(|mut f| {
                    f.write_all(&p.bytes)?;
                    if self.fsync {
                        f.sync_all()?;
                    }
                    f.metadata()
                });
            attempts += 1;
            match written {
                // Retention removes a service directory once its last file is
                // deleted, which may fall between making it and opening the
                // file in it: make it again.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && attempts < 3 => continue,
                other => break other,
            }
        };
        let meta = match written {
            Ok(meta) => meta,
            Err(e) => {
                let _ = fs::remove_file(&temp);
                return Err(Error::io("write", &temp, e));
            }
        };
        Ok(Staged {
            temp,
            dest: dir.join(&p.file_name),
            rel: format!("{}/{}", p.service_dir, p.file_name),
            size: book::disk_size(&meta),
            line: p.line,
        })
    }
}

/// One payload's profiles as an OTLP JSON `ExportProfilesServiceRequest`
/// whose dictionary holds only what they use; resource and scope as
/// [`otlp::OtlpProfiles::resource_and_scope`] makes them from the labels.
fn otlp_json(labels: &Labels, o: &otlp::OtlpProfiles) -> Result<Vec<u8>, otlp::ConvertError> {
    let mut request = otlp::RequestBuilder::new().compact();
    request.push(labels, o);
    Ok(otlp::json::encode_request(&request.build()?.to_message()?))
}

/// Best-effort removal while undoing a failed export; the original error is
/// what gets reported.
fn remove_all<'a>(paths: impl Iterator<Item = &'a PathBuf>) {
    for path in paths {
        if let Err(e) = fs::remove_file(path)
            && e.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(path = %path.display(), error = %e, "could not remove a file of a failed export");
        }
    }
}

#[derive(Serialize)]
struct IndexLine<'a> {
    path: &'a str,
    labels: LabelsObject<'a>,
    start: i64,
    end: i64,
    sample_types: Vec<SampleTypeJson<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant: Option<&'a str>,
}

/// Series labels as one JSON object, `{"name": "value", ...}`.
struct LabelsObject<'a>(&'a Labels);

impl Serialize for LabelsObject<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().map(|l| (&l.name, &l.value)))
    }
}

#[derive(Serialize)]
struct SampleTypeJson<'a> {
    #[serde(rename = "type")]
    ty: &'a str,
    unit: &'a str,
}

/// The index line of one written file, newline included.
fn index_line<'a>(
    service_dir: &str,
    file_name: &str,
    envelope: &Envelope,
    tenant: Option<&'a str>,
    sample_types: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<u8>, Error> {
    let path = format!("{service_dir}/{file_name}");
    let line = IndexLine {
        path: &path,
        labels: LabelsObject(&envelope.labels),
        start: envelope.start_unix_nanos,
        end: envelope.end_unix_nanos,
        sample_types: sample_types
            .into_iter()
            .map(|(ty, unit)| SampleTypeJson { ty, unit })
            .collect(),
        tenant,
    };
    let mut bytes = serde_json::to_vec(&line).map_err(|source| Error::Encode {
        series: envelope.labels.to_selector_string(),
        source,
    })?;
    bytes.push(b'\n');
    Ok(bytes)
}
