//! The running `otlp` receiver: binds one listener per configured protocol
//! (with its `tls` and `auth`) and serves each with the pipeline's shared
//! accept loop (`proflow_net::server`).

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use proflow_core::component::{BuildError, Receiver, ReceiverContext, ServeFuture};
use proflow_model::otlp::AttributeLabels;
use proflow_net::server::{ListenerSettings, Listeners, Secured, TenantLimiter};
use tokio::net::TcpListener;

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
    tenant_limits: Option<Arc<TenantLimiter>>,
    local: LocalAddrs,
}

impl OtlpReceiver {
    pub(crate) fn new(
        grpc: Option<grpc::Settings>,
        http: Option<http::Settings>,
        labels: AttributeLabels,
        tenant_limits: Option<Arc<TenantLimiter>>,
    ) -> Self {
        OtlpReceiver {
            grpc,
            http,
            labels,
            tenant_limits,
            local: LocalAddrs::default(),
        }
    }

    /// A handle to the addresses this receiver will be bound to.
    pub fn local_addrs(&self) -> LocalAddrs {
        self.local.clone()
    }
}

/// The TLS and credentials of one protocol's listener, watched until the
/// receiver stops.
fn secure(
    ctx: &ReceiverContext,
    protocol: &str,
    listener: &ListenerSettings,
) -> Result<Secured, BuildError> {
    let (tls, auth) = (listener.tls.as_ref(), listener.auth.as_ref());
    Secured::start(tls, auth, &format!("{}/{protocol}", ctx.id), &ctx.shutdown)
        .map_err(|e| BuildError::new(format!("receiver `{}`: protocols.{protocol}.{e}", ctx.id)))
}

async fn bind(
    listeners: &Listeners,
    id: &str,
    what: &str,
    endpoint: SocketAddr,
) -> Result<(TcpListener, SocketAddr), BuildError> {
    let listener = listeners.bind(endpoint).map_err(|e| {
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
                let secured = secure(&ctx, "grpc", &settings.listener)?;
                let (listener, addr) =
                    bind(&ctx.listeners, &ctx.id, "OTLP/gRPC", settings.endpoint).await?;
                let _ = self.local.grpc.set(addr);
                Some((listener, settings, secured))
            }
            None => None,
        };
        let http = match self.http {
            Some(settings) => {
                let secured = secure(&ctx, "http", &settings.listener.listener)?;
                let (listener, addr) =
                    bind(&ctx.listeners, &ctx.id, "OTLP/HTTP", settings.endpoint).await?;
                let _ = self.local.http.set(addr);
                Some((listener, settings, secured))
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
            tenant_limits: self.tenant_limits,
        });
        let grpc = grpc.map(|(listener, settings, secured)| {
            grpc::serve(
                listener,
                settings,
                secured,
                handler.clone(),
                ctx.shutdown.clone(),
            )
        });
        let http = http.map(|(listener, settings, secured)| {
            http::serve(
                listener,
                settings,
                handler.clone(),
                secured,
                ctx.shutdown.clone(),
            )
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
