//! What every listener shares: the accept loop ([`accept_loop`]: at most
//! `max_connections` at once, the rest wait in the kernel's backlog; a
//! header timeout for HTTP/1; TLS when configured; a graceful end on
//! shutdown, open connections finishing their requests), `tls` ([`tls`]:
//! certificates reloaded on change, optional mutual TLS) and receivers'
//! `auth` ([`auth`]: bearer tokens, basic auth, reloaded on change).

pub mod auth;
pub mod tls;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

pub use auth::{AuthSettings, Authenticated, Authenticator, BasicAuthSettings, Unauthenticated};
pub use tls::{ServerTls, ServerTlsFiles, ServerTlsSettings, TlsVersion};

/// How long a connection accepted just before shutdown gets to send its
/// first request before the graceful end (which closes idle connections).
pub const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(250);

/// The longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How [`accept_loop`] serves connections.
#[derive(Debug, Clone)]
pub struct Listen {
    pub max_connections: usize,
    /// HTTP/1 header read timeout (`None`: hyper's default).
    pub read_header_timeout: Option<Duration>,
    /// Serve HTTP/2 only (gRPC).
    pub http2_only: bool,
    /// TLS on every connection, when set.
    pub tls: Option<Arc<ServerTls>>,
}

/// Serves one connection to its end in its own task, holding its place
/// among the listener's connections until then.
fn spawn_connection<C, E>(
    connection: C,
    peer: SocketAddr,
    permit: tokio::sync::OwnedSemaphorePermit,
) where
    C: Future<Output = Result<(), E>> + Send + 'static,
    E: std::fmt::Display,
{
    tokio::spawn(async move {
        // Errors are the client's doing (reset, timeout, bad framing).
        if let Err(e) = connection.await {
            tracing::debug!(error = %e, client = %peer, "connection ended with an error");
        }
        drop(permit);
    });
}

