//! The `pyroscope` exporter's config: where and how to send, auth, TLS,
//! and its validation.

use std::collections::BTreeMap;
use std::path::PathBuf;

use http::Uri;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use proflow_config::{ClientTlsSettings, Duration, SendingSettings};
use proflow_core::component::{FieldError, Validate};
use proflow_model::model::is_valid_label_name;
use serde::Deserialize;

use super::RESERVED_HEADERS;
use crate::client;

/// `api` of the `pyroscope` exporter.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Api {
    /// `push.v1.PusherService/Push` (Connect, protobuf), several series a request.
    #[default]
    Push,
    /// `/ingest?format=pprof`, one profile a request (servers without the push API).
    Ingest,
}

/// `compression` of the request body (`api: push`).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// `Content-Encoding: gzip`.
    #[default]
    Gzip,
    /// Uncompressed (the profiles inside usually arrived gzipped already).
    None,
}

/// `basic_auth` of the `pyroscope` exporter.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BasicAuth {
    pub username: String,
    /// The password; or `password_file`.
    #[serde(default)]
    pub password: Option<String>,
    /// A file holding the password (read when the exporter starts; a final
    /// line break is ignored).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// Config of the `pyroscope` exporter. Names follow Alloy's `pyroscope.write`
/// `endpoint` block, except that `endpoint` is the base URL itself (as in
/// proflow's `otlp` exporter) rather than a block with `url`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PyroscopeExporterConfig {
    /// Base URL of the server, `http(s)://host:port[/prefix]`; the API path
    /// is appended.
    pub endpoint: String,
    /// `push` (default) or `ingest`.
    #[serde(default)]
    pub api: Api,
    /// Sent as `X-Scope-OrgID`. Unset: a profile that arrived with a tenant
    /// is sent with it.
    #[serde(default)]
    pub tenant_id: Option<String>,
    /// HTTP basic authentication.
    #[serde(default)]
    pub basic_auth: Option<BasicAuth>,
    /// `Authorization: Bearer <token>`.
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// A file holding the bearer token (read when the exporter starts).
    #[serde(default)]
    pub bearer_token_file: Option<PathBuf>,
    /// Headers added to every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Labels added to every profile that lacks them.
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    /// `service_name` of profiles that have none. Default `unknown_service`.
    #[serde(default = "default_service_name")]
    pub default_service_name: String,
    /// `gzip` (default) or `none`: the push request body.
    #[serde(default)]
    pub compression: Compression,
    /// Most profile bytes in one push request. Default 4 MiB.
    #[serde(default = "default_max_batch_bytes")]
    pub max_batch_bytes: usize,
    /// Longest wait for one request's answer, connecting included. Default 10s.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// TLS of `https://` endpoints: `ca_file`, `cert_file`, `key_file`,
    /// `insecure_skip_verify` (an `http://` endpoint does not use TLS).
    #[serde(default)]
    pub tls: ClientTlsSettings,
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub sending: SendingSettings,
}

pub(super) fn default_service_name() -> String {
    proflow_model::model::UNKNOWN_SERVICE.to_owned()
}

pub(super) fn default_max_batch_bytes() -> usize {
    4 << 20
}

pub(super) fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

impl PyroscopeExporterConfig {
    /// `tls` in the form the shared client takes (`insecure` is a gRPC
    /// notion: here the URL's scheme decides).
    pub(super) fn client_tls(&self) -> client::TlsSettings {
        client::TlsSettings {
            files: self.tls.clone(),
            insecure: false,
        }
    }

    /// The base URL, or the problem with it.
    pub(super) fn base_url(&self) -> Result<Uri, FieldError> {
        let text = self.endpoint.trim_end_matches('/');
        let problem = |m: String| FieldError::new("endpoint", m);
        if text.is_empty() {
            return Err(problem(
                "is required: the server's base URL, such as http://localhost:4040".into(),
            ));
        }
        let uri = client::parse_url(text).map_err(problem)?;
        if uri.query().is_some() {
            return Err(problem(format!("`{text}` must not have a query")));
        }
        Ok(uri)
    }

