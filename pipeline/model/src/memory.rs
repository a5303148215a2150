//! The collector-wide memory budget for data in flight through receivers
//! (`service.limits.max_in_flight_bytes`): request bodies being read and
//! everything decompressed from them, until the batch is handed to the
//! pipeline (queues account for it from then on, with their `max_bytes`).
//!
//! A receiver takes a [`MemoryGrant`] before it reads a body and grows it
//! before every allocation the request makes; a grant that cannot grow within
//! a short wait is refused, and the receiver answers 429 (or
//! `RESOURCE_EXHAUSTED`). Dropping the grant gives the bytes back. A grant
//! waiting for memory holds no place in line (it looks again whenever
//! memory is given back), so a small request is never held up behind a
//! large one waiting to grow.
//!
//! Large requests may not take the whole budget: grants above
//! [`SMALL_REQUEST`] draw only from the first three quarters, so a crowd of
//! large or slow uploads cannot stop the small pushes that make up almost all
//! of the traffic.
//!
//! Tenants share it fairly: a grant made for a tenant
//! ([`MemoryBudget::grant_for`]) may not grow past the tenant's share once
//! the budget is more than half held ([`CONTENDED`]). The share is the
//! budget divided by the tenants sending now: those holding memory, or that
//! held some in the last [`RECENT`] (this one included). A tenant alone may
//! use all of it; one that holds more than its share while others send is
//! refused first, however much room is left. A share is at least the budget
//! over [`MAX_SHARES`] tenants, and at most [`MAX_COUNTED_TENANTS`] are
//! counted, so tenants made up by a sender cannot shrink the others' shares
//! to nothing.
//!
//! What may depend on this: receivers (take grants), the topology (makes the
//! budget), telemetry (reports it).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{Semaphore, SemaphorePermit};

/// The tenant of a request that names none (Pyroscope's).
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// Requests whose grant stays at or below this are small: they may use the
/// whole budget.
pub const SMALL_REQUEST: usize = 1 << 20;

/// How long a request may wait for memory before it is refused.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(1);

/// The part of the budget held past which tenants are held to their
/// shares (one half).
pub const CONTENDED: f64 = 0.5;

/// How long a tenant that held memory counts as sending after it gave it
/// all back: a tenant of quick small pushes holds memory only for moments.
pub const RECENT: Duration = Duration::from_secs(5);

/// A share is never less than the budget over this many tenants: tenants
/// named by a header cost nothing to make up, and a crowd of made-up ones
/// must not shrink everyone's share to nothing.
pub const MAX_SHARES: usize = 16;

/// Most tenants counted at once; past that a new tenant is not held to a
/// share (the budget's own limits still hold).
pub const MAX_COUNTED_TENANTS: usize = 10_000;

/// Most grants and room checks waiting for memory at once; more are
/// refused at once, so a crowd of waiting requests never makes each release
/// of memory wake thousands of them.
pub const MAX_WAITING: usize = 256;

/// Why memory could not be had.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", self.message())]
pub struct OverBudget {
    pub limit: usize,
    pub wanted: usize,
    /// More than one grant can ever hold (see [`MemoryBudget::max_grant`]):
    /// waiting or sending again cannot help.
    pub never: bool,
    /// The tenant that holds its share of a contended budget, when that is
    /// why (see the module docs): (tenant, its bytes, its share).
    pub tenant: Option<(String, usize, usize)>,
}

impl OverBudget {
    fn message(&self) -> String {
        if let Some((tenant, held, share)) = &self.tenant {
            return format!(
                "tenant {tenant:?} holds its share of the collector's in-flight memory ({held} bytes with this request, its share {share} of service.limits.max_in_flight_bytes = {} bytes, shared by the tenants sending now); retry later",
                self.limit
            );
        }
        if self.never {
            format!(
                "the request needs more memory than service.limits.max_in_flight_bytes ({} bytes) lets one request hold ({} more bytes wanted); send smaller requests or raise max_in_flight_bytes",
                self.limit, self.wanted
            )
        } else {
            format!(
                "the collector is at its in-flight memory limit (service.limits.max_in_flight_bytes = {} bytes, {} more bytes wanted); retry later",
                self.limit, self.wanted
            )
        }
    }
}

