//! The `pyroscope` exporter: sends pprof profiles to Grafana Pyroscope (or
//! anything that speaks its push API, such as Alloy's
//! `pyroscope.receive_http`), as they arrived, never decoded.
//!
//! - `api: push` (default): `POST {endpoint}/push.v1.PusherService/Push`,
//!   Connect unary, `Content-Type: application/proto`, the body gzipped
//!   (`Content-Encoding: gzip`, as pyroscope-rs sends it). One request holds
//!   the profiles of one tenant up to `max_batch_bytes`, profiles with equal
//!   labels in one series; each `RawSample.raw_profile` is the pprof bytes
//!   as they arrived.
//! - `api: ingest`: `POST {endpoint}/ingest?name=app{k=v}&from&until&format=pprof`,
//!   one profile a request, the gzipped pprof as the body; for servers
//!   without the push API.
//!
//! Labels ([`request::series_labels`]): `__*` labels are dropped but
//! `__name__` and `__delta__` (as Alloy's `pyroscope.write`; a profile
//! without `__name__` gets one from its sample types, by Pyroscope's rules,
//! as the `parca` exporter derives Parca's), missing
//! `external_labels` are added, and a profile without `service_name` gets
//! `default_service_name` (`unknown_service`, what Pyroscope itself fills in).
//!
//! Answers: 2xx delivered; 429 and 5xx retryable (honouring `Retry-After`
//! in seconds); any other status permanent, its message (Connect's JSON
//! `message`, else the body's text) logged once per distinct message and the
//! failure counted under the status's reason. As in the `otlp` exporter, a
//! retryable failure fails the whole export only while nothing of it was
//! delivered; after that the rest is retried in place and, if that gives up,
//! reported as refused by index so the queue does not send delivered
//! profiles twice.

mod config;
mod request;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{
    AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE, HeaderMap, HeaderName, HeaderValue, RETRY_AFTER,
};
use http::{Method, Request, Uri};
use http_body_util::{BodyExt, Full, Limited};
use proflow_config::SendingSettings;
use proflow_core::component::no_problems;
use proflow_core::component::{
    BuildContext, BuildError, ErrorClass, ExportError, Exporter, ExporterConfig, Validate,
};
use proflow_core::queue::RetrySettings;
use proflow_core::telemetry::ExporterTelemetry;
use proflow_model::model::{ExportBatch, Format};
use proflow_model::profile_type::profile_name_from_sample_types;

use crate::client::{self, Connector, status};

pub use config::*;
use request::NAME_LABEL;

/// The push API's path under `endpoint`.
pub const PUSH_PATH: &str = "/push.v1.PusherService/Push";
/// The ingest API's path under `endpoint`.
pub const INGEST_PATH: &str = "/ingest";
/// The tenant header of Pyroscope (and Mimir-style gateways).
pub const TENANT_HEADER: &str = "X-Scope-OrgID";

/// Longest server message kept in an error or a log line.
const MAX_MESSAGE_CHARS: usize = 512;
/// Distinct messages remembered for log-once.
const MAX_REMEMBERED_MESSAGES: usize = 256;

/// Headers the exporter sets itself.
const RESERVED_HEADERS: &[&str] = &["content-type", "content-encoding", "content-length", "host"];

impl ExporterConfig for PyroscopeExporterConfig {
    fn sending(&self) -> &SendingSettings {
        &self.sending
    }

    fn wants(&self) -> Option<Format> {
        Some(Format::Pprof)
    }

    fn build(&self, ctx: &BuildContext) -> Result<Arc<dyn Exporter>, BuildError> {
        Ok(Arc::new(self.build_pyroscope(ctx)?))
    }
}

