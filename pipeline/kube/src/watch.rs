//! A cache of one kind of object, kept current by list and watch.
//!
//! [`Store::watch`] starts a task that lists the objects in pages
//! (`limit`/`continue`), then watches from the list's `resourceVersion` with
//! bookmarks, so a quiet watch still moves its version on. A watch the
//! server ends (its `timeoutSeconds`, five to ten minutes) starts again
//! from the last version seen; one whose version is gone (`410 Gone`) lists
//! again. A failure (no connection, an error status) is logged once, and
//! retried after 1 s, doubling to 30 s; the cache keeps what it had.
//!
//! Memory is bounded three ways ([`WatchLimits`]): one watch event (one
//! object) of at most `max_object_bytes` (etcd stores none over 1.5 MiB), one
//! list page of at most `max_page_bytes`, and at most `max_objects` objects
//! kept (more are counted and not kept). With [`Store::watch_granted`], a
//! list page and its parse are also granted from the in-flight memory budget
//! while they are read: a page the budget has no room for fails that list,
//! which is retried. What is kept of an object is only
//! the fields of its type in [`crate::objects`].
//!
//! Readers take [`Store::list`] or [`Store::get`] and wait on
//! [`Store::changes`], a counter bumped once per list and once per batch of
//! events that arrived together.

use std::collections::HashMap;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use http_body_util::BodyExt;
use proflow_model::json_shape::JsonShape;
use proflow_model::memory::MemoryBudget;
use proflow_net::http::FetchError;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::connect::Client;
use crate::objects::Resource;

/// Which objects of a kind: all, or one namespace's, and those matching
/// the selectors (the API's `labelSelector` and `fieldSelector` syntax).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    pub namespace: Option<String>,
    pub label_selector: Option<String>,
    pub field_selector: Option<String>,
}

/// Bounds on what a watch reads and keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WatchLimits {
    /// Most bytes of one watch event (one object).
    pub max_object_bytes: usize,
    /// Most bytes of one list page.
    pub max_page_bytes: usize,
    /// Objects asked for per list page.
    pub page_size: u32,
    /// Most objects kept.
    pub max_objects: usize,
}

impl Default for WatchLimits {
    fn default() -> Self {
        WatchLimits {
            max_object_bytes: 4 * 1024 * 1024,
            max_page_bytes: 64 * 1024 * 1024,
            page_size: 500,
            max_objects: 100_000,
        }
    }
}

/// How long a list page may take to arrive.
const LIST_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the answer to a watch request may take to start.
const WATCH_START_TIMEOUT: Duration = Duration::from_secs(30);
/// Slack after the watch's own timeout before proflow gives up on it.
const WATCH_SLACK: Duration = Duration::from_secs(30);
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Counters of a store's task, for components' metrics.
#[derive(Debug, Default)]
pub struct Stats {
    /// Failed lists and watches.
    pub failures: AtomicU64,
    /// Objects not kept: over `max_objects`.
    pub refused: AtomicU64,
}

struct Inner<K> {
    objects: RwLock<HashMap<String, Arc<K>>>,
    changes: watch::Sender<u64>,
    synced: AtomicBool,
    stats: Stats,
    max_objects: usize,
    /// Logged once when `max_objects` first refuses an object.
    refused_logged: AtomicBool,
}

/// The cache of one kind; cheap to clone.
pub struct Store<K> {
    inner: Arc<Inner<K>>,
}

impl<K> Clone for Store<K> {
    fn clone(&self) -> Self {
        Store {
            inner: self.inner.clone(),
        }
    }
}

