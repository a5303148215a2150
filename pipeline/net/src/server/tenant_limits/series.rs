//! `max_local_series_per_tenant` and `max_global_series_per_tenant`: a
//! tenant's active series, those seen in the last [`ACTIVE_SERIES_WINDOW`]
//! (10 minutes, as Pyroscope's ingesters count them), are remembered by a
//! hash of their labels; a request that would take a tenant past its limit
//! is refused whole (429 and Pyroscope's words) and adds none. A series
//! leaves the count once unseen for the window: every tenant is swept once
//! a minute, as Pyroscope sweeps, and a tenant left with none is forgotten. At most [`MAX_REMEMBERED_SERIES`]
//! series are remembered for all tenants together (about 50 MiB); past
//! that (or past [`super::MAX_TENANTS`] tenants), new series are let
//! through uncounted, so the limit fails open rather than refusing a tenant
//! for what other tenants hold.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use super::LimitRefused;

/// How long a series unseen stays active.
pub const ACTIVE_SERIES_WINDOW: Duration = Duration::from_secs(600);

/// Most series remembered for all tenants together.
pub const MAX_REMEMBERED_SERIES: usize = 1_000_000;

/// How often a tenant's unseen series are swept out.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// The hash a series is remembered by: of its labels, in name order (so
/// the order they came in does not matter).
pub fn series_hash<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> u64 {
    let mut pairs: Vec<(&str, &str)> = labels.collect();
    pairs.sort_unstable();
    // Fixed keys: the same series hashes alike for the process's life.
    let mut h = std::hash::DefaultHasher::new();
    for (name, value) in pairs {
        name.hash(&mut h);
        value.hash(&mut h);
    }
    h.finish()
}

/// The active series of every tenant with a series limit.
#[derive(Debug, Default)]
pub(super) struct ActiveSeries {
    tenants: HashMap<String, HashMap<u64, Instant>>,
    remembered: usize,
    swept: Option<Instant>,
}

impl ActiveSeries {
    /// Admits a request's `series` (hashes, repeats allowed) for `tenant`
    /// under `limit` (0: none), or refuses them all and adds none.
    pub(super) fn admit(
        &mut self,
        tenant: &str,
        limit: usize,
        series: &[u64],
        now: Instant,
    ) -> Result<(), LimitRefused> {
        if limit == 0 || series.is_empty() {
            return Ok(());
        }
        self.sweep(now);
        if !self.tenants.contains_key(tenant) && self.tenants.len() >= super::MAX_TENANTS {
            // As past MAX_REMEMBERED_SERIES: let through, uncounted.
            return Ok(());
        }
        let seen = match self.tenants.get_mut(tenant) {
            Some(t) => t,
            None => self.tenants.entry(tenant.to_owned()).or_default(),
        };
        let mut new: Vec<u64> = series
            .iter()
            .copied()
            .filter(|h| !seen.contains_key(h))
            .collect();
        new.sort_unstable();
        new.dedup();
        let active = seen.len();
        if active + new.len() > limit {
            return Err(LimitRefused {
                reason: "series_limit",
                message: format!(
                    "Maximum active series limit exceeded ({active}/{limit}), reduce the number of active streams (reduce labels or reduce label values), or contact your administrator to see if the limit can be increased (tenant {tenant:?}, {} new series in this request)",
                    new.len()
                ),
                tenant: tenant.to_owned(),
                exhausted: true,
            });
        }
        for h in series {
            if let Some(at) = seen.get_mut(h) {
                *at = now;
            }
        }
        if self.remembered + new.len() <= MAX_REMEMBERED_SERIES {
            self.remembered += new.len();
            seen.extend(new.into_iter().map(|h| (h, now)));
        }
        Ok(())
    }

    /// Once a [`SWEEP_EVERY`]: every tenant's series unseen for the window
    /// go, and tenants left with none.
    fn sweep(&mut self, now: Instant) {
        if self
            .swept
            .is_some_and(|t| now.saturating_duration_since(t) < SWEEP_EVERY)
        {
            return;
        }
        self.swept = Some(now);
        let mut remembered = 0;
        self.tenants.retain(|_, seen| {
            seen.retain(|_, at| now.saturating_duration_since(*at) < ACTIVE_SERIES_WINDOW);
            remembered += seen.len();
            !seen.is_empty()
        });
        self.remembered = remembered;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tenant_past_its_active_series_is_refused_until_they_age_out() {
        let mut a = ActiveSeries::default();
        let t0 = Instant::now();
        assert!(a.admit("t", 3, &[1, 2, 2], t0).is_ok());
        // One more new series fits; two do not, and none of them is added.
        let e = a.admit("t", 3, &[1, 3, 4], t0).unwrap_err();
        assert_eq!((e.reason, e.exhausted), ("series_limit", true));
        assert!(
            e.message
                .starts_with("Maximum active series limit exceeded (2/3)"),
            "{}",
            e.message
        );
        assert!(a.admit("t", 3, &[3], t0).is_ok());
        // Known series always pass; another tenant has its own count.
        assert!(a.admit("t", 3, &[1, 2, 3], t0).is_ok());
        assert!(a.admit("u", 3, &[4, 5, 6], t0).is_ok());
        assert!(a.admit("t", 3, &[4], t0).is_err());
        // Series 1 seen again late; 2 and 3 age out.
        let late = t0 + ACTIVE_SERIES_WINDOW - Duration::from_secs(1);
        assert!(a.admit("t", 3, &[1], late).is_ok());
        let later = t0 + ACTIVE_SERIES_WINDOW + SWEEP_EVERY;
        assert!(a.admit("t", 3, &[7, 8], later).is_ok());
        // `u` sent nothing since: its series are gone, and it with them.
        assert_eq!(a.remembered, 3);
        assert_eq!(a.tenants.len(), 1);
        assert!(a.admit("t", 0, &[9, 10, 11, 12], later).is_ok());
    }

    #[test]
    fn a_series_is_its_labels_in_any_order() {
        let ab = series_hash([("a", "1"), ("b", "2")].into_iter());
        assert_eq!(ab, series_hash([("b", "2"), ("a", "1")].into_iter()));
        assert_ne!(ab, series_hash([("a", "1"), ("b", "3")].into_iter()));
        assert_ne!(
            series_hash([("ab", ""), ("c", "")].into_iter()),
            series_hash([("a", "bc"), ("", "")].into_iter())
        );
    }
}
