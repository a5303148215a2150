//! proflow's processors: components that rewrite or filter profiles on their way
//! from receivers to exporters. Each lives in a folder named after its config
//! `type` (`relabel/`), holding its config struct and the running processor.
//!
//! This crate may depend on `proflow-pipeline` (envelope, component traits,
//! telemetry, the relabel engine) and `proflow-config` only, never on the
//! receiver or exporter crates. The binary registers what [`factories`] returns.

mod relabel;

use proflow_pipeline::registry::{Factory, Stability};

pub use relabel::{RELABEL_DROP_REASON, RelabelProcessor, RelabelProcessorConfig};

/// Every processor type this crate provides.
pub fn factories() -> Vec<Factory> {
    vec![Factory::processor::<RelabelProcessorConfig>(
        "relabel",
        Stability::Beta,
        "Rewrites and filters series labels with Prometheus relabel_configs, without decoding profiles.",
    )]
}
