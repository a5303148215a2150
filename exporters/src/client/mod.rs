//! The clients exporters connect out with: the TLS settings and their
//! rustls client config, the pooled HTTP/2 client of the gRPC exporters
//! (`otlp`, `parca`) and the HTTP/1.1 client of `pyroscope` and OTLP/HTTP,
//! one gRPC unary call written by hand, and ([`status`]) what a peer's
//! answer means for the queue.
//!
//! A gRPC unary call is one HTTP/2 POST whose body is the message behind a
//! 5-byte prefix (compressed flag, length): [`unary`] writes that frame
//! itself around bytes the exporter has already encoded (and, if it wants,
//! gzipped), and reads the answer's `grpc-status` with tonic's status
//! parsing; no generated client code re-encodes anything. hyper-util's
//! client is the lightest maintained HTTP/2 client (h2c and TLS through
//! hyper-rustls) and is already in the build through hyper.
//!
//! Only exporter modules depend on this one; it depends on nothing of them.

pub(crate) mod status;

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use proflow_config::ClientTlsSettings;
use proflow_core::component::FieldError;
use rustls::ClientConfig;
use serde::Deserialize;

/// Most bytes read of a gRPC answer (a response message or an error is a few
/// hundred bytes; anything more is not read).
pub(crate) const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// `tls` of a gRPC (or HTTP) exporter (rustls; no OpenSSL): the files
/// every client takes, and gRPC's `insecure`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TlsSettings {
    /// `ca_file`, `cert_file`, `key_file` and `insecure_skip_verify`,
    /// written beside `insecure` (see [`ClientTlsSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub files: ClientTlsSettings,
    /// gRPC with an `endpoint` of bare `host:port`: plaintext (h2c) instead
    /// of TLS. An `http://` endpoint is always plaintext, an `https://` one
    /// always TLS, whatever this says.
    pub insecure: bool,
}

impl TlsSettings {
    /// Every problem of these settings with an endpoint that does
    /// (`uses_tls`) or does not use TLS; paths are under `tls`.
    pub(crate) fn endpoint_problems(&self, uses_tls: bool) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if !uses_tls && self.files.has_files() {
            problems.push(FieldError::new(
                "tls",
                "`ca_file`, `cert_file` and `key_file` need a TLS endpoint, but this one is \
                 plaintext: use `https://` (or, for gRPC, a bare host:port without \
                 `tls.insecure`)",
            ));
        }
        if !uses_tls && self.files.insecure_skip_verify {
            problems.push(FieldError::new(
                "tls.insecure_skip_verify",
                "has no effect on a plaintext endpoint; remove it",
            ));
        }
        if uses_tls && self.insecure {
            problems.push(FieldError::new(
                "tls.insecure",
                "contradicts the `https://` endpoint: use `http://` for plaintext, or \
                 remove `insecure`",
            ));
        }
        problems
    }

    /// Every problem of these settings whatever the endpoint.
    pub(crate) fn own_problems(&self) -> Vec<FieldError> {
        self.files.problems("tls")
    }
}