impl<K> std::fmt::Debug for Store<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("synced", &self.inner.synced.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

/// The key of an object: `namespace/name`, or `name` for objects without a
/// namespace.
pub fn key(namespace: &str, name: &str) -> String {
    if namespace.is_empty() {
        name.to_owned()
    } else {
        format!("{namespace}/{name}")
    }
}

impl<K: Resource> Store<K> {
    /// An empty store, to be filled by [`Store::apply`] (tests, and
    /// [`Store::watch`]).
    pub fn new(max_objects: usize) -> Self {
        Store {
            inner: Arc::new(Inner {
                objects: RwLock::new(HashMap::new()),
                changes: watch::channel(0).0,
                synced: AtomicBool::new(false),
                stats: Stats::default(),
                max_objects,
                refused_logged: AtomicBool::new(false),
            }),
        }
    }

    /// A store kept current by a task (on the current tokio runtime) that
    /// lists and watches `scope` until `shutdown`.
    pub fn watch(
        client: Client,
        scope: Scope,
        limits: WatchLimits,
        shutdown: CancellationToken,
    ) -> Self {
        Store::watch_granted(client, scope, limits, None, shutdown)
    }

    /// [`Store::watch`], with each list page and its parse granted from
    /// `memory` (the in-flight budget) while it is read.
    pub fn watch_granted(
        client: Client,
        scope: Scope,
        limits: WatchLimits,
        memory: Option<MemoryBudget>,
        shutdown: CancellationToken,
    ) -> Self {
        let store = Store::new(limits.max_objects);
        let reflector = Reflector::<K> {
            client,
            scope,
            limits,
            memory,
            store: store.clone(),
            last_failure: None,
            kind: PhantomData,
        };
        tokio::spawn(reflector.run(shutdown));
        store
    }

    /// The object `namespace/name` (namespace empty for nodes and
    /// namespaces).
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<K>> {
        let objects = self.inner.objects.read().ok()?;
        objects.get(&key(namespace, name)).cloned()
    }

    /// Every object, in no order.
    pub fn list(&self) -> Vec<Arc<K>> {
        self.inner
            .objects
            .read()
            .map(|o| o.values().cloned().collect())
            .unwrap_or_default()
    }

    pub fn len(&self) -> usize {
        self.inner.objects.read().map(|o| o.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A receiver of the change counter: changed after each list and each
    /// batch of events.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    /// Whether the first list has arrived.
    pub fn synced(&self) -> bool {
        self.inner.synced.load(Ordering::Acquire)
    }

    pub fn stats(&self) -> &Stats {
        &self.inner.stats
    }

    /// Wakes `notify` at each change of this store, until `stop` (a task
    /// on the current runtime): one [`tokio::sync::Notify`] can stand for
    /// several stores that one reader builds from.
    pub fn notify_on_change(&self, notify: &Arc<tokio::sync::Notify>, stop: &CancellationToken) {
        let mut changes = self.changes();
        // A change before this subscription (the first list, done already)
        // would otherwise go unnoticed: the reader looks once now.
        notify.notify_one();
        let (notify, stop) = (notify.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = stop.cancelled() => return,
                    changed = changes.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        notify.notify_one();
                    }
                }
            }
        });
    }

    /// A synced store of objects given as JSON (tests, and tools that have
    /// the objects already).
    pub fn from_json(objects: &[&str]) -> Result<Self, serde_json::Error> {
        let items = objects
            .iter()
            .map(|j| serde_json::from_str(j))
            .collect::<Result<Vec<K>, _>>()?;
        let store = Store::new(WatchLimits::default().max_objects);
        store.replace(items);
        Ok(store)
    }

    /// Replaces every object with `items` (a fresh list).
    pub fn replace(&self, items: Vec<K>) {
        let mut map = HashMap::with_capacity(items.len().min(self.inner.max_objects));
        for item in items {
            if map.len() >= self.inner.max_objects {
                self.refuse();
                continue;
            }
            let meta = item.meta();
            map.insert(key(&meta.namespace, &meta.name), Arc::new(item));
        }
        if let Ok(mut objects) = self.inner.objects.write() {
            *objects = map;
        }
        self.inner.synced.store(true, Ordering::Release);
        self.bump();
    }

    /// Applies one change without telling readers (see [`Store::bump`]).
    pub fn apply(&self, change: Change<K>) {
        let Ok(mut objects) = self.inner.objects.write() else {
            return;
        };
        match change {
            Change::Upsert(item) => {
                let meta = item.meta();
                let k = key(&meta.namespace, &meta.name);
                if !objects.contains_key(&k) && objects.len() >= self.inner.max_objects {
                    drop(objects);
                    self.refuse();
                    return;
                }
                objects.insert(k, Arc::new(item));
            }
            Change::Delete(item) => {
                let meta = item.meta();
                objects.remove(&key(&meta.namespace, &meta.name));
            }
        }
    }

    /// Tells readers that the store changed.
    pub fn bump(&self) {
        self.inner.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    fn refuse(&self) {
        self.inner.stats.refused.fetch_add(1, Ordering::Relaxed);
        if !self.inner.refused_logged.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                kind = K::PLURAL,
                max_objects = self.inner.max_objects,
                "more objects than the cache keeps: the rest are not kept (narrow the watch with namespaces or selectors)"
            );
        }
    }
}

