//! proflow's exporters: the components that take profiles out of the collector.
//! One folder per component, named after its config `type`: [`file`] writes
//! pprof or folded files to a local directory, [`nop`] discards (for tests and
//! benchmarks).
//!
//! This crate depends only on `proflow-pipeline` and `proflow-config`, never on
//! another component crate: exporters are driven by the pipeline's queue and
//! implement nothing but [`Exporter::export`](proflow_pipeline::component::Exporter::export).

mod error;
pub mod file;
pub mod nop;

pub use error::Error;

use proflow_pipeline::registry::{Factory, Stability};

/// The exporter types of this crate, for the binary's registry.
pub fn factories() -> Vec<Factory> {
    vec![
        Factory::exporter::<file::FileExporterConfig>(
            "file",
            Stability::Alpha,
            "Writes profiles as gzip pprof or folded stacks under a local directory, with a JSON-lines index and size/age retention.",
        ),
        Factory::exporter::<nop::NopExporterConfig>(
            "nop",
            Stability::Stable,
            "Accepts and discards profiles, counting them; for tests and benchmarks.",
        ),
    ]
}
