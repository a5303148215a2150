//! Java Flight Recorder files, as the Pyroscope Java agent (async-profiler
//! inside) and the JDK's own recorder write them, read without trusting a
//! single size or count in them:
//!
//! - [`cursor`] reads the format's integers and strings from a slice, every
//!   length checked against what is left before anything is allocated;
//! - [`chunk`] reads a chunk's fixed header, [`metadata`] its classes,
//!   [`values`] one value as its class lays it out, [`pools`] the constant
//!   pools, [`events`] the events one by one, [`stacks`] the stack traces;
//! - [`labels`] reads the agent's dynamic labels (a protobuf beside the JFR);
//! - [`convert`] makes pprof profiles of a recording, as Pyroscope does.
//!
//! Everything the reading keeps is measured by a [`Meter`] before it is
//! allocated, so a small file cannot claim a large amount of memory: the
//! caller says how much may be taken.
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

/// The maps of the reader, keyed by what the file says (pool keys, class
/// ids): hashed with a per-process random seed, and fast.
pub(crate) type HashMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;

/// Why a JFR file could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JfrError {
    /// The data ended inside a value that was still being read.
    #[error("the JFR data ends at byte {at} inside {what}")]
    Truncated { what: &'static str, at: usize },
    /// A value that cannot be what the format says it is.
    #[error("invalid JFR at byte {at}: {what}")]
    Invalid { what: String, at: usize },
    /// Reading would take more memory than the caller allowed.
    #[error("reading the JFR data needs more than the {allowed} bytes of memory it may take")]
    OverBudget { allowed: usize },
}

/// What the reading of one recording holds in memory, granted before it is
/// allocated: `grant(n)` is asked for `n` more bytes whenever what is held
/// goes past everything granted so far, and says no by returning false.
/// What is given back (an event's values once used) is granted again
/// without asking.
pub struct Meter<'a> {
    grant: Box<dyn FnMut(usize) -> bool + 'a>,
    held: usize,
    granted: usize,
}

impl std::fmt::Debug for Meter<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Meter")
            .field("held", &self.held)
            .field("granted", &self.granted)
            .finish()
    }
}

impl<'a> Meter<'a> {
    pub fn new(grant: impl FnMut(usize) -> bool + 'a) -> Self {
        Meter {
            grant: Box::new(grant),
            held: 0,
            granted: 0,
        }
    }

    /// A meter that grants whatever is asked (for what is trusted, and tests).
    pub fn unbounded() -> Meter<'static> {
        Meter::new(|_| true)
    }

    /// Takes `bytes` more, asking for a grant if what is held outgrows it.
    pub fn take(&mut self, bytes: usize) -> Result<()> {
        let held = self.held.saturating_add(bytes);
        if held > self.granted {
            if !(self.grant)(held - self.granted) {
                return Err(JfrError::OverBudget {
                    allowed: self.granted,
                });
            }
            self.granted = held;
        }
        self.held = held;
        Ok(())
    }

    /// Takes room for `n` things of type `T`.
    pub fn take_items<T>(&mut self, n: usize) -> Result<()> {
        self.take(n.saturating_mul(std::mem::size_of::<T>()))
    }

    /// Gives back `bytes` taken before (what they held is dropped).
    pub fn give_back(&mut self, bytes: usize) {
        self.held = self.held.saturating_sub(bytes);
    }

    /// What is held now.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The most ever held: everything granted.
    pub fn peak(&self) -> usize {
        self.granted
    }
}

pub type Result<T> = std::result::Result<T, JfrError>;
