//! Reading the ring buffer in passes of a bounded number of records.
//!
//! The BPF program can write samples as fast as the sampling thread reads
//! them (off-CPU waits of many short processes, a burst of CPUs coming
//! online). Read until empty, one pass would then last as long as the flood,
//! and the interval's profiles, the counters and the marking of processes
//! that are not profiled would wait for it. A pass stops after
//! [`MAX_PASS`] records instead; the sampling thread does its other work and
//! comes back at once.

use aya::maps::{MapData, RingBuf};

/// Records read at most in one pass: at the default rates (19 Hz on each
/// of a few hundred CPUs, 100 ms between passes) a pass holds a few hundred,
/// so only a flood reaches it.
pub const MAX_PASS: u64 = 4096;

/// Where records are read from: the BPF ring buffer, or a queue in tests.
pub trait Records {
    /// Hands the next record to `each`; false when there is none.
    fn read_one(&mut self, each: &mut dyn FnMut(&[u8])) -> bool;
}

impl Records for RingBuf<MapData> {
    fn read_one(&mut self, each: &mut dyn FnMut(&[u8])) -> bool {
        match self.next() {
            Some(item) => {
                each(&item);
                true
            }
            None => false,
        }
    }
}

/// What one pass read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pass {
    /// Records read.
    pub records: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Whether the pass stopped at its bound with records perhaps left.
    pub full: bool,
}

/// Reads records into `each` until there is none or `max` were read
/// (`None`: no bound, as when stopping, to read what was already sent).
pub fn read_pass(
    records: &mut impl Records,
    max: Option<u64>,
    mut each: impl FnMut(&[u8]),
) -> Pass {
    let mut pass = Pass::default();
    while max.is_none_or(|max| pass.records < max) {
        let mut bytes = 0;
        if !records.read_one(&mut |item| {
            bytes = item.len() as u64;
            each(item);
        }) {
            return pass;
        }
        pass.records += 1;
        pass.bytes += bytes;
    }
    pass.full = true;
    pass
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    impl Records for VecDeque<Vec<u8>> {
        fn read_one(&mut self, each: &mut dyn FnMut(&[u8])) -> bool {
            self.pop_front().map(|r| each(&r)).is_some()
        }
    }

    #[test]
    fn a_flood_is_read_in_bounded_passes_and_nothing_is_lost() {
        let mut ring: VecDeque<Vec<u8>> =
            (0..10_000u32).map(|i| i.to_le_bytes().to_vec()).collect();
        let mut seen = Vec::new();
        let mut passes = Vec::new();
        loop {
            let pass = read_pass(&mut ring, Some(4096), |r| {
                seen.push(u32::from_le_bytes(r.try_into().unwrap()))
            });
            passes.push(pass);
            if !pass.full {
                break;
            }
        }
        let counts: Vec<(u64, bool)> = passes.iter().map(|p| (p.records, p.full)).collect();
        assert_eq!(
            counts,
            [(4096, true), (4096, true), (1808, false)],
            "each pass stops at its bound; the last finds the ring empty"
        );
        assert_eq!(passes.iter().map(|p| p.bytes).sum::<u64>(), 40_000);
        assert_eq!(
            seen,
            (0..10_000).collect::<Vec<_>>(),
            "every record, in order"
        );
    }

    #[test]
    fn without_a_bound_a_pass_reads_until_empty() {
        let mut ring: VecDeque<Vec<u8>> = (0..10_000).map(|_| vec![0; 3]).collect();
        let pass = read_pass(&mut ring, None, |_| {});
        assert_eq!(
            pass,
            Pass {
                records: 10_000,
                bytes: 30_000,
                full: false
            }
        );
        assert!(ring.is_empty());
    }

    #[test]
    fn a_pass_that_reads_exactly_its_bound_says_it_may_have_left_some() {
        // The ring cannot say whether more is there without reading it: the
        // next pass finds out, at once (no wait for the poll).
        let mut ring: VecDeque<Vec<u8>> = (0..8).map(|_| vec![1]).collect();
        assert!(read_pass(&mut ring, Some(8), |_| {}).full);
        assert_eq!(read_pass(&mut ring, Some(8), |_| {}), Pass::default());
    }
}
