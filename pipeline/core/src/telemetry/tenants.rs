//! Per-tenant volume, for `/metrics` and `/tenants`: what each tenant
//! brought into the pipelines (profiles and bytes, in total and per second
//! over the last minute), its share of the bytes of that minute, and what
//! the receivers refused of it, by reason.
//!
//! A profile's tenant is the one its exporters write: its `__tenant_id__`
//! label after the processors, else the tenant its request named or its
//! token is bound to, else `anonymous`. At most [`MAX_TRACKED_TENANTS`]
//! tenants are tracked one by one (the rest are summed as `other`).
//! `/metrics` shows the [`MAX_SHOWN_TENANTS`] busiest of the last minute by
//! name and the rest as `other`, as gauges: a tenant's rank changes, and a
//! counter's series must not move between labels.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most tenants tracked one by one; the rest are summed as `other`.
pub const MAX_TRACKED_TENANTS: usize = 10_000;

/// Most tenants `/metrics` names; the rest are summed as `other`.
pub const MAX_SHOWN_TENANTS: usize = 100;

/// The name of the tenants not named.
pub const OTHER: &str = "other";

/// The span of the rates.
const WINDOW: Duration = Duration::from_secs(60);

/// Counts of a sliding minute: the current minute and the one before it,
/// whose part still inside the last 60 s is weighed in.
#[derive(Debug, Clone, Copy)]
struct Window {
    started: Instant,
    current: [u64; 2],
    previous: [u64; 2],
}

impl Window {
    fn new(now: Instant) -> Self {
        Window {
            started: now,
            current: [0; 2],
            previous: [0; 2],
        }
    }

    fn roll(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.started);
        if elapsed >= 2 * WINDOW {
            *self = Window::new(now);
        } else if elapsed >= WINDOW {
            self.previous = self.current;
            self.current = [0; 2];
            self.started += WINDOW;
        }
    }

    fn add(&mut self, now: Instant, profiles: u64, bytes: u64) {
        self.roll(now);
        self.current[0] = self.current[0].saturating_add(profiles);
        self.current[1] = self.current[1].saturating_add(bytes);
    }

    /// (profiles, bytes) per second over the last minute.
    fn rates(&mut self, now: Instant) -> [f64; 2] {
        self.roll(now);
        let into = now.saturating_duration_since(self.started).as_secs_f64() / WINDOW.as_secs_f64();
        let weight = (1.0 - into).clamp(0.0, 1.0);
        [0, 1].map(|i| {
            (self.previous[i] as f64 * weight + self.current[i] as f64) / WINDOW.as_secs_f64()
        })
    }
}

#[derive(Debug, Clone)]
struct Tally {
    profiles: u64,
    bytes: u64,
    refused: BTreeMap<&'static str, u64>,
    window: Window,
}

impl Tally {
    fn new(now: Instant) -> Self {
        Tally {
            profiles: 0,
            bytes: 0,
            refused: BTreeMap::new(),
            window: Window::new(now),
        }
    }
}

/// One tenant's row of `/tenants`.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TenantRow {
    pub tenant: String,
    /// Profiles and bytes brought into the pipelines since the start.
    pub profiles_total: u64,
    pub bytes_total: u64,
    /// Per second over the last minute.
    pub profiles_per_second: f64,
    pub bytes_per_second: f64,
    /// Its part of all tenants' bytes of the last minute, 0 to 1.
    pub share: f64,
    /// Requests refused, by reason (`rate_limited`, `samples_limit`...).
    pub refused: BTreeMap<&'static str, u64>,
}

/// The tallies of every tenant.
#[derive(Debug, Default)]
pub struct TenantBook {
    tallies: Mutex<HashMap<String, Tally>>,
}

impl TenantBook {
    /// `profiles` of `bytes` that `tenant` brought into a pipeline.
    pub fn accepted(&self, tenant: &str, profiles: u64, bytes: u64) {
        self.with(tenant, |t, now| {
            t.profiles = t.profiles.saturating_add(profiles);
            t.bytes = t.bytes.saturating_add(bytes);
            t.window.add(now, profiles, bytes);
        });
    }

    /// A request of `tenant` refused for `reason`.
    pub fn refused(&self, tenant: &str, reason: &'static str) {
        self.with(tenant, |t, _| *t.refused.entry(reason).or_default() += 1);
    }

    fn with(&self, tenant: &str, f: impl FnOnce(&mut Tally, Instant)) {
        let now = Instant::now();
        let mut tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        let key = if tallies.contains_key(tenant) || tallies.len() < MAX_TRACKED_TENANTS {
            tenant
        } else {
            OTHER
        };
        let tally = match tallies.get_mut(key) {
            Some(t) => t,
            None => tallies
                .entry(key.to_owned())
                .or_insert_with(|| Tally::new(now)),
        };
        f(tally, now);
    }

