//! What a conversion could not carry: samples counted by reason, so a
//! receiver can report them (`proflow_receiver_lost_samples_total`) instead
//! of answering 200 for data that never arrives; and parts of samples that
//! arrive without them (a frame, a label:
//! `proflow_receiver_lost_parts_total`).
//!
//! A sample whose value is 0 where it arrived is nothing to store (pprof and
//! every backend drop it) and is not a loss; a sample with a value that a
//! conversion turns into nothing (rounded to 0, a stack with no frame, a
//! value the target type cannot hold) is.

/// Samples lost by one conversion, per reason (a short snake_case word);
/// and parts of samples that arrived without them (a frame, a label), per
/// part and reason.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostSamples {
    reasons: Vec<(&'static str, u64)>,
    parts: Vec<(&'static str, &'static str, u64)>,
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

    /// `count` more of `part` (e.g. `frame`) lost for `reason` from samples
    /// that still arrive.
    pub fn add_part(&mut self, part: &'static str, reason: &'static str, count: u64) {
        if count == 0 {
            return;
        }
        match self
            .parts
            .iter_mut()
            .find(|(p, r, _)| *p == part && *r == reason)
        {
            Some((_, _, n)) => *n = n.saturating_add(count),
            None => self.parts.push((part, reason, count)),
        }
    }

    /// Adds everything `other` lost.
    pub fn merge(&mut self, other: &LostSamples) {
        for &(reason, samples) in &other.reasons {
            self.add(reason, samples);
        }
        for &(part, reason, count) in &other.parts {
            self.add_part(part, reason, count);
        }
    }

    /// Whether nothing was lost (samples or parts).
    pub fn is_empty(&self) -> bool {
        self.reasons.is_empty() && self.parts.is_empty()
    }

    /// Every part, reason and count, in the order first seen.
    pub fn parts(&self) -> impl Iterator<Item = (&'static str, &'static str, u64)> + '_ {
        self.parts.iter().copied()
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
        let mut c = LostSamples::default();
        c.add_part("frame", "unnamed", 0);
        assert!(c.is_empty());
        c.add_part("frame", "unnamed", 2);
        a.merge(&c);
        a.merge(&c);
        assert_eq!(a.parts().collect::<Vec<_>>(), vec![("frame", "unnamed", 4)]);
        assert_eq!(a.samples("unnamed"), 0, "parts are no lost samples");
    }
}