#[derive(Debug)]
struct Inner {
    /// Every grant draws from this: the whole budget.
    all: Semaphore,
    /// Grants above [`SMALL_REQUEST`] also draw from this: three quarters.
    large: Semaphore,
    limit: usize,
    large_limit: usize,
    in_flight: Gauge,
    /// Signalled whenever memory is given back (for [`MemoryBudget::room_for`]).
    freed: tokio::sync::Notify,
    /// Grants and room checks waiting for memory now.
    waiting: std::sync::atomic::AtomicUsize,
    /// Each tenant sending now (see [`RECENT`]).
    tenants: std::sync::Mutex<Tenants>,
    /// When the budget was made (the slots' clock).
    made: std::time::Instant,
}

/// One tenant's memory: what its grants hold now and when it last held
/// or gave back any (milliseconds since the budget was made).
#[derive(Debug, Default)]
struct Slot {
    held: AtomicUsize,
    last_ms: AtomicU64,
}

/// The tenants sending now, by name; a grant keeps its tenant's slot, so
/// growing and shrinking take no lock.
#[derive(Debug, Default)]
struct Tenants {
    slots: std::collections::HashMap<Arc<str>, Arc<Slot>>,
    /// When those idle past [`RECENT`] were last swept out (ms).
    swept_ms: u64,
}

impl Tenants {
    /// Forgets, at most every 100 ms, the tenants no grant holds that were
    /// idle past [`RECENT`].
    fn sweep(&mut self, now_ms: u64) {
        if now_ms.saturating_sub(self.swept_ms) < 100 && self.swept_ms != 0 {
            return;
        }
        self.swept_ms = now_ms;
        let recent = RECENT.as_millis() as u64;
        self.slots.retain(|_, slot| {
            Arc::strong_count(slot) > 1
                || now_ms.saturating_sub(slot.last_ms.load(Ordering::Relaxed)) < recent
        });
    }
}

impl Inner {
    fn over(&self, wanted: usize) -> OverBudget {
        OverBudget {
            limit: self.limit,
            wanted,
            never: false,
            tenant: None,
        }
    }

    fn never(&self, wanted: usize) -> OverBudget {
        OverBudget {
            never: true,
            ..self.over(wanted)
        }
    }

    /// Waits until memory is given back or `deadline`; false when the
    /// deadline passed or [`MAX_WAITING`] wait already. `freed` must have
    /// been enabled before the caller last looked for room.
    async fn wait_freed(
        &self,
        freed: std::pin::Pin<&mut tokio::sync::futures::Notified<'_>>,
        deadline: tokio::time::Instant,
    ) -> bool {
        use std::sync::atomic::Ordering;
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= MAX_WAITING {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        let woke = tokio::time::timeout_at(deadline, freed).await.is_ok();
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        woke
    }

    /// Milliseconds since the budget was made.
    fn now_ms(&self) -> u64 {
        self.made.elapsed().as_millis() as u64
    }

    /// Whether `tenant` (its `slot`) may grow by `bytes` now: always while
    /// the budget is not contended, else within its share.
    fn share_allows(&self, tenant: &str, slot: &Slot, bytes: usize) -> Result<(), OverBudget> {
        let held = self.limit - self.all.available_permits();
        if (held.saturating_add(bytes) as f64) <= self.limit as f64 * CONTENDED {
            return Ok(());
        }
        let now = self.now_ms();
        let recent = RECENT.as_millis() as u64;
        let sending = {
            let tenants = self.tenants.lock().unwrap_or_else(|p| p.into_inner());
            tenants
                .slots
                .values()
                .filter(|s| {
                    s.held.load(Ordering::Relaxed) > 0
                        || now.saturating_sub(s.last_ms.load(Ordering::Relaxed)) < recent
                })
                .count()
        };
        // This tenant counts, whether or not it held memory lately.
        let sending = sending
            + usize::from(
                slot.held.load(Ordering::Relaxed) == 0
                    && now.saturating_sub(slot.last_ms.load(Ordering::Relaxed)) >= recent,
            );
        let share = self.limit / sending.clamp(1, MAX_SHARES);
        let after = slot.held.load(Ordering::Relaxed).saturating_add(bytes);
        if after <= share {
            return Ok(());
        }
        Err(OverBudget {
            tenant: Some((tenant.to_owned(), after, share)),
            ..self.over(bytes)
        })
    }
}

/// The most one grant of a budget of `limit` bytes can hold: three
/// quarters of it (a grant past [`SMALL_REQUEST`] draws from the large
/// share too), or all of a budget too small for that to matter.
pub fn max_grant(limit: usize) -> usize {
    let limit = limit.min(Semaphore::MAX_PERMITS);
    (limit - limit / 4).max(SMALL_REQUEST.min(limit))
}

/// The budget: cheap to clone, shared by every receiver.
#[derive(Debug, Clone)]
pub struct MemoryBudget {
    inner: Arc<Inner>,
}

impl MemoryBudget {
    /// A budget of `limit` bytes (at most `u32::MAX` bytes per grant step).
    pub fn new(limit: usize) -> Self {
        MemoryBudget::with_gauge(limit, Gauge::default())
    }

