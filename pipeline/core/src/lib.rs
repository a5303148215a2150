//! proflow's core, the one crate that knows how data moves between
//! components: the component traits ([`component`]) and the table of
//! component types ([`registry`]), the running graph ([`topology`]: plan,
//! fan-out, reload, shutdown), exporter queues with retry and disk storage
//! ([`queue`]), self-telemetry ([`telemetry`]) and the admin HTTP server that
//! shows it ([`admin`]).
//!
//! It depends on `proflow-config`, `proflow-model` and `proflow-net`, and
//! re-exports their modules under the names components have always used
//! (`proflow_pipeline::model`, `::server`, …). Components depend on it and
//! on the engines they use (`proflow-relabel`, `proflow-kafka`,
//! `proflow-symbolize`); nothing here depends on a component or an engine.

// The data model and codecs, where they were before they had a crate of
// their own (`proflow_pipeline::model` and the like keep working).
#[doc(hidden)]
pub use proflow_model::testdata;
pub use proflow_model::{
    delivery, inflate, jfr, json_shape, lost, memory, model, otlp, pprof, profile_type, push_v1,
    spans, wire,
};

// The network edges, where they were before they had a crate of their own.
#[cfg(feature = "http-client")]
pub use proflow_net::http;
#[cfg(feature = "test-pki")]
pub use proflow_net::test_pki;
pub use proflow_net::{server, tls, url};

pub mod admin;
pub mod component;
pub mod queue;
pub mod registry;
pub mod telemetry;
pub mod topology;
