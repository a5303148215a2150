//! proflow's core: the profile [`model`] (envelope, labels, lazily decoded
//! payload, batches), delivery acknowledgement ([`delivery`]), the pprof
//! messages ([`pprof`]), OTLP profiles and the conversions ([`otlp`]), the
//! profile type rules ([`profile_type`]), Pyroscope's push messages ([`push_v1`]), the
//! component traits ([`component`]), the in-flight memory budget
//! ([`memory`]), exporter queues with retry ([`queue`]), the running graph
//! ([`topology`]), self-telemetry ([`telemetry`]) and the admin HTTP server
//! that shows it ([`admin`]), plus the protobuf wire
//! walker ([`wire`]) that bounds untrusted messages before they are decoded,
//! query escaping for URLs components build ([`url`]),
//! the rustls client setup of components that connect out ([`tls`]), the
//! accept loop, TLS and authentication every listener shares ([`server`]),
//! (feature `http-client`) their GET client ([`http`]), and (feature `symbolize`) addresses to function names,
//! files and lines for the components that name frames ([`symbolize`]),
//! and the spans a `traces` pipeline feeds to processors ([`spans`]).
//!
//! Only this crate knows how data moves between components. It depends on
//! `proflow-config` for config values; components depend on it, never the reverse.

// The data model and codecs, where they were before they had a crate of
// their own (`proflow_pipeline::model` and the like keep working).
#[doc(hidden)]
pub use proflow_model::testdata;
pub use proflow_model::{
    delivery, inflate, json_shape, memory, model, otlp, pprof, profile_type, push_v1, spans, wire,
};

pub mod admin;
pub mod component;
#[cfg(feature = "http-client")]
pub mod http;
pub mod kafka;
pub mod queue;
pub mod registry;
pub mod relabel;
pub mod server;
#[cfg(feature = "symbolize")]
pub mod symbolize;
pub mod telemetry;
#[cfg(feature = "test-pki")]
pub mod test_pki;
pub mod tls;
pub mod topology;
pub mod url;
