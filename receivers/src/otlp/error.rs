//! Why a request was refused, and how each protocol says so: an HTTP status
//! and a gRPC code (as the OpenTelemetry Collector maps them), the telemetry
//! reason, and a message that says what to do.

use std::time::Duration;

use proflow_core::component::PushRefusal;
use proflow_net::server::body::BodyError;

use hyper::StatusCode;

/// What a client refused for memory is told to wait.
pub(crate) const MEMORY_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OtlpError {
    /// The request is malformed (undecodable, or its dictionary is broken);
    /// sending it again cannot help.
    #[error("{0}")]
    BadRequest(String),
    /// The request is larger than a configured limit.
    #[error("{0}")]
    TooLarge(String),
    /// A content type or encoding this receiver does not read.
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("method {0} is not allowed here; send POST")]
    MethodNotAllowed(String),
    #[error(
        "no endpoint at {0}; OTLP profiles go to POST /v1development/profiles (and traces, for a receiver in a traces pipeline, to POST /v1/traces)"
    )]
    NotFound(String),
    /// A signal this receiver is in no pipeline for.
    #[error("{0}")]
    NotServed(String),
    /// `auth` is set and the request's credentials are missing or wrong.
    #[error("{0}")]
    Unauthenticated(String),
    /// The pipeline is full: retry after the given time.
    #[error("{detail}; retry after {retry_after:?}")]
    Backpressure {
        retry_after: Duration,
        detail: String,
    },
    /// The collector's in-flight memory budget is spent: retry later.
    /// (A request no single grant could ever hold is [`OtlpError::from_memory`]'s
    /// `TooLarge` instead.)
    #[error("{0}")]
    MemoryLimit(String),
    /// The tenant's `limits` rate is spent: retry after the time it says.
    #[error("{}", .0.message())]
    RateLimited(proflow_net::server::RateLimited),
    /// A series or profile past one of the tenant's `limits` other than
    /// the rate (Pyroscope's 400, its reason and words).
    #[error("{}", .0.message)]
    Limit(proflow_net::server::LimitRefused),
    /// The request did not arrive within `read_timeout`.
    #[error(
        "the request did not arrive within read_timeout ({0:?}); send it faster or in smaller requests"
    )]
    Timeout(Duration),
    /// The body came slower than the least rate a body must keep.
    #[error("{0}")]
    SlowBody(String),
    #[error("the collector is shutting down and takes no new data; retry later")]
    ShuttingDown,
    /// A bug on our side (a decoding task died); the request may be retried.
    #[error("internal error: {0}; please report it")]
    Internal(String),
}

impl OtlpError {
    /// A request the memory budget cannot take: retry later, or too large
    /// when no single request may ever hold that much.
    pub(crate) fn from_memory(e: proflow_model::memory::OverBudget) -> Self {
        if e.never {
            OtlpError::TooLarge(e.to_string())
        } else {
            OtlpError::MemoryLimit(e.to_string())
        }
    }

    /// A body that could not be read; `too_large` says which limit it
    /// passed, given that limit in bytes.
    pub(crate) fn from_body(e: BodyError, too_large: impl FnOnce(usize) -> String) -> Self {
        match e {
            BodyError::TooLarge { limit } => OtlpError::TooLarge(too_large(limit)),
            BodyError::OverBudget(e) => OtlpError::from_memory(e),
            BodyError::Unreadable(_) => OtlpError::bad_request(e.to_string()),
            BodyError::TimedOut(t) => OtlpError::Timeout(t),
            BodyError::TooSlow => OtlpError::SlowBody(e.to_string()),
        }
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        OtlpError::BadRequest(message.into())
    }

