//! The `otlp` exporter's config: endpoint, protocol, encoding, compression,
//! tenant and TLS; their checks, where requests go, and the build.

use super::transport::{Transport, Wire};
use crate::client::{self, parse_url};
use http::Uri;
use http::header::HeaderMap;
use proflow_config::Duration;
use proflow_config::SendingSettings;
use proflow_core::component::{
    BuildContext, BuildError, Exporter, ExporterConfig, FieldError, Validate,
};
use proflow_model::model::Format;
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use super::{HTTP_PROFILES_PATH, OtlpExporter, TENANT_HEADER};
use crate::client::TlsSettings;

/// `protocol` of the `otlp` exporter.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Protocol {
    /// OTLP/gRPC (`ProfilesService/Export`), HTTP/2.
    #[default]
    Grpc,
    /// OTLP/HTTP: `POST` to `<endpoint>/v1development/profiles`.
    Http,
}

/// `encoding` of the `otlp` exporter (HTTP only).
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Encoding {
    /// Binary protobuf, `Content-Type: application/x-protobuf`.
    #[default]
    Proto,
    /// OTLP JSON, `Content-Type: application/json` (larger; for peers or
    /// proxies that only take JSON).
    Json,
}

/// `compression` of the `otlp` exporter.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    /// gzip: the gRPC message compression flag, or `Content-Encoding: gzip`.
    #[default]
    Gzip,
    /// Uncompressed (a peer on the same host, or one that takes no gzip).
    None,
}

/// Config of the `otlp` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OtlpExporterConfig {
    /// `grpc` (default) or `http`.
    #[serde(default)]
    pub protocol: Protocol,
    /// Where to send. gRPC: `host:port` (TLS unless `tls.insecure`) or
    /// `http://host:port` / `https://host:port`. HTTP: the base URL
    /// (`http(s)://host:port[/prefix]`); `/v1development/profiles` is
    /// appended. May be left out for HTTP when `profiles_endpoint` is set.
    #[serde(default)]
    pub endpoint: String,
    /// HTTP only: the full URL to `POST` to, used as it is (no path appended).
    #[serde(default)]
    pub profiles_endpoint: Option<String>,
    /// HTTP only: `proto` (default) or `json`.
    #[serde(default)]
    pub encoding: Option<Encoding>,
    /// Headers added to every request (gRPC metadata or HTTP headers), such
    /// as `Authorization` or `X-Scope-OrgID`. Without a configured
    /// `X-Scope-OrgID`, profiles that arrived with a tenant are sent with
    /// theirs.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// `gzip` (default, as the Collector) or `none`.
    #[serde(default)]
    pub compression: Compression,
    /// Longest wait for one request's answer, connecting included; a request
    /// that takes longer fails as retryable. Default 10s.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// TLS of the connection (see [`TlsSettings`]).
    #[serde(default)]
    pub tls: TlsSettings,
    /// Most proflow profiles in one request (each may hold several OTLP
    /// profiles, one per sample type); a larger export is split. The queue's
    /// `sending_queue.batch.max_profiles` bounds an export already, except
    /// for a single received batch larger than it. Default 500.
    #[serde(default = "default_max_batch_size")]
    pub max_batch_size: usize,
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub sending: SendingSettings,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_max_batch_size() -> usize {
    500
}

impl Default for OtlpExporterConfig {
    fn default() -> Self {
        OtlpExporterConfig {
            protocol: Protocol::default(),
            endpoint: String::new(),
            profiles_endpoint: None,
            encoding: None,
            headers: BTreeMap::new(),
            compression: Compression::default(),
            timeout: default_timeout(),
            tls: TlsSettings::default(),
            max_batch_size: default_max_batch_size(),
            sending: SendingSettings::default(),
        }
    }
}

impl OtlpExporterConfig {
    /// The resolved target, or every problem with `endpoint`,
    /// `profiles_endpoint`, `encoding` and their interplay with `tls`.
    pub(super) fn wire(&self) -> Result<Wire, Vec<FieldError>> {
        let mut problems = Vec::new();
        let wire = match self.protocol {
            Protocol::Grpc => {
                if self.profiles_endpoint.is_some() {
                    problems.push(FieldError::new(
                        "profiles_endpoint",
                        "is for `protocol: http` only; with gRPC set `endpoint` to host:port",
                    ));
                }
                if self.encoding.is_some() {
                    problems.push(FieldError::new(
                        "encoding",
                        "is for `protocol: http` only; gRPC always sends protobuf",
                    ));
                }
                self.grpc_origin(&mut problems)
            }
            Protocol::Http => self.http_url(&mut problems).map(|url| Wire::Http {
                url,
                json: self.encoding == Some(Encoding::Json),
            }),
        };
        if let Some(wire) = &wire {
            problems.extend(self.tls.endpoint_problems(wire.uses_tls()));
        }
        match wire {
            Some(wire) if problems.is_empty() => Ok(wire),
            _ => Err(problems),
        }
    }

