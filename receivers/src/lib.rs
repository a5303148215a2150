//! proflow's receivers: the components that accept profiles from the network
//! and hand each request's profiles to the pipeline as one batch.
//!
//! Lives here: one module per receiver type, named after its config `type`
//! ([`pprof_push`]: Pyroscope-compatible `/ingest` and `push.v1` Push), and
//! [`factories`], the table the binary joins into its registry.
//!
//! This crate may depend only on `proflow-pipeline` (envelope, component traits,
//! telemetry, pprof helpers) and `proflow-config`; never on another component
//! crate, so receivers, processors and exporters stay independent.

pub mod pprof_push;

use proflow_pipeline::registry::{Factory, Stability};

/// Every receiver type this crate provides.
pub fn factories() -> Vec<Factory> {
    vec![Factory::receiver::<pprof_push::PprofPushConfig>(
        "pprof_push",
        Stability::Alpha,
        "Accepts profiles pushed the way Pyroscope clients send them: POST /ingest (pprof, multipart, folded text) and the push.v1 Connect Push API.",
    )]
}