    /// A budget that reports what is in flight through `in_flight`.
    pub fn with_gauge(limit: usize, in_flight: Gauge) -> Self {
        let limit = limit.min(Semaphore::MAX_PERMITS);
        let large_limit = limit - limit / 4;
        MemoryBudget {
            inner: Arc::new(Inner {
                all: Semaphore::new(limit),
                large: Semaphore::new(large_limit),
                limit,
                large_limit,
                in_flight,
                freed: tokio::sync::Notify::new(),
                waiting: std::sync::atomic::AtomicUsize::new(0),
                tenants: Default::default(),
                made: std::time::Instant::now(),
            }),
        }
    }

    /// The configured limit.
    pub fn limit(&self) -> usize {
        self.inner.limit
    }

    /// The most one grant can ever hold: a grant past [`SMALL_REQUEST`]
    /// draws from the large share too. Asking more waits in vain.
    pub fn max_grant(&self) -> usize {
        max_grant(self.inner.limit)
    }

    /// Bytes held by grants now.
    pub fn in_flight(&self) -> usize {
        self.inner.limit - self.inner.all.available_permits()
    }

    /// An empty grant, to grow as the request needs.
    pub fn grant(&self) -> MemoryGrant {
        MemoryGrant {
            budget: self.clone(),
            held: 0,
            large: false,
            tenant: None,
        }
    }

    /// An empty grant of `tenant`'s (the request's `X-Scope-OrgID` or its
    /// token's; `None` or empty: `anonymous`), held to its share of a
    /// contended budget (see the module docs).
    pub fn grant_for(&self, tenant: Option<&str>) -> MemoryGrant {
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or(ANONYMOUS_TENANT);
        let inner = &self.inner;
        let mut grant = self.grant();
        let mut tenants = inner.tenants.lock().unwrap_or_else(|p| p.into_inner());
        tenants.sweep(inner.now_ms());
        let slot = match tenants.slots.get(tenant) {
            Some(slot) => slot.clone(),
            // Past the count, a new tenant is not held to a share.
            None if tenants.slots.len() >= MAX_COUNTED_TENANTS => return grant,
            None => tenants.slots.entry(Arc::from(tenant)).or_default().clone(),
        };
        drop(tenants);
        grant.tenant = Some((Arc::from(tenant), slot));
        grant
    }

    /// A grant of `bytes`, waiting up to `wait` for them.
    pub async fn acquire(&self, bytes: usize, wait: Duration) -> Result<MemoryGrant, OverBudget> {
        let mut grant = self.grant();
        grant.grow(bytes, wait).await?;
        Ok(grant)
    }

    /// Whether a grant of `bytes` could be had now (a large one from the
    /// large share too).
    pub fn has_room(&self, bytes: usize) -> bool {
        self.grant().has_room(bytes).unwrap_or(false)
    }

