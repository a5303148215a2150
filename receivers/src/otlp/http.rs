//! OTLP/HTTP: `POST /v1development/profiles`, answered as the OpenTelemetry
//! Collector answers: an `ExportProfilesServiceResponse` in the request's
//! encoding (protobuf or JSON) on success, a `google.rpc.Status` in that
//! encoding for a refused request, and plain text for a wrong path (404),
//! method (405) or content type (415). Throttling (429) carries
//! `Retry-After`.
//!
//! The body is read within `max_request_body_size` and `read_timeout`,
//! every byte granted from the memory budget before it is allocated; a gzip
//! body inflates within `max_decompressed_size`, likewise granted.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{self, HeaderMap, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use proflow_model::inflate::{self, InflateError};
use proflow_model::memory::MemoryGrant;
use proflow_model::otlp::collector::ExportProfilesServiceResponse;
use prost::Message;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::error::{OtlpError, Refused};
use super::export::{Encoding, Handler, Origin};
use proflow_net::server::body::{declared_length, read_body};
use proflow_net::server::{HttpListenerSettings, Secured, TenantBound, accept_loop};

/// The one path profiles are posted to.
pub(crate) const PROFILES_PATH: &str = "/v1development/profiles";
/// Where traces go (for a receiver in a traces pipeline).
pub(crate) const TRACES_PATH: &str = "/v1/traces";

/// What a request was answered with.
enum Reply {
    Profiles(ExportProfilesServiceResponse),
    Traces(proflow_model::spans::ExportTraceServiceResponse),
}

/// The header multi-tenant backends read the tenant from.
pub(crate) const TENANT_HEADER: &str = "x-scope-orgid";

/// How much gzip inflation reads at a time.
const INFLATE_STEP: usize = 32 << 10;

/// The HTTP protocol's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    pub endpoint: SocketAddr,
    pub max_request_body: usize,
    pub max_decompressed: usize,
    pub max_decoded: usize,
    pub listener: HttpListenerSettings,
}

struct Http {
    settings: Settings,
    handler: Arc<Handler>,
    secured: Secured,
}

/// Serves OTLP/HTTP on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    settings: Settings,
    handler: Arc<Handler>,
    secured: Secured,
    shutdown: CancellationToken,
) {
    let id = handler.id.clone();
    let listen = settings.listener.listen(secured.tls.clone());
    let http = Arc::new(Http {
        settings,
        handler,
        secured,
    });
    accept_loop(listener, listen, shutdown, id, move |req, peer| {
        let http = http.clone();
        async move { http.handle(req, peer).await }
    })
    .await;
}

/// The protobuf or JSON media type of a request, as it named it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MediaType {
    encoding: Encoding,
    name: &'static str,
}

/// Reads `Content-Type` as the collector does: the media type without its
/// parameters, case-insensitive.
fn media_type(headers: &HeaderMap) -> Option<MediaType> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    let essence = value
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let (encoding, name) = match essence.as_str() {
        "application/x-protobuf" => (Encoding::Protobuf, "application/x-protobuf"),
        "application/protobuf" => (Encoding::Protobuf, "application/protobuf"),
        "application/json" => (Encoding::Json, "application/json"),
        _ => return None,
    };
    Some(MediaType { encoding, name })
}

fn text(status: StatusCode, message: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(message)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn body_of(media: &MediaType, status: StatusCode, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(media.name));
    response
}

/// An export response in OTLP JSON: `{}`, or its partial success with the
/// count under `rejected` (`rejectedProfiles`, `rejectedSpans`).
fn response_json(rejected: &str, partial: Option<(i64, &str)>) -> Vec<u8> {
    let body = match partial {
        Some((n, message)) => serde_json::json!({"partialSuccess": {
            rejected: n.to_string(),
            "errorMessage": message,
        }}),
        None => serde_json::json!({}),
    };
    body.to_string().into_bytes()
}