/// Accepts connections until `shutdown` and serves each request with
/// `service(request, client address)`; then lets the open connections
/// finish their requests. With TLS, the handshake runs in the connection's
/// own task (bounded by [`HANDSHAKE_TIMEOUT`]), so a slow client never
/// holds up the accepting; a plain-text client on a TLS port fails its
/// handshake and is dropped.
pub async fn accept_loop<S, F, B>(
    listener: TcpListener,
    listen: Listen,
    shutdown: CancellationToken,
    id: String,
    service: S,
) where
    S: Fn(Request<Incoming>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if listen.http2_only {
        builder = builder.http2_only();
    }
    {
        let mut http1 = builder.http1();
        http1.timer(TokioTimer::new());
        if let Some(timeout) = listen.read_header_timeout {
            http1.header_read_timeout(timeout);
        }
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(None);
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(listen.max_connections.max(1)));
    // Connections still in their TLS handshake when shutdown comes.
    let handshaking = tokio_util::task::TaskTracker::new();
    let mut last_accept = std::time::Instant::now();
    loop {
        let permit = tokio::select! {
            permit = connections.clone().acquire_owned() => permit,
            _ = shutdown.cancelled() => break,
        };
        let Ok(permit) = permit else { break };
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.cancelled() => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: wait a moment rather
                // than spin on the error.
                tracing::warn!(listener = %id, error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        last_accept = std::time::Instant::now();
        let service = service.clone();
        let per_request = hyper::service::service_fn(move |req: Request<Incoming>| {
            let response = service(req, peer);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let Some(tls) = &listen.tls else {
            let connection = graceful.watch(
                builder
                    .serve_connection(TokioIo::new(stream), per_request)
                    .into_owned(),
            );
            spawn_connection(connection, peer, permit);
            continue;
        };
        // TLS: the handshake runs in the connection's own task (a slow
        // client never holds up accepting), ends with shutdown, and the
        // connection is watched for the graceful end once it is served.
        let acceptor = tls.acceptor(listen.http2_only);
        let watcher = graceful.watcher();
        let builder = builder.clone();
        let (id, stop) = (id.clone(), shutdown.clone());
        handshaking.spawn(async move {
            let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
            let tls = tokio::select! {
                r = handshake => match r {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::debug!(listener = %id, client = %peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(listener = %id, client = %peer, "TLS handshake timed out");
                        return;
                    }
                },
                _ = stop.cancelled() => return,
            };
            let connection = watcher.watch(
                builder
                    .serve_connection(TokioIo::new(tls), per_request)
                    .into_owned(),
            );
            spawn_connection(connection, peer, permit);
        });
    }
    drop(listener);
    // A connection accepted a moment ago has not sent its request yet; the
    // graceful end would close it unanswered. Give it that moment (a
    // receiver replaced by a reload hands its socket over, so its last
    // connections must still be served).
    if let Some(left) = FIRST_REQUEST_GRACE.checked_sub(last_accept.elapsed()) {
        tokio::time::sleep(left).await;
    }
    // Handshakes end at once on shutdown; then every served connection
    // finishes its requests.
    handshaking.close();
    handshaking.wait().await;
    graceful.shutdown().await;
}

/// A hash of each file's contents (`None` when it cannot be read, so its
/// return is noticed). Contents, not times: a rotated token of the same
/// length written within the clock's resolution, or a copy that keeps the
/// old time, is still seen. The files are small (certificates, keys,
/// credentials).
pub(crate) type Stamps = Vec<Option<u64>>;

pub(crate) fn stamps(files: &[&std::path::Path]) -> Stamps {
    use std::hash::{Hash, Hasher};
    files
        .iter()
        .map(|f| {
            let bytes = std::fs::read(f).ok()?;
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut h);
            Some(h.finish())
        })
        .collect()
}

/// Calls `reload` whenever `files` change (checked every
/// [`tls::RELOAD_EVERY`]), starting from `seen`, until `stop`.
pub(crate) fn watch_files(
    files: &[&std::path::Path],
    mut seen: Stamps,
    stop: CancellationToken,
    reload: impl Fn() + Send + 'static,
) {
    let files: Vec<std::path::PathBuf> = files.iter().map(|p| p.to_path_buf()).collect();
    tokio::spawn(async move {
        let paths: Vec<&std::path::Path> = files.iter().map(|p| p.as_path()).collect();
        loop {
            tokio::select! {
                _ = tokio::time::sleep(tls::RELOAD_EVERY) => {}
                _ = stop.cancelled() => return,
            }
            let now = stamps(&paths);
            if now != seen {
                seen = now;
                reload();
            }
        }
    });
}

/// The listening sockets of the running receivers, by address, so a
/// receiver started again by a reload on the same address takes over the
/// very socket its predecessor listened on (connections waiting in its
/// backlog included): no connection is refused while one replaces the other.
#[derive(Debug, Clone, Default)]
pub struct Listeners(
    Arc<std::sync::Mutex<std::collections::HashMap<SocketAddr, std::net::TcpListener>>>,
);

impl Listeners {
    /// A listener on `addr`: the socket already open there, or a new one.
    /// Port 0 always binds a new socket.
    pub fn bind(&self, addr: SocketAddr) -> std::io::Result<TcpListener> {
        let mut open = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let socket = match open.get(&addr) {
            Some(s) if addr.port() != 0 => s.try_clone()?,
            _ => {
                let s = std::net::TcpListener::bind(addr)?;
                if addr.port() != 0 {
                    open.insert(addr, s.try_clone()?);
                }
                s
            }
        };
        socket.set_nonblocking(true)?;
        TcpListener::from_std(socket)
    }

    /// Closes the sockets on addresses not in `keep` (receivers removed or
    /// moved by a reload).
    pub fn retain(&self, keep: &std::collections::HashSet<SocketAddr>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|addr, _| keep.contains(addr));
    }
}

/// The running TLS and authentication of one listener.
#[derive(Debug, Clone, Default)]
pub struct Secured {
    pub tls: Option<Arc<ServerTls>>,
    pub auth: Option<Arc<Authenticator>>,
}

/// The header Grafana's multi-tenant servers (and proflow's receivers) read
/// the tenant from.
pub const TENANT_HEADER: &str = "x-scope-orgid";

impl Secured {
    /// Loads the files of `tls` and `auth` and watches them until `stop`.
    /// Errors name the field.
    pub fn start(
        tls: Option<&ServerTlsSettings>,
        auth: Option<&AuthSettings>,
        what: &str,
        stop: &CancellationToken,
    ) -> Result<Secured, String> {
        Ok(Secured {
            tls: tls
                .map(|t| ServerTls::start(t.clone(), what, stop.clone()))
                .transpose()?,
            auth: auth
                .map(|a| Authenticator::start(a.clone(), what, stop.clone()))
                .transpose()
                .map_err(|e| format!("auth: {e}"))?,
        })
    }

    /// Checks a request's credentials when `auth` is set. A token bound to a
    /// tenant replaces the request's `X-Scope-OrgID`, so a token cannot write
    /// as another tenant.
    pub async fn authenticate<B>(&self, req: &mut Request<B>) -> Result<(), Unauthenticated> {
        let Some(auth) = &self.auth else {
            return Ok(());
        };
        let who = auth.check(req.headers()).await?;
        if let Some(tenant) = who.tenant
            && let Ok(value) = hyper::header::HeaderValue::from_str(&tenant)
        {
            req.headers_mut().insert(TENANT_HEADER, value);
        }
        Ok(())
    }
}
