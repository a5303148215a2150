//! Tenants' shares of one exporter queue: while the queue is more than half
//! full, a tenant pushing (a push receiver's request, which its sender
//! retries) may hold no more than its share of it: the queue's room divided
//! among the tenants that have profiles in it, at least a sixteenth. A
//! tenant alone may use all of it (a queue with one tenant behaves as it
//! always did). A tenant over its share is refused
//! (429 naming it) while the others still get in, so one tenant's flood
//! behind a slow backend cannot take the whole queue.

use std::collections::HashMap;
use std::sync::Arc;

/// The smallest share: a sixteenth of the queue, however many tenants.
const MAX_SHARES: usize = 16;

/// What each tenant holds in the queue (profiles, bytes), tenants holding
/// nothing left out.
#[derive(Debug, Default)]
pub(super) struct TenantShares {
    held: HashMap<Arc<str>, (usize, usize)>,
}

/// How full the queue is: (held, capacity) in profiles and in bytes
/// (`usize::MAX` capacity: not bounded that way).
pub(super) struct Fill {
    pub(super) profiles: (usize, usize),
    pub(super) bytes: (usize, usize),
}

impl TenantShares {
    pub(super) fn add(&mut self, tenant: Option<&Arc<str>>, profiles: usize, bytes: usize) {
        if let Some(t) = tenant {
            let h = self.held.entry(t.clone()).or_default();
            h.0 += profiles;
            h.1 += bytes;
        }
    }

    pub(super) fn sub(&mut self, tenant: Option<&Arc<str>>, profiles: usize, bytes: usize) {
        let Some(t) = tenant else { return };
        if let Some(h) = self.held.get_mut(t) {
            h.0 = h.0.saturating_sub(profiles);
            h.1 = h.1.saturating_sub(bytes);
            if *h == (0, 0) {
                self.held.remove(t);
            }
        }
    }

    pub(super) fn clear(&mut self) {
        self.held.clear();
    }

    /// Whether `tenant` may add `profiles` and `bytes` to a queue `fill`s.
    pub(super) fn allows(&self, tenant: &str, profiles: usize, bytes: usize, fill: &Fill) -> bool {
        let busy = |(held, cap): (usize, usize)| cap != usize::MAX && held.saturating_mul(2) > cap;
        if !busy(fill.profiles) && !busy(fill.bytes) {
            return true;
        }
        let mine = self.held.get(tenant).copied().unwrap_or_default();
        let active = self.held.len() + usize::from(mine == (0, 0));
        let within = |have: usize, more: usize, cap: usize| {
            cap == usize::MAX
                || have.saturating_add(more) <= (cap / active.max(1)).max(cap / MAX_SHARES)
        };
        within(mine.0, profiles, fill.profiles.1) && within(mine.1, bytes, fill.bytes.1)
    }

    /// What `tenant` holds now (profiles, bytes).
    #[cfg(test)]
    pub(super) fn held(&self, tenant: &str) -> (usize, usize) {
        self.held.get(tenant).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fill(profiles: usize) -> Fill {
        Fill {
            profiles: (profiles, 100),
            bytes: (0, usize::MAX),
        }
    }

    #[test]
    fn a_tenant_alone_may_use_it_all() {
        let mut s = TenantShares::default();
        let a: Arc<str> = "a".into();
        s.add(Some(&a), 90, 0);
        assert!(s.allows("a", 10, 0, &fill(90)));
        // A newcomer's share is half.
        assert!(s.allows("b", 10, 0, &fill(90)));
    }

    #[test]
    fn past_half_a_tenant_over_its_share_is_refused_and_others_are_not() {
        let mut s = TenantShares::default();
        let (a, b): (Arc<str>, Arc<str>) = ("a".into(), "b".into());
        s.add(Some(&a), 45, 0);
        // Half full or less: anyone.
        assert!(s.allows("a", 5, 0, &fill(45)));
        s.add(Some(&a), 10, 0);
        // 55 of 100: `a` alone may go on; a newcomer halves its share.
        assert!(s.allows("a", 5, 0, &fill(55)));
        assert!(s.allows("b", 5, 0, &fill(55)));
        s.add(Some(&b), 5, 0);
        assert!(!s.allows("a", 1, 0, &fill(60)), "a holds 55 of a 50 share");
        assert!(s.allows("b", 40, 0, &fill(60)));
        assert!(!s.allows("b", 46, 0, &fill(60)));
        // Its profiles sent, `a` is under its share again.
        s.sub(Some(&a), 20, 0);
        assert_eq!(s.held("a"), (35, 0));
        assert!(s.allows("a", 10, 0, &fill(60)));
        s.sub(Some(&b), 5, 0);
        assert_eq!(s.held("b"), (0, 0));
        assert_eq!(s.held.len(), 1);
    }

    #[test]
    fn many_tenants_keep_a_sixteenth_each() {
        let mut s = TenantShares::default();
        for i in 0..40 {
            let t: Arc<str> = format!("t{i}").into();
            s.add(Some(&t), 2, 0);
        }
        // 80 of 100 held by 40 tenants: a share is 100/41, but at least 6.
        assert!(s.allows("new", 6, 0, &fill(80)));
        assert!(!s.allows("new", 7, 0, &fill(80)));
        assert!(s.allows("t0", 4, 0, &fill(80)));
    }

    #[test]
    fn bytes_count_like_profiles() {
        let mut s = TenantShares::default();
        let a: Arc<str> = "a".into();
        let b: Arc<str> = "b".into();
        s.add(Some(&a), 1, 600);
        s.add(Some(&b), 1, 10);
        let f = Fill {
            profiles: (2, usize::MAX),
            bytes: (610, 1000),
        };
        assert!(!s.allows("a", 1, 10, &f));
        assert!(s.allows("b", 1, 400, &f));
    }
}