/// The response for a refusal: text for what the collector answers in text,
/// a `google.rpc.Status` in the request's encoding otherwise.
fn refusal(error: &OtlpError, media: Option<&MediaType>) -> Response<Full<Bytes>> {
    let status = error.http_status();
    let mut response = match (error, media) {
        (
            OtlpError::MethodNotAllowed(_)
            | OtlpError::NotFound(_)
            | OtlpError::UnsupportedMediaType(_),
            _,
        )
        | (_, None) => text(status, error.to_string()),
        (_, Some(media)) => {
            let rpc = error.rpc_status();
            let body = match media.encoding {
                Encoding::Protobuf => rpc.encode_to_vec(),
                Encoding::Json => rpc.to_json(),
            };
            body_of(media, status, body)
        }
    };
    let headers = response.headers_mut();
    if let Some(retry_after) = error.retry_after() {
        // Whole seconds, rounded up and at least 1.
        let secs = retry_after
            .as_secs()
            .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
            .max(1);
        headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    if matches!(error, OtlpError::MethodNotAllowed(_)) {
        headers.insert(header::ALLOW, HeaderValue::from_static("POST"));
    }
    // A refusal may come before the body was read: the connection cannot be
    // reused then, so say so rather than let the client's next request race
    // the close.
    headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

impl Http {
    async fn handle(&self, mut req: Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
        let media = media_type(req.headers());
        // Credentials first: a request without them is refused unread.
        if let Err(why) = self.secured.authenticate(&mut req).await {
            let refused = Refused::from(OtlpError::Unauthenticated(why.to_string()));
            self.handler.refused(&refused);
            let mut response = refusal(&refused.error, media.as_ref());
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer, Basic realm=\"proflow\""),
            );
            return response;
        }
        match self.export(req, peer, media.clone()).await {
            Ok((media, reply)) => {
                let body = match (media.encoding, reply) {
                    (Encoding::Protobuf, Reply::Profiles(r)) => r.encode_to_vec(),
                    (Encoding::Json, Reply::Profiles(r)) => response_json(
                        "rejectedProfiles",
                        r.partial_success
                            .as_ref()
                            .map(|p| (p.rejected_profiles, p.error_message.as_str())),
                    ),
                    (Encoding::Protobuf, Reply::Traces(r)) => r.encode_to_vec(),
                    (Encoding::Json, Reply::Traces(r)) => response_json(
                        "rejectedSpans",
                        r.partial_success
                            .as_ref()
                            .map(|p| (p.rejected_spans, p.error_message.as_str())),
                    ),
                };
                body_of(&media, StatusCode::OK, body)
            }
            Err(refused) => {
                self.handler.refused(&refused);
                refusal(&refused.error, media.as_ref())
            }
        }
    }

    async fn export(
        &self,
        req: Request<Incoming>,
        peer: SocketAddr,
        media: Option<MediaType>,
    ) -> Result<(MediaType, Reply), Refused> {
        let traces = match req.uri().path() {
            PROFILES_PATH => false,
            TRACES_PATH => true,
            other => return Err(OtlpError::NotFound(other.to_owned()).into()),
        };
        if req.method() != Method::POST {
            return Err(OtlpError::MethodNotAllowed(req.method().to_string()).into());
        }
        let media = media.ok_or_else(|| {
            OtlpError::UnsupportedMediaType(
                "unsupported Content-Type; send application/x-protobuf (or application/protobuf) or application/json".to_owned(),
            )
        })?;
        // A signal this receiver has no pipeline for is refused before its
        // body is read.
        if traces {
            self.handler.span_consumer()?;
        } else {
            self.handler.takes_profiles()?;
        }
        let gzip = content_encoding_is_gzip(req.headers())?;
        let (parts, body) = req.into_parts();
        let origin = Origin {
            tenant: parts
                .headers
                .get(TENANT_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            tenant_bound: parts.extensions.get::<TenantBound>().is_some(),
            client: Some(peer),
        };
        let (body, mut grant) = self.read_body(&parts.headers, body).await?;
        let body = if gzip {
            let limit = self.settings.max_decompressed;
            let inflated = if body.len() <= INFLATE_STEP {
                inflate(&body, limit, &mut grant)
            } else {
                let compressed = body.clone();
                let (inflated, back) = tokio::task::spawn_blocking(move || {
                    let inflated = inflate(&compressed, limit, &mut grant);
                    (inflated, grant)
                })
                .await
                .map_err(|e| OtlpError::Internal(format!("the decompression task failed: {e}")))?;
                grant = back;
                inflated
            }?;
            // The compressed body is no longer held.
            grant.shrink(body.len());
            drop(body);
            Bytes::from(inflated)
        } else {
            body
        };
        if traces {
            let response = self
                .handler
                .export_spans(body, media.encoding, grant, self.settings.max_decoded)
                .await?;
            return Ok((media, Reply::Traces(response)));
        }
        let response = self
            .handler
            .export(
                body,
                media.encoding,
                grant,
                self.settings.max_decoded,
                origin,
            )
            .await?;
        Ok((media, Reply::Profiles(response)))
    }

    /// Reads the whole body within `read_timeout` and
    /// `max_request_body_size` (a larger declared `Content-Length` is
    /// refused before anything is read), every byte of the buffer granted
    /// from the in-flight memory budget as it arrives.
    async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Incoming,
    ) -> Result<(Bytes, MemoryGrant), OtlpError> {
        // A tenant's grant: held to its share when memory is contended.
        let tenant = proflow_net::server::request_tenant(headers).map_err(OtlpError::BadRequest)?;
        let mut grant = self.handler.memory.grant_for(tenant);
        let body = read_body(
            body,
            declared_length(headers),
            self.settings.max_request_body,
            &mut grant,
            self.settings.listener.listener.read_timeout.get(),
        )
        .await
        .map_err(|e| {
            OtlpError::from_body(e, |limit| format!(
                "request body exceeds max_request_body_size ({limit} bytes); send smaller requests or raise max_request_body_size"
            ))
        })?;
        Ok((body, grant))
    }
}

