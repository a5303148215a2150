//! What a conversion could not carry: samples counted by reason, so a
//! receiver can report them (`proflow_receiver_lost_samples_total`) instead
//! of answering 200 for data that never arrives.
//!
//! A sample whose value is 0 where it arrived is nothing to store (pprof and
//! every backend drop it) and is not a loss; a sample with a value that a
//! conversion turns into nothing (rounded to 0, a stack with no frame, a
//! value the target type cannot hold) is.

/// Samples lost by one conversion, per reason (a short snake_case word).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostSamples {
    reasons: Vec<(&'static str, u64)>,
}

impl LostSamples {
    /// `samples` more lost for `reason`.
    pub fn add(&mut self, reason: &'static str, samples: u64) {
        if samples == 0 {
            return;
        }
        match self.reasons.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n = n.saturating_add(samples),
            None => self.reasons.push((reason, samples)),
        }
    }

    /// Adds everything `other` lost.
    pub fn merge(&mut self, other: &LostSamples) {
        for &(reason, samples) in &other.reasons {
            self.add(reason, samples);
        }
    }

    /// Whether nothing was lost.
    pub fn is_empty(&self) -> bool {
        self.reasons.is_empty()
    }

    /// Samples lost for `reason`.
    pub fn samples(&self, reason: &str) -> u64 {
        self.reasons
            .iter()
            .find(|(r, _)| *r == reason)
            .map_or(0, |(_, n)| *n)
    }

    /// Every reason and its samples, in the order first seen.
    pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.reasons.iter().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_add_up_per_reason_and_zero_is_nothing() {
        let mut a = LostSamples::default();
        a.add("rounded_to_zero", 2);
        a.add("empty_stack", 0);
        a.add("rounded_to_zero", 3);
        let mut b = LostSamples::default();
        b.add("empty_stack", 1);
        b.add("rounded_to_zero", u64::MAX);
        a.merge(&b);
        assert_eq!(
            a.iter().collect::<Vec<_>>(),
            vec![("rounded_to_zero", u64::MAX), ("empty_stack", 1)]
        );
        assert_eq!(a.samples("empty_stack"), 1);
        assert!(LostSamples::default().is_empty());
    }
}