impl PyroscopeExporterConfig {
    /// The exporter as its concrete type (tests read its state).
    pub fn build_pyroscope(&self, ctx: &BuildContext) -> Result<PyroscopeExporter, BuildError> {
        let fail = |m: String| BuildError::new(format!("exporter `{}`: {m}", ctx.id));
        no_problems(self.validate()).map_err(|e| fail(e.0))?;
        let base = self.base_url().map_err(|e| fail(e.message))?;
        let mut headers = self.header_map().map_err(|_| fail("headers".into()))?;
        if let Some(v) = self.authorization().map_err(fail)? {
            headers.insert(AUTHORIZATION, v);
        }
        let tls = self.client_tls();
        let uses_tls = base.scheme_str() == Some("https");
        let client = client::http_client(&tls, uses_tls, self.timeout.get()).map_err(fail)?;
        let base = base.to_string().trim_end_matches('/').to_owned();
        Ok(PyroscopeExporter {
            id: ctx.id.clone(),
            client,
            base,
            api: self.api,
            headers,
            tenant_configured: self.tenant_id.is_some(),
            external_labels: self.external_labels.clone(),
            default_service_name: self.default_service_name.clone(),
            gzip: self.compression == Compression::Gzip,
            max_batch_bytes: self.max_batch_bytes.max(1),
            timeout: self.timeout.get(),
            retry: self.sending.retry_on_failure.clone(),
            telemetry: ctx.exporter_telemetry(),
            logged: Mutex::new(HashSet::new()),
        })
    }
}

/// The running `pyroscope` exporter.
#[derive(Debug)]
pub struct PyroscopeExporter {
    id: String,
    client: hyper_util::client::legacy::Client<Connector, Full<Bytes>>,
    /// `endpoint` without a trailing `/`.
    base: String,
    api: Api,
    /// Configured headers, `X-Scope-OrgID` of `tenant_id` and `Authorization`.
    headers: HeaderMap,
    tenant_configured: bool,
    external_labels: BTreeMap<String, String>,
    default_service_name: String,
    gzip: bool,
    max_batch_bytes: usize,
    timeout: std::time::Duration,
    retry: RetrySettings,
    telemetry: ExporterTelemetry,
    /// Server messages already logged.
    logged: Mutex<HashSet<String>>,
}

/// One HTTP request of an export.
struct Outgoing {
    path_and_query: String,
    content_type: &'static str,
    gzip: bool,
    body: Bytes,
}

/// What became of the requests of one export so far.
#[derive(Debug, Default)]
struct Outcome {
    delivered: usize,
    refused: Vec<usize>,
    first: Option<ExportError>,
}

impl Outcome {
    fn refuse(&mut self, indexes: impl IntoIterator<Item = usize>, error: ExportError) {
        self.refused.extend(indexes);
        self.first.get_or_insert(error);
    }
}

