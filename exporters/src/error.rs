//! The one error type of this crate. Each variant knows whether retrying can
//! help, which decides how it becomes an [`ExportError`].

use std::io;
use std::path::{Path, PathBuf};

use proflow_core::component::{BuildError, ExportError};
use proflow_model::model::PayloadError;

/// Why an exporter could not start or could not write a profile.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A filesystem operation failed.
    #[error("{}", io_message(.action, .path, .source))]
    Io {
        /// What we were doing, as a verb phrase (`create directory`, `write`, ...).
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A payload could not be decoded for an output format that needs the decoded form.
    #[error(
        "profile {series} could not be decoded for {format} output ({source}); it was dropped \
         because retrying cannot help ({} profile(s) in all could not be decoded, \
         {written} other(s) of the batch were written); \
         fix the sender or use `format: pprof`, which writes the bytes as they arrived",
        .refused.len()
    )]
    Decode {
        /// The series labels, for finding the sender.
        series: String,
        /// The output format that needed the decoded form (`folded`, `otlp_json`).
        format: &'static str,
        written: usize,
        /// Indexes (in the exported batch) of every profile that could not be
        /// decoded; the others were written.
        refused: Vec<usize>,
        #[source]
        source: PayloadError,
    },

    /// An index line could not be encoded (cannot happen for string labels; kept
    /// as an error instead of a panic).
    #[error("could not encode the index line for {series}: {source}")]
    Encode {
        series: String,
        #[source]
        source: serde_json::Error,
    },
}

impl Error {
    pub(crate) fn io(action: &'static str, path: impl AsRef<Path>, source: io::Error) -> Self {
        Error::Io {
            action,
            path: path.as_ref().to_path_buf(),
            source,
        }
    }

    /// The export error the queue acts on: I/O problems are retryable (space can
    /// be freed, permissions fixed) unless the request itself is invalid; data
    /// problems are permanent.
    pub fn into_export_error(self) -> ExportError {
        let message = self.to_string();
        match self {
            Error::Io { source, .. } => match source.kind() {
                io::ErrorKind::InvalidInput | io::ErrorKind::InvalidFilename => {
                    ExportError::permanent("io", message)
                }
                _ => ExportError::retryable("io", message),
            },
            // The rest of the batch was written: only these failed.
            Error::Decode { refused, .. } => ExportError::partial(refused, "decode", message),
            Error::Encode { .. } => ExportError::permanent("encode", message),
        }
    }
}

impl From<Error> for BuildError {
    fn from(e: Error) -> Self {
        BuildError::new(e.to_string())
    }
}

/// The message of an I/O error, with what to do about the common causes.
fn io_message(action: &str, path: &Path, source: &io::Error) -> String {
    let shown = path.display();
    let advice = match source.kind() {
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
            "the directory is not writable: check its permissions, owner and mount options"
        }
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
            "the disk is full: free space or set `retention.max_total_size`"
        }
        io::ErrorKind::NotADirectory => {
            "a component of the path is a file, not a directory: check `directory`"
        }
        io::ErrorKind::AlreadyExists => {
            "something that is not a directory is in the way: move or remove it"
        }
        io::ErrorKind::NotFound => {
            "a directory on the path is missing: check that `directory` was not removed"
        }
        _ => "check the directory and the disk",
    };
    format!("could not {action} `{shown}`: {source}: {advice}")
}