    /// Waits up to `wait` until `bytes` could be granted, taking nothing and
    /// holding no place in line: for a request that says how much it will
    /// send, so it is refused before sending when the budget cannot take
    /// it, while its memory is still granted only as its bytes arrive (a
    /// crowd of such checks never delays the grants of others).
    pub async fn room_for(&self, bytes: usize, wait: Duration) -> Result<(), OverBudget> {
        self.grant().room_to_grow(bytes, wait).await
    }
}

/// Memory one request holds; given back when dropped.
#[derive(Debug)]
pub struct MemoryGrant {
    budget: MemoryBudget,
    held: usize,
    /// Holds `held` permits of `large` too.
    large: bool,
    /// The tenant whose share it draws from, if any, and its slot.
    tenant: Option<(Arc<str>, Arc<Slot>)>,
}

impl MemoryGrant {
    /// Bytes held.
    pub fn held(&self) -> usize {
        self.held
    }

    /// The budget this grant draws from.
    pub fn budget(&self) -> &MemoryBudget {
        &self.budget
    }

    /// The permits to take from each semaphore to grow by `bytes`: from the
    /// whole budget always, and from the large share when the grant is or
    /// becomes large (all it holds, the first time).
    fn need(&self, bytes: usize) -> Result<(u32, u32), OverBudget> {
        let inner = &self.budget.inner;
        let total = self.held.saturating_add(bytes);
        let never = || inner.never(bytes);
        let large_need = if self.large {
            bytes
        } else if total > SMALL_REQUEST {
            total
        } else {
            0
        };
        if total > inner.limit || (large_need > 0 && total > inner.large_limit) {
            // Could never be had, however long it waited.
            return Err(never());
        }
        let all = u32::try_from(bytes).map_err(|_| never())?;
        let large = u32::try_from(large_need).map_err(|_| never())?;
        Ok((all, large))
    }

    /// Keeps the permits just acquired (they come back through `shrink`).
    fn take(&mut self, bytes: usize, all: SemaphorePermit<'_>, large: Option<SemaphorePermit<'_>>) {
        all.forget();
        if let Some(large) = large {
            large.forget();
            self.large = true;
        }
        self.held += bytes;
        self.budget.inner.in_flight.inc_by(bytes as i64);
        if let Some((_, slot)) = &self.tenant {
            slot.held.fetch_add(bytes, Ordering::Relaxed);
            slot.last_ms
                .store(self.budget.inner.now_ms(), Ordering::Relaxed);
        }
    }

    /// Grows by `bytes` if the budget has them now.
    pub fn try_grow(&mut self, bytes: usize) -> Result<(), OverBudget> {
        if bytes == 0 {
            return Ok(());
        }
        let (all, large) = self.need(bytes)?;
        let inner = self.budget.inner.clone();
        if let Some((tenant, slot)) = &self.tenant {
            inner.share_allows(tenant, slot, bytes)?;
        }
        let large_permit = match large {
            0 => None,
            n => Some(
                inner
                    .large
                    .try_acquire_many(n)
                    .map_err(|_| inner.over(bytes))?,
            ),
        };
        let Ok(all_permit) = inner.all.try_acquire_many(all) else {
            if let Some(large) = large_permit {
                // Taken for a moment: a waiter that looked meanwhile is told.
                drop(large);
                inner.freed.notify_waiters();
            }
            return Err(inner.over(bytes));
        };
        self.take(bytes, all_permit, large_permit);
        Ok(())
    }

    /// Whether this grant could grow by `bytes` now (from the large share
    /// too when it is or becomes large); `Err` when it never could.
    fn has_room(&self, bytes: usize) -> Result<bool, OverBudget> {
        let (all, large) = self.need(bytes)?;
        let inner = &self.budget.inner;
        Ok(all as usize <= inner.all.available_permits()
            && large as usize <= inner.large.available_permits())
    }

