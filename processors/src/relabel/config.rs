//! The `relabel` processor's config: its rules, their checks, and the build.

use proflow_core::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate,
};
use proflow_relabel::{RelabelConfig, Relabeler, validate_configs};
use serde::Deserialize;
use std::sync::Arc;

use super::RelabelProcessor;

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
