//! Why a request was refused, and how that is told to the client: an HTTP
//! status, a Connect error code and a message that says what to do, in the
//! Connect JSON error form `{"code": "...", "message": "..."}` on every endpoint
//! (Pyroscope's own clients only log the body; Connect clients read the code).

use std::time::Duration;

use proflow_core::component::PushRefusal;
use proflow_net::server::body::BodyError;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use proflow_model::pprof::DecodeError;

/// Why a request was refused. The variant decides status, Connect code and the
/// telemetry reason; the message is for the person reading the client's log.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IngestError {
    /// The request is malformed; sending it again cannot help.
    #[error("{0}")]
    BadRequest(String),
    /// The body on the wire is larger than `max_request_body_size`.
    #[error(
        "request body exceeds max_request_body_size ({limit} bytes); send smaller requests or raise max_request_body_size"
    )]
    BodyTooLarge { limit: usize },
    /// A text body converts to more than `max_text_stacks` or
    /// `max_text_frames` allow.
    #[error("{0}")]
    TooComplex(String),
    /// Something grew past `max_decompressed_size` when decompressed.
    #[error(
        "{what} exceeds max_decompressed_size ({limit} bytes) once decompressed (the limit covers everything one request decompresses); send smaller or fewer profiles per request or raise max_decompressed_size"
    )]
    DecompressedTooLarge { what: String, limit: usize },
    /// A content type, content encoding or format this receiver does not read.
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("method {method} is not allowed on {path}; send POST")]
    MethodNotAllowed { method: String, path: String },
    #[error(
        "no endpoint at {path}; profiles go to POST /ingest, /pyroscope/ingest or /push.v1.PusherService/Push"
    )]
    NotFound { path: String },
    /// The pipeline is full: retry after the given time.
    #[error("{detail}; retry after {retry_after:?}")]
    Backpressure {
        retry_after: Duration,
        detail: String,
    },
    /// The collector's in-flight memory budget is spent: retry later.
    #[error("{0}")]
    MemoryLimit(String),
    /// The tenant's `limits` rate is spent: retry after the time it says.
    #[error("{}", .0.message())]
    RateLimited(proflow_net::server::RateLimited),
    /// A series or profile past one of the tenant's `limits` other than
    /// the rate (Pyroscope's 400, its reason and words).
    #[error("{}", .0.message)]
    Limit(proflow_net::server::LimitRefused),
    /// The body did not arrive within `read_timeout`.
    #[error(
        "the request body did not arrive within read_timeout ({0:?}); send it faster or in smaller requests"
    )]
    Timeout(Duration),
    /// The body came slower than the least rate a body must keep.
    #[error("{0}")]
    SlowBody(String),
    #[error("the collector is shutting down and takes no new data; retry later")]
    ShuttingDown,
    /// `auth` is set and the request's credentials are missing or wrong.
    #[error(
        "{0}; send `Authorization: Bearer <token>` or basic auth credentials this receiver knows"
    )]
    Unauthenticated(String),
    /// A bug on our side (a decoding task died); the request may be retried.
    #[error("internal error: {0}; please report it")]
    Internal(String),
}

