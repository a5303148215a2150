//! What a peer's answer means for the queue: retryable or permanent, and how
//! long the peer asked us to wait. Also the few `google.rpc` messages a peer
//! puts its reasons in (written here from their field numbers; nothing else
//! of googleapis is needed).
//!
//! gRPC codes follow the OpenTelemetry Collector's `otlp` exporter (and the
//! OTLP spec): CANCELLED, DEADLINE_EXCEEDED, ABORTED, OUT_OF_RANGE,
//! UNAVAILABLE and DATA_LOSS are retried; RESOURCE_EXHAUSTED only when the
//! peer attached a `google.rpc.RetryInfo` (without one it signals a limit
//! that waiting does not lift, such as a message over the peer's size cap);
//! everything else is permanent. HTTP follows its `otlphttp` exporter: 429,
//! 502, 503 and 504 are retried (honouring `Retry-After` in seconds), every
//! other non-2xx status is permanent.

use std::time::Duration;

use proflow_core::component::ExportError;
use prost::Message;
use tonic::Code;

/// Longest wait a peer may ask for; a larger `RetryInfo`/`Retry-After` is
/// capped so one odd answer cannot park a queue consumer for hours (the
/// queue's `max_elapsed_time` still applies on top).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// Longest server message kept in an error or a log line.
const MAX_MESSAGE_CHARS: usize = 512;

/// `google.rpc.Status`: the body of a refused OTLP/HTTP protobuf request and
/// the `grpc-status-details-bin` trailer of a gRPC one.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RpcStatus {
    #[prost(int32, tag = "1")]
    pub code: i32,
    #[prost(string, tag = "2")]
    pub message: String,
    #[prost(message, repeated, tag = "3")]
    pub details: Vec<RpcAny>,
}

impl RpcStatus {
    /// RESOURCE_EXHAUSTED asking to wait `seconds` (a `RetryInfo`), encoded:
    /// the refusal tests make a peer give.
    #[cfg(test)]
    pub(crate) fn retry_after_encoded(seconds: i64) -> Vec<u8> {
        RpcStatus {
            code: 8,
            message: "slow down".into(),
            details: vec![RpcAny {
                type_url: "type.googleapis.com/google.rpc.RetryInfo".into(),
                value: RetryInfo {
                    retry_delay: Some(ProtoDuration { seconds, nanos: 0 }),
                }
                .encode_to_vec(),
            }],
        }
        .encode_to_vec()
    }
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RpcAny {
    #[prost(string, tag = "1")]
    pub type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    pub value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    pub retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, PartialEq, Message)]
pub(crate) struct ProtoDuration {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

const RETRY_INFO_TYPE: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The delay of the first `RetryInfo` among an encoded `google.rpc.Status`'s
/// details, if any (capped at [`MAX_RETRY_AFTER`]; a negative or undecodable
/// one counts as absent).
pub(crate) fn retry_info_delay(status_details: &[u8]) -> Option<Duration> {
    let status = RpcStatus::decode(status_details).ok()?;
    status
        .details
        .iter()
        .filter(|any| any.type_url == RETRY_INFO_TYPE)
        .find_map(|any| {
            let d = RetryInfo::decode(any.value.as_slice()).ok()?.retry_delay?;
            let seconds = u64::try_from(d.seconds).ok()?;
            let nanos = u32::try_from(d.nanos).ok().filter(|n| *n < 1_000_000_000)?;
            Some(Duration::new(seconds, nanos).min(MAX_RETRY_AFTER))
        })
}

/// Whether a gRPC status code is worth retrying, given whether the peer sent
/// a `RetryInfo`.
pub(crate) fn grpc_code_retryable(code: Code, has_retry_info: bool) -> bool {
    match code {
        Code::Cancelled
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::OutOfRange
        | Code::Unavailable
        | Code::DataLoss => true,
        Code::ResourceExhausted => has_retry_info,
        _ => false,
    }
}

/// The export error of a failed gRPC call; `call` names it in the message
/// (`OTLP gRPC export to host:port`). A failure to connect or a broken
/// connection (tonic reports those as UNKNOWN with the transport error as
/// source) counts as UNAVAILABLE.
pub(crate) fn grpc_error(status: &tonic::Status, call: &str) -> ExportError {
    let code = if status.code() == Code::Unknown && is_transport_error(status) {
        Code::Unavailable
    } else {
        status.code()
    };
    let delay = retry_info_delay(status.details());
    let reason = grpc_reason(code);
    // A transport failure's reason (refused connection, unknown certificate
    // issuer, ...) is in the sources, not in the status message.
    let said = match std::error::Error::source(status) {
        Some(source) if code != status.code() => error_chain(source),
        _ => status.message().to_owned(),
    };
    let message = format!("{call} failed: {code:?}: {}", truncate(&said));
    if grpc_code_retryable(code, delay.is_some()) {
        let e = ExportError::retryable(reason, message);
        match delay {
            Some(d) => e.with_retry_after(d),
            None => e,
        }
    } else {
        ExportError::permanent(reason, message)
    }
}

pub(crate) use proflow_core::component::error_chain;

/// Whether a status stands for a transport failure rather than an answer.
fn is_transport_error(status: &tonic::Status) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(e) = source {
        if e.is::<hyper_util::client::legacy::Error>()
            || e.is::<hyper::Error>()
            || e.is::<std::io::Error>()
        {
            return true;
        }
        source = e.source();
    }
    false
}