/// One change of a watch.
#[derive(Debug)]
pub enum Change<K> {
    Upsert(K),
    Delete(K),
}

/// The list answer.
#[derive(Deserialize)]
#[serde(bound = "K: DeserializeOwned")]
struct List<K> {
    #[serde(default)]
    metadata: ListMeta,
    #[serde(default = "Vec::new")]
    items: Vec<K>,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct ListMeta {
    resource_version: String,
    #[serde(rename = "continue")]
    continue_token: String,
}

#[derive(Deserialize)]
struct RawEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    #[serde(borrow)]
    object: &'a RawValue,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct Status {
    code: u16,
    reason: String,
    message: String,
}

#[derive(Default, Deserialize)]
#[serde(default)]
struct VersionOnly {
    metadata: VersionMeta,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase", default)]
struct VersionMeta {
    resource_version: String,
}

/// One decoded line of a watch stream.
#[derive(Debug)]
pub enum Event<K> {
    /// ADDED or MODIFIED.
    Upsert(K),
    Deleted(K),
    /// A quiet watch's new version.
    Bookmark(String),
    /// The server's error: `code` 410 means the version is gone.
    Error {
        code: u16,
        reason: String,
        message: String,
    },
    /// A type this reader does not know; skipped.
    Other,
}

/// Decodes one line of a watch stream (`{"type": …, "object": …}`).
pub fn decode_event<K: Resource>(line: &[u8]) -> Result<Event<K>, serde_json::Error> {
    let event: RawEvent<'_> = serde_json::from_slice(line)?;
    Ok(match event.kind {
        "ADDED" | "MODIFIED" => Event::Upsert(serde_json::from_str(event.object.get())?),
        "DELETED" => Event::Deleted(serde_json::from_str(event.object.get())?),
        "BOOKMARK" => {
            let object: VersionOnly = serde_json::from_str(event.object.get())?;
            Event::Bookmark(object.metadata.resource_version)
        }
        "ERROR" => {
            let status: Status = serde_json::from_str(event.object.get())?;
            Event::Error {
                code: status.code,
                reason: status.reason,
                message: status.message,
            }
        }
        _ => Event::Other,
    })
}

/// Decodes one list page: its objects, resource version and continue token.
pub fn decode_list<K: Resource>(
    bytes: &[u8],
) -> Result<(Vec<K>, String, String), serde_json::Error> {
    let page: List<K> = serde_json::from_slice(bytes)?;
    Ok((
        page.items,
        page.metadata.resource_version,
        page.metadata.continue_token,
    ))
}

/// Why a watch ended.
enum WatchEnd {
    /// Shutting down.
    Shutdown,
    /// The server closed it (its timeout): watch again from the version.
    Closed,
    /// The version is gone: list again.
    Expired,
    Failed(String),
}

struct Reflector<K> {
    client: Client,
    scope: Scope,
    limits: WatchLimits,
    memory: Option<MemoryBudget>,
    store: Store<K>,
    last_failure: Option<String>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource> Reflector<K> {
    async fn run(mut self, shutdown: CancellationToken) {
        let mut backoff = FIRST_BACKOFF;
        'list: loop {
            let listed = tokio::select! {
                biased;
                () = shutdown.cancelled() => return,
                listed = self.list() => listed,
            };
            let mut version = match listed {
                Ok(version) => version,
                Err(e) => {
                    self.failed(e);
                    if !sleep(&mut backoff, &shutdown).await {
                        return;
                    }
                    continue 'list;
                }
            };
            self.recovered();
            backoff = FIRST_BACKOFF;
            loop {
                match self.watch_once(&mut version, &shutdown).await {
                    WatchEnd::Shutdown => return,
                    WatchEnd::Closed => backoff = FIRST_BACKOFF,
                    WatchEnd::Expired => continue 'list,
                    WatchEnd::Failed(e) => {
                        self.failed(e);
                        if !sleep(&mut backoff, &shutdown).await {
                            return;
                        }
                    }
                }
            }
        }
    }

