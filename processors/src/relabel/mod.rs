//! The `relabel` processor: Prometheus `relabel_configs` on each profile's
//! series labels. It works on labels only and never decodes the payload, so it
//! costs the same for any profile size; a rule that drops the series drops the
//! profile.

use std::sync::Arc;

use async_trait::async_trait;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate,
};
use proflow_core::telemetry::ProcessorTelemetry;
use proflow_model::model::{BatchMeta, Envelope};
use proflow_relabel::{RelabelConfig, Relabeler, validate_configs};
use serde::Deserialize;

/// The `reason` label of `proflow_processor_dropped_profiles` for profiles a
/// relabel rule dropped.
pub const RELABEL_DROP_REASON: &str = "relabel_drop";

/// Config of the `relabel` processor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelabelProcessorConfig {
    /// Prometheus `relabel_config` rules applied in order to every profile's
    /// series labels (`__name__`, `service_name`, ...). A `keep`, `drop`,
    /// `keepequal` or `dropequal` rule that drops the series drops the profile.
    pub relabel_configs: Vec<RelabelConfig>,
}

impl Validate for RelabelProcessorConfig {
    fn validate(&self) -> Vec<FieldError> {
        validate_configs(&self.relabel_configs)
            .into_iter()
            .map(|p| FieldError::new(format!("relabel_configs.{}", p.path), p.message))
            .collect()
    }
}

impl ProcessorConfig for RelabelProcessorConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        Ok(Arc::new(RelabelProcessor {
            relabeler: Relabeler::new(&self.relabel_configs)?,
            telemetry: ctx.processor_telemetry(),
        }))
    }
}

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
