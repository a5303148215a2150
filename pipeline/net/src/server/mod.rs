//! What every listener shares: its settings ([`listener`]), the accept loop ([`accept_loop`]: at most
//! `max_connections` at once, connections that hold a slot without a request
//! closed after `idle_timeout` — or at once for a new client when every slot
//! is taken ([`connections`]) —, a header timeout for HTTP/1, at most
//! `max_concurrent_streams` requests per HTTP/2 connection, TLS when
//! configured, a graceful end on shutdown, open connections finishing their
//! requests), `tls` ([`tls`]: certificates reloaded on change, optional
//! mutual TLS) and receivers' `auth` ([`auth`]: bearer tokens, basic auth,
//! reloaded on change).

pub mod auth;
pub mod body;
mod connections;
pub mod listener;
pub mod tenant_limits;
pub mod tls;
mod watch;

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulConnection;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

pub use auth::{AuthSettings, Authenticated, Authenticator, BasicAuthSettings, Unauthenticated};
pub use listener::{HttpListenerSettings, ListenerSettings, parse_endpoint, positive_timeout};
pub use tenant_limits::{
    LimitRefused, ProfileLimits, ProfileShape, ProfileSource, RateLimited, TenantLimiter,
    TenantLimitsSettings, series_hash,
};
pub use tls::{ServerTls, ServerTlsFiles, ServerTlsSettings, TlsVersion};

use connections::{Conn, Connections};

/// How long a connection accepted just before shutdown gets to send its
/// first request before the graceful end (which closes idle connections).
pub const FIRST_REQUEST_GRACE: Duration = Duration::from_millis(250);

/// The longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a connection told to close (idle, or shutdown) may take to
/// finish what it is doing before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(5);

/// How long a connection closed for being unused (idle, or evicted for a new
/// client) may take to go: it has no request in flight, so only an HTTP/2
/// goodbye or a request that began just then is waited for. A client
/// trickling half a header is not waited for: it may be evicted, and then
/// stays open beside the client that got its slot.
const UNUSED_CLOSE_GRACE: Duration = Duration::from_millis(200);

/// The default `idle_timeout` of every listener (the OpenTelemetry
/// Collector's for HTTP servers).
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// What one HTTP/1 connection may buffer of a request before the handler
/// reads it (headers, and body bytes read ahead): hyper's default is 400 KiB.
const H1_MAX_BUF: usize = 64 << 10;
/// What one HTTP/2 stream, and one connection in all, may have sent that
/// the handler has not read yet (flow control; hyper's default is 1 MiB
/// each). Bytes past it wait in the client: a connection holds at most this
/// much that no grant counts, while its handler waits for memory.
const H2_STREAM_WINDOW: u32 = 256 << 10;
const H2_CONNECTION_WINDOW: u32 = 512 << 10;

/// The default `max_concurrent_streams` of every listener.
pub const DEFAULT_MAX_CONCURRENT_STREAMS: u32 = 100;

/// How [`accept_loop`] serves connections.
#[derive(Debug, Clone)]
pub struct Listen {
    pub max_connections: usize,
    /// HTTP/1 header read timeout (`None`: hyper's default).
    pub read_header_timeout: Option<Duration>,
    /// How long a connection may stay open without a request in flight;
    /// its first request is due within `read_header_timeout` (or this).
    pub idle_timeout: Duration,
    /// Most requests in flight on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// Serve HTTP/2 only (gRPC).
    pub http2_only: bool,
    /// TLS on every connection, when set.
    pub tls: Option<Arc<ServerTls>>,
}

impl Listen {
    /// A listener's settings with the defaults for what is not given.
    pub fn new(max_connections: usize, tls: Option<Arc<ServerTls>>) -> Self {
        Listen {
            max_connections,
            read_header_timeout: None,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            http2_only: false,
            tls,
        }
    }

    fn first_request_timeout(&self) -> Duration {
        self.read_header_timeout
            .unwrap_or(HANDSHAKE_TIMEOUT)
            .min(self.idle_timeout)
    }
}