    /// `/api/v1/namespaces/ns/pods?…`
    fn path(&self, query: &[(&str, &str)]) -> String {
        let mut path = format!("/{}/", K::API);
        if let Some(ns) = self.scope.namespace.as_deref().filter(|_| K::NAMESPACED) {
            path.push_str("namespaces/");
            path.push_str(&proflow_net::url::percent_encode(ns));
            path.push('/');
        }
        path.push_str(K::PLURAL);
        let selectors = [
            ("labelSelector", self.scope.label_selector.as_deref()),
            ("fieldSelector", self.scope.field_selector.as_deref()),
        ];
        let mut sep = '?';
        for (name, value) in selectors
            .iter()
            .filter_map(|(n, v)| v.filter(|v| !v.is_empty()).map(|v| (*n, v)))
            .chain(query.iter().copied())
        {
            path.push(sep);
            sep = '&';
            path.push_str(name);
            path.push('=');
            path.push_str(&proflow_net::url::percent_encode(value));
        }
        path
    }

    /// Lists every object into the store; gives the list's version.
    async fn list(&self) -> Result<String, String> {
        let mut items: Vec<K> = Vec::new();
        let mut token = String::new();
        let mut version = None;
        let page_size = self.limits.page_size.to_string();
        loop {
            let mut query = vec![("limit", page_size.as_str())];
            if !token.is_empty() {
                query.push(("continue", token.as_str()));
            }
            let path = self.path(&query);
            // The page as it arrives, and its parse before it is made (a
            // JSON tree of it: more than the typed objects keep), is held
            // against the budget until the page is in the store.
            let budget = self
                .memory
                .clone()
                .unwrap_or_else(|| MemoryBudget::new(usize::MAX));
            let mut grant = budget.grant();
            let body = tokio::time::timeout(
                LIST_TIMEOUT,
                self.client
                    .get_granted(&path, self.limits.max_page_bytes, &mut grant),
            )
            .await
            .map_err(|_| format!("listing {} took over {LIST_TIMEOUT:?}", K::PLURAL))?
            .map_err(|e| self.fetch_error("listing", &e))?;
            grant
                .try_grow(JsonShape::scan(&body).tree_bytes())
                .map_err(|e| self.fetch_error("listing", &FetchError::Memory(e.to_string())))?;
            let (page, page_version, next) = decode_list::<K>(&body)
                .map_err(|e| format!("listing {}: the answer is not a list: {e}", K::PLURAL))?;
            // Every page of a list is one snapshot, at the first page's version.
            version.get_or_insert(page_version);
            items.extend(page);
            if next.is_empty() || items.len() >= self.limits.max_objects {
                break;
            }
            token = next;
        }
        self.store.replace(items);
        Ok(version.unwrap_or_default())
    }

    fn fetch_error(&self, doing: &str, e: &FetchError) -> String {
        match e {
            FetchError::Status { status: 401, .. } => format!(
                "{doing} {} at {}: {e} (the credential was refused: check the token or certificate)",
                K::PLURAL,
                self.client.base()
            ),
            FetchError::Status { status: 403, .. } => format!(
                "{doing} {} at {}: {e} (not allowed: grant `list` and `watch` on {} to proflow's ServiceAccount)",
                K::PLURAL,
                self.client.base(),
                K::PLURAL
            ),
            FetchError::Memory(_) => format!(
                "{doing} {} at {}: a list page and its parse need more memory than the in-flight budget has for one read now (service.limits.max_in_flight_bytes): raise it, or narrow the watch with namespaces or selectors ({e})",
                K::PLURAL,
                self.client.base()
            ),
            _ => format!("{doing} {} at {}: {e}", K::PLURAL, self.client.base()),
        }
    }

