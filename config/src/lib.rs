//! proflow's configuration loading. Lives here: the located YAML tree ([`Node`]),
//! a serde deserializer over it that reports the YAML path and line of every error
//! ([`from_node`]), `${env:VAR}` expansion, [`Duration`] and [`ByteSize`] values,
//! [`ComponentId`]s and the top-level [`Document`]; what every component config
//! answers to ([`Validate`], [`FieldError`]) and the settings every exporter
//! shares (`sending_queue`, `retry_on_failure`).
//!
//! This crate depends on no other proflow crate; `pipeline` and the components
//! depend on it to read their typed configs.

mod de;
mod document;
mod env;
mod error;
mod node;
mod opamp;
mod sending;
mod tls;
mod validate;
mod values;

pub use de::{EMBEDDED, Located, from_node};
pub use document::{
    ComponentId, Document, LimitsConfig, LogFormat, PipelineConfig, PipelineId, ServiceConfig,
    TelemetryConfig,
};
pub use env::expand_env;
pub use error::{Error, Errors};
pub use node::{Node, NodeValue};
pub use opamp::{OpampConnection, OpampServer, OpampSettings, OpampTransport};
pub use sending::{
    BatchSettings, Fsync, MIN_STORAGE_SIZE, QueueSettings, RetrySettings, SendingSettings,
    StorageSettings, WhenFull, queue_problems,
};
pub use tls::{ClientTlsSettings, ServerTlsSettings, TlsVersion};
pub use validate::{BuildError, FieldError, Validate, joined_problems, no_problems};
pub use values::{ByteSize, Duration, null_as_default};