/// A short snake_case metric reason for a gRPC code.
fn grpc_reason(code: Code) -> &'static str {
    match code {
        Code::Cancelled => "cancelled",
        Code::DeadlineExceeded => "deadline_exceeded",
        Code::Aborted => "aborted",
        Code::OutOfRange => "out_of_range",
        Code::Unavailable => "unavailable",
        Code::DataLoss => "data_loss",
        Code::ResourceExhausted => "resource_exhausted",
        Code::InvalidArgument => "invalid_argument",
        Code::Unauthenticated => "unauthenticated",
        Code::PermissionDenied => "permission_denied",
        Code::Unimplemented => "unimplemented",
        Code::NotFound => "not_found",
        Code::Internal => "internal",
        _ => "grpc_error",
    }
}

#[cfg(feature = "otlp")]
/// Whether an HTTP status is worth retrying.
pub(crate) fn http_status_retryable(status: u16) -> bool {
    matches!(status, 429 | 502 | 503 | 504)
}

#[cfg(any(feature = "otlp", feature = "pyroscope"))]
/// A `Retry-After` header in delay-seconds form (the HTTP-date form is not
/// read: OTLP peers send seconds, and without it the queue's backoff applies).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let seconds: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

#[cfg(feature = "otlp")]
/// The export error of a non-2xx OTLP/HTTP response. `body_message` is what
/// the server said (see [`http_body_message`]).
pub(crate) fn http_error(
    status: u16,
    retry_after: Option<Duration>,
    body_message: &str,
    url: &str,
) -> ExportError {
    let message = format!("OTLP HTTP export to {url} failed: HTTP {status}: {body_message}");
    if http_status_retryable(status) {
        let e = ExportError::retryable(http_reason(status), message);
        match retry_after {
            Some(d) => e.with_retry_after(d),
            None => e,
        }
    } else {
        ExportError::permanent(http_reason(status), message)
    }
}

#[cfg(feature = "otlp")]
fn http_reason(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        413 => "too_large",
        415 => "unsupported_media_type",
        422 => "unprocessable",
        429 => "too_many_requests",
        502 => "bad_gateway",
        503 => "unavailable",
        504 => "gateway_timeout",
        500..=599 => "server_error",
        _ => "http_error",
    }
}

#[cfg(feature = "otlp")]
/// What a refusing server said: a `google.rpc.Status` message when the body
/// is protobuf, the `message` of a JSON body, else the body as text.
pub(crate) fn http_body_message(content_type: Option<&str>, body: &[u8]) -> String {
    let media = content_type
        .and_then(|c| c.split(';').next())
        .map(|c| c.trim().to_ascii_lowercase());
    let text = match media.as_deref() {
        Some("application/x-protobuf" | "application/protobuf" | "application/proto") => {
            RpcStatus::decode(body).ok().map(|s| s.message)
        }
        Some("application/json") => serde_json::from_slice::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("message")?.as_str().map(str::to_owned)),
        _ => None,
    };
    let text = text.unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text = text.trim();
    if text.is_empty() {
        "(no message)".to_owned()
    } else {
        truncate(text)
    }
}

