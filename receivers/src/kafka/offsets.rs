//! Which offsets may be committed: per partition, the records handed to the
//! pipeline and not yet resolved. The committable position is just past the
//! longest run of resolved records, so a record that is still in a queue (or
//! was abandoned at shutdown) holds back every later offset of its partition:
//! after a crash or restart they are read again (at least once; duplicates
//! are possible, losses are not).
//!
//! A partition's tracking starts when it is assigned and ends when it is
//! revoked; each assignment has a generation, so a record of an earlier
//! assignment that resolves late changes nothing.

use std::collections::{BTreeSet, HashMap};

/// One record's place.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Slot {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub generation: u64,
}

#[derive(Debug, Default)]
struct Partition {
    generation: u64,
    /// Offsets handed to the pipeline, not yet resolved.
    pending: BTreeSet<i64>,
    /// The lowest and highest offsets begun in this assignment.
    first_begun: Option<i64>,
    last_begun: Option<i64>,
    /// The last offset stored for commit (its next position is one more).
    last_stored: Option<i64>,
}

impl Partition {
    /// The last offset before the first unresolved record (or the last begun
    /// when none is pending), when it moved past what was stored. Offsets in
    /// between that are no records (compaction, transaction markers) are
    /// rightly passed over: reading resumes at the first pending record.
    fn advance(&mut self) -> Option<i64> {
        let last_done = match self.pending.first() {
            Some(&first) => first - 1,
            None => self.last_begun?,
        };
        // Nothing of this assignment resolved yet: the position is where
        // reading started, nothing to store.
        let nothing_done = self.first_begun.is_none_or(|f| last_done < f);
        if nothing_done || self.last_stored.is_some_and(|s| s >= last_done) {
            return None;
        }
        self.last_stored = Some(last_done);
        Some(last_done)
    }
}

/// Tracks every assigned partition.
#[derive(Debug, Default)]
pub(crate) struct Offsets {
    partitions: HashMap<(String, i32), Partition>,
    next_generation: u64,
}

impl Offsets {
    /// A partition was assigned: tracking starts afresh.
    pub fn assign(&mut self, topic: &str, partition: i32) {
        self.next_generation += 1;
        self.partitions.insert(
            (topic.to_owned(), partition),
            Partition {
                generation: self.next_generation,
                ..Partition::default()
            },
        );
    }

    /// A partition was revoked: its records resolving later change nothing.
    pub fn revoke(&mut self, topic: &str, partition: i32) {
        self.partitions.remove(&(topic.to_owned(), partition));
    }

    /// A record is handed to the pipeline; `None` when its partition is not
    /// assigned (a record fetched just before a revocation: it is read again
    /// by the partition's next owner).
    pub fn begin(&mut self, topic: &str, partition: i32, offset: i64) -> Option<Slot> {
        let p = self.partitions.get_mut(&(topic.to_owned(), partition))?;
        p.pending.insert(offset);
        p.first_begun = Some(p.first_begun.map_or(offset, |f| f.min(offset)));
        p.last_begun = Some(p.last_begun.map_or(offset, |l| l.max(offset)));
        Some(Slot {
            topic: topic.to_owned(),
            partition,
            offset,
            generation: p.generation,
        })
    }

    /// A record is resolved (delivered, refused for good, filtered or
    /// undecodable). Returns the offset to store when the committable
    /// position moved.
    pub fn resolve(&mut self, slot: &Slot) -> Option<i64> {
        let p = self
            .partitions
            .get_mut(&(slot.topic.clone(), slot.partition))?;
        if p.generation != slot.generation {
            return None;
        }
        p.pending.remove(&slot.offset);
        p.advance()
    }

    /// `(topic, partition, next offset)` of every partition with something
    /// committable: for the final commit at shutdown.
    pub fn committable(&self) -> Vec<(String, i32, i64)> {
        self.partitions
            .iter()
            .filter_map(|((t, p), s)| s.last_stored.map(|o| (t.clone(), *p, o + 1)))
            .collect()
    }

    /// Records handed to the pipeline and not yet resolved.
    pub fn pending(&self) -> usize {
        self.partitions.values().map(|p| p.pending.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_position_moves_only_past_a_resolved_run() {
        let mut o = Offsets::default();
        o.assign("t", 0);
        let s: Vec<Slot> = (10..14).map(|off| o.begin("t", 0, off).unwrap()).collect();
        assert_eq!(o.resolve(&s[1]), None, "10 is still pending");
        assert_eq!(o.resolve(&s[2]), None);
        assert_eq!(o.resolve(&s[0]), Some(12), "10..=12 done");
        assert_eq!(o.pending(), 1);
        assert_eq!(o.committable(), [("t".to_owned(), 0, 13)]);
        assert_eq!(o.resolve(&s[3]), Some(13));
        assert_eq!(o.resolve(&s[3]), None, "resolving twice changes nothing");
    }

    #[test]
    fn gaps_between_records_are_passed_over() {
        let mut o = Offsets::default();
        o.assign("t", 0);
        let a = o.begin("t", 0, 5).unwrap();
        let b = o.begin("t", 0, 9).unwrap();
        assert_eq!(
            o.resolve(&a),
            Some(8),
            "reading resumes at 9, the pending record"
        );
        assert_eq!(o.resolve(&b), Some(9));
    }

    #[test]
    fn revoked_and_reassigned_partitions_ignore_late_records() {
        let mut o = Offsets::default();
        o.assign("t", 0);
        let old = o.begin("t", 0, 1).unwrap();
        o.revoke("t", 0);
        assert_eq!(o.begin("t", 0, 2), None, "not assigned");
        assert_eq!(o.resolve(&old), None);
        o.assign("t", 0);
        let new = o.begin("t", 0, 1).unwrap();
        assert_eq!(o.resolve(&old), None, "an earlier assignment's record");
        assert_eq!(o.pending(), 1);
        assert_eq!(o.resolve(&new), Some(1));
    }

    #[test]
    fn offset_zero_pending_stores_nothing() {
        let mut o = Offsets::default();
        o.assign("t", 3);
        let a = o.begin("t", 3, 0).unwrap();
        let b = o.begin("t", 3, 1).unwrap();
        assert_eq!(o.resolve(&b), None);
        assert!(o.committable().is_empty());
        assert_eq!(o.resolve(&a), Some(1));
    }
}