    pub fn http_status(&self) -> StatusCode {
        match self {
            OtlpError::Limit(r) if r.exhausted => StatusCode::TOO_MANY_REQUESTS,
            OtlpError::BadRequest(_) | OtlpError::Limit(_) => StatusCode::BAD_REQUEST,
            OtlpError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            OtlpError::UnsupportedMediaType(_) => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            OtlpError::MethodNotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            OtlpError::NotFound(_) | OtlpError::NotServed(_) => StatusCode::NOT_FOUND,
            OtlpError::Unauthenticated(_) => StatusCode::UNAUTHORIZED,
            OtlpError::Backpressure { .. }
            | OtlpError::MemoryLimit(_)
            | OtlpError::RateLimited(_) => StatusCode::TOO_MANY_REQUESTS,
            OtlpError::Timeout(_) | OtlpError::SlowBody(_) => StatusCode::REQUEST_TIMEOUT,
            OtlpError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
            OtlpError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    pub fn grpc_code(&self) -> tonic::Code {
        match self {
            OtlpError::Limit(r) if r.exhausted => tonic::Code::ResourceExhausted,
            OtlpError::BadRequest(_) | OtlpError::Limit(_) => tonic::Code::InvalidArgument,
            OtlpError::TooLarge(_)
            | OtlpError::Backpressure { .. }
            | OtlpError::MemoryLimit(_)
            | OtlpError::RateLimited(_) => tonic::Code::ResourceExhausted,
            OtlpError::UnsupportedMediaType(_)
            | OtlpError::MethodNotAllowed(_)
            | OtlpError::NotFound(_)
            | OtlpError::NotServed(_) => tonic::Code::Unimplemented,
            OtlpError::Unauthenticated(_) => tonic::Code::Unauthenticated,
            OtlpError::Timeout(_) | OtlpError::SlowBody(_) => tonic::Code::DeadlineExceeded,
            OtlpError::ShuttingDown => tonic::Code::Unavailable,
            OtlpError::Internal(_) => tonic::Code::Internal,
        }
    }

    /// When the client should try again, for refusals that say so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            OtlpError::Backpressure { retry_after, .. } => Some(*retry_after),
            OtlpError::MemoryLimit(_) => Some(MEMORY_RETRY_AFTER),
            OtlpError::RateLimited(r) => r.retry_after,
            _ => None,
        }
    }

    /// The `reason` label of the refused-requests metric.
    pub fn reason(&self) -> &'static str {
        match self {
            OtlpError::BadRequest(_) => "bad_request",
            OtlpError::TooLarge(_) => "too_large",
            OtlpError::UnsupportedMediaType(_) => "unsupported_media_type",
            OtlpError::MethodNotAllowed(_) => "method_not_allowed",
            OtlpError::NotFound(_) => "not_found",
            OtlpError::NotServed(_) => "not_served",
            OtlpError::Unauthenticated(_) => "unauthenticated",
            OtlpError::Backpressure { .. } => "backpressure",
            OtlpError::MemoryLimit(_) => "memory_limit",
            OtlpError::RateLimited(_) => "rate_limited",
            OtlpError::Limit(r) => r.reason,
            OtlpError::Timeout(_) | OtlpError::SlowBody(_) => "timeout",
            OtlpError::ShuttingDown => "shutting_down",
            OtlpError::Internal(_) => "internal",
        }
    }

    /// The `google.rpc.Status` both protocols send.
    pub(crate) fn rpc_status(&self) -> super::status::RpcStatus {
        super::status::RpcStatus::new(
            self.grpc_code() as i32,
            self.to_string(),
            self.retry_after(),
        )
    }

    /// The gRPC status, with a `RetryInfo` detail when the client should
    /// retry later.
    pub(crate) fn to_grpc(&self) -> tonic::Status {
        let status = self.rpc_status();
        if status.details.is_empty() {
            tonic::Status::new(self.grpc_code(), status.message)
        } else {
            let details = prost::Message::encode_to_vec(&status);
            tonic::Status::with_details(self.grpc_code(), status.message, details.into())
        }
    }
}

impl From<PushRefusal> for OtlpError {
    fn from(refusal: PushRefusal) -> Self {
        match refusal {
            PushRefusal::RetryLater {
                retry_after,
                detail,
            } => OtlpError::Backpressure {
                retry_after,
                detail,
            },
            PushRefusal::ShuttingDown => OtlpError::ShuttingDown,
        }
    }
}

/// A refusal with the number of profiles the request carried, when known
/// (0 when it was refused before its profiles were counted).
#[derive(Debug)]
pub(crate) struct Refused {
    pub error: OtlpError,
    pub profiles: u64,
}

impl From<OtlpError> for Refused {
    fn from(error: OtlpError) -> Self {
        Refused { error, profiles: 0 }
    }
}
