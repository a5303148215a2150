//! The `nop` exporter's config: only the sending settings every exporter has.

use proflow_config::SendingSettings;
use proflow_core::component::{
    BuildContext, BuildError, Exporter, ExporterConfig, FieldError, Validate,
};
use serde::Deserialize;
use std::sync::Arc;

use super::NopExporter;

/// Config of the `nop` exporter: only the queue and retry blocks every
/// exporter has (so benchmarks measure the real queue).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NopExporterConfig {
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub sending: SendingSettings,
}

impl Validate for NopExporterConfig {
    fn validate(&self) -> Vec<FieldError> {
        // Nothing of its own; the queue and retry blocks are checked by the registry.
        Vec::new()
    }
}

impl NopExporterConfig {
    /// The exporter as its concrete type, for callers that read [`NopExporter::seen`].
    pub fn build_nop(&self) -> Arc<NopExporter> {
        Arc::new(NopExporter::new())
    }
}

impl ExporterConfig for NopExporterConfig {
    fn sending(&self) -> &SendingSettings {
        &self.sending
    }

    fn build(&self, _ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
        Ok(self.build_nop())
    }
}