/// Whether the body is gzip; other encodings are refused (415).
fn content_encoding_is_gzip(headers: &HeaderMap) -> Result<bool, OtlpError> {
    let Some(value) = headers.get(header::CONTENT_ENCODING) else {
        return Ok(false);
    };
    let value = value.to_str().unwrap_or("?").trim().to_ascii_lowercase();
    match value.as_str() {
        "" | "identity" => Ok(false),
        "gzip" | "x-gzip" => Ok(true),
        other => Err(OtlpError::UnsupportedMediaType(format!(
            "unsupported Content-Encoding {other:?}: send gzip or uncompressed (identity) bodies"
        ))),
    }
}

/// Inflates a gzip body to at most `limit` bytes, growing `grant` before
/// every allocation of the output buffer.
pub(super) fn inflate(
    compressed: &[u8],
    limit: usize,
    grant: &mut MemoryGrant,
) -> Result<Vec<u8>, OtlpError> {
    inflate::inflate(compressed, limit, grant).map_err(|e| match e {
        InflateError::Corrupt(detail) => OtlpError::bad_request(format!(
            "the gzip request body is corrupt ({detail}); send a valid gzip stream or an uncompressed body"
        )),
        InflateError::TooLarge { limit } => OtlpError::TooLarge(format!(
            "the gzip request body exceeds max_decompressed_size ({limit} bytes) once decompressed; send smaller requests or raise max_decompressed_size"
        )),
        InflateError::OverBudget(e) => OtlpError::from_memory(e),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_model::memory::MemoryBudget;

    #[test]
    fn media_types_are_read_as_the_collector_reads_them() {
        let of = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(v));
            media_type(&h).map(|m| m.encoding)
        };
        assert_eq!(of("application/x-protobuf"), Some(Encoding::Protobuf));
        assert_eq!(of("Application/Protobuf"), Some(Encoding::Protobuf));
        assert_eq!(of("application/json; charset=utf-8"), Some(Encoding::Json));
        assert_eq!(of("text/plain"), None);
        assert_eq!(media_type(&HeaderMap::new()), None);
    }

    #[test]
    fn inflation_is_bounded_by_the_setting_and_the_grant() {
        let memory = MemoryBudget::new(1 << 20);
        let mut grant = memory.grant();
        let gz = proflow_model::pprof::gzip(&[7u8; 1000]);
        assert_eq!(inflate(&gz, 1000, &mut grant).unwrap().len(), 1000);
        assert!(grant.held() >= 1000);
        let err = inflate(&gz, 999, &mut grant).unwrap_err();
        assert_eq!(err.http_status(), StatusCode::PAYLOAD_TOO_LARGE);
        let bomb = proflow_model::pprof::gzip(&vec![0u8; 4 << 20]);
        let mut small = memory.grant();
        // More than one request may ever hold: 413, sending again cannot help.
        let err = inflate(&bomb, 8 << 20, &mut small).unwrap_err();
        assert_eq!(err.reason(), "too_large", "{err}");
        assert!(err.to_string().contains("max_in_flight_bytes"), "{err}");
        assert_eq!(small.held(), 0);
        // What could fit but is held elsewhere now: 429.
        let mut hog = memory.grant();
        hog.try_grow(900 << 10).unwrap();
        let some = proflow_model::pprof::gzip(&vec![0u8; 200 << 10]);
        let err = inflate(&some, 8 << 20, &mut small).unwrap_err();
        assert_eq!(err.reason(), "memory_limit", "{err}");
        drop(hog);
        let err = inflate(&[0x1f, 0x8b, 1, 2], 100, &mut small).unwrap_err();
        assert_eq!(err.http_status(), StatusCode::BAD_REQUEST);
    }
}
