//! The admin HTTP server on `service.telemetry.address`: the status page
//! (`/`, `/status`: [`crate::status_page`]), `/metrics`
//! (Prometheus text), `/healthz`, `/readyz`, `/tenants` (each tenant's volume
//! and refusals), `/targets` and `/api/v1/targets`
//! (the pull receivers' targets, as Prometheus's targets API answers) and, when enabled, `POST /-/reload`. What it shows lives in
//! [`crate::telemetry`]; how it accepts connections (TLS, timeouts) in
//! [`proflow_net::server`].

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::get;
use tokio_util::sync::CancellationToken;

use crate::telemetry::Telemetry;
use proflow_net::server::{Listen, ServerTls, accept_loop};

/// Where `POST /-/reload` asks for a reload; the answer is a summary or
/// the errors of the new config.
pub type ReloadRequests =
    tokio::sync::mpsc::Sender<tokio::sync::oneshot::Sender<Result<String, String>>>;

/// Binds the telemetry address; an error names the address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await
}

/// Serves the status page (`/`, `/status`), `/metrics`, `/healthz`,
/// `/readyz`, `/tenants` and `/targets` on `listener`
/// until `shutdown`, over TLS when `tls` is set.
pub async fn serve(
    telemetry: Arc<Telemetry>,
    listener: tokio::net::TcpListener,
    tls: Option<Arc<ServerTls>>,
    reload: Option<ReloadRequests>,
    shutdown: CancellationToken,
) {
    let t = telemetry.clone();
    let t2 = telemetry.clone();
    let t3 = telemetry.clone();
    let t4 = telemetry.clone();
    let t5 = telemetry;
    // The status page, at `/` and `/status`.
    let status = get(move || {
        let t = t5.clone();
        async move {
            (
                [
                    ("content-type", "text/html; charset=utf-8"),
                    ("cache-control", "no-store"),
                ],
                crate::status_page::render(&t),
            )
        }
    });
    // Prometheus's targets API, at its own path too, for the tools that read it.
    let targets = get(
        move |axum::extract::Query(q): axum::extract::Query<Vec<(String, String)>>| {
            let t = t3.clone();
            async move {
                let state = q
                    .iter()
                    .find(|(k, _)| k == "state")
                    .map(|(_, v)| v.as_str());
                axum::Json(t.targets_json(state))
            }
        },
    );
    let app = Router::new()
        .route(
            "/metrics",
            get(move |headers: axum::http::HeaderMap| {
                let t = t.clone();
                async move {
                    // The text is OpenMetrics (a counter's family without
                    // `_total`, `# EOF`): said so to whoever accepts it, as
                    // Prometheus does by default, so it types each family.
                    let open_metrics = headers
                        .get_all("accept")
                        .iter()
                        .filter_map(|v| v.to_str().ok())
                        .any(|v| v.contains("application/openmetrics-text"));
                    let content_type = if open_metrics {
                        "application/openmetrics-text; version=1.0.0; charset=utf-8"
                    } else {
                        "text/plain; version=0.0.4; charset=utf-8"
                    };
                    ([("content-type", content_type)], t.render())
                }
            }),
        )
        .route("/", status.clone())
        .route("/status", status)
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/tenants",
            get(move || {
                let t = t4.clone();
                async move { axum::Json(t.tenants_json()) }
            }),
        )
        .route("/targets", targets.clone())
        .route("/api/v1/targets", targets)
        .route(
            "/readyz",
            get(move || {
                let t = t2.clone();
                async move {
                    if t.is_ready() {
                        (StatusCode::OK, "ready\n").into_response()
                    } else {
                        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n").into_response()
                    }
                }
            }),
        );
    let app = match reload {
        Some(requests) => app.route(
            "/-/reload",
            axum::routing::post(move || {
                let requests = requests.clone();
                async move {
                    let (tx, rx) = tokio::sync::oneshot::channel();
                    if requests.send(tx).await.is_err() {
                        return (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the collector is stopping\n".to_owned(),
                        );
                    }
                    match rx.await {
                        Ok(Ok(summary)) => (StatusCode::OK, format!("reloaded: {summary}\n")),
                        Ok(Err(e)) => (StatusCode::BAD_REQUEST, format!("{e}\n")),
                        Err(_) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            "the collector is stopping\n".to_owned(),
                        ),
                    }
                }
            }),
        ),
        None => app,
    };
    let listen = Listen {
        read_header_timeout: Some(std::time::Duration::from_secs(10)),
        ..Listen::new(1024, tls)
    };
    accept_loop(
        listener,
        listen,
        shutdown,
        "telemetry".to_owned(),
        move |req, _peer| {
            let mut app = app.clone();
            async move {
                match tower::Service::call(&mut app, req.map(axum::body::Body::new)).await {
                    Ok(response) => response,
                    Err(never) => match never {},
                }
            }
        },
    )
    .await;
}