impl PyroscopeExporter {
    /// The requests carrying `indexes` of `envelopes`; profiles that cannot
    /// be sent are refused into `outcome`. Each request comes with the
    /// indexes it carries.
    fn build_requests(
        &self,
        envelopes: &[proflow_model::model::Envelope],
        indexes: std::ops::Range<usize>,
        outcome: &mut Outcome,
    ) -> Vec<(Outgoing, Vec<usize>)> {
        let mut profiles = Vec::new();
        let mut carried = Vec::new();
        let mut ingest = Vec::new();
        for i in indexes {
            let e = &envelopes[i];
            let shown = || e.labels.to_selector_string();
            // A profile without `__name__` (a relabel removed it, say) is
            // named from its sample types by Pyroscope's own rules, as the
            // receivers name what arrives; only a profile without named
            // sample types cannot be sent.
            let named;
            let own_labels = if e.labels.get(NAME_LABEL).is_none_or(str::is_empty) {
                let types = e.sample_types.iter().map(|t| t.r#type.as_str());
                match profile_name_from_sample_types(types, None) {
                    Some(name) => {
                        let mut l = e.labels.clone();
                        l.set(NAME_LABEL, name);
                        named = l;
                        &named
                    }
                    None => {
                        outcome.refuse(
                            [i],
                            ExportError::permanent(
                                "no_profile_name",
                                format!(
                                    "profile {} has no `__name__` label and no named sample type to derive one from, and Pyroscope requires one (such as process_cpu); it was dropped",
                                    shown()
                                ),
                            ),
                        );
                        continue;
                    }
                }
            } else {
                &e.labels
            };
            // As it arrived: no decode, no re-encode (gzipped or plain).
            let bytes = match e.payload.encoded() {
                Ok(enc) => enc.bytes,
                Err(err) => {
                    outcome.refuse(
                        [i],
                        ExportError::permanent(
                            "encode",
                            format!(
                                "profile {} has no pprof form ({err}); it was dropped",
                                shown()
                            ),
                        ),
                    );
                    continue;
                }
            };
            let labels = request::series_labels(
                own_labels,
                &self.external_labels,
                &self.default_service_name,
            );
            match self.api {
                Api::Push => {
                    profiles.push((labels, bytes));
                    carried.push(i);
                }
                Api::Ingest => {
                    match request::ingest_query(&labels, e.start_unix_nanos, e.end_unix_nanos) {
                        Ok(query) => {
                            let body = match e.payload.gzipped() {
                                Ok(b) => b,
                                Err(_) => request::gzip_bytes(&bytes),
                            };
                            ingest.push((
                                Outgoing {
                                    path_and_query: format!("{INGEST_PATH}?{query}"),
                                    content_type: "application/octet-stream",
                                    gzip: false,
                                    body,
                                },
                                vec![i],
                            ));
                        }
                        Err(err) => outcome.refuse(
                            [i],
                            ExportError::permanent(
                                "unrepresentable_labels",
                                format!("profile {}: {err}; it was dropped", shown()),
                            ),
                        ),
                    }
                }
            }
        }
        if self.api == Api::Ingest {
            return ingest;
        }
        if profiles.is_empty() {
            return Vec::new();
        }
        let push = request::push_request(profiles);
        vec![(
            Outgoing {
                path_and_query: PUSH_PATH.to_owned(),
                content_type: "application/proto",
                gzip: self.gzip,
                body: request::encode_push(&push, self.gzip),
            },
            carried,
        )]
    }

    /// Sends one request once, bounded by `timeout`.
    async fn send_once(&self, out: &Outgoing, tenant: Option<&str>) -> Result<(), ExportError> {
        let url = format!("{}{}", self.base, out.path_and_query);
        let uri: Uri = url.parse().map_err(|e| {
            ExportError::permanent("invalid_url", format!("`{url}` is not a valid URL: {e}"))
        })?;
        let mut headers = self.headers.clone();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static(out.content_type));
        if out.gzip {
            headers.insert(CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        if let Some(t) = tenant {
            let v = HeaderValue::from_str(t).map_err(|_| {
                ExportError::permanent(
                    "invalid_tenant",
                    format!("tenant `{t}` cannot be sent as an {TENANT_HEADER} header"),
                )
            })?;
            headers.insert(HeaderName::from_static("x-scope-orgid"), v);
        }
        let mut req = Request::new(Full::new(out.body.clone()));
        *req.method_mut() = Method::POST;
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        let call = async {
            let response = self.client.request(req).await.map_err(|e| {
                ExportError::retryable(
                    "unavailable",
                    format!(
                        "Pyroscope export to {} failed: could not send: {}",
                        self.base,
                        status::error_chain(&e)
                    ),
                )
            })?;
            let (parts, body) = response.into_parts();
            if parts.status.is_success() {
                return Ok(());
            }
            let body = Limited::new(body, client::MAX_RESPONSE_BYTES)
                .collect()
                .await
                .map(|c| c.to_bytes())
                .unwrap_or_default();
            let retry_after = parts
                .headers
                .get(RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(status::parse_retry_after);
            Err(self.refusal(parts.status.as_u16(), retry_after, &body))
        };
        match tokio::time::timeout(self.timeout, call).await {
            Ok(r) => r,
            Err(_) => Err(ExportError::retryable(
                "timeout",
                format!(
                    "Pyroscope export to {} got no answer within {:?} (`timeout`)",
                    self.base, self.timeout
                ),
            )),
        }
    }

    /// The export error of a non-2xx answer; a permanent one's message is
    /// logged once.
    fn refusal(
        &self,
        status: u16,
        retry_after: Option<std::time::Duration>,
        body: &[u8],
    ) -> ExportError {
        let said = server_message(body);
        let message = format!(
            "Pyroscope export to {} failed: HTTP {status}: {said}",
            self.base
        );
        let reason = status_reason(status);
        if status_retryable(status) {
            let e = ExportError::retryable(reason, message);
            return match retry_after {
                Some(d) => e.with_retry_after(d),
                None => e,
            };
        }
        let first_time = {
            let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
            logged.len() < MAX_REMEMBERED_MESSAGES && logged.insert(format!("{status} {said}"))
        };
        if first_time {
            tracing::warn!(exporter = %self.id, peer = %self.base, status, error = %said, "Pyroscope refused profiles; this message is logged once");
        } else {
            tracing::debug!(exporter = %self.id, status, error = %said, "Pyroscope refused profiles");
        }
        ExportError::permanent(reason, message)
    }

    /// Sends one request; once part of the batch is delivered (`in_place`),
    /// retryable failures are retried here with the `retry_on_failure` backoff.
    async fn send(
        &self,
        out: &Outgoing,
        tenant: Option<&str>,
        in_place: bool,
    ) -> Result<(), ExportError> {
        let started = Instant::now();
        let mut wait = self.retry.initial_interval.get();
        loop {
            let err = match self.send_once(out, tenant).await {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            let retry_after = match err.class {
                ErrorClass::Retryable { retry_after } if in_place && self.retry.enabled => {
                    retry_after
                }
                _ => return Err(err),
            };
            let delay = retry_after.unwrap_or(wait);
            let max_elapsed = self.retry.max_elapsed_time.get();
            let past_deadline = started
                .elapsed()
                .checked_add(delay)
                .is_none_or(|end| end > max_elapsed);
            if !max_elapsed.is_zero() && past_deadline {
                return Err(err);
            }
            self.telemetry.retried();
            tokio::time::sleep(delay).await;
            wait = std::cmp::min(
                std::time::Duration::try_from_secs_f64(
                    wait.as_secs_f64() * self.retry.multiplier.max(1.0),
                )
                .unwrap_or(std::time::Duration::MAX),
                self.retry.max_interval.get(),
            );
        }
    }
}

/// 429 and every 5xx are worth retrying (Pyroscope answers 5xx while an
/// ingester is unavailable); other non-2xx statuses are final.
pub(crate) fn status_retryable(status: u16) -> bool {
    status == 429 || (500..=599).contains(&status)
}

fn status_reason(status: u16) -> &'static str {
    match status {
        400 => "bad_request",
        401 => "unauthorized",
        403 => "forbidden",
        404 => "not_found",
        413 => "too_large",
        415 => "unsupported_media_type",
        422 => "unprocessable",
        429 => "too_many_requests",
        503 => "unavailable",
        500..=599 => "server_error",
        _ => "http_error",
    }
}

/// What a refusing server said: Connect's JSON `{code, message}`, else the
/// body as text, trimmed and cut to a length fit for a log line.
pub(crate) fn server_message(body: &[u8]) -> String {
    let text = serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("message")?.as_str().map(str::to_owned))
        .unwrap_or_else(|| String::from_utf8_lossy(body).into_owned());
    let text = text.trim();
    if text.is_empty() {
        return "(no message)".to_owned();
    }
    match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_owned(),
    }
}

#[async_trait]
impl Exporter for PyroscopeExporter {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let envelopes = batch.envelopes();
        let planned = request::plan(
            batch.sources(),
            self.max_batch_bytes,
            self.tenant_configured,
            self.api == Api::Ingest,
        );
        let mut outcome = Outcome::default();
        let mut not_sent: Vec<usize> = Vec::new();
        let mut gave_up = false;
        for p in &planned {
            if gave_up {
                not_sent.extend(p.indexes.clone());
                continue;
            }
            for (out, carried) in self.build_requests(envelopes, p.indexes.clone(), &mut outcome) {
                if gave_up {
                    not_sent.extend(carried);
                    continue;
                }
                let in_place = outcome.delivered > 0;
                match self.send(&out, p.tenant.as_deref(), in_place).await {
                    Ok(()) => outcome.delivered += carried.len(),
                    Err(e) if matches!(e.class, ErrorClass::Permanent) => {
                        outcome.refuse(carried, e)
                    }
                    // Nothing delivered yet: the queue retries the batch.
                    Err(e) if !in_place => return Err(e),
                    Err(e) => {
                        outcome.refuse(carried, e);
                        gave_up = true;
                    }
                }
            }
        }
        outcome.refused.extend(not_sent);
        let Some(first) = outcome.first else {
            return Ok(());
        };
        if outcome.delivered == 0 {
            return Err(ExportError {
                class: ErrorClass::Permanent,
                refused: None,
                ..first
            });
        }
        outcome.refused.sort_unstable();
        outcome.refused.dedup();
        let message = format!(
            "{} of {} profiles were not delivered: {}",
            outcome.refused.len(),
            envelopes.len(),
            first.message
        );
        Err(ExportError::partial(outcome.refused, first.reason, message))
    }
}