/// An absolute `http://` or `https://` URL with a host.
pub(crate) fn parse_url(text: &str) -> Result<Uri, String> {
    // Refused before anything else, and shown without the password: URLs go
    // into log lines and error messages.
    if proflow_net::url::has_userinfo(text) {
        return Err(format!(
            "`{}` holds a user name and password: write the URL without them and set the exporter's `basic_auth` (or an `Authorization` header); a password in a URL would end up in logs",
            proflow_net::url::redact_userinfo(text)
        ));
    }
    let uri: Uri = text
        .parse()
        .map_err(|e| format!("`{text}` is not a valid URL or host:port: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        Some(other) => {
            return Err(format!(
                "`{text}`: scheme `{other}` is not supported; use http:// or https://"
            ));
        }
        None => return Err(format!("`{text}` has no scheme")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{text}` names no host"));
    }
    Ok(uri)
}

/// The origin of a gRPC `endpoint`: `host:port` (TLS unless `insecure`) or
/// `http(s)://host:port`; a problem under `endpoint` otherwise. `example`
/// is shown when the endpoint is missing.
pub(crate) fn grpc_origin(
    endpoint: &str,
    insecure: bool,
    example: &str,
    problems: &mut Vec<FieldError>,
) -> Option<Uri> {
    let endpoint = endpoint.trim();
    if endpoint.is_empty() {
        problems.push(FieldError::new(
            "endpoint",
            format!("must be set: the peer's host:port, such as `{example}`"),
        ));
        return None;
    }
    let with_scheme = if endpoint.contains("://") {
        endpoint.to_owned()
    } else if insecure {
        format!("http://{endpoint}")
    } else {
        format!("https://{endpoint}")
    };
    let uri = match parse_url(&with_scheme) {
        Ok(uri) => uri,
        Err(e) => {
            problems.push(FieldError::new("endpoint", e));
            return None;
        }
    };
    if uri.path() != "/" || uri.query().is_some() {
        problems.push(FieldError::new(
            "endpoint",
            format!("`{endpoint}`: a gRPC endpoint has no path; write host:port"),
        ));
        return None;
    }
    Some(uri)
}

/// Headers the exporter sets itself; configuring them would break requests.
pub(crate) const RESERVED_HEADERS: [&str; 7] = [
    "content-type",
    "content-encoding",
    "content-length",
    "transfer-encoding",
    "te",
    "host",
    "connection",
];

/// Why a gRPC exporter does not take a configured header (`lower`, its name
/// in lowercase), if it does not: the reserved ones and `grpc-*` are set by
/// the exporter itself, from the settings `set_by` names.
pub(crate) fn set_by_grpc(set_by: &str) -> impl Fn(&str) -> Option<String> + '_ {
    move |lower| {
        (RESERVED_HEADERS.contains(&lower) || lower.starts_with("grpc-"))
            .then(|| format!("is set by the exporter itself ({set_by}); remove it"))
    }
}

/// Configured `headers` as a map, or every problem with them (paths
/// `headers.<name>`); `refuse` says why a header (given its lowercase
/// name) may not be configured, if it may not.
pub(crate) fn header_map(
    headers: &BTreeMap<String, String>,
    refuse: impl Fn(&str) -> Option<String>,
) -> Result<HeaderMap, Vec<FieldError>> {
    let mut map = HeaderMap::new();
    let mut problems = Vec::new();
    for (name, value) in headers {
        let path = format!("headers.{name}");
        if let Some(why) = refuse(&name.to_ascii_lowercase()) {
            problems.push(FieldError::new(path, why));
            continue;
        }
        let parsed_name = HeaderName::from_bytes(name.as_bytes());
        let parsed_value = HeaderValue::from_str(value);
        match (parsed_name, parsed_value) {
            (Ok(n), Ok(v)) => {
                map.insert(n, v);
            }
            (Err(_), _) => problems.push(FieldError::new(
                path,
                "is not a valid header name (letters, digits and `-`, no spaces)",
            )),
            (_, Err(_)) => problems.push(FieldError::new(
                path,
                "has a value that is not a valid header value (visible ASCII, no line breaks)",
            )),
        }
    }
    if problems.is_empty() {
        Ok(map)
    } else {
        Err(problems)
    }
}

pub(crate) type Connector = HttpsConnector<HttpConnector>;

/// The TCP connector under every client: no Nagle, connecting bounded by
/// `timeout`.
fn http_connector(timeout: Duration) -> HttpConnector {
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(timeout));
    http
}

/// A pooled HTTP/2-only client (gRPC), h2c for `http://` URLs and TLS with
/// `tls` for `https://` ones; connects lazily.
pub(crate) fn grpc_client(
    tls: &TlsSettings,
    uses_tls: bool,
    timeout: Duration,
) -> Result<Client<Connector, Full<Bytes>>, String> {
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(client_tls_config(tls, uses_tls)?)
        .https_or_http()
        .enable_http2()
        .wrap_connector(http_connector(timeout));
    Ok(Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_only(true)
        .build(connector))
}

/// A pooled HTTP/1.1-and-2 client (OTLP/HTTP, Pyroscope) with the same TLS setup.
#[cfg(any(feature = "otlp", feature = "pyroscope"))]
pub(crate) fn http_client(
    tls: &TlsSettings,
    uses_tls: bool,
    timeout: Duration,
) -> Result<Client<Connector, Full<Bytes>>, String> {
    let connector = HttpsConnectorBuilder::new()
        .with_tls_config(client_tls_config(tls, uses_tls)?)
        .https_or_http()
        .enable_all_versions()
        .wrap_connector(http_connector(timeout));
    Ok(Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .build(connector))
}

/// One gRPC unary call: `message` (encoded, gzipped already when
/// `gzipped`) in one frame to `url` (origin + method path) with `headers`;
/// the answer's body (its frame, not unwrapped) when `grpc-status` is OK,
/// else the status. A failure to send counts as UNAVAILABLE; an answer that
/// is not gRPC gets the code the gRPC spec gives its HTTP status. The
/// caller bounds the whole call with its own timeout; `timeout` is also
/// sent as `grpc-timeout` so the peer can give up in time.
pub(crate) async fn unary(
    client: &Client<Connector, Full<Bytes>>,
    url: &Uri,
    mut headers: HeaderMap,
    message: Bytes,
    gzipped: bool,
    timeout: Duration,
) -> Result<Bytes, tonic::Status> {
    let len = u32::try_from(message.len()).map_err(|_| {
        tonic::Status::resource_exhausted(
            "the request is larger than a gRPC message can be (4 GiB)",
        )
    })?;
    let mut frame = BytesMut::with_capacity(5 + message.len());
    frame.put_u8(u8::from(gzipped));
    frame.put_u32(len);
    frame.put_slice(&message);
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert("te", HeaderValue::from_static("trailers"));
    if gzipped {
        headers.insert("grpc-encoding", HeaderValue::from_static("gzip"));
    }
    // The answer is small: ask for it uncompressed.
    headers.insert("grpc-accept-encoding", HeaderValue::from_static("identity"));
    if let Ok(v) = HeaderValue::from_str(&format!("{}m", timeout.as_millis().max(1))) {
        headers.insert("grpc-timeout", v);
    }
    let mut request = Request::new(Full::new(frame.freeze()));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = url.clone();
    *request.headers_mut() = headers;
    let response = client.request(request).await.map_err(|e| {
        tonic::Status::unavailable(format!("could not send: {}", status::error_chain(&e)))
    })?;
    let (parts, body) = response.into_parts();
    if !parts.status.is_success() {
        // Not a gRPC answer (a proxy, or no gRPC server): the code the
        // gRPC spec gives each HTTP status.
        let code = match parts.status.as_u16() {
            400 => tonic::Code::Internal,
            401 => tonic::Code::Unauthenticated,
            403 => tonic::Code::PermissionDenied,
            404 => tonic::Code::Unimplemented,
            429 | 502..=504 => tonic::Code::Unavailable,
            _ => tonic::Code::Unknown,
        };
        return Err(tonic::Status::new(
            code,
            format!("the peer answered HTTP {} instead of gRPC", parts.status),
        ));
    }
    // A trailers-only answer carries its status in the headers.
    if let Some(s) = tonic::Status::from_header_map(&parts.headers)
        && s.code() != tonic::Code::Ok
    {
        return Err(s);
    }
    let collected = Limited::new(body, MAX_RESPONSE_BYTES)
        .collect()
        .await
        .map_err(|e| tonic::Status::unavailable(format!("the answer could not be read: {e}")))?;
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let answer = collected.to_bytes();
    match tonic::Status::from_header_map(&trailers)
        .or_else(|| tonic::Status::from_header_map(&parts.headers))
    {
        Some(s) if s.code() == tonic::Code::Ok => Ok(answer),
        Some(s) => Err(s),
        None => Err(tonic::Status::internal("the answer carries no grpc-status")),
    }
}

/// The rustls client config of the peer (see
/// [`proflow_net::tls::client_config`]).
pub(crate) fn client_tls_config(tls: &TlsSettings, uses_tls: bool) -> Result<ClientConfig, String> {
    proflow_net::tls::client_config(&(&tls.files).into(), uses_tls)
}