/// Serves one connection to its end, holding its slot until then: until
/// the client closes it, it stays unused too long ([`Conn::unused`]), or
/// `drain` (shutdown); then it ends gracefully, finishing the requests in
/// flight within [`CLOSE_GRACE`].
async fn serve_connection<C>(
    connection: C,
    conn: Arc<Conn>,
    listen: &Listen,
    drain: CancellationToken,
    peer: SocketAddr,
) where
    C: GracefulConnection,
    C::Error: std::fmt::Display,
{
    let mut connection = std::pin::pin!(connection);
    let ended = tokio::select! {
        ended = connection.as_mut() => Ok(ended),
        _ = drain.cancelled() => Err(CLOSE_GRACE),
        _ = conn.unused(listen.first_request_timeout(), listen.idle_timeout) => Err(UNUSED_CLOSE_GRACE),
    };
    let ended = match ended {
        Ok(ended) => ended,
        Err(grace) => {
            connection.as_mut().graceful_shutdown();
            let deadline = tokio::time::Instant::now() + CLOSE_GRACE;
            loop {
                let step = (tokio::time::Instant::now() + grace).min(deadline);
                match tokio::time::timeout_at(step, connection.as_mut()).await {
                    Ok(ended) => break ended,
                    // A connection closed for being unused (half a header
                    // trickling in, say) goes after a moment, unless a
                    // request began meanwhile: that one gets the full grace.
                    Err(_) if step >= deadline || !conn.busy() => return,
                    Err(_) => {}
                }
            }
        }
    };
    // Errors are the client's doing (reset, timeout, bad framing).
    if let Err(e) = ended {
        tracing::debug!(error = %e, client = %peer, "connection ended with an error");
    }
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
    let builder = Arc::new(http_builder(&listen));
    let listen = Arc::new(listen);
    let connections = Connections::new(listen.max_connections);
    // Every connection's task, handshakes included; `drain` ends the
    // served ones gracefully once accepting stopped.
    let tasks = tokio_util::task::TaskTracker::new();
    let drain = CancellationToken::new();
    let mut last_accept = std::time::Instant::now();
    loop {
        let room = tokio::select! {
            room = connections.room() => room,
            _ = shutdown.cancelled() => break,
        };
        let Ok(room) = room else { break };
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
        // The connection's clock starts now, not when room was taken for it.
        let slot = connections.open(room);
        let conn = slot.conn();
        let per_request = {
            let (service, conn) = (service.clone(), conn.clone());
            hyper::service::service_fn(move |req: Request<Incoming>| {
                let busy = conn.begin();
                let response = service(req, peer);
                async move {
                    let response = response.await;
                    drop(busy);
                    Ok::<_, Infallible>(response)
                }
            })
        };
        let (builder, listen, drain) = (builder.clone(), listen.clone(), drain.clone());
        let (id, stop) = (id.clone(), shutdown.clone());
        tasks.spawn(async move {
            let _slot = slot;
            let Some(tls) = &listen.tls else {
                let connection = builder
                    .serve_connection(TokioIo::new(stream), per_request)
                    .into_owned();
                serve_connection(connection, conn, &listen, drain, peer).await;
                return;
            };
            // TLS: the handshake runs here (a slow client never holds up
            // accepting) and ends at once with shutdown.
            let Some(tls) = tls_handshake(tls, stream, &conn, &listen, &id, &stop, peer).await
            else {
                return;
            };
            let connection = builder
                .serve_connection(TokioIo::new(tls), per_request)
                .into_owned();
            serve_connection(connection, conn, &listen, drain, peer).await;
        });
    }
    finish_connections(listener, last_accept, drain, tasks).await;
}

/// The HTTP/1 and HTTP/2 connection settings of `listen`.
fn http_builder(listen: &Listen) -> auto::Builder<TokioExecutor> {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if listen.http2_only {
        builder = builder.http2_only();
    }
    {
        let mut http1 = builder.http1();
        http1.timer(TokioTimer::new()).max_buf_size(H1_MAX_BUF);
        if let Some(timeout) = listen.read_header_timeout {
            http1.header_read_timeout(timeout);
        }
    }
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(None)
        .max_concurrent_streams(listen.max_concurrent_streams.max(1))
        .initial_stream_window_size(H2_STREAM_WINDOW)
        .initial_connection_window_size(H2_CONNECTION_WINDOW);
    builder
}

/// Runs the TLS handshake of a connection in its own task; `None` when it
/// failed, timed out, took too long for its slot, or `stop` came first.
async fn tls_handshake(
    tls: &ServerTls,
    stream: TcpStream,
    conn: &Conn,
    listen: &Listen,
    id: &str,
    stop: &CancellationToken,
    peer: SocketAddr,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let acceptor = tls.acceptor(listen.http2_only);
    let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream));
    tokio::select! {
        // A handshake takes its slot like a first request does: it
        // ends when that is due, or when evicted for a new client.
        _ = conn.unused(listen.first_request_timeout(), listen.idle_timeout) => None,
        r = handshake => match r {
            Ok(Ok(tls)) => Some(tls),
            Ok(Err(e)) => {
                tracing::debug!(listener = %id, client = %peer, error = %e, "TLS handshake failed");
                None
            }
            Err(_) => {
                tracing::debug!(listener = %id, client = %peer, "TLS handshake timed out");
                None
            }
        },
        _ = stop.cancelled() => None,
    }
}