    /// Every tenant's row, the busiest of the last minute first (then by
    /// bytes in total, then by name).
    pub fn rows(&self) -> Vec<TenantRow> {
        let now = Instant::now();
        let mut tallies = self.tallies.lock().unwrap_or_else(|p| p.into_inner());
        let mut rows: Vec<TenantRow> = tallies
            .iter_mut()
            .map(|(tenant, t)| {
                let [profiles_per_second, bytes_per_second] = t.window.rates(now);
                TenantRow {
                    tenant: tenant.clone(),
                    profiles_total: t.profiles,
                    bytes_total: t.bytes,
                    profiles_per_second,
                    bytes_per_second,
                    share: 0.0,
                    refused: t.refused.clone(),
                }
            })
            .collect();
        drop(tallies);
        let all: f64 = rows.iter().map(|r| r.bytes_per_second).sum();
        if all > 0.0 {
            for r in &mut rows {
                r.share = r.bytes_per_second / all;
            }
        }
        rows.sort_by(|a, b| {
            b.bytes_per_second
                .total_cmp(&a.bytes_per_second)
                .then(b.bytes_total.cmp(&a.bytes_total))
                .then(a.tenant.cmp(&b.tenant))
        });
        rows
    }

    /// The rows `/metrics` shows: the [`MAX_SHOWN_TENANTS`] first of
    /// [`TenantBook::rows`] and the rest summed as `other`.
    pub fn shown(&self) -> Vec<TenantRow> {
        let mut rows = self.rows();
        if rows.len() <= MAX_SHOWN_TENANTS {
            return rows;
        }
        let rest = rows.split_off(MAX_SHOWN_TENANTS);
        let mut other = rows
            .iter()
            .position(|r| r.tenant == OTHER)
            .map(|i| rows.remove(i))
            .unwrap_or_else(|| TenantRow {
                tenant: OTHER.to_owned(),
                profiles_total: 0,
                bytes_total: 0,
                profiles_per_second: 0.0,
                bytes_per_second: 0.0,
                share: 0.0,
                refused: BTreeMap::new(),
            });
        for r in rest {
            other.profiles_total += r.profiles_total;
            other.bytes_total += r.bytes_total;
            other.profiles_per_second += r.profiles_per_second;
            other.bytes_per_second += r.bytes_per_second;
            other.share += r.share;
            for (reason, n) in r.refused {
                *other.refused.entry(reason).or_default() += n;
            }
        }
        rows.push(other);
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_slides_over_the_one_before() {
        let t0 = Instant::now();
        let mut w = Window::new(t0);
        w.add(t0, 60, 6000);
        assert_eq!(w.rates(t0), [1.0, 100.0]);
        // Half into the next minute: half of the last one still counts.
        let half = t0 + WINDOW + WINDOW / 2;
        w.add(half, 30, 0);
        let [p, b] = w.rates(half);
        assert!((p - 1.0).abs() < 1e-9 && (b - 50.0).abs() < 1e-9, "{p} {b}");
        // Two idle minutes later, nothing.
        assert_eq!(w.rates(half + 2 * WINDOW), [0.0, 0.0]);
    }

    #[test]
    fn the_busiest_are_named_and_the_rest_are_other() {
        let book = TenantBook::default();
        for i in 0..MAX_SHOWN_TENANTS + 5 {
            book.accepted(&format!("t{i:03}"), 1, 10 + i as u64);
        }
        book.refused("t000", "rate_limited");
        book.refused("t000", "rate_limited");
        let rows = book.rows();
        assert_eq!(rows.len(), MAX_SHOWN_TENANTS + 5);
        assert_eq!(rows[0].tenant, format!("t{:03}", MAX_SHOWN_TENANTS + 4));
        let share: f64 = rows.iter().map(|r| r.share).sum();
        assert!((share - 1.0).abs() < 1e-9, "{share}");
        let shown = book.shown();
        assert_eq!(shown.len(), MAX_SHOWN_TENANTS + 1);
        let other = shown.last().unwrap();
        assert_eq!(other.tenant, OTHER);
        // The five quietest: t000..t004.
        assert_eq!(
            (other.profiles_total, other.bytes_total),
            (5, 10 + 11 + 12 + 13 + 14)
        );
        assert_eq!(other.refused.get("rate_limited"), Some(&2));
        let total: u64 = shown.iter().map(|r| r.profiles_total).sum();
        assert_eq!(total, (MAX_SHOWN_TENANTS + 5) as u64);
    }

    #[test]
    fn tenants_past_the_tracked_ones_are_other() {
        let book = TenantBook::default();
        for i in 0..MAX_TRACKED_TENANTS + 3 {
            book.accepted(&i.to_string(), 1, 1);
        }
        let rows = book.rows();
        assert_eq!(rows.len(), MAX_TRACKED_TENANTS + 1);
        let other = rows.iter().find(|r| r.tenant == OTHER).unwrap();
        assert_eq!(other.profiles_total, 3);
    }
}
