//! The wire: one encoded `ExportProfilesServiceRequest` to the peer over
//! OTLP/gRPC or OTLP/HTTP, and the peer's answer as a [`PartialSuccess`] or
//! an [`ExportError`].
//!
//! Both protocols run on hyper-util's pooled client behind one rustls
//! connector (hyper-rustls), so TLS is set up once, the same way, for both.
//! A gRPC unary call is one HTTP/2 POST whose body is the message behind a
//! 5-byte prefix (compressed flag, length): proflow writes that frame itself
//! around bytes the exporter has already encoded and gzipped (at the fast
//! level, once; tonic's client would compress every message again at level
//! 6 with fresh state, which cost more than the rest of the export), and
//! reads the answer's `grpc-status` with tonic's status parsing.
//! hyper-util's client is the lightest maintained HTTP client that does
//! HTTP/1.1 and HTTP/2 (h2c for gRPC) and is already in the build through
//! hyper; reqwest would bring a second connection pool and more features
//! than a POST needs.
//!
//! The request bytes are sent as they are, never re-encoded; only the small
//! response is decoded.

use std::time::Duration;

use bytes::Bytes;
use http::Uri;
use http::header::{
    CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER,
};
use http::{Method, Request};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use proflow_core::component::ExportError;
use proflow_model::otlp::collector::ExportProfilesServiceResponse;
use prost::Message;

use crate::client::TlsSettings;
use crate::client::{self, Connector, MAX_RESPONSE_BYTES, status};

/// Where requests go, resolved from the config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Wire {
    /// gRPC to this origin (`http://` for h2c, `https://` for TLS).
    Grpc { origin: Uri },
    /// HTTP `POST` to this URL.
    Http { url: Uri, json: bool },
}

impl Wire {
    pub(crate) fn uses_tls(&self) -> bool {
        let uri = match self {
            Wire::Grpc { origin } => origin,
            Wire::Http { url, .. } => url,
        };
        uri.scheme_str() == Some("https")
    }
}

/// The gRPC method every OTLP profiles exporter calls.
pub(crate) const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

/// What a delivered request's response reported as refused: OTLP counts the
/// rejected profiles of the request but names none of them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct PartialSuccess {
    pub rejected_profiles: i64,
    pub error_message: String,
}

/// A connected-on-demand peer; cheap to share between queue consumers (the
/// clients pool their connections).
#[derive(Debug)]
pub(crate) struct Transport {
    kind: Kind,
    /// Configured headers, sent with every request.
    headers: HeaderMap,
    timeout: Duration,
    gzip: bool,
    /// The peer as logs and errors show it.
    shown: String,
}

#[derive(Debug)]
enum Kind {
    Grpc {
        client: Client<Connector, Full<Bytes>>,
        /// `origin` + the export path.
        url: Uri,
    },
    Http {
        client: Client<Connector, Full<Bytes>>,
        url: Uri,
        json: bool,
    },
}

impl Transport {
    /// Reads the TLS files (if any) and sets up the client; connects lazily.
    pub(crate) fn new(
        wire: &Wire,
        tls: &TlsSettings,
        headers: HeaderMap,
        timeout: Duration,
        gzip: bool,
    ) -> Result<Self, String> {
        let (kind, shown) = match wire {
            Wire::Grpc { origin } => {
                let client = client::grpc_client(tls, wire.uses_tls(), timeout)?;
                let url = format!("{}{EXPORT_PATH}", origin.to_string().trim_end_matches('/'))
                    .parse()
                    .map_err(|e| format!("`endpoint` {origin} does not make a URL: {e}"))?;
                (Kind::Grpc { client, url }, origin.to_string())
            }
            Wire::Http { url, json } => {
                let client = client::http_client(tls, wire.uses_tls(), timeout)?;
                (
                    Kind::Http {
                        client,
                        url: url.clone(),
                        json: *json,
                    },
                    url.to_string(),
                )
            }
        };
        Ok(Transport {
            kind,
            headers,
            timeout,
            gzip,
            shown,
        })
    }

    /// Whether the body given to [`Transport::send`] must be gzipped already
    /// (compression on: OTLP/HTTP sends it as the body, gRPC as a compressed
    /// message).
    pub(crate) fn wants_gzipped_body(&self) -> bool {
        self.gzip
    }

    /// Whether the body must be OTLP JSON rather than protobuf.
    pub(crate) fn wants_json(&self) -> bool {
        matches!(self.kind, Kind::Http { json: true, .. })
    }

    /// The peer as logs show it.
    pub(crate) fn shown(&self) -> &str {
        &self.shown
    }