/// Once accepting stopped: closes the listening socket, gives a connection
/// accepted a moment ago the time to send its first request, then ends every
/// served connection gracefully and waits for all of their tasks.
async fn finish_connections(
    listener: TcpListener,
    last_accept: std::time::Instant,
    drain: CancellationToken,
    tasks: tokio_util::task::TaskTracker,
) {
    drop(listener);
    // A connection accepted a moment ago has not sent its request yet; the
    // graceful end would close it unanswered. Give it that moment (a
    // receiver replaced by a reload hands its socket over, so its last
    // connections must still be served).
    if let Some(left) = FIRST_REQUEST_GRACE.checked_sub(last_accept.elapsed()) {
        tokio::time::sleep(left).await;
    }
    // Then every served connection finishes its requests and closes.
    drain.cancel();
    tasks.close();
    tasks.wait().await;
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
                let s = listen_on(addr)?;
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

/// The most connections the kernel holds for a listener before they are
/// accepted; Linux lowers it to `net.core.somaxconn` (4096 by default), as
/// Go's servers get. The 128 of `std::net::TcpListener::bind` made a burst of
/// new clients past it wait a second or more for their SYN to be sent again.
const LISTEN_BACKLOG: u32 = 65_535;

/// A new listening socket on `addr` (`SO_REUSEADDR`, as std binds it).
fn listen_on(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)?.into_std()
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

/// Longest tenant id (Pyroscope's rule, as its other checks).
pub const MAX_TENANT_ID_LENGTH: usize = 150;

/// The request's tenant (its `X-Scope-OrgID`, `None` when it names none),
/// or why it is no tenant Pyroscope would take: at most
/// [`MAX_TENANT_ID_LENGTH`] bytes of letters, digits and `!-_.*'()`, not
/// `.` or `..`. Receivers refuse such a request (400) before they read its
/// body, so a made-up name can neither reach a backend nor grow the
/// per-tenant tables.
pub fn request_tenant(headers: &hyper::HeaderMap) -> Result<Option<&str>, String> {
    let Some(value) = headers.get(TENANT_HEADER) else {
        return Ok(None);
    };
    let shown = || String::from_utf8_lossy(&value.as_bytes()[..value.len().min(64)]).into_owned();
    let tenant = value.to_str().map_err(|_| {
        format!(
            "X-Scope-OrgID {:?} is not text; send a tenant id of letters, digits and !-_.*'()",
            shown()
        )
    })?;
    if tenant.is_empty() {
        return Ok(None);
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || "!-_.*'()".contains(c);
    if tenant.len() > MAX_TENANT_ID_LENGTH
        || !tenant.chars().all(allowed)
        || tenant == "."
        || tenant == ".."
    {
        return Err(format!(
            "X-Scope-OrgID {:?} is not a tenant id: send at most {MAX_TENANT_ID_LENGTH} letters, digits and !-_.*'() (not . or ..), as Pyroscope takes them",
            shown()
        ));
    }
    Ok(Some(tenant))
}

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
            req.extensions_mut().insert(TenantBound);
        }
        Ok(())
    }
}

/// In a request's extensions: its `X-Scope-OrgID` is the tenant its bearer
/// token is bound to, which no label may change
/// (`BatchMeta::tenant_bound`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantBound;

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpStream;

    /// One slot, taken by a client trickling half a header: a new client
    /// gets it once that one has been idle a second, without waiting for the
    /// five seconds a connection with a request in flight gets to finish.
    #[tokio::test]
    async fn a_trickling_client_evicted_for_a_new_one_goes_at_once() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let listen = Listen {
            // Only eviction closes the trickler within this test.
            read_header_timeout: Some(Duration::from_secs(60)),
            ..Listen::new(1, None)
        };
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(accept_loop(
            listener,
            listen,
            shutdown.clone(),
            "test".into(),
            |_req, _peer| async { Response::new(String::from("ok")) },
        ));
        let mut trickler = TcpStream::connect(addr).await.unwrap();
        trickler.write_all(b"POST / HTTP/1.1\r\n").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        trickler.write_all(b"Host: a\r\n").await.unwrap();

        let started = tokio::time::Instant::now();
        let mut client = TcpStream::connect(addr).await.unwrap();
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(30), client.read_to_string(&mut answer))
            .await
            .expect("the new client is served")
            .unwrap();
        let waited = started.elapsed();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(
            waited < CLOSE_GRACE,
            "the trickler was closed at once, not after the grace of a busy connection: {waited:?}"
        );
        // Its slot went to the new client at once; it is closed within the
        // short grace of an unused connection (an end, or a reset: either
        // way the read returns).
        let mut rest = Vec::new();
        let end = tokio::time::timeout(
            UNUSED_CLOSE_GRACE + Duration::from_millis(500),
            trickler.read_to_end(&mut rest),
        )
        .await;
        assert!(end.is_ok(), "the trickler is closed");
        shutdown.cancel();
        server.await.unwrap();
    }

    /// A burst of clients larger than std's backlog of 128, none accepted
    /// yet, all connect at once: none waits for its SYN to be sent again
    /// (the first resend is a second later).
    #[tokio::test]
    async fn a_burst_of_clients_waits_in_the_backlog_not_in_syn_resends() {
        let listeners = Listeners::default();
        let listener = listeners.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let mut burst = Vec::new();
        for i in 0..400 {
            let connect =
                tokio::time::timeout(Duration::from_millis(900), TcpStream::connect(addr));
            match connect.await {
                Ok(Ok(c)) => burst.push(c),
                other => panic!("client {i} of the burst did not connect at once: {other:?}"),
            }
        }
        drop(listener);
    }
}
