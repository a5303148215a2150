//! Delivery acknowledgement: how a receiver learns what became of a batch it
//! handed to the pipeline.
//!
//! A receiver that wants to know makes an [`Ack`] with [`Ack::new`] and keeps
//! the [`Delivery`]; one that does not uses [`Ack::none`], which costs
//! nothing. The pipeline splits the ack into one share per copy it makes
//! (one per pipeline after its processors, one per exporter queue), and every
//! share reports the outcome of its profiles: delivered, failed permanently,
//! dropped by a full `drop_newest` queue, filtered by a processor, or
//! abandoned (the collector stopped before sending it). A share that is
//! dropped without reporting counts its profiles as abandoned, so every path
//! resolves, including panics and aborted tasks.
//!
//! The [`Delivery`] resolves exactly once, when the last share is gone, with
//! the counts of every copy ([`DeliveryReport`]). The Kafka receiver commits
//! offsets on it; a push receiver may answer only once it resolved.
//!
//! What may depend on this: receivers (make acks, await deliveries), the
//! topology and queues (split and resolve shares). Exporters never see acks:
//! they report outcomes through `export`'s result.

use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

/// What became of some profile copies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The exporter delivered them.
    Delivered,
    /// A persistent exporter queue stored them durably: it sends them,
    /// across restarts, without the receiver having to wait.
    Stored,
    /// The exporter's peer refused them for good, or retries ran out.
    Failed,
    /// A full `drop_newest` queue dropped them.
    Dropped,
    /// A processor filtered them out (relabel `drop`, for example).
    Filtered,
    /// The collector stopped before they were sent.
    Abandoned,
}

/// The outcome counts of every copy of one batch: a batch of 3 profiles sent
/// to 2 exporters has 6 copies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DeliveryReport {
    pub delivered: usize,
    /// Copies a persistent queue keeps on disk (sent later, restarts included).
    pub stored: usize,
    pub failed: usize,
    pub dropped: usize,
    pub filtered: usize,
    pub abandoned: usize,
}

impl DeliveryReport {
    fn add(&mut self, outcome: Outcome, n: usize) {
        let slot = match outcome {
            Outcome::Delivered => &mut self.delivered,
            Outcome::Stored => &mut self.stored,
            Outcome::Failed => &mut self.failed,
            Outcome::Dropped => &mut self.dropped,
            Outcome::Filtered => &mut self.filtered,
            Outcome::Abandoned => &mut self.abandoned,
        };
        *slot += n;
    }

    /// Copies accounted for.
    pub fn total(&self) -> usize {
        self.delivered + self.stored + self.failed + self.dropped + self.filtered + self.abandoned
    }

    /// True when no copy was lost: each was delivered, stored by a persistent
    /// queue, or deliberately filtered.
    pub fn is_complete(&self) -> bool {
        self.failed == 0 && self.dropped == 0 && self.abandoned == 0
    }
}

struct Shared {
    counts: Mutex<DeliveryReport>,
    done: Mutex<Option<oneshot::Sender<DeliveryReport>>>,
}

impl Drop for Shared {
    // The last share is gone: every copy has reported (or was abandoned).
    fn drop(&mut self) {
        let report = *self.counts.get_mut().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = self
            .done
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            let _ = tx.send(report);
        }
    }
}

/// A share of one batch's acknowledgement, responsible for `pending` profile
/// copies. Resolve it with [`Ack::resolve`]; dropping it unresolved reports
/// its copies as abandoned.
#[must_use = "an ack reports its profiles when resolved; dropped, they count as abandoned"]
pub struct Ack {
    shared: Option<Arc<Shared>>,
    pending: usize,
}

impl std::fmt::Debug for Ack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ack")
            .field("tracked", &self.shared.is_some())
            .field("pending", &self.pending)
            .finish()
    }
}

impl Ack {
    /// An ack for `profiles` profiles, and the delivery that resolves when
    /// every copy made from it has reported.
    pub fn new(profiles: usize) -> (Ack, Delivery) {
        let (tx, rx) = oneshot::channel();
        let shared = Arc::new(Shared {
            counts: Mutex::new(DeliveryReport::default()),
            done: Mutex::new(Some(tx)),
        });
        (
            Ack {
                shared: Some(shared),
                pending: profiles,
            },
            Delivery { rx },
        )
    }

    /// An ack nobody waits for: every operation is free.
    pub fn none() -> Ack {
        Ack {
            shared: None,
            pending: 0,
        }
    }