    /// Waits up to `wait` until this grant could grow by `bytes`, taking
    /// nothing and holding no place in line; refused at once (`never`) when
    /// it never could.
    pub async fn room_to_grow(&self, bytes: usize, wait: Duration) -> Result<(), OverBudget> {
        let inner = self.budget.inner.clone();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let freed = inner.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if self.has_room(bytes)? {
                return Ok(());
            }
            if !inner.wait_freed(freed, deadline).await {
                return Err(inner.over(bytes));
            }
        }
    }

    /// Grows by `bytes`, waiting up to `wait` for them. A waiting grant
    /// holds no place in line: a small one that fits is granted while a
    /// large one waits, so no request waits behind another's growth.
    pub async fn grow(&mut self, bytes: usize, wait: Duration) -> Result<(), OverBudget> {
        if bytes == 0 {
            return Ok(());
        }
        // Could never be had, however long it waited: at once.
        self.need(bytes)?;
        let inner = self.budget.inner.clone();
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let freed = inner.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            // The last refusal is the one told (a tenant's share names it).
            let refused = match self.try_grow(bytes) {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if !inner.wait_freed(freed, deadline).await {
                return Err(refused);
            }
        }
    }

    /// Gives back `bytes` of what is held (a buffer the request freed).
    pub fn shrink(&mut self, bytes: usize) {
        let n = bytes.min(self.held);
        if n == 0 {
            return;
        }
        self.held -= n;
        let inner = &self.budget.inner;
        inner.all.add_permits(n);
        if self.large {
            inner.large.add_permits(n);
        }
        inner.in_flight.dec_by(n as i64);
        if let Some((_, slot)) = &self.tenant {
            slot.held.fetch_sub(n, Ordering::Relaxed);
            slot.last_ms.store(inner.now_ms(), Ordering::Relaxed);
        }
        inner.freed.notify_waiters();
    }
}

