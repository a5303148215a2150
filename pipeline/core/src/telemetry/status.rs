//! What the status page shows beyond the metric families: since when the
//! collector runs, which config it runs (hash, source, when applied), its
//! pipelines, and each component's last error.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Instant, SystemTime};

/// The most components whose last error is kept (a reload that renames
/// components many times over must not grow this without end).
const MAX_LAST_ERRORS: usize = 1024;
/// The longest last error kept, in bytes.
const MAX_ERROR_LEN: usize = 512;

/// The config running now.
#[derive(Clone, Debug)]
pub struct ConfigInfo {
    /// SHA-256 of the config's bytes, in hex.
    pub hash: String,
    pub source: super::ConfigSource,
    /// Where it came from (a path, or the OpAMP server).
    pub origin: String,
    pub applied_at: SystemTime,
}

/// One pipeline and its components, in order.
#[derive(Clone, Debug)]
pub struct PipelineView {
    pub id: String,
    pub receivers: Vec<String>,
    pub processors: Vec<String>,
    pub exporters: Vec<String>,
}

/// A component's last error and when it happened.
#[derive(Clone, Debug)]
pub struct LastError {
    pub at: SystemTime,
    pub message: String,
}

pub(super) struct StatusBook {
    pub(super) started: Instant,
    pub(super) started_at: SystemTime,
    config: Mutex<Option<ConfigInfo>>,
    pipelines: Mutex<Vec<PipelineView>>,
    /// By `(kind, id)`: `("exporter", "pyroscope")`.
    last_errors: Mutex<BTreeMap<(&'static str, String), LastError>>,
}

impl StatusBook {
    pub(super) fn new() -> Self {
        StatusBook {
            started: Instant::now(),
            started_at: SystemTime::now(),
            config: Mutex::default(),
            pipelines: Mutex::default(),
            last_errors: Mutex::default(),
        }
    }

    pub(super) fn set_config(&self, info: ConfigInfo) {
        *self.config.lock().unwrap_or_else(PoisonError::into_inner) = Some(info);
    }

    pub(super) fn config(&self) -> Option<ConfigInfo> {
        self.config
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn set_pipelines(&self, pipelines: Vec<PipelineView>) {
        *self
            .pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = pipelines;
    }

    pub(super) fn pipelines(&self) -> Vec<PipelineView> {
        self.pipelines
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub(super) fn error(&self, kind: &'static str, id: &str, message: &str) {
        let mut errors = self
            .last_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let key = (kind, id.to_owned());
        if errors.len() >= MAX_LAST_ERRORS && !errors.contains_key(&key) {
            return;
        }
        let mut message = message.to_owned();
        if message.len() > MAX_ERROR_LEN {
            let mut end = MAX_ERROR_LEN;
            while !message.is_char_boundary(end) {
                end -= 1;
            }
            message.truncate(end);
            message.push('…');
        }
        errors.insert(
            key,
            LastError {
                at: SystemTime::now(),
                message,
            },
        );
    }

    pub(super) fn last_error(&self, kind: &'static str, id: &str) -> Option<LastError> {
        self.last_errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(kind, id.to_owned()))
            .cloned()
    }
}