    fn grpc_origin(&self, problems: &mut Vec<FieldError>) -> Option<Wire> {
        client::grpc_origin(
            &self.endpoint,
            self.tls.insecure,
            "127.0.0.1:4317",
            problems,
        )
        .map(|origin| Wire::Grpc { origin })
    }

    fn http_url(&self, problems: &mut Vec<FieldError>) -> Option<Uri> {
        if let Some(full) = &self.profiles_endpoint {
            return match parse_url(full.trim()) {
                Ok(uri) if full.contains("://") => Some(uri),
                Ok(_) => {
                    problems.push(FieldError::new(
                        "profiles_endpoint",
                        "must be a URL with its scheme, such as `https://host:4318/v1development/profiles`",
                    ));
                    None
                }
                Err(e) => {
                    problems.push(FieldError::new("profiles_endpoint", e));
                    None
                }
            };
        }
        let endpoint = self.endpoint.trim();
        if endpoint.is_empty() {
            problems.push(FieldError::new(
                "endpoint",
                "must be set (or `profiles_endpoint`): the peer's base URL, such as \
                 `http://127.0.0.1:4318`",
            ));
            return None;
        }
        if !endpoint.contains("://") {
            problems.push(FieldError::new(
                "endpoint",
                format!(
                    "`{endpoint}`: an HTTP endpoint is a URL with its scheme, such as `http://{endpoint}`"
                ),
            ));
            return None;
        }
        let full = format!("{}{HTTP_PROFILES_PATH}", endpoint.trim_end_matches('/'));
        match parse_url(&full) {
            Ok(uri) => Some(uri),
            Err(e) => {
                problems.push(FieldError::new("endpoint", e));
                None
            }
        }
    }

    /// The configured headers, or every problem with them.
    fn header_map(&self) -> Result<HeaderMap, Vec<FieldError>> {
        client::header_map(
            &self.headers,
            client::set_by_grpc("from `protocol`, `encoding`, `compression`"),
        )
    }
}

impl Validate for OtlpExporterConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = self.wire().err().unwrap_or_default();
        problems.extend(self.header_map().err().unwrap_or_default());
        if self.timeout.is_zero() {
            problems.push(FieldError::new(
                "timeout",
                "must be more than 0: every request needs a deadline (default 10s)",
            ));
        }
        if self.max_batch_size == 0 {
            problems.push(FieldError::new(
                "max_batch_size",
                "must be at least 1 (default 500)",
            ));
        }
        problems.extend(self.tls.own_problems());
        problems
    }
}

impl ExporterConfig for OtlpExporterConfig {
    fn sending(&self) -> &SendingSettings {
        &self.sending
    }

    fn wants(&self) -> Option<Format> {
        Some(Format::Otlp)
    }

    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
        Ok(Arc::new(self.build_otlp(ctx)?))
    }
}

impl OtlpExporterConfig {
    /// The exporter as its concrete type (tests read what it logged).
    pub fn build_otlp(&self, ctx: &BuildContext) -> Result<OtlpExporter, BuildError> {
        let fail = |problems: Vec<FieldError>| {
            BuildError::new(format!(
                "exporter `{}`: {}",
                ctx.id,
                proflow_core::component::joined_problems(&problems)
            ))
        };
        let wire = self.wire().map_err(fail)?;
        let headers = self.header_map().map_err(fail)?;
        let tenant_configured = headers.contains_key(TENANT_HEADER);
        let transport = Transport::new(
            &wire,
            &self.tls,
            headers,
            self.timeout.get(),
            self.compression == Compression::Gzip,
        )
        .map_err(|e| BuildError::new(format!("exporter `{}`: {e}", ctx.id)))?;
        Ok(OtlpExporter {
            id: ctx.id.clone(),
            transport,
            max_batch_size: self.max_batch_size.max(1),
            tenant_configured,
            retry: self.sending.retry_on_failure.clone(),
            telemetry: ctx.exporter_telemetry(),
            logged: Mutex::new(HashSet::new()),
        })
    }
}
