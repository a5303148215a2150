//! The running `otlp` receiver: binds one listener per configured protocol
//! and serves each with [`accept_loop`]: at most `max_connections`
//! connections at once (the rest wait in the kernel's backlog, costing
//! nothing), a header timeout for HTTP/1, and a graceful end on shutdown
//! (open connections finish their requests).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use proflow_pipeline::component::{BuildError, Receiver, ReceiverContext, ServeFuture};
use proflow_pipeline::otlp::AttributeLabels;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::export::Handler;
use super::{grpc, http};

/// The addresses a receiver listens on, known once [`Receiver::start`] has
/// bound them (tests with `endpoint: 127.0.0.1:0` read the real ports here).
#[derive(Debug, Clone, Default)]
pub struct LocalAddrs {
    grpc: Arc<OnceLock<SocketAddr>>,
    http: Arc<OnceLock<SocketAddr>>,
}

impl LocalAddrs {
    /// The gRPC listener's address, once started (if gRPC is configured).
    pub fn grpc(&self) -> Option<SocketAddr> {
        self.grpc.get().copied()
    }

    /// The HTTP listener's address, once started (if HTTP is configured).
    pub fn http(&self) -> Option<SocketAddr> {
        self.http.get().copied()
    }
}

/// A built, not yet started `otlp` receiver.
#[derive(Debug)]
pub struct OtlpReceiver {
    grpc: Option<grpc::Settings>,
    http: Option<http::Settings>,
    labels: AttributeLabels,
    local: LocalAddrs,
}

impl OtlpReceiver {
    pub(crate) fn new(
        grpc: Option<grpc::Settings>,
        http: Option<http::Settings>,
        labels: AttributeLabels,
    ) -> Self {
        OtlpReceiver {
            grpc,
            http,
            labels,
            local: LocalAddrs::default(),
        }
    }

    /// A handle to the addresses this receiver will be bound to.
    pub fn local_addrs(&self) -> LocalAddrs {
        self.local.clone()
    }
}

async fn bind(
    id: &str,
    what: &str,
    endpoint: SocketAddr,
) -> Result<(TcpListener, SocketAddr), BuildError> {
    let listener = TcpListener::bind(endpoint).await.map_err(|e| {
        BuildError::new(format!(
            "receiver `{id}`: cannot listen for {what} on {endpoint}: {e}"
        ))
    })?;
    let addr = listener.local_addr().map_err(|e| {
        BuildError::new(format!(
            "receiver `{id}`: cannot read the address bound for {endpoint}: {e}"
        ))
    })?;
    tracing::info!(receiver = %id, %addr, "otlp receiver listening for {what}");
    Ok((listener, addr))
}

#[async_trait]
impl Receiver for OtlpReceiver {
    async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError> {
        // Both listeners are bound before either serves, so a port in use
        // fails the start as a whole.
        let grpc = match self.grpc {
            Some(settings) => {
                let (listener, addr) = bind(&ctx.id, "OTLP/gRPC", settings.endpoint).await?;
                let _ = self.local.grpc.set(addr);
                Some((listener, settings))
            }
            None => None,
        };
        let http = match self.http {
            Some(settings) => {
                let (listener, addr) = bind(&ctx.id, "OTLP/HTTP", settings.endpoint).await?;
                let _ = self.local.http.set(addr);
                Some((listener, settings))
            }
            None => None,
        };
        let handler = Arc::new(Handler {
            id: ctx.id.clone(),
            receiver: Arc::from(ctx.id.as_str()),
            labels: self.labels,
            consumer: ctx.consumer,
            telemetry: ctx.telemetry,
            memory: ctx.memory,
            takes_profiles: ctx.takes_profiles,
            spans: ctx.spans,
        });
        let grpc = grpc.map(|(listener, settings)| {
            grpc::serve(listener, settings, handler.clone(), ctx.shutdown.clone())
        });
        let http = http.map(|(listener, settings)| {
            http::serve(listener, settings, handler.clone(), ctx.shutdown.clone())
        });
        let id = ctx.id;
        Ok(Box::pin(async move {
            let grpc = async {
                if let Some(grpc) = grpc {
                    grpc.await;
                }
            };
            let http = async {
                if let Some(http) = http {
                    http.await;
                }
            };
            tokio::join!(grpc, http);
            tracing::info!(receiver = %id, "otlp receiver stopped");
        }))
    }
}

/// How [`accept_loop`] serves connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Listen {
    pub max_connections: usize,
    /// HTTP/1 header read timeout (`None` for HTTP/2 only).
    pub read_header_timeout: Option<Duration>,
    /// Serve HTTP/2 only (gRPC).
    pub http2_only: bool,
}

/// Accepts connections until `shutdown` and serves each request with
/// `service(request, client address)`; then lets the open connections
/// finish their requests.
pub(crate) async fn accept_loop<S, F, B>(
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
    let graceful = GracefulShutdown::new();
    let connections = Arc::new(Semaphore::new(listen.max_connections.max(1)));
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
                tracing::warn!(receiver = %id, error = %e, "cannot accept a connection");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let service = service.clone();
        let per_request = hyper::service::service_fn(move |req: Request<Incoming>| {
            let response = service(req, peer);
            async move { Ok::<_, Infallible>(response.await) }
        });
        let connection = graceful.watch(
            builder
                .serve_connection(TokioIo::new(stream), per_request)
                .into_owned(),
        );
        tokio::spawn(async move {
            // Errors are the client's doing (reset, timeout, bad framing).
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, client = %peer, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
}