    /// The configured headers, or every problem with them.
    pub(super) fn header_map(&self) -> Result<HeaderMap, Vec<FieldError>> {
        let auth = self.basic_auth.is_some()
            || self.bearer_token.is_some()
            || self.bearer_token_file.is_some();
        let (mut map, mut problems) = match crate::client::header_map(&self.headers, |lower| {
            if RESERVED_HEADERS.contains(&lower) {
                Some("is set by the exporter itself; remove it".into())
            } else if lower == "authorization" && auth {
                Some("conflicts with `basic_auth`/`bearer_token`: keep one of them".into())
            } else if lower == "x-scope-orgid" && self.tenant_id.is_some() {
                Some("conflicts with `tenant_id`: keep one of them".into())
            } else {
                None
            }
        }) {
            Ok(map) => (map, Vec::new()),
            Err(problems) => (HeaderMap::new(), problems),
        };
        if let Some(t) = &self.tenant_id {
            match HeaderValue::from_str(t) {
                Ok(v) if !t.is_empty() => {
                    map.insert(HeaderName::from_static("x-scope-orgid"), v);
                }
                _ => problems.push(FieldError::new(
                    "tenant_id",
                    "must be a non-empty header value (visible ASCII, no line breaks)",
                )),
            }
        }
        if problems.is_empty() {
            Ok(map)
        } else {
            Err(problems)
        }
    }

    /// The `Authorization` header, reading the password or token file.
    pub(super) fn authorization(&self) -> Result<Option<HeaderValue>, String> {
        let read = |field: &str, path: &PathBuf| {
            std::fs::read_to_string(path)
                .map(|s| s.trim_end_matches(['\r', '\n']).to_owned())
                .map_err(|e| format!("{field} `{}`: {e}", path.display()))
        };
        let value = if let Some(b) = &self.basic_auth {
            let password = match (&b.password, &b.password_file) {
                (Some(p), _) => p.clone(),
                (None, Some(f)) => read("basic_auth.password_file", f)?,
                (None, None) => String::new(),
            };
            let token = base64_encode(format!("{}:{password}", b.username).as_bytes());
            format!("Basic {token}")
        } else if let Some(t) = &self.bearer_token {
            format!("Bearer {t}")
        } else if let Some(f) = &self.bearer_token_file {
            format!("Bearer {}", read("bearer_token_file", f)?)
        } else {
            return Ok(None);
        };
        let mut v = HeaderValue::from_str(&value)
            .map_err(|_| "the credentials are not a valid header value".to_owned())?;
        v.set_sensitive(true);
        Ok(Some(v))
    }
}

/// Standard base64 with padding (for basic auth; a dependency for 20 lines
/// is not worth it).
pub(super) fn base64_encode(input: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(input.len().div_ceil(3) * 4);
    for chunk in input.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

impl Validate for PyroscopeExporterConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if let Err(e) = self.base_url() {
            problems.push(e);
        }
        problems.extend(self.header_map().err().unwrap_or_default());
        if let Some(b) = &self.basic_auth {
            if b.username.is_empty() {
                problems.push(FieldError::new("basic_auth.username", "must not be empty"));
            }
            if b.password.is_some() == b.password_file.is_some() {
                problems.push(FieldError::new(
                    "basic_auth",
                    "needs exactly one of `password` and `password_file`",
                ));
            }
        }
        if self.bearer_token.is_some() && self.bearer_token_file.is_some() {
            problems.push(FieldError::new(
                "bearer_token_file",
                "conflicts with `bearer_token`: keep one of them",
            ));
        }
        if self.basic_auth.is_some()
            && (self.bearer_token.is_some() || self.bearer_token_file.is_some())
        {
            problems.push(FieldError::new(
                "basic_auth",
                "conflicts with `bearer_token`/`bearer_token_file`: a request has one Authorization",
            ));
        }
        for name in self.external_labels.keys() {
            if !is_valid_label_name(name) || name.starts_with("__") {
                problems.push(FieldError::new(
                    format!("external_labels.{name}"),
                    "is not a valid label name ([a-zA-Z_][a-zA-Z0-9_]*, not starting with __)",
                ));
            }
        }
        if self.default_service_name.is_empty() {
            problems.push(FieldError::new(
                "default_service_name",
                "must not be empty (default unknown_service)",
            ));
        }
        if self.max_batch_bytes == 0 {
            problems.push(FieldError::new(
                "max_batch_bytes",
                "must be at least 1 (default 4194304, 4 MiB)",
            ));
        }
        if self.timeout.is_zero() {
            problems.push(FieldError::new(
                "timeout",
                "must be more than 0: every request needs a deadline (default 10s)",
            ));
        }
        let tls = self.client_tls();
        problems.extend(tls.own_problems());
        if let Ok(base) = self.base_url() {
            problems.extend(tls.endpoint_problems(base.scheme_str() == Some("https")));
        }
        problems
    }
}