fn truncate(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_core::component::ErrorClass;

    fn status_with_retry_info(seconds: i64, nanos: i32) -> Vec<u8> {
        let info = RetryInfo {
            retry_delay: Some(ProtoDuration { seconds, nanos }),
        };
        RpcStatus {
            code: Code::ResourceExhausted as i32,
            message: "slow down".into(),
            details: vec![
                RpcAny {
                    type_url: "type.googleapis.com/google.rpc.ErrorInfo".into(),
                    value: vec![0x0a, 0x01, b'x'],
                },
                RpcAny {
                    type_url: RETRY_INFO_TYPE.into(),
                    value: info.encode_to_vec(),
                },
            ],
        }
        .encode_to_vec()
    }

    #[test]
    fn retry_info_is_read_from_status_details() {
        assert_eq!(
            retry_info_delay(&status_with_retry_info(2, 500_000_000)),
            Some(Duration::from_millis(2500))
        );
        assert_eq!(
            retry_info_delay(&status_with_retry_info(100_000, 0)),
            Some(MAX_RETRY_AFTER),
            "capped"
        );
        assert_eq!(retry_info_delay(&status_with_retry_info(-1, 0)), None);
        assert_eq!(retry_info_delay(&status_with_retry_info(1, -5)), None);
        assert_eq!(retry_info_delay(b""), None, "no details");
        assert_eq!(retry_info_delay(&[0xff, 0xff]), None, "garbage");
        let other_only = RpcStatus {
            code: 8,
            message: String::new(),
            details: vec![RpcAny {
                type_url: "type.googleapis.com/google.rpc.QuotaFailure".into(),
                value: Vec::new(),
            }],
        };
        assert_eq!(retry_info_delay(&other_only.encode_to_vec()), None);
    }

    #[test]
    fn grpc_codes_are_classified_like_the_collector() {
        let retryable = [
            Code::Cancelled,
            Code::DeadlineExceeded,
            Code::Aborted,
            Code::OutOfRange,
            Code::Unavailable,
            Code::DataLoss,
        ];
        let permanent = [
            Code::Unknown,
            Code::InvalidArgument,
            Code::NotFound,
            Code::AlreadyExists,
            Code::PermissionDenied,
            Code::FailedPrecondition,
            Code::Unimplemented,
            Code::Internal,
            Code::Unauthenticated,
        ];
        for code in retryable {
            assert!(grpc_code_retryable(code, false), "{code:?}");
            let e = grpc_error(&tonic::Status::new(code, "x"), "peer");
            assert_eq!(e.class, ErrorClass::Retryable { retry_after: None });
        }
        for code in permanent {
            assert!(!grpc_code_retryable(code, true), "{code:?}");
            let e = grpc_error(&tonic::Status::new(code, "x"), "peer");
            assert_eq!(e.class, ErrorClass::Permanent, "{code:?}");
        }
        // RESOURCE_EXHAUSTED: retryable only with RetryInfo, which sets the wait.
        let bare = grpc_error(
            &tonic::Status::new(Code::ResourceExhausted, "too big"),
            "peer",
        );
        assert_eq!(bare.class, ErrorClass::Permanent);
        let with_info = grpc_error(
            &tonic::Status::with_details(
                Code::ResourceExhausted,
                "slow down",
                status_with_retry_info(3, 0).into(),
            ),
            "peer",
        );
        assert_eq!(
            with_info.class,
            ErrorClass::Retryable {
                retry_after: Some(Duration::from_secs(3))
            }
        );
        assert_eq!(with_info.reason, "resource_exhausted");
        assert!(with_info.message.contains("slow down"), "{with_info:?}");
        // UNAVAILABLE with RetryInfo honours the delay too.
        let unavailable = grpc_error(
            &tonic::Status::with_details(
                Code::Unavailable,
                "restarting",
                status_with_retry_info(1, 0).into(),
            ),
            "peer",
        );
        assert_eq!(
            unavailable.class,
            ErrorClass::Retryable {
                retry_after: Some(Duration::from_secs(1))
            }
        );
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn http_statuses_are_classified_like_the_collector() {
        for s in [429, 502, 503, 504] {
            assert!(http_status_retryable(s), "{s}");
            let e = http_error(s, Some(Duration::from_secs(7)), "busy", "u");
            assert_eq!(
                e.class,
                ErrorClass::Retryable {
                    retry_after: Some(Duration::from_secs(7))
                }
            );
        }
        for s in [400, 401, 403, 404, 405, 413, 415, 422, 500, 501] {
            assert!(!http_status_retryable(s), "{s}");
            let e = http_error(s, Some(Duration::from_secs(7)), "no", "u");
            assert_eq!(e.class, ErrorClass::Permanent, "{s}");
            assert!(e.message.contains(&format!("HTTP {s}: no")), "{e:?}");
        }
        assert_eq!(parse_retry_after(" 12 "), Some(Duration::from_secs(12)));
        assert_eq!(parse_retry_after("99999"), Some(MAX_RETRY_AFTER));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-3"), None);
    }

    #[cfg(feature = "otlp")]
    #[test]
    fn server_messages_come_from_status_json_or_text() {
        let status = RpcStatus {
            code: 3,
            message: "profile has no dictionary".into(),
            details: Vec::new(),
        };
        assert_eq!(
            http_body_message(Some("application/x-protobuf"), &status.encode_to_vec()),
            "profile has no dictionary"
        );
        assert_eq!(
            http_body_message(
                Some("application/json; charset=utf-8"),
                br#"{"code":3,"message":"bad json"}"#
            ),
            "bad json"
        );
        assert_eq!(
            http_body_message(Some("text/plain"), b" unsupported media type\n"),
            "unsupported media type"
        );
        assert_eq!(http_body_message(None, b""), "(no message)");
        let long = "x".repeat(2000);
        let shown = http_body_message(None, long.as_bytes());
        assert_eq!(shown.chars().count(), MAX_MESSAGE_CHARS + 1);
    }
}
