//! The connections of one listener: `max_connections` slots, and for each
//! connection its requests in flight and since when it has had none, so
//! that a connection holding a slot without using it lets it go: it is
//! closed after `idle_timeout` with no request in flight (its first request
//! is due within `first_request_timeout` of the accept), and when every slot
//! is taken while a new client waits, the connection idle the longest is
//! told to close and its slot goes to the new client at once (it has no
//! request in flight, so it goes within moments; at most
//! [`CLOSING_MAX`] such connections are still open beyond the slots). A
//! crowd of clients that connect and send nothing (or stop between requests)
//! therefore never keeps out a client that sends, however fast it comes back.
//!
//! What may depend on this: the accept loop ([`super::accept_loop`]) only.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often a listener whose connections are all busy looks for one that
/// became idle, while a new client waits.
const EVICT_EVERY: Duration = Duration::from_millis(100);
/// The least a connection must have been idle to be closed for a new
/// client: a kept-alive client between two pushes is about to send again.
const EVICT_IDLE_AFTER: Duration = Duration::from_secs(1);
/// The most connections told to close for new clients, and still open,
/// beyond the slots; past it a new client waits for them to go.
pub(crate) const CLOSING_MAX: usize = 64;

/// Every connection of one listener.
#[derive(Debug)]
pub(crate) struct Connections {
    slots: Arc<Semaphore>,
    live: Mutex<HashMap<u64, Arc<Conn>>>,
    /// Connections evicted and not closed yet (their slots already given).
    closing: AtomicUsize,
    next_id: AtomicU64,
    epoch: Instant,
}

/// One connection's use of its slot.
#[derive(Debug)]
pub(crate) struct Conn {
    in_flight: AtomicUsize,
    /// Milliseconds after the listener's epoch when it last had no request
    /// in flight (its accept, at first).
    idle_since_ms: AtomicU64,
    /// Whether it has begun a request yet.
    served: AtomicBool,
    /// Cancelled to close it for a waiting client.
    evicted: CancellationToken,
    /// Its slot, until it is closed or its slot is given to a new client.
    permit: Mutex<Option<OwnedSemaphorePermit>>,
    epoch: Instant,
}

/// A connection's slot: given back (and the connection forgotten) when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    connections: Arc<Connections>,
    id: u64,
    conn: Arc<Conn>,
}

/// A request in flight on a connection; the connection is idle again once
/// the last one is dropped.
#[derive(Debug)]
pub(crate) struct Busy(Arc<Conn>);

impl Connections {
    pub fn new(max_connections: usize) -> Arc<Self> {
        Arc::new(Connections {
            slots: Arc::new(Semaphore::new(
                max_connections.clamp(1, Semaphore::MAX_PERMITS),
            )),
            live: Mutex::new(HashMap::new()),
            closing: AtomicUsize::new(0),
            next_id: AtomicU64::new(0),
            epoch: Instant::now(),
        })
    }

    /// Room for the next connection: a free slot, else the slot of the
    /// connection idle the longest (told to close), else the first given
    /// back. Its clock starts only when the connection comes
    /// ([`Connections::open`]).
    pub async fn room(&self) -> Result<OwnedSemaphorePermit, AcquireError> {
        loop {
            if let Ok(permit) = self.slots.clone().try_acquire_owned() {
                return Ok(permit);
            }
            // Every slot is taken: an idle connection gives up its own; while
            // all are busy, look again as they finish their requests.
            if let Some(permit) = self.evict_longest_idle() {
                return Ok(permit);
            }
            tokio::select! {
                permit = self.slots.clone().acquire_owned() => return permit,
                _ = tokio::time::sleep(EVICT_EVERY) => {}
            }
        }
    }

