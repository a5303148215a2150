//! Java Flight Recorder files, as the Pyroscope Java agent (async-profiler
//! inside) and the JDK's own recorder write them, read without trusting a
//! single size or count in them: [`cursor`] reads the format's integers and
//! strings from a slice, every length checked against what is left before
//! anything is allocated; [`chunk`] reads a chunk's fixed header.
//!
//! Work in progress (issue 23): metadata, constant pools, events and the
//! conversion to pprof come next.
//!
//! What may depend on this: the model crate's conversions and the
//! receivers; it depends on nothing of proflow.

pub mod chunk;
pub mod convert;
pub mod cursor;
pub mod events;
pub mod labels;
pub mod metadata;
pub mod pools;
pub mod stacks;
pub mod values;

/// Why a JFR file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JfrError {
    /// The data ended inside a value that was still being read.
    #[error("the JFR data ends at byte {at} inside {what}")]
    Truncated { what: &'static str, at: usize },
    /// A value that cannot be what the format says it is.
    #[error("invalid JFR at byte {at}: {what}")]
    Invalid { what: String, at: usize },
}

pub type Result<T> = std::result::Result<T, JfrError>;
