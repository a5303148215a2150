//! The settings every exporter shares, as the OpenTelemetry Collector's
//! `exporterhelper` and `configretry` have them: `sending_queue` (with its
//! `batch` and on-disk `storage`) and `retry_on_failure`, their defaults,
//! and [`queue_problems`], which checks them. The queue that runs on them is
//! `proflow_core::queue`.

use std::path::PathBuf;

use serde::Deserialize;

use crate::validate::FieldError;
use crate::values::{ByteSize, Duration};

/// What to do with a batch when an exporter's queue is full.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Drop the batch for this exporter only, count it (logged once per
    /// episode), and deliver it to the other exporters: one dead backend never
    /// stops delivery to the healthy ones. The OpenTelemetry Collector's default.
    #[default]
    DropNewest,
    /// Hold the sender back: push receivers refuse the whole batch everywhere
    /// (429 / `RESOURCE_EXHAUSTED`) so the client retries, and receivers that
    /// can wait (scrape, Kafka) wait for room. For senders that retry.
    Block,
}

/// `sending_queue.batch`: how a consumer gathers what it sends at once.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSettings {
    /// How long to wait for more profiles after the first one, before sending
    /// what was gathered. `0` sends what is queued at once, without waiting.
    pub flush_timeout: Duration,
    /// Most profiles in one send. A single received batch larger than this is
    /// sent whole, never split.
    pub max_profiles: usize,
    /// Most bytes in one send (same rule for a larger single batch).
    pub max_bytes: ByteSize,
}

impl Default for BatchSettings {
    fn default() -> Self {
        BatchSettings {
            flush_timeout: Duration::from_secs(0),
            max_profiles: 500,
            max_bytes: ByteSize::mib(16),
        }
    }
}

/// `sending_queue` of an exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    /// Most profiles waiting in the queue (including those being sent).
    pub queue_size: usize,
    /// Most bytes of memory the waiting profiles keep alive (including those
    /// being sent): their bytes, and for a profile a processor rebuilt its
    /// decoded form too.
    pub max_bytes: ByteSize,
    /// `drop_newest` (default) or `block`.
    pub when_full: WhenFull,
    /// How long a full queue holds a sender back, waiting for room, before
    /// `when_full` applies: the receiver waits (its client's TCP slows
    /// down) while the exporter drains, so a burst is delivered late rather
    /// than dropped. A queue whose last wait ran out applies `when_full` at
    /// once until it has room again, so a dead exporter costs one wait, not
    /// one per request. `0s` applies `when_full` at once.
    pub wait_when_full: Duration,
    /// How many sends run at once.
    pub num_consumers: usize,
    /// How each send is gathered from the queue.
    pub batch: BatchSettings,
    /// Keep the queue on disk: `{directory, max_size, fsync}`. Off by default.
    pub storage: Option<StorageSettings>,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            queue_size: 1000,
            max_bytes: ByteSize::mib(256),
            when_full: WhenFull::DropNewest,
            wait_when_full: Duration::from_secs(1),
            num_consumers: 4,
            batch: BatchSettings::default(),
            storage: None,
        }
    }
}

/// `retry_on_failure` of an exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetrySettings {
    /// Retry retryable failures at all.
    pub enabled: bool,
    /// Wait before the first retry.
    pub initial_interval: Duration,
    /// Longest wait between retries.
    pub max_interval: Duration,
    /// Give up after this long since the first attempt; `0` retries forever.
    pub max_elapsed_time: Duration,
    /// Growth of the wait per retry.
    pub multiplier: f64,
}

impl Default for RetrySettings {
    fn default() -> Self {
        RetrySettings {
            enabled: true,
            initial_interval: Duration::from_secs(5),
            max_interval: Duration::from_secs(30),
            max_elapsed_time: Duration::from_secs(300),
            multiplier: 1.5,
        }
    }
}