    /// Sends one encoded request (gzipped already when
    /// [`Transport::wants_gzipped_body`]), with `extra` headers on top of the
    /// configured ones, bounded by the configured timeout.
    pub(crate) async fn send(
        &self,
        body: Bytes,
        extra: &[(HeaderName, HeaderValue)],
    ) -> Result<PartialSuccess, ExportError> {
        let mut headers = self.headers.clone();
        for (name, value) in extra {
            headers.insert(name.clone(), value.clone());
        }
        let call = async {
            match &self.kind {
                Kind::Grpc { client, url } => self.send_grpc(client, url, body, headers).await,
                Kind::Http { client, url, json } => {
                    self.send_http(client, url, *json, body, headers).await
                }
            }
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(result) => result,
            Err(_) => Err(ExportError::retryable(
                "timeout",
                format!(
                    "OTLP export to {} got no answer within {:?} (`timeout`)",
                    self.shown, self.timeout
                ),
            )),
        }
    }

    async fn send_grpc(
        &self,
        client: &Client<Connector, Full<Bytes>>,
        url: &Uri,
        body: Bytes,
        headers: HeaderMap,
    ) -> Result<PartialSuccess, ExportError> {
        let answer = client::unary(client, url, headers, body, self.gzip, self.timeout)
            .await
            .map_err(|s| status::grpc_error(&s, &format!("OTLP gRPC export to {}", self.shown)))?;
        // The request was delivered: an unreadable answer only loses the
        // partial-success report.
        Ok(grpc_partial_success(&answer).unwrap_or_default())
    }

    async fn send_http(
        &self,
        client: &Client<Connector, Full<Bytes>>,
        url: &Uri,
        json: bool,
        body: Bytes,
        mut headers: HeaderMap,
    ) -> Result<PartialSuccess, ExportError> {
        let content_type = if json {
            "application/json"
        } else {
            "application/x-protobuf"
        };
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if self.gzip {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = url.clone();
        *request.headers_mut() = headers;
        let unavailable = |what: &str, e: &dyn std::error::Error| {
            ExportError::retryable(
                "unavailable",
                format!(
                    "OTLP HTTP export to {} failed: {what}: {}",
                    self.shown,
                    status::error_chain(e)
                ),
            )
        };
        let response = client
            .request(request)
            .await
            .map_err(|e| unavailable("could not send", &e))?;
        let (parts, body) = response.into_parts();
        let body = Limited::new(body, MAX_RESPONSE_BYTES)
            .collect()
            .await
            .map(|c| c.to_bytes());
        let content_type = parts
            .headers
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let code = parts.status.as_u16();
        if parts.status.is_success() {
            // The request was delivered; an unreadable answer only loses the
            // partial-success report, so it must not fail the export.
            return Ok(body
                .ok()
                .and_then(|b| http_partial_success(content_type, &b))
                .unwrap_or_default());
        }
        let retry_after = parts
            .headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(status::parse_retry_after);
        let said = match &body {
            Ok(b) => status::http_body_message(content_type, b),
            Err(_) => "(the response body could not be read)".to_owned(),
        };
        Err(status::http_error(code, retry_after, &said, &self.shown))
    }
}

/// The partial success of a 2xx OTLP/HTTP answer (protobuf or JSON), if it
/// reports one.
pub(crate) fn http_partial_success(
    content_type: Option<&str>,
    body: &[u8],
) -> Option<PartialSuccess> {
    if body.is_empty() {
        return None;
    }
    let json = content_type.is_some_and(|c| c.trim_start().starts_with("application/json"));
    if json {
        let v: serde_json::Value = serde_json::from_slice(body).ok()?;
        let p = v
            .get("partialSuccess")
            .or_else(|| v.get("partial_success"))?;
        let rejected = p
            .get("rejectedProfiles")
            .or_else(|| p.get("rejected_profiles"))
            .and_then(|r| match r {
                serde_json::Value::String(s) => s.parse().ok(),
                other => other.as_i64(),
            })
            .unwrap_or(0);
        let message = p
            .get("errorMessage")
            .or_else(|| p.get("error_message"))
            .and_then(|m| m.as_str())
            .unwrap_or_default()
            .to_owned();
        Some(PartialSuccess {
            rejected_profiles: rejected,
            error_message: message,
        })
    } else {
        let r = ExportProfilesServiceResponse::decode(body).ok()?;
        r.partial_success.map(|p| PartialSuccess {
            rejected_profiles: p.rejected_profiles,
            error_message: p.error_message,
        })
    }
}

/// The partial success in a gRPC answer's message (an uncompressed frame).
fn grpc_partial_success(message: &[u8]) -> Option<PartialSuccess> {
    let (&flag, rest) = message.split_first()?;
    if flag != 0 || rest.len() < 4 {
        return None;
    }
    let (len, rest) = rest.split_at(4);
    let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
    let r = ExportProfilesServiceResponse::decode(rest.get(..len)?).ok()?;
    r.partial_success.map(|p| PartialSuccess {
        rejected_profiles: p.rejected_profiles,
        error_message: p.error_message,
    })
}
