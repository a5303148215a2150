//! The `parca` exporter's config: endpoint, TLS, labels and limits; their
//! checks, and the build.

use crate::client::{self, TlsSettings};
use http::Uri;
use http::header::{AUTHORIZATION, HeaderMap, HeaderValue};
use proflow_config::Duration;
use proflow_config::SendingSettings;
use proflow_core::component::no_problems;
use proflow_core::component::{
    BuildContext, BuildError, Exporter, ExporterConfig, FieldError, Validate,
};
use proflow_model::model::{Format, is_valid_label_name};
use serde::Deserialize;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use super::{ParcaExporter, WRITE_RAW_PATH};

/// Config of the `parca` exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParcaExporterConfig {
    /// Parca's gRPC address: `host:port` (TLS unless `tls.insecure`) or
    /// `http://host:port` / `https://host:port`. Parca serves gRPC on its
    /// HTTP port (7070 by default).
    #[serde(default)]
    pub endpoint: String,
    /// TLS of the connection; `tls: { insecure: true }` for plaintext (h2c).
    #[serde(default)]
    pub tls: TlsSettings,
    /// Sent as `Authorization: Bearer <token>` (Polar Signals Cloud and
    /// Parca behind an authenticating proxy).
    #[serde(default)]
    pub bearer_token: Option<String>,
    /// File holding the bearer token (surrounding whitespace trimmed); read
    /// when the exporter starts.
    #[serde(default)]
    pub bearer_token_file: Option<PathBuf>,
    /// gRPC metadata added to every request.
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// Longest wait for one request's answer, connecting included; a request
    /// that takes longer fails as retryable. Default 10s.
    #[serde(default = "default_timeout")]
    pub timeout: Duration,
    /// `WriteRawRequest.normalized`: the pprof addresses are already
    /// normalized (relative to their mappings). Default true, as Parca's
    /// agent sends; runtime profilers' pprof (Go, Python, Node) is
    /// symbolized, so Parca has no addresses to normalize.
    #[serde(default = "default_normalized")]
    pub normalized: bool,
    /// Labels added to every series that does not have them already. Names
    /// must be Prometheus label names not starting with `__`.
    #[serde(default)]
    pub external_labels: BTreeMap<String, String>,
    /// `sending_queue` and `retry_on_failure`, written beside this
    /// exporter's own keys (see [`SendingSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub sending: SendingSettings,
}

fn default_timeout() -> Duration {
    Duration::from_secs(10)
}

fn default_normalized() -> bool {
    true
}

impl Default for ParcaExporterConfig {
    fn default() -> Self {
        ParcaExporterConfig {
            endpoint: String::new(),
            tls: TlsSettings::default(),
            bearer_token: None,
            bearer_token_file: None,
            headers: BTreeMap::new(),
            timeout: default_timeout(),
            normalized: default_normalized(),
            external_labels: BTreeMap::new(),
            sending: SendingSettings::default(),
        }
    }
}

impl ParcaExporterConfig {
    pub(super) fn origin(&self, problems: &mut Vec<FieldError>) -> Option<Uri> {
        let origin = client::grpc_origin(
            &self.endpoint,
            self.tls.insecure,
            "127.0.0.1:7070",
            problems,
        )?;
        problems.extend(
            self.tls
                .endpoint_problems(origin.scheme_str() == Some("https")),
        );
        Some(origin)
    }

    fn header_map(&self) -> Result<HeaderMap, Vec<FieldError>> {
        client::header_map(
            &self.headers,
            client::set_by_grpc("gRPC framing and `bearer_token`"),
        )
    }
}

