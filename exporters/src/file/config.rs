//! The `file` exporter's config: directory, format, retention and the
//! sending settings; their checks.

use proflow_config::SendingSettings;
use proflow_config::{ByteSize, Duration};
use proflow_core::component::{
    BuildContext, BuildError, Exporter, ExporterConfig, FieldError, Resource, Validate,
};
use proflow_model::model::Format;
use serde::Deserialize;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::FileExporter;

/// Smallest non-zero `retention.max_total_size`: anything below one filesystem
/// block is almost surely a missing unit (`512` meant `512MiB`).
const MIN_MAX_TOTAL_SIZE: u64 = 4096;

/// What the file exporter writes.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum FileFormat {
    /// Gzip pprof (`.pb.gz`), the bytes as they arrived; readable by `go tool pprof`.
    #[default]
    Pprof,
    /// Folded stacks (`.folded`), one file per sample type; needs the payload decoded.
    Folded,
    /// OTLP profiles JSON (`.otlp.json`): one `ExportProfilesServiceRequest`
    /// per file, one OTLP profile per sample type; an OTLP profile's own
    /// attributes (changed where its labels changed), a pprof profile's series
    /// labels as resource attributes (`service_name` as `service.name`); what
    /// the OpenTelemetry Collector's OTLP/HTTP receiver takes.
    OtlpJson,
}

/// `retention` of the file exporter.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetentionSettings {
    /// Most bytes kept under `directory`, as they take up the disk: profile
    /// files (their allocated blocks), the service directories holding them,
    /// and `index.jsonl`. The oldest files are deleted first (a directory
    /// left empty with them), the newest always kept. `0` (default) keeps
    /// everything.
    pub max_total_size: ByteSize,
    /// Profile files written longer ago than this are deleted (checked after
    /// each export and at start). `0` (default) keeps them forever.
    pub max_age: Duration,
}

/// Config of the `file` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileExporterConfig {
    /// Directory to write under; created if missing. Each `file` exporter needs
    /// its own: two exporters on one directory fail validation.
    pub directory: PathBuf,
    /// `pprof` (default): gzip pprof files as they arrived; `folded`: folded stacks.
    #[serde(default)]
    pub format: FileFormat,
    /// Fsync each file, its directory and the index before an export counts as
    /// done. Off (default): a process crash still never leaves a partial file
    /// (writes are renamed into place), but a power loss or kernel crash can lose
    /// or empty the files of the last seconds. On: they survive, at the cost of a
    /// disk flush (milliseconds, more on busy disks) per export.
    #[serde(default)]
    pub fsync: bool,
    /// Deletes the oldest profile files past a total size or an age.
    #[serde(default)]
    pub retention: RetentionSettings,
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub sending: SendingSettings,
}

impl Validate for FileExporterConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if self.directory.as_os_str().is_empty() {
            problems.push(FieldError::new(
                "directory",
                "must not be empty: name the directory to write profiles under",
            ));
        }
        let max_total = self.retention.max_total_size.bytes();
        if max_total > 0 && max_total < MIN_MAX_TOTAL_SIZE {
            problems.push(FieldError::new(
                "retention.max_total_size",
                format!(
                    "{max_total} bytes is less than one filesystem block; write a unit (such as 512MiB), or 0 for no limit"
                ),
            ));
        }
        problems
    }
}

impl ExporterConfig for FileExporterConfig {
    fn sending(&self) -> &SendingSettings {
        &self.sending
    }

    fn resources(&self) -> Vec<Resource> {
        vec![Resource::Directory(normalize(&self.directory))]
    }

    fn wants(&self) -> Option<Format> {
        Some(match self.format {
            FileFormat::Pprof | FileFormat::Folded => Format::Pprof,
            FileFormat::OtlpJson => Format::Otlp,
        })
    }

    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
        let exporter = FileExporter::open(self, &ctx.id)
            .map_err(|e| BuildError::new(format!("exporter `{}`: {e}", ctx.id)))?;
        Ok(Arc::new(exporter))
    }
}

/// `path` made absolute and lexically normalized (`.` and `..` resolved without
/// touching the disk, which may not have it yet), so `out` and `./out` claim the
/// same directory. Symlinks are not resolved.
fn normalize(path: &Path) -> PathBuf {
    let absolute = if path.is_absolute() {
        path.to_path_buf()
    } else {
        match std::env::current_dir() {
            Ok(cwd) => cwd.join(path),
            Err(_) => path.to_path_buf(),
        }
    };
    let mut out = PathBuf::new();
    for part in absolute.components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}
