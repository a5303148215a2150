//! Exporter queues: bounded in profiles and bytes, `when_full: block | drop_newest`,
//! drained by `num_consumers` tasks that export with exponential-backoff retry.
//! One queue per exporter, so a slow exporter never delays the others' sends.

use proflow_config::{ByteSize, Duration};
use serde::Deserialize;

/// What to do with a batch when an exporter's queue is full.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WhenFull {
    /// Refuse the batch everywhere (the receiver answers 429 / RESOURCE_EXHAUSTED)
    /// so the sender retries: no data loss, backpressure reaches the client.
    #[default]
    Block,
    /// Drop the batch for this exporter only, count it, and accept it elsewhere.
    DropNewest,
}

/// `sending_queue` of an exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QueueSettings {
    /// Most profiles waiting in the queue (including those being sent).
    pub queue_size: usize,
    /// Most payload bytes waiting in the queue (including those being sent).
    pub max_bytes: ByteSize,
    /// `block` (default) or `drop_newest`.
    pub when_full: WhenFull,
    /// How many sends run at once.
    pub num_consumers: usize,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            queue_size: 1000,
            max_bytes: ByteSize::mib(256),
            when_full: WhenFull::Block,
            num_consumers: 4,
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