    /// The slot of a connection just accepted, in the room taken for it.
    pub fn open(self: &Arc<Self>, room: OwnedSemaphorePermit) -> Slot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let conn = Arc::new(Conn {
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(millis_since(self.epoch)),
            served: AtomicBool::new(false),
            evicted: CancellationToken::new(),
            permit: Mutex::new(Some(room)),
            epoch: self.epoch,
        });
        self.lock().insert(id, conn.clone());
        Slot {
            connections: self.clone(),
            id,
            conn,
        }
    }

    /// Room and a slot at once (tests).
    #[cfg(test)]
    async fn slot(self: &Arc<Self>) -> Result<Slot, AcquireError> {
        let room = self.room().await?;
        Ok(self.open(room))
    }

    /// Connections holding a slot now.
    #[cfg(test)]
    fn live(&self) -> usize {
        self.lock().len()
    }

    /// Tells the connection that has had no request in flight the longest
    /// to close, and takes its slot (none when every connection is busy or
    /// idle less than a second, or [`CLOSING_MAX`] are closing already).
    fn evict_longest_idle(&self) -> Option<OwnedSemaphorePermit> {
        let mut live = self.lock();
        if self.closing.load(Ordering::Acquire) >= CLOSING_MAX {
            return None;
        }
        let now = millis_since(self.epoch);
        let longest = u64::try_from(EVICT_IDLE_AFTER.as_millis()).unwrap_or(u64::MAX);
        let (&id, _) = live
            .iter()
            .filter(|(_, c)| c.in_flight.load(Ordering::Acquire) == 0)
            .filter(|(_, c)| now.saturating_sub(c.idle_since_ms.load(Ordering::Relaxed)) >= longest)
            .min_by_key(|(_, c)| c.idle_since_ms.load(Ordering::Relaxed))?;
        let conn = live.remove(&id)?;
        let permit = lock(&conn.permit).take()?;
        self.closing.fetch_add(1, Ordering::AcqRel);
        conn.evicted.cancel();
        Some(permit)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Conn>>> {
        lock(&self.live)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Under the lock of `live`, so an eviction sees either the slot and
        // its connection, or neither.
        let mut live = self.connections.lock();
        if live.remove(&self.id).is_none() {
            // Evicted: its slot went to a new client; it is closed now.
            self.connections.closing.fetch_sub(1, Ordering::AcqRel);
        }
        lock(&self.conn.permit).take();
    }
}

impl Slot {
    pub fn conn(&self) -> Arc<Conn> {
        self.conn.clone()
    }
}

