//! The `ebpf` receiver's state budget (`max_state_size`): what the node
//! agent keeps because of what other users of the node run, charged in one
//! total. Lives here: [`StateBudget`], shared by the process table's perf
//! maps (`perfmap.rs`), the unwind sections copied or inflated
//! (`procs/binary.rs`, `procs/spill.rs`) and the interpreters' per-process caches
//! ([`CacheCharge`]), each charged as it is taken and given back when it is
//! dropped, with the refusals counted by what was refused.
//!
//! What may depend on this: the receiver's process table and, through
//! feature `perf-map`, the perf map reader's fuzz target.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// What a refusal was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Use {
    /// Entries of a process's perf map.
    PerfMap,
    /// An unwind section copied or inflated.
    UnwindSection,
    /// What an interpreter's functions read from its process hold (names,
    /// files, lines), kept per process.
    RuntimeCache,
}

impl Use {
    pub const ALL: [Use; 3] = [Use::PerfMap, Use::UnwindSection, Use::RuntimeCache];

    pub fn as_str(self) -> &'static str {
        match self {
            Use::PerfMap => "perf_map",
            Use::UnwindSection => "unwind_section",
            Use::RuntimeCache => "runtime_cache",
        }
    }
}

/// Memory the receiver's state may take together; shared (Arc).
#[derive(Debug)]
pub struct StateBudget {
    limit: usize,
    // Relaxed: each counter is one variable updated on its own; nothing
    // else is published through them.
    used: AtomicUsize,
    refused: [AtomicU64; Use::ALL.len()],
}

impl StateBudget {
    /// A budget of `limit` bytes.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(StateBudget {
            limit,
            used: AtomicUsize::new(0),
            refused: Default::default(),
        })
    }

    /// A budget with no bound (tests and fuzz targets).
    pub fn unbounded() -> Arc<Self> {
        StateBudget::new(usize::MAX)
    }

    /// Bytes charged now.
    pub fn used_bytes(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Refusals so far for `what`.
    pub fn refusals(&self, what: Use) -> u64 {
        self.refused[what as usize].load(Ordering::Relaxed)
    }

    /// Charges `bytes` for `what` if they fit; counts a refusal if not.
    pub fn take(&self, what: Use, bytes: usize) -> bool {
        let ok = self
            .used
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|after| *after <= self.limit)
            })
            .is_ok();
        if !ok {
            self.refused[what as usize].fetch_add(1, Ordering::Relaxed);
        }
        ok
    }

    /// Gives back `bytes` taken earlier.
    pub fn give(&self, bytes: usize) {
        self.used.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Bytes held under a [`StateBudget`], given back when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: Arc<StateBudget>,
    bytes: usize,
}

impl Charge {
    /// `bytes` of `budget` for `what`, or `None` (counted) if they do not
    /// fit.
    pub fn take(budget: &Arc<StateBudget>, what: Use, bytes: usize) -> Option<Charge> {
        budget.take(what, bytes).then(|| Charge {
            budget: budget.clone(),
            bytes,
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.budget.give(self.bytes);
    }
}

/// The bytes one growing cache holds (an interpreter's functions read from
/// its process), charged to the budget as entries are added and given back
/// when it starts over or is dropped.
#[derive(Debug)]
pub struct CacheCharge {
    budget: Arc<StateBudget>,
    bytes: usize,
}

impl CacheCharge {
    pub fn new(budget: &Arc<StateBudget>) -> Self {
        CacheCharge {
            budget: budget.clone(),
            bytes: 0,
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Charges `n` more bytes; false (counted as a `runtime_cache`
    /// refusal) when the budget has no room: the entry is not kept.
    pub fn take(&mut self, n: usize) -> bool {
        let ok = self.budget.take(Use::RuntimeCache, n);
        if ok {
            self.bytes += n;
        }
        ok
    }

    /// Gives every byte back (the cache starts over).
    pub fn clear(&mut self) {
        self.budget.give(self.bytes);
        self.bytes = 0;
    }
}

impl Drop for CacheCharge {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_caches_charge_grows_and_comes_back() {
        let budget = StateBudget::new(100);
        let mut c = CacheCharge::new(&budget);
        assert!(c.take(70));
        assert!(!c.take(40), "over the limit: not kept");
        assert_eq!((c.bytes(), budget.used_bytes()), (70, 70));
        assert_eq!(budget.refusals(Use::RuntimeCache), 1);
        c.clear();
        assert_eq!(budget.used_bytes(), 0);
        assert!(c.take(90));
        drop(c);
        assert_eq!(budget.used_bytes(), 0);
    }

    #[test]
    fn charges_fit_the_limit_and_come_back_when_dropped() {
        let budget = StateBudget::new(100);
        let a = Charge::take(&budget, Use::UnwindSection, 60).expect("fits");
        assert!(Charge::take(&budget, Use::UnwindSection, 41).is_none());
        assert!(!budget.take(Use::PerfMap, 41));
        assert_eq!(budget.refusals(Use::UnwindSection), 1);
        assert_eq!(budget.refusals(Use::PerfMap), 1);
        assert!(budget.take(Use::PerfMap, 40));
        assert_eq!(budget.used_bytes(), 100);
        drop(a);
        assert_eq!(budget.used_bytes(), 40);
        budget.give(40);
        assert_eq!(budget.used_bytes(), 0);
        assert!(StateBudget::unbounded().take(Use::PerfMap, usize::MAX - 1));
    }
}
