//! The running graph: [`plan`] turns a parsed config [`Document`] into a
//! checked [`Plan`] (every problem reported at once), [`Plan::start`] builds
//! and starts exporters, processors and receivers in that order, and
//! [`Running::shutdown`] stops them in reverse: receivers, then queues drain
//! up to `shutdown_timeout`, then exporters.
//!
//! A receiver's batches go through each of its pipelines' processors in order,
//! then to every exporter queue of those pipelines. Admission is all or
//! nothing across `block` queues, so a refused batch (429) leaves no copies
//! behind and the sender's retry creates no duplicates.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use proflow_config::TelemetryConfig;

mod diff;
mod fanout;
mod hold;
mod plan;
mod reload;
mod running;
mod shutdown;
mod swap;
#[cfg(test)]
mod tests;

pub use plan::plan;
pub use running::{ReloadReport, Running};
pub use shutdown::ShutdownReport;

/// How long a refused sender is told to wait before retrying.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How long receivers get to finish in-flight requests at shutdown.
const RECEIVER_STOP_TIMEOUT: Duration = Duration::from_secs(5);
/// The least time exporters get to close after the drain, even when the
/// drain used all of `shutdown_timeout`.
const EXPORTER_SHUTDOWN_MIN: Duration = Duration::from_secs(1);

/// What a pipeline carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// `profiles`, `profiles/<name>`: receivers → processors → exporters.
    Profiles,
    /// `traces`, `traces/<name>`: receivers → span-taking processors (their
    /// span index); proflow exports no traces.
    Traces,
}

/// One pipeline by component ids.
#[derive(Debug, Clone)]
pub struct PipelinePlan {
    pub id: String,
    pub signal: Signal,
    pub receivers: Vec<String>,
    pub processors: Vec<String>,
    pub exporters: Vec<String>,
}

/// A checked configuration, ready to start.
#[derive(Debug)]
pub struct Plan {
    receivers: BTreeMap<String, Arc<dyn crate::component::ReceiverConfig>>,
    processors: BTreeMap<String, Arc<dyn crate::component::ProcessorConfig>>,
    exporters: BTreeMap<String, Arc<dyn crate::component::ExporterConfig>>,
    pub pipelines: Vec<PipelinePlan>,
    pub telemetry: TelemetryConfig,
    /// `service.opamp`: read at the start only, as `telemetry` is.
    pub opamp: Option<proflow_config::OpampSettings>,
    pub shutdown_timeout: Duration,
    /// `service.limits.max_in_flight_bytes`.
    pub max_in_flight_bytes: usize,
    /// Things worth saying that do not stop the collector (unused components).
    pub warnings: Vec<String>,
    /// Each component's config as text without positions, by
    /// `<section>.<id>`: what a reload compares.
    fingerprints: HashMap<String, String>,
}
