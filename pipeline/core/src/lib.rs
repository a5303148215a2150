//! proflow's core, the one crate that knows how data moves between
//! components: the component traits ([`component`]) and the table of
//! component types ([`registry`]), the running graph ([`topology`]: plan,
//! fan-out, reload, shutdown), exporter queues with retry and disk storage
//! ([`queue`]), self-telemetry ([`telemetry`]) and the admin HTTP server that
//! shows it ([`admin`]), with the status page a person reads ([`status_page`]).
//!
//! It depends on `proflow-config`, `proflow-model` and `proflow-net`.
//! Components depend on it, on those two directly for the data model and
//! the network edges, and on the engines they use (`proflow-relabel`,
//! `proflow-kafka`, `proflow-symbolize`, `proflow-kube`); nothing here
//! depends on a component or an engine.

pub mod admin;
pub mod component;
pub mod queue;
pub mod registry;
pub mod status_page;
pub mod telemetry;
pub mod topology;