/// Every problem in an exporter's queue and retry settings, with paths relative
/// to the exporter's body.
pub fn queue_problems(queue: &QueueSettings, retry: &RetrySettings) -> Vec<FieldError> {
    let mut problems = Vec::new();
    if queue.queue_size == 0 {
        problems.push(FieldError::new(
            "sending_queue.queue_size",
            "must be at least 1: a queue that holds nothing refuses every profile",
        ));
    }
    if queue.max_bytes.bytes() == 0 {
        problems.push(FieldError::new(
            "sending_queue.max_bytes",
            "must be more than 0: a queue that holds no bytes refuses every profile",
        ));
    }
    if queue.num_consumers == 0 {
        problems.push(FieldError::new(
            "sending_queue.num_consumers",
            "must be at least 1: with no consumer nothing is ever exported",
        ));
    }
    if !retry.multiplier.is_finite() || !(1.0..=10.0).contains(&retry.multiplier) {
        problems.push(FieldError::new(
            "retry_on_failure.multiplier",
            format!(
                "must be a number from 1 to 10 (got {}): the wait between retries must not shrink, nor jump past max_interval at once",
                retry.multiplier
            ),
        ));
    }
    if retry.enabled && retry.initial_interval.is_zero() {
        problems.push(FieldError::new(
            "retry_on_failure.initial_interval",
            "must be more than 0 when retries are enabled: retrying at once hammers a failing target",
        ));
    }
    if queue.batch.max_profiles == 0 {
        problems.push(FieldError::new(
            "sending_queue.batch.max_profiles",
            "must be at least 1: a send of no profiles sends nothing",
        ));
    }
    if queue.batch.max_bytes.bytes() == 0 {
        problems.push(FieldError::new(
            "sending_queue.batch.max_bytes",
            "must be more than 0, such as 16MiB",
        ));
    }
    if queue.wait_when_full.get() > std::time::Duration::from_secs(60) {
        problems.push(FieldError::new(
            "sending_queue.wait_when_full",
            format!(
                "{} holds senders for too long (their own timeouts end first and they send again); use at most 60s (default 1s)",
                queue.wait_when_full
            ),
        ));
    }
    if queue.batch.flush_timeout.get() > std::time::Duration::from_secs(60) {
        problems.push(FieldError::new(
            "sending_queue.batch.flush_timeout",
            format!(
                "{} holds profiles back for too long; use at most 60s (typical: 200ms)",
                queue.batch.flush_timeout
            ),
        ));
    }
    if let Some(storage) = &queue.storage {
        problems.extend(storage.problems());
    }
    if retry.initial_interval > retry.max_interval {
        problems.push(FieldError::new(
            "retry_on_failure.max_interval",
            format!(
                "must be at least initial_interval ({}), got {}",
                retry.initial_interval, retry.max_interval
            ),
        ));
    }
    problems
}

/// When a written record counts as stored.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Fsync {
    /// Group commit: one sync at a time covers every record written before
    /// it started; a receiver waits for at most the sync in progress and the
    /// next one. Far fewer syncs than `always` under load.
    #[default]
    Batch,
    /// Sync each record before its receiver is answered.
    Always,
    /// Never sync: records survive the process being killed (they are in
    /// the kernel's page cache), not a power loss.
    Never,
}

/// `sending_queue.storage`: a persistent queue in a directory.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StorageSettings {
    /// Where the segment files go; each exporter gets a folder in it named
    /// after its id. Must be on a local file system that keeps what was
    /// synced (not tmpfs, if restarts of the machine must be survived).
    pub directory: PathBuf,
    /// Most bytes of records the queue keeps; then `when_full` applies.
    #[serde(default = "default_max_size")]
    pub max_size: ByteSize,
    /// `batch` (default), `always` or `never`.
    #[serde(default)]
    pub fsync: Fsync,
}

fn default_max_size() -> ByteSize {
    ByteSize::mib(1024)
}

impl StorageSettings {
    /// Every problem, with paths relative to the exporter's body.
    pub fn problems(&self) -> Vec<FieldError> {
        let mut out = Vec::new();
        if self.directory.as_os_str().is_empty() {
            out.push(FieldError::new(
                "sending_queue.storage.directory",
                "must name a directory, such as /var/lib/proflow/queue",
            ));
        }
        if self.max_size.bytes() < MIN_STORAGE_SIZE {
            out.push(FieldError::new(
                "sending_queue.storage.max_size",
                format!("must be at least 1MiB (got {})", self.max_size),
            ));
        }
        out
    }

    /// The folder of exporter `id`: its id with every character other than
    /// letters, digits, `-`, `_` and `.` written as `~XX` (hex), so distinct
    /// ids never share a folder.
    pub fn folder(&self, id: &str) -> PathBuf {
        let mut name = String::with_capacity(id.len());
        for b in id.bytes() {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.') {
                name.push(char::from(b));
            } else {
                name.push_str(&format!("~{b:02x}"));
            }
        }
        self.directory.join(name)
    }
}

/// The smallest `sending_queue.storage.max_size`, and the smallest segment.
pub const MIN_STORAGE_SIZE: u64 = 1 << 20;

/// What every exporter takes in front of its sends, declared once: the
/// queue (`sending_queue`) and the retry of failed sends
/// (`retry_on_failure`), the OpenTelemetry Collector's names and defaults.
/// An exporter embeds it (`#[serde(rename = "__proflow_embedded", default)]`), so
/// both keys sit beside its own.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SendingSettings {
    /// The queue in front of the exporter: size, consumers, batching and
    /// an optional persistent `storage`.
    pub sending_queue: QueueSettings,
    /// Retry of failed sends, with exponential backoff.
    pub retry_on_failure: RetrySettings,
}

impl SendingSettings {
    /// Every problem of both blocks, under their keys.
    pub fn problems(&self) -> Vec<FieldError> {
        queue_problems(&self.sending_queue, &self.retry_on_failure)
    }
}
