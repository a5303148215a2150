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
