//! The `relabel` processor: Prometheus `relabel_configs` on each profile's
//! series labels. It works on labels only and never decodes the payload, so it
//! costs the same for any profile size; a rule that drops the series drops the
//! profile.

mod config;

pub use config::RelabelProcessorConfig;

use async_trait::async_trait;
use proflow_core::component::Processor;
use proflow_core::telemetry::ProcessorTelemetry;
use proflow_model::model::{BatchMeta, Envelope};
use proflow_relabel::Relabeler;

/// The `reason` label of `proflow_processor_dropped_profiles` for profiles a
/// relabel rule dropped.
pub const RELABEL_DROP_REASON: &str = "relabel_drop";

/// The running `relabel` processor.
pub struct RelabelProcessor {
    relabeler: Relabeler,
    telemetry: ProcessorTelemetry,
}

#[async_trait]
impl Processor for RelabelProcessor {
    async fn process(&self, mut batch: Vec<Envelope>, _meta: &BatchMeta) -> Vec<Envelope> {
        let before = batch.len();
        batch.retain_mut(|envelope| self.relabeler.apply(&mut envelope.labels));
        let dropped = before - batch.len();
        if dropped > 0 {
            self.telemetry.dropped(RELABEL_DROP_REASON, dropped as u64);
        }
        batch
    }
}

#[cfg(test)]
mod tests;