    /// Watches from `version` (moved on as events arrive) until the server
    /// ends the watch, it fails, or shutdown.
    async fn watch_once(&mut self, version: &mut String, shutdown: &CancellationToken) -> WatchEnd {
        // Five to ten minutes, spread so that many watches do not end together.
        let seconds = 300
            + std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::from(d.subsec_nanos()) % 300);
        let seconds_text = seconds.to_string();
        let path = self.path(&[
            ("watch", "1"),
            ("allowWatchBookmarks", "true"),
            ("resourceVersion", version.as_str()),
            ("timeoutSeconds", &seconds_text),
        ]);
        let started = tokio::select! {
            biased;
            () = shutdown.cancelled() => return WatchEnd::Shutdown,
            started = tokio::time::timeout(WATCH_START_TIMEOUT, self.client.stream(&path)) => started,
        };
        let mut body = match started {
            Err(_) => {
                return WatchEnd::Failed(format!(
                    "watching {}: no answer within {WATCH_START_TIMEOUT:?}",
                    K::PLURAL
                ));
            }
            Ok(Err(FetchError::Status { status: 410, .. })) => return WatchEnd::Expired,
            Ok(Err(e)) => return WatchEnd::Failed(self.fetch_error("watching", &e)),
            Ok(Ok(body)) => body,
        };
        // Watching again after a failure (resumed, or listed anew) is working again.
        self.recovered();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(seconds) + WATCH_SLACK;
        let mut buf: Vec<u8> = Vec::new();
        loop {
            let frame = tokio::select! {
                biased;
                () = shutdown.cancelled() => return WatchEnd::Shutdown,
                frame = tokio::time::timeout_at(deadline, body.frame()) => frame,
            };
            let data = match frame {
                Err(_) => return WatchEnd::Closed, // the server should have ended it
                Ok(None) => return WatchEnd::Closed,
                Ok(Some(Err(e))) => {
                    return WatchEnd::Failed(format!(
                        "watching {}: the stream broke: {}",
                        K::PLURAL,
                        proflow_net::error_chain(&e)
                    ));
                }
                Ok(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) => data,
                    Err(_) => continue, // trailers
                },
            };
            buf.extend_from_slice(&data);
            let mut changed = false;
            let mut start = 0;
            while let Some(end) = buf[start..].iter().position(|&b| b == b'\n') {
                let line = &buf[start..start + end];
                start += end + 1;
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match self.event(line, version) {
                    Ok(c) => changed |= c,
                    Err(end) => {
                        if changed {
                            self.store.bump();
                        }
                        return end;
                    }
                }
            }
            buf.drain(..start);
            if changed {
                self.store.bump();
            }
            if buf.len() > self.limits.max_object_bytes {
                return WatchEnd::Failed(format!(
                    "watching {}: an event of more than {} bytes",
                    K::PLURAL,
                    self.limits.max_object_bytes
                ));
            }
        }
    }

    /// Applies one event line; true when the store changed.
    fn event(&self, line: &[u8], version: &mut String) -> Result<bool, WatchEnd> {
        let event = decode_event::<K>(line).map_err(|e| {
            WatchEnd::Failed(format!(
                "watching {}: an event that does not parse: {e}",
                K::PLURAL
            ))
        })?;
        match event {
            Event::Upsert(object) => {
                version.clone_from(&object.meta().resource_version);
                self.store.apply(Change::Upsert(object));
                Ok(true)
            }
            Event::Deleted(object) => {
                version.clone_from(&object.meta().resource_version);
                self.store.apply(Change::Delete(object));
                Ok(true)
            }
            Event::Bookmark(v) => {
                *version = v;
                Ok(false)
            }
            Event::Error {
                code,
                reason,
                message,
            } => {
                if code == 410 || reason == "Expired" || reason == "Gone" {
                    Err(WatchEnd::Expired)
                } else {
                    Err(WatchEnd::Failed(format!(
                        "watching {}: the server said {code} {reason}: {message}",
                        K::PLURAL
                    )))
                }
            }
            Event::Other => Ok(false),
        }
    }

    fn failed(&mut self, e: String) {
        self.store
            .inner
            .stats
            .failures
            .fetch_add(1, Ordering::Relaxed);
        if self.last_failure.as_deref() != Some(e.as_str()) {
            tracing::warn!(error = %e, "Kubernetes watch failed; retrying, and keeping the objects it had");
            self.last_failure = Some(e);
        }
    }

    fn recovered(&mut self) {
        if self.last_failure.take().is_some() {
            tracing::info!(
                kind = K::PLURAL,
                api = self.client.base(),
                "Kubernetes watch works again"
            );
        }
    }
}

/// Sleeps `backoff` (then doubles it up to the most); false on shutdown.
async fn sleep(backoff: &mut Duration, shutdown: &CancellationToken) -> bool {
    let wait = *backoff;
    *backoff = (*backoff * 2).min(MAX_BACKOFF);
    tokio::select! {
        () = shutdown.cancelled() => false,
        () = tokio::time::sleep(wait) => true,
    }
}

#[cfg(test)]
mod tests;