impl Validate for ParcaExporterConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        self.origin(&mut problems);
        problems.extend(self.tls.own_problems());
        problems.extend(self.header_map().err().unwrap_or_default());
        let bearer = self.bearer_token.is_some() || self.bearer_token_file.is_some();
        if self.bearer_token.is_some() && self.bearer_token_file.is_some() {
            problems.push(FieldError::new(
                "bearer_token_file",
                "is set together with `bearer_token`; keep one of them",
            ));
        }
        if self
            .bearer_token
            .as_deref()
            .is_some_and(|t| t.trim().is_empty())
        {
            problems.push(FieldError::new(
                "bearer_token",
                "is empty; remove it or set the token",
            ));
        }
        if bearer
            && self
                .headers
                .keys()
                .any(|k| k.eq_ignore_ascii_case("authorization"))
        {
            problems.push(FieldError::new(
                "headers.authorization",
                "is set by `bearer_token`/`bearer_token_file`; keep one of them",
            ));
        }
        if self.timeout.is_zero() {
            problems.push(FieldError::new(
                "timeout",
                "must be more than 0: every request needs a deadline (default 10s)",
            ));
        }
        for (name, value) in &self.external_labels {
            let path = format!("external_labels.{name}");
            if !is_valid_label_name(name) {
                problems.push(FieldError::new(
                    path,
                    "is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)",
                ));
            } else if name.starts_with("__") {
                problems.push(FieldError::new(
                    path,
                    "starts with `__`, which is reserved for internal labels; rename it",
                ));
            } else if value.is_empty() {
                problems.push(FieldError::new(
                    path,
                    "has an empty value, which means no label at all; remove it or set a value",
                ));
            }
        }
        // One export is one request, and Parca refuses gRPC messages over
        // 32 MiB for good: keep what one send gathers under it with room
        // for the series labels and framing.
        if self.sending.sending_queue.batch.max_bytes.bytes() > MAX_BATCH_BYTES {
            problems.push(FieldError::new(
                "sending_queue.batch.max_bytes",
                format!(
                    "is more than {} MiB: one export is one WriteRaw request and Parca refuses messages over 32 MiB (default 16MiB)",
                    MAX_BATCH_BYTES >> 20
                ),
            ));
        }
        problems
    }
}

/// The most `sending_queue.batch.max_bytes` may be (see `validate`).
const MAX_BATCH_BYTES: u64 = 28 << 20;

impl ExporterConfig for ParcaExporterConfig {
    fn sending(&self) -> &SendingSettings {
        &self.sending
    }

    fn wants(&self) -> Option<Format> {
        Some(Format::Pprof)
    }

    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
        Ok(Arc::new(self.build_parca(ctx)?))
    }
}

impl ParcaExporterConfig {
    /// The exporter as its concrete type.
    pub fn build_parca(&self, ctx: &BuildContext) -> Result<ParcaExporter, BuildError> {
        let fail = |message: String| BuildError::new(format!("exporter `{}`: {message}", ctx.id));
        no_problems(self.validate()).map_err(|e| fail(e.0))?;
        let origin = self
            .origin(&mut Vec::new())
            .ok_or_else(|| fail("`endpoint` is not usable".to_owned()))?;
        let mut headers = self
            .header_map()
            .map_err(|_| fail("`headers` are not usable".to_owned()))?;
        let token = match (&self.bearer_token, &self.bearer_token_file) {
            (Some(t), _) => Some(t.trim().to_owned()),
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| fail(format!("bearer_token_file `{}`: {e}", path.display())))?;
                let t = text.trim().to_owned();
                if t.is_empty() {
                    return Err(fail(format!(
                        "bearer_token_file `{}` is empty",
                        path.display()
                    )));
                }
                Some(t)
            }
            (None, None) => None,
        };
        if let Some(token) = token {
            let mut value = HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                fail("the bearer token is not a valid header value (visible ASCII only)".to_owned())
            })?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let timeout = self.timeout.get();
        let client = client::grpc_client(&self.tls, origin.scheme_str() == Some("https"), timeout)
            .map_err(fail)?;
        let shown = origin.to_string();
        let url = format!("{}{WRITE_RAW_PATH}", shown.trim_end_matches('/'))
            .parse()
            .map_err(|e| fail(format!("`endpoint` {shown} does not make a URL: {e}")))?;
        Ok(ParcaExporter {
            id: ctx.id.clone(),
            client,
            url,
            shown,
            headers,
            timeout,
            normalized: self.normalized,
            external_labels: self
                .external_labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            logged: Mutex::new(HashSet::new()),
        })
    }
}
