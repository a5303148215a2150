//! A pooled HTTP(S) GET client for components that fetch from servers
//! (the `scrape` receiver's targets and service discovery, the `symbolize`
//! processor's debuginfod servers): rustls with the shared client TLS
//! setup, an optional credential sent only to the host it was configured
//! for, redirects followed on request (at most ten), and bodies bounded
//! before they are read, by `Content-Length` and while streaming.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{AUTHORIZATION, HeaderValue, LOCATION, USER_AGENT};
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Incoming;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::error_chain::error_chain;
use crate::tls::ClientTls;

/// Most redirects one request follows (Go's and Prometheus's limit).
const MAX_REDIRECTS: usize = 10;
/// Bytes of an error answer kept for the error message.
const ERROR_BODY_BYTES: usize = 256;

type Connector = HttpsConnector<HttpConnector>;

/// Why a GET did not give a body.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FetchError {
    /// No connection, or it broke before an answer.
    #[error("{0}")]
    Connection(String),
    /// An answer that is not 2xx; `message` is the start of its body.
    #[error("HTTP {status}{}", if .message.is_empty() { String::new() } else { format!(": {}", .message) })]
    Status { status: u16, message: String },
    /// The body is larger than the limit.
    #[error("the body is larger than {limit} bytes (raise body_size_limit if this is expected)")]
    TooLarge { limit: usize },
    /// The body could not be read to its end.
    #[error("reading the body failed: {0}")]
    Body(String),
    /// Redirects led nowhere usable.
    #[error("{0}")]
    Redirect(String),
    /// The in-flight memory budget had no room for the body.
    #[error("{0}")]
    Memory(String),
}

impl FetchError {
    /// The metric reason: `connection`, `http_status`, `too_large`,
    /// `body`, `redirect`, `memory_limit`.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::Connection(_) => "connection",
            FetchError::Status { .. } => "http_status",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Body(_) => "body",
            FetchError::Redirect(_) => "redirect",
            FetchError::Memory(_) => "memory_limit",
        }
    }
}

/// How a client connects.
#[derive(Debug, Clone)]
pub struct Options<'a> {
    pub tls: ClientTls<'a>,
    /// Load the CA roots even for a client that starts on plain HTTP (its
    /// URLs may turn to https later).
    pub load_roots: bool,
    /// The `Authorization` header to send to the first URL's host.
    pub auth: Option<HeaderValue>,
    pub follow_redirects: bool,
    pub connect_timeout: Duration,
}

/// A pooled client with its auth header; cheap to clone.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<Connector, Empty<Bytes>>,
    auth: Option<Arc<HeaderValue>>,
    follow_redirects: bool,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient")
            .field("follow_redirects", &self.follow_redirects)
            .finish_non_exhaustive()
    }
}