impl IngestError {
    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        IngestError::BadRequest(message.into())
    }

    /// A request the memory budget cannot take: 429 (retry later), or 413
    /// when no single request may ever hold that much.
    pub(crate) fn from_memory(e: proflow_model::memory::OverBudget) -> Self {
        if e.never {
            IngestError::TooComplex(e.to_string())
        } else {
            IngestError::MemoryLimit(e.to_string())
        }
    }

    /// A body that could not be read.
    pub(crate) fn from_body(e: BodyError) -> Self {
        match e {
            BodyError::TooLarge { limit } => IngestError::BodyTooLarge { limit },
            BodyError::OverBudget(e) => IngestError::from_memory(e),
            BodyError::Unreadable(_) => IngestError::bad_request(e.to_string()),
            BodyError::TimedOut(t) => IngestError::Timeout(t),
            BodyError::TooSlow => IngestError::SlowBody(e.to_string()),
        }
    }

    /// Maps a failure to read or convert a text body to a refusal.
    pub(crate) fn from_text(e: super::folded::FoldedError) -> Self {
        use super::folded::FoldedError;
        match e {
            FoldedError::BadCount { .. } | FoldedError::Malformed(_) => {
                IngestError::BadRequest(e.to_string())
            }
            FoldedError::TooManyStacks { .. } | FoldedError::TooManyFrames { .. } => {
                IngestError::TooComplex(e.to_string())
            }
            FoldedError::Memory(e) => IngestError::from_memory(e),
        }
    }

    /// Maps a pprof decoding failure of `what` (such as "profile 2") to a refusal.
    pub(crate) fn from_decode(what: &str, e: DecodeError) -> Self {
        match e {
            DecodeError::TooLarge { limit } => IngestError::DecompressedTooLarge {
                what: what.to_owned(),
                limit,
            },
            DecodeError::Gzip(detail) => IngestError::BadRequest(format!(
                "{what}: corrupt gzip data ({detail}); send a valid gzip stream or uncompressed data"
            )),
            DecodeError::Protobuf(detail) => IngestError::BadRequest(format!(
                "{what}: not a valid pprof protobuf ({detail}); send a pprof profile, plain or gzip-compressed"
            )),
            e @ (DecodeError::TooManyElements { .. } | DecodeError::DecodedTooLarge { .. }) => {
                IngestError::BadRequest(format!("{what}: {e}"))
            }
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            IngestError::Limit(r) if r.exhausted => StatusCode::TOO_MANY_REQUESTS,
            IngestError::BadRequest(_) | IngestError::Limit(_) => StatusCode::BAD_REQUEST,
            IngestError::BodyTooLarge { .. }
            | IngestError::DecompressedTooLarge { .. }
            | IngestError::TooComplex(_) => StatusCode::PAYLOAD_TOO_LARGE,
            IngestError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            IngestError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            IngestError::NotFound { .. } => StatusCode::NOT_FOUND,
            IngestError::Backpressure { .. }
            | IngestError::MemoryLimit(_)
            | IngestError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            IngestError::Timeout(_) | IngestError::SlowBody(_) => StatusCode::REQUEST_TIMEOUT,
            IngestError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            IngestError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            IngestError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The Connect error code. Connect derives the HTTP status from the code;
    /// where HTTP has a more precise status (413, 415, 405) we send that status
    /// and the closest code, which Connect clients read from the body.
    pub fn code(&self) -> &'static str {
        match self {
            IngestError::Limit(r) if r.exhausted => "resource_exhausted",
            IngestError::BadRequest(_) | IngestError::Limit(_) => "invalid_argument",
            IngestError::BodyTooLarge { .. }
            | IngestError::DecompressedTooLarge { .. }
            | IngestError::TooComplex(_)
            | IngestError::Backpressure { .. }
            | IngestError::MemoryLimit(_)
            | IngestError::RateLimited(_) => "resource_exhausted",
            IngestError::Timeout(_) | IngestError::SlowBody(_) => "deadline_exceeded",
            IngestError::UnsupportedMediaType(_)
            | IngestError::MethodNotAllowed { .. }
            | IngestError::NotFound { .. } => "unimplemented",
            IngestError::ShuttingDown => "unavailable",
            IngestError::Unauthenticated(_) => "unauthenticated",
            IngestError::Internal(_) => "internal",
        }
    }

    /// The `reason` label of the refused-requests metric.
    pub fn reason(&self) -> &'static str {
        match self {
            IngestError::BadRequest(_) => "bad_request",
            IngestError::BodyTooLarge { .. }
            | IngestError::DecompressedTooLarge { .. }
            | IngestError::TooComplex(_) => "too_large",
            IngestError::UnsupportedMediaType(_) => "unsupported_media_type",
            IngestError::MethodNotAllowed { .. } => "method_not_allowed",
            IngestError::NotFound { .. } => "not_found",
            IngestError::Backpressure { .. } => "backpressure",
            IngestError::MemoryLimit(_) => "memory_limit",
            IngestError::RateLimited(_) => "rate_limited",
            IngestError::Limit(r) => r.reason,
            IngestError::Timeout(_) | IngestError::SlowBody(_) => "timeout",
            IngestError::ShuttingDown => "shutting_down",
            IngestError::Unauthenticated(_) => "unauthenticated",
            IngestError::Internal(_) => "internal",
        }
    }
}

/// What a client refused for memory is told to wait.
const MEMORY_RETRY_AFTER: Duration = Duration::from_secs(1);

impl From<PushRefusal> for IngestError {
    fn from(refusal: PushRefusal) -> Self {
        match refusal {
            PushRefusal::RetryLater {
                retry_after,
                detail,
            } => IngestError::Backpressure {
                retry_after,
                detail,
            },
            PushRefusal::ShuttingDown => IngestError::ShuttingDown,
        }
    }
}

/// A refusal with the number of profiles the request carried, when known
/// (0 when the request was refused before its profiles were counted).
#[derive(Debug)]
pub(crate) struct Refused {
    pub error: IngestError,
    pub profiles: u64,
}

impl From<IngestError> for Refused {
    fn from(error: IngestError) -> Self {
        Refused { error, profiles: 0 }
    }
}

impl IntoResponse for IngestError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.code(), "message": self.to_string() });
        let mut response = (self.status(), axum::Json(body)).into_response();
        let retry_after = match &self {
            IngestError::Backpressure { retry_after, .. } => Some(*retry_after),
            IngestError::MemoryLimit(_) => Some(MEMORY_RETRY_AFTER),
            IngestError::RateLimited(r) => r.retry_after,
            _ => None,
        };
        if let Some(retry_after) = retry_after {
            // Whole seconds, rounded up and at least 1 so a client never
            // retries in a tight loop.
            let secs = retry_after
                .as_secs()
                .saturating_add(u64::from(retry_after.subsec_nanos() > 0))
                .max(1);
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        // A refusal may come before the body was read (size, memory, method,
        // query); the server then cannot reuse the connection, so say so, or a
        // client's next request on it races the close and fails.
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        if matches!(self, IngestError::MethodNotAllowed { .. }) {
            response
                .headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
        }
        response
    }
}