impl Drop for MemoryGrant {
    fn drop(&mut self) {
        let held = self.held;
        self.shrink(held);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_tenant_over_its_share_is_refused_first_when_memory_is_contended() {
        let budget = MemoryBudget::new(8 << 20);
        // Alone, a tenant may take what any request may.
        let mut a1 = budget.grant_for(Some("a"));
        a1.try_grow(SMALL_REQUEST).unwrap();
        let mut a_more: Vec<MemoryGrant> = (0..4)
            .map(|_| {
                let mut g = budget.grant_for(Some("a"));
                g.try_grow(SMALL_REQUEST).unwrap();
                g
            })
            .collect();
        assert_eq!(budget.in_flight(), 5 << 20);
        // Another tenant under its share (4 MiB of 8 with two sending) gets
        // memory; `a`, over it, is refused though 3 MiB are free.
        let mut b = budget.grant_for(Some("b"));
        b.try_grow(SMALL_REQUEST).unwrap();
        let e = budget.grant_for(Some("a")).try_grow(1024).unwrap_err();
        assert_eq!(e.tenant, Some(("a".to_owned(), (5 << 20) + 1024, 4 << 20)));
        assert!(
            e.to_string().contains("tenant \"a\" holds its share"),
            "{e}"
        );
        // A grant of no tenant is not held to a share.
        budget.grant().try_grow(1024).unwrap();
        // Once `a` gives back, it is under its share again.
        a_more.truncate(1);
        budget.grant_for(Some("a")).try_grow(1024).unwrap();
        // Nothing held: the tenants count as sending for a while yet.
        drop((a1, a_more, b));
        assert_eq!(budget.in_flight(), 0);
        assert_eq!(budget.inner.tenants.lock().unwrap().slots.len(), 2);
        // `None` and "" are `anonymous`.
        let mut none = budget.grant_for(None);
        none.try_grow(1).unwrap();
        let held = |t: &str| {
            let tenants = budget.inner.tenants.lock().unwrap();
            tenants.slots.get(t).map(|s| s.held.load(Ordering::Relaxed))
        };
        assert_eq!(
            (held("anonymous"), held("a"), held("b")),
            (Some(1), Some(0), Some(0))
        );
        // Idle past RECENT, a tenant no grant holds is forgotten.
        let later = budget.inner.now_ms() + RECENT.as_millis() as u64 + 1000;
        let mut tenants = budget.inner.tenants.lock().unwrap();
        tenants.sweep(later);
        assert_eq!(
            tenants.slots.keys().map(|k| &**k).collect::<Vec<_>>(),
            ["anonymous"]
        );
    }

    #[tokio::test]
    async fn grants_are_bounded_and_given_back() {
        let budget = MemoryBudget::new(8 << 20);
        let mut a = budget.acquire(1000, DEFAULT_WAIT).await.unwrap();
        assert_eq!(budget.in_flight(), 1000);
        a.try_grow(24).unwrap();
        assert_eq!(a.held(), 1024);
        a.shrink(24);
        assert_eq!(budget.in_flight(), 1000);
        drop(a);
        assert_eq!(budget.in_flight(), 0);
    }

    #[tokio::test]
    async fn large_grants_leave_a_quarter_for_small_ones() {
        let budget = MemoryBudget::new(8 << 20);
        // Large requests take the 6 MiB they may have.
        let big1 = budget.acquire(3 << 20, DEFAULT_WAIT).await.unwrap();
        let big2 = budget.acquire(3 << 20, DEFAULT_WAIT).await.unwrap();
        let err = budget
            .acquire(2 << 20, Duration::from_millis(50))
            .await
            .unwrap_err();
        assert_eq!(err.wanted, 2 << 20);
        assert!(err.to_string().contains("max_in_flight_bytes"), "{err}");
        // Small ones still get the last quarter.
        let small: Vec<_> = (0..2)
            .map(|_| budget.grant())
            .map(|mut g| {
                g.try_grow(SMALL_REQUEST).unwrap();
                g
            })
            .collect();
        assert_eq!(budget.in_flight(), 8 << 20);
        assert!(budget.grant().try_grow(1).is_err(), "the budget is spent");
        // A small grant that grows large competes for the large share.
        let mut growing = budget.grant();
        drop(small);
        growing.try_grow(SMALL_REQUEST).unwrap();
        assert!(
            growing.try_grow(1).is_err(),
            "the large share is held by big1 and big2"
        );
        drop(big1);
        growing.try_grow(1).unwrap();
        drop((big2, growing));
        assert_eq!(budget.in_flight(), 0);
    }

    #[tokio::test]
    async fn a_waiting_grant_gets_memory_given_back_in_time() {
        let budget = MemoryBudget::new(4 << 20);
        let held = budget.acquire(3 << 20, DEFAULT_WAIT).await.unwrap();
        let waiter = tokio::spawn({
            let budget = budget.clone();
            async move { budget.acquire(3 << 20, Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(held);
        let got = waiter.await.unwrap().unwrap();
        assert_eq!(got.held(), 3 << 20);
    }

    #[tokio::test(start_paused = true)]
    async fn room_for_takes_nothing_and_waits_for_memory_given_back() {
        let budget = MemoryBudget::new(4 << 20);
        budget.room_for(3 << 20, DEFAULT_WAIT).await.unwrap();
        assert_eq!(budget.in_flight(), 0, "a check holds nothing");
        let held = budget.acquire(3 << 20, DEFAULT_WAIT).await.unwrap();
        assert!(!budget.has_room(3 << 20));
        let err = budget.room_for(3 << 20, DEFAULT_WAIT).await.unwrap_err();
        assert_eq!(err.wanted, 3 << 20);
        let waiter = tokio::spawn({
            let budget = budget.clone();
            async move { budget.room_for(2 << 20, Duration::from_secs(5)).await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiter.is_finished());
        // Small grants still get in while it waits: it holds no place in line.
        budget.acquire(512 << 10, DEFAULT_WAIT).await.unwrap();
        drop(held);
        waiter.await.unwrap().unwrap();
        // More than one grant may ever hold: refused at once.
        assert!(budget.room_for(4 << 20, DEFAULT_WAIT).await.is_err());
    }

    #[test]
    fn a_grant_larger_than_the_budget_fails_at_once() {
        let budget = MemoryBudget::new(1 << 20);
        let mut g = budget.grant();
        assert!(g.try_grow(2 << 20).is_err());
        assert_eq!(budget.in_flight(), 0);
    }
}