impl HttpClient {
    /// Builds the client; reads the TLS files now, so a missing file fails
    /// the start with its name.
    pub fn new(options: Options<'_>) -> Result<Self, String> {
        let tls_config = crate::tls::client_config(&options.tls, options.load_roots)?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(options.connect_timeout));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls_config)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        let inner = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(2)
            .build(connector);
        Ok(HttpClient {
            inner,
            auth: options.auth.map(Arc::new),
            follow_redirects: options.follow_redirects,
        })
    }

    /// GETs `url` and returns its body, at most `limit` bytes; follows
    /// redirects when the settings say so. The caller bounds the time.
    pub async fn get(&self, url: Uri, limit: usize) -> Result<Bytes, FetchError> {
        self.get_as(url, limit, None).await
    }

    /// [`HttpClient::get`] with `auth` as the `Authorization` header of
    /// this request instead of the client's own (a token reread from its
    /// file as it is renewed).
    pub async fn get_as(
        &self,
        url: Uri,
        limit: usize,
        auth: Option<&HeaderValue>,
    ) -> Result<Bytes, FetchError> {
        let response = self.response(url, auth).await?;
        if declared_length(&response).is_some_and(|len| len > limit as u64) {
            return Err(FetchError::TooLarge { limit });
        }
        match Limited::new(response.into_body(), limit).collect().await {
            Ok(body) => Ok(body.to_bytes()),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                Err(FetchError::TooLarge { limit })
            }
            Err(e) => Err(FetchError::Body(error_chain(&*e))),
        }
    }

    /// [`HttpClient::get`], with every byte of the body granted from
    /// `grant` as it arrives (see [`crate::server::body`]): a slow or large
    /// answer takes only memory the in-flight budget gave it.
    pub async fn get_granted(
        &self,
        url: Uri,
        limit: usize,
        grant: &mut proflow_model::memory::MemoryGrant,
    ) -> Result<Bytes, FetchError> {
        self.get_granted_as(url, limit, grant, None).await
    }

    /// [`HttpClient::get_granted`] with `auth` as in [`HttpClient::get_as`].
    pub async fn get_granted_as(
        &self,
        url: Uri,
        limit: usize,
        grant: &mut proflow_model::memory::MemoryGrant,
        auth: Option<&HeaderValue>,
    ) -> Result<Bytes, FetchError> {
        use crate::server::body::{BodyError, read_body};
        let response = self.response(url, auth).await?;
        let declared = declared_length(&response);
        // The caller bounds the time: no timeout of our own.
        let unbounded = Duration::from_secs(u64::from(u32::MAX));
        read_body(response.into_body(), declared, limit, grant, unbounded)
            .await
            .map_err(|e| match e {
                BodyError::TooLarge { limit } => FetchError::TooLarge { limit },
                BodyError::OverBudget(e) => FetchError::Memory(e.to_string()),
                BodyError::Unreadable(m) => FetchError::Body(m),
                BodyError::TimedOut(_) => FetchError::Body("timed out".to_owned()),
                BodyError::TooSlow => FetchError::Body(BodyError::TooSlow.to_string()),
            })
    }

    /// The body of a GET of `url` as it arrives, for answers that stream
    /// without end (a Kubernetes watch): the caller reads it frame by frame
    /// and bounds what it keeps. `auth` as in [`HttpClient::get_as`].
    pub async fn get_streaming(
        &self,
        url: Uri,
        auth: Option<&HeaderValue>,
    ) -> Result<Incoming, FetchError> {
        Ok(self.response(url, auth).await?.into_body())
    }

    /// The answer to a GET of `url` with a success status, redirects
    /// followed as the settings say; `auth` replaces the client's own
    /// credential for this request.
    async fn response(
        &self,
        url: Uri,
        auth: Option<&HeaderValue>,
    ) -> Result<hyper::Response<Incoming>, FetchError> {
        let own = self.auth.as_deref();
        let auth = auth.or(own);
        let origin = url.authority().cloned();
        let mut url = url;
        for _ in 0..=MAX_REDIRECTS {
            let mut request = Request::new(Empty::<Bytes>::new());
            *request.uri_mut() = url.clone();
            request.headers_mut().insert(
                USER_AGENT,
                HeaderValue::from_static(concat!("proflow/", env!("CARGO_PKG_VERSION"))),
            );
            // Credentials go only to the host they were configured for.
            if let Some(auth) = auth
                && url.authority() == origin.as_ref()
            {
                request.headers_mut().insert(AUTHORIZATION, auth.clone());
            }
            let response = self
                .inner
                .request(request)
                .await
                .map_err(|e| FetchError::Connection(error_chain(&e)))?;
            let status = response.status();
            if status.is_redirection() && status != StatusCode::NOT_MODIFIED {
                if !self.follow_redirects {
                    return Err(FetchError::Redirect(format!(
                        "HTTP {status} redirect, and follow_redirects is false"
                    )));
                }
                let location = response
                    .headers()
                    .get(LOCATION)
                    .and_then(|l| l.to_str().ok())
                    .ok_or_else(|| {
                        FetchError::Redirect(format!("HTTP {status} without a Location"))
                    })?;
                url = resolve(&url, location).ok_or_else(|| {
                    FetchError::Redirect(format!(
                        "HTTP {status} to an unusable Location {location:?}"
                    ))
                })?;
                continue;
            }
            if !status.is_success() {
                let body = Limited::new(response.into_body(), ERROR_BODY_BYTES * 4)
                    .collect()
                    .await
                    .map(|b| b.to_bytes())
                    .unwrap_or_default();
                let text = String::from_utf8_lossy(&body[..body.len().min(ERROR_BODY_BYTES)]);
                return Err(FetchError::Status {
                    status: status.as_u16(),
                    message: text.split_whitespace().collect::<Vec<_>>().join(" "),
                });
            }
            return Ok(response);
        }
        Err(FetchError::Redirect(format!(
            "more than {MAX_REDIRECTS} redirects"
        )))
    }
}

/// `text` as a sensitive header value; `field` names it in the error.
pub fn header_value(text: &str, field: &str) -> Result<HeaderValue, String> {
    let mut v = HeaderValue::from_str(text)
        .map_err(|_| format!("{field}: holds characters an HTTP header cannot carry"))?;
    v.set_sensitive(true);
    Ok(v)
}

/// The `Content-Length` an answer declares.
fn declared_length<B>(response: &hyper::Response<B>) -> Option<u64> {
    response
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// A `Location` (absolute, or a path on the same origin) against `base`.
fn resolve(base: &Uri, location: &str) -> Option<Uri> {
    if let Ok(u) = location.parse::<Uri>()
        && u.scheme().is_some()
        && u.authority().is_some()
    {
        return matches!(u.scheme_str(), Some("http" | "https")).then_some(u);
    }
    if location.starts_with('/') {
        let mut parts = base.clone().into_parts();
        parts.path_and_query = Some(location.parse().ok()?);
        return Uri::from_parts(parts).ok();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locations_resolve_against_the_base() {
        let base: Uri = "http://h:1/debug/pprof/allocs?x=1".parse().unwrap();
        assert_eq!(
            resolve(&base, "/other?y=2").unwrap().to_string(),
            "http://h:1/other?y=2"
        );
        assert_eq!(
            resolve(&base, "https://g:2/p").unwrap().to_string(),
            "https://g:2/p"
        );
        assert!(resolve(&base, "ftp://g/p").is_none());
        assert!(resolve(&base, "relative").is_none());
    }

    #[test]
    fn errors_name_their_reason() {
        let e = FetchError::Status {
            status: 404,
            message: "404 page not found".into(),
        };
        assert_eq!(e.to_string(), "HTTP 404: 404 page not found");
        assert_eq!(e.reason(), "http_status");
    }
}
