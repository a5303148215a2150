//! The `aggregate` processor's config: the window and the series bound, their
//! checks, and the build.

use proflow_config::Duration;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Processor, ProcessorConfig, Validate,
};
use serde::Deserialize;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use super::telemetry::AggregateTelemetry;
use super::{AggregateProcessor, Windows};

/// The shortest window: shorter would merge next to nothing.
pub const MIN_WINDOW: StdDuration = StdDuration::from_secs(1);
/// The longest window: what a window holds is lost if the collector is
/// killed, and a backend's recent data would lag by this much.
pub const MAX_WINDOW: StdDuration = StdDuration::from_secs(600);

/// Config of the `aggregate` processor.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AggregateProcessorConfig {
    /// How long the profiles of one series are merged, from the first one
    /// that opens its window (`1s` to `10m`). Default `15s`.
    #[serde(default = "default_window")]
    pub window: Duration,
    /// The most series with an open window at once. A profile of another
    /// series goes on unmerged until a window closes. Default 100,000.
    #[serde(default = "default_max_series")]
    pub max_series: usize,
}

fn default_window() -> Duration {
    Duration::from_secs(15)
}

fn default_max_series() -> usize {
    100_000
}

impl Default for AggregateProcessorConfig {
    fn default() -> Self {
        AggregateProcessorConfig {
            window: default_window(),
            max_series: default_max_series(),
        }
    }
}

impl Validate for AggregateProcessorConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        let w = self.window.get();
        if !(MIN_WINDOW..=MAX_WINDOW).contains(&w) {
            problems.push(FieldError::new(
                "window",
                format!("must be between 1s and 10m (is {w:?}): set the window over which one series' profiles are merged, such as 15s"),
            ));
        }
        if self.max_series == 0 {
            problems.push(FieldError::new(
                "max_series",
                "must be at least 1: set how many series may have an open window at once, such as 100000",
            ));
        }
        problems
    }
}

impl ProcessorConfig for AggregateProcessorConfig {
    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Processor>, BuildError> {
        Ok(Arc::new(AggregateProcessor(Arc::new(Windows {
            window: self.window.get(),
            max_series: self.max_series,
            memory: ctx.memory.clone(),
            open: Mutex::new(HashMap::new()),
            telemetry: AggregateTelemetry::new(&ctx.telemetry, &ctx.id),
        }))))
    }
}
