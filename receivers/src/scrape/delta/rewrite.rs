//! Writing the delta: each sample with its new values, every other field
//! as it came.

use super::parts::{Count, Sink, each_raw_field, varint_len};
use super::*;

/// Key of a profile's `sample` field (2, length-delimited).
const SAMPLE_KEY: u64 = (2 << 3) | 2;
/// Key of a sample's packed `value` field (2, length-delimited).
const VALUE_KEY: u64 = (2 << 3) | 2;
/// Key of a profile's `duration_nanos` field (10, varint).
const DURATION_KEY: u64 = 10 << 3;

/// Where a key's previous values are while the delta is written.
#[derive(Clone, Copy)]
pub(super) struct Prev {
    /// The key's first sample, which carries the key's whole delta; later
    /// samples of the key get 0.
    first: usize,
    /// The key's slot in the previous state, or `usize::MAX` when it is new
    /// (its whole value is new).
    before: usize,
}

/// How the samples of a scrape are rewritten into its delta.
pub(super) struct Rewrite<'s> {
    /// Column of each sample type among the cumulative ones.
    column: &'s [Option<usize>],
    /// Per slot of the new state.
    prev: Vec<Prev>,
    slot_of: &'s [usize],
    /// Keys with a value that went down where that is no restart (their
    /// delta in that column is 0).
    went_down: usize,
}

impl<'s> Rewrite<'s> {
    /// `None` when a cumulative value of a column in `restarts` went down (a
    /// restart). `new` is the scrape's state, `first` the first sample of
    /// each of its keys and `slot_of` the slot of each of its samples.
    pub(super) fn new(
        column: &'s [Option<usize>],
        restarts: &[bool],
        old: &Held,
        new: &Held,
        first: &[usize],
        slot_of: &'s [usize],
    ) -> Option<Rewrite<'s>> {
        // Both key arrays are sorted: one merge finds each key's previous slot.
        let mut prev = Vec::with_capacity(new.keys.len());
        let mut went_down = 0;
        let mut j = 0;
        for (slot, key) in new.keys.iter().enumerate() {
            while old.keys.get(j).is_some_and(|k| k < key) {
                j += 1;
            }
            let before = if old.keys.get(j) == Some(key) {
                let mut down = false;
                for (k, (now, before)) in new.values(slot).iter().zip(old.values(j)).enumerate() {
                    if now < before {
                        if restarts.get(k).copied().unwrap_or(true) {
                            return None;
                        }
                        down = true;
                    }
                }
                went_down += usize::from(down);
                j
            } else {
                usize::MAX
            };
            prev.push(Prev {
                first: first.get(slot).copied().unwrap_or(usize::MAX),
                before,
            });
        }
        Some(Rewrite {
            column,
            prev,
            slot_of,
            went_down,
        })
    }

    /// The delta profile: `plain` with its samples rewritten and its
    /// duration replaced by the time since the previous scrape.
    pub(super) fn delta(
        &self,
        plain: &[u8],
        parts: &Parts<'_>,
        old: &Held,
        new: &Held,
        granted: usize,
    ) -> Result<Delta, DeltaError> {
        // The delta covers the time between the two scrapes; the duration Go
        // writes in a cumulative profile is only how long writing it took. A
        // clock that went back leaves the scraped duration.
        let duration = (old.time_nanos > 0 && parts.time_nanos > old.time_nanos)
            .then(|| parts.time_nanos - old.time_nanos);
        let mut length = Count(0);
        self.write(plain, old, new, duration, &mut length)?;
        // The scratch (`Prev`s included) and the delta itself.
        let need = parts.work.saturating_add(length.0);
        if need > granted {
            return Err(DeltaError::OverBudget { need, granted });
        }
        let mut bytes = Vec::with_capacity(length.0);
        let samples = self.write(plain, old, new, duration, &mut bytes)?;
        debug_assert_eq!(bytes.len(), length.0);
        Ok(Delta {
            bytes,
            samples,
            went_down: self.went_down,
            time_nanos: parts.time_nanos,
            duration_nanos: duration.unwrap_or(parts.duration_nanos),
        })
    }

    /// Writes the delta profile to `out`; returns how many samples it kept.
    fn write(
        &self,
        plain: &[u8],
        old: &Held,
        new: &Held,
        duration: Option<i64>,
        out: &mut impl Sink,
    ) -> Result<usize, DeltaError> {
        let mut kept = 0;
        let mut index = 0;
        let mut duration_written = false;
        let mut fields = wire::fields(plain);
        loop {
            let start = plain.len() - fields.rest().len();
            let Some(field) = fields.next() else { break };
            let (tag, value) = field?;
            let raw = &plain[start..plain.len() - fields.rest().len()];
            match (tag, value, duration) {
                (2, Value::Bytes(sample), _) => {
                    if self.write_sample(sample, index, old, new, out)? {
                        kept += 1;
                    }
                    index += 1;
                }
                (10, Value::Varint(_), Some(d)) => {
                    if !duration_written {
                        out.varint(DURATION_KEY);
                        out.varint(d as u64);
                        duration_written = true;
                    }
                }
                _ => out.put(raw),
            }
        }
        if let (Some(d), false) = (duration, duration_written) {
            out.varint(DURATION_KEY);
            out.varint(d as u64);
        }
        Ok(kept)
    }

    /// Writes sample `index` with its new values, unless they are all zero;
    /// true when it was written.
    fn write_sample(
        &self,
        sample: &[u8],
        index: usize,
        old: &Held,
        new: &Held,
        out: &mut impl Sink,
    ) -> Result<bool, DeltaError> {
        let slot = self.slot_of.get(index).copied().unwrap_or(usize::MAX);
        let Some(prev) = self.prev.get(slot) else {
            return Ok(false);
        };
        let now = new.values(slot);
        let before = old.values(prev.before);
        let first = prev.first == index;
        let value_of = |index: usize, v: i64| match self.column.get(index) {
            Some(&Some(k)) if first => {
                // An estimate that went down adds nothing (0, not a
                // negative value); saturating, as a crafted negative
                // previous value could overflow the plain subtraction.
                let now = now.get(k).copied().unwrap_or(0);
                now.saturating_sub(before.get(k).copied().unwrap_or(0))
                    .max(0)
            }
            Some(&Some(_)) => 0,
            _ => v,
        };
        // The new values' packed length, and whether any is not zero.
        let mut values_len = 0usize;
        let mut any = false;
        for_each_value(sample, |i, v| {
            let v = value_of(i, v);
            any |= v != 0;
            values_len += varint_len(v as u64);
        })?;
        if !any {
            return Ok(false);
        }
        // Every field but the values, as it came: their length first.
        let mut rest = 0usize;
        each_raw_field(sample, |tag, raw| {
            if tag != 2 {
                rest += raw.len();
            }
        })?;
        let values_field = 1 + varint_len(values_len as u64) + values_len;
        out.varint(SAMPLE_KEY);
        out.varint((rest + values_field) as u64);
        // Location ids, values, then labels and any other field: Go's
        // order; each field's elements keep theirs.
        each_raw_field(sample, |tag, raw| {
            if tag == 1 {
                out.put(raw);
            }
        })?;
        out.varint(VALUE_KEY);
        out.varint(values_len as u64);
        for_each_value(sample, |i, v| out.varint(value_of(i, v) as u64))?;
        each_raw_field(sample, |tag, raw| {
            if tag > 2 {
                out.put(raw);
            }
        })?;
        Ok(true)
    }
}