impl Conn {
    /// Marks a request begun; it ends when the returned guard is dropped.
    pub fn begin(self: &Arc<Self>) -> Busy {
        self.served.store(true, Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }

    /// Whether a request is in flight on it now.
    pub fn busy(&self) -> bool {
        self.in_flight.load(Ordering::Acquire) > 0
    }

    /// Completes when the connection should close: it had no request in
    /// flight for `idle_timeout` (for `first_request_timeout` before its
    /// first request), or it was evicted for a waiting client.
    pub async fn unused(&self, first_request_timeout: Duration, idle_timeout: Duration) {
        loop {
            let limit = if self.served.load(Ordering::Relaxed) {
                idle_timeout
            } else {
                first_request_timeout
            };
            let wait = if self.in_flight.load(Ordering::Acquire) == 0 {
                let since = Duration::from_millis(self.idle_since_ms.load(Ordering::Relaxed));
                let idle_for = self.epoch.elapsed().saturating_sub(since);
                match limit.checked_sub(idle_for) {
                    Some(left) if !left.is_zero() => left,
                    _ => return,
                }
            } else {
                // Busy: look again later (a request's own timeouts bound it).
                limit
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.evicted.cancelled() => return,
            }
        }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let conn = &self.0;
        conn.idle_since_ms
            .store(millis_since(conn.epoch), Ordering::Relaxed);
        conn.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

fn millis_since(epoch: Instant) -> u64 {
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: Duration = Duration::from_secs(10);
    const IDLE: Duration = Duration::from_secs(60);

    #[tokio::test(start_paused = true)]
    async fn a_connection_without_requests_goes_after_the_first_request_timeout() {
        let conns = Connections::new(4);
        let slot = conns.slot().await.unwrap();
        let conn = slot.conn();
        let start = Instant::now();
        conn.unused(FIRST, IDLE).await;
        assert_eq!(start.elapsed(), FIRST);
        drop(slot);
        assert_eq!(conns.live(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_request_is_timed_from_the_accept_not_from_the_wait_for_it() {
        let conns = Connections::new(4);
        // Room is taken for the next connection long before it comes.
        let room = conns.room().await.unwrap();
        tokio::time::sleep(FIRST * 3).await;
        let slot = conns.open(room);
        let conn = slot.conn();
        let start = Instant::now();
        conn.unused(FIRST, IDLE).await;
        assert_eq!(start.elapsed(), FIRST);
    }

    #[tokio::test(start_paused = true)]
    async fn a_busy_connection_stays_and_goes_idle_timeout_after_its_last_request() {
        let conns = Connections::new(4);
        let slot = conns.slot().await.unwrap();
        let conn = slot.conn();
        let busy = conn.begin();
        let watch = tokio::spawn({
            let conn = conn.clone();
            async move { conn.unused(FIRST, IDLE).await }
        });
        tokio::time::sleep(IDLE * 3).await;
        assert!(!watch.is_finished(), "a request in flight keeps it");
        let ended = Instant::now();
        drop(busy);
        watch.await.unwrap();
        assert!(ended.elapsed() >= IDLE, "{:?}", ended.elapsed());
        assert!(ended.elapsed() <= IDLE * 2, "{:?}", ended.elapsed());
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_listener_closes_its_longest_idle_connection_for_a_new_one() {
        let conns = Connections::new(2);
        let older = conns.slot().await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let newer = conns.slot().await.unwrap();
        let (older_conn, newer_conn) = (older.conn(), newer.conn());
        let third = tokio::spawn({
            let conns = conns.clone();
            async move { conns.slot().await.unwrap() }
        });
        // The older one is told to go at once (no timeout passed), the newer
        // stays (it could not be evicted anyway: idle less than a second).
        tokio::time::timeout(Duration::from_millis(1), older_conn.unused(FIRST, IDLE))
            .await
            .expect("the longest-idle connection is evicted");
        assert!(!newer_conn.evicted.is_cancelled());
        // Its slot went to the new client before it closed.
        let third = tokio::time::timeout(Duration::from_millis(1), third)
            .await
            .expect("the new client has the evicted one's slot at once")
            .unwrap();
        assert_eq!(conns.live(), 2);
        assert_eq!(conns.closing.load(Ordering::Acquire), 1);
        drop(older);
        assert_eq!(conns.closing.load(Ordering::Acquire), 0);
        assert_eq!(conns.live(), 2);
        // Busy connections are never evicted: the next one waits.
        let _busy = (newer_conn.begin(), third.conn().begin());
        let fourth = tokio::spawn({
            let conns = conns.clone();
            async move { conns.slot().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!fourth.is_finished());
        assert!(!newer_conn.evicted.is_cancelled() && !third.conn().evicted.is_cancelled());
        drop(third);
        fourth.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn connections_told_to_close_and_still_open_are_bounded() {
        let conns = Connections::new(CLOSING_MAX + 1);
        let mut idle = Vec::new();
        for _ in 0..=CLOSING_MAX {
            idle.push(conns.slot().await.unwrap());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        // None of the idle ones closes: each new client takes one's slot.
        let mut new = Vec::new();
        for _ in 0..CLOSING_MAX {
            let slot = tokio::time::timeout(Duration::from_millis(1), conns.slot())
                .await
                .expect("an idle connection's slot is given at once");
            new.push(slot.unwrap());
        }
        assert_eq!(conns.closing.load(Ordering::Acquire), CLOSING_MAX);
        let next = tokio::spawn({
            let conns = conns.clone();
            async move { conns.slot().await.unwrap() }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!next.is_finished(), "past the bound, the next client waits");
        // One evicted connection closes: the last idle one is evicted for it.
        drop(idle.remove(0));
        let _next = tokio::time::timeout(EVICT_EVERY * 2, next)
            .await
            .expect("room once one has closed")
            .unwrap();
        assert_eq!(conns.closing.load(Ordering::Acquire), CLOSING_MAX);
        drop(idle);
        assert_eq!(conns.closing.load(Ordering::Acquire), 0);
        assert_eq!(conns.live(), CLOSING_MAX + 1);
    }
}