    /// Whether somebody waits for this ack's delivery.
    pub fn is_tracked(&self) -> bool {
        self.shared.is_some()
    }

    /// Profile copies this share still has to report.
    pub fn pending(&self) -> usize {
        self.pending
    }

    /// A new share for `profiles` copies of the same batch (a fan-out copy).
    /// This share keeps its own pending count.
    pub fn share(&self, profiles: usize) -> Ack {
        Ack {
            shared: self.shared.clone(),
            pending: if self.shared.is_some() { profiles } else { 0 },
        }
    }

    /// Moves `profiles` of this share's pending copies into a new share.
    pub fn split_off(&mut self, profiles: usize) -> Ack {
        let n = profiles.min(self.pending);
        self.pending -= n;
        Ack {
            shared: self.shared.clone(),
            pending: n,
        }
    }

    /// Reports `n` of this share's copies (at most what is pending).
    pub fn report(&mut self, outcome: Outcome, n: usize) {
        let n = n.min(self.pending);
        if n == 0 {
            return;
        }
        self.pending -= n;
        if let Some(shared) = &self.shared {
            shared
                .counts
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .add(outcome, n);
        }
    }

    /// Reports every pending copy with `outcome`.
    pub fn resolve(mut self, outcome: Outcome) {
        let n = self.pending;
        self.report(outcome, n);
    }

    /// Ends this share without reporting anything: for the original ack once
    /// its copies have their own shares.
    pub fn retire(mut self) {
        self.pending = 0;
    }
}

impl Drop for Ack {
    fn drop(&mut self) {
        let n = self.pending;
        self.report(Outcome::Abandoned, n);
    }
}

/// The receiver's end of an [`Ack`]: resolves once, when every copy has
/// reported.
#[derive(Debug)]
pub struct Delivery {
    rx: oneshot::Receiver<DeliveryReport>,
}

impl Delivery {
    /// Waits until every copy has reported.
    pub async fn wait(self) -> DeliveryReport {
        // The sender lives in the shared state, which sends before it goes, so
        // an error cannot happen; an empty report is the honest fallback.
        self.rx.await.unwrap_or_default()
    }

    /// The report if the delivery already resolved.
    pub fn try_report(&mut self) -> Option<DeliveryReport> {
        self.rx.try_recv().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_once_when_the_last_share_reports() {
        let (ack, mut delivery) = Ack::new(3);
        let mut a = ack.share(3);
        let b = ack.share(3);
        ack.retire();
        a.report(Outcome::Delivered, 2);
        let rest = a.split_off(5);
        assert_eq!(rest.pending(), 1, "split_off takes at most what is pending");
        rest.resolve(Outcome::Failed);
        drop(a);
        assert_eq!(delivery.try_report(), None, "b has not reported");
        b.resolve(Outcome::Dropped);
        let report = delivery.wait().await;
        assert_eq!(
            report,
            DeliveryReport {
                delivered: 2,
                failed: 1,
                dropped: 3,
                ..Default::default()
            }
        );
        assert_eq!(report.total(), 6);
        assert!(!report.is_complete());
    }

    #[tokio::test]
    async fn an_unresolved_share_counts_as_abandoned() {
        let (mut ack, delivery) = Ack::new(4);
        ack.report(Outcome::Filtered, 1);
        let copy = ack.share(2);
        ack.report(Outcome::Delivered, 3);
        drop(ack);
        // A task holding `copy` panics or is aborted: the share is dropped.
        let task = tokio::spawn(async move {
            let _held = copy;
            panic!("exporter task dies");
        });
        assert!(task.await.is_err());
        let report = delivery.wait().await;
        assert_eq!(
            report,
            DeliveryReport {
                delivered: 3,
                filtered: 1,
                abandoned: 2,
                ..Default::default()
            }
        );
    }

    #[tokio::test]
    async fn a_fully_delivered_or_filtered_batch_is_complete() {
        let (ack, delivery) = Ack::new(2);
        let mut s = ack.share(2);
        ack.retire();
        s.report(Outcome::Filtered, 1);
        s.resolve(Outcome::Delivered);
        let report = delivery.wait().await;
        assert!(report.is_complete());
        assert_eq!(report.total(), 2);
    }

    #[test]
    fn untracked_acks_cost_nothing_and_report_nothing() {
        let ack = Ack::none();
        assert!(!ack.is_tracked());
        let mut s = ack.share(10);
        assert_eq!(s.pending(), 0);
        s.report(Outcome::Delivered, 10);
        ack.resolve(Outcome::Failed);
    }
}
