//! The `otlp` exporter: sends profiles as OTLP profiles
//! (`ExportProfilesServiceRequest`, proto 1.10 `v1development`) to an
//! OpenTelemetry Collector, Pyroscope, Parca or any OTLP profiles receiver,
//! over gRPC or HTTP (protobuf or JSON). Config names follow the Collector's
//! `otlp` and `otlphttp` exporters.
//!
//! - This file: the config, its validation, and [`OtlpExporter::export`],
//!   which splits a batch into requests ([`plan`]) and reports what became of
//!   each profile.
//! - [`transport`]: the gRPC and HTTP clients (one rustls setup for both) and
//!   the raw-bytes gRPC codec.
//! - [`status`]: which answers are retryable, `RetryInfo` / `Retry-After`,
//!   and the server's message.
//!
//! Requests: the pipeline has converted every profile to its OTLP form before
//! the queue ([`ExporterConfig::wants`]), so an export encodes the batch's
//! OTLP forms into one request with one shared dictionary
//! ([`otlp::RequestBuilder`]; the bytes are written from references and sent
//! as they are, never re-encoded through generated client code). A batch is
//! split only (a) between runs of different tenants, since a request carries
//! one `X-Scope-OrgID`, and (b) every `max_batch_size` profiles.
//!
//! Failures of a split batch: a retryable error retries the whole batch, so
//! it is returned only while nothing of the batch has been delivered. Once a
//! request of the batch has succeeded, a retryable failure of a later one is
//! retried here, in place, with the `retry_on_failure` backoff (and the
//! peer's `RetryInfo`/`Retry-After`); if that gives up, the profiles not
//! delivered are reported as refused ([`ExportError::partial`]) so the queue
//! does not resend, and duplicate, the delivered ones. Profiles the peer
//! refuses permanently are reported the same way, by index.
//!
//! Partial success: an OTLP response may say it rejected some profiles of a
//! delivered request, but names none (the protocol gives a count and a
//! message, no indexes). The request then counts as delivered; the count
//! goes to `exporter_dropped_profiles{reason="rejected_by_peer"}` (in OTLP
//! profiles, one per sample type, so it overlaps `exporter_sent_profiles`,
//! which the queue counts per proflow profile) and each distinct message is
//! logged once.
//!
//! The queue counts sent and failed profiles from what `export` returns; this
//! exporter counts nothing else.

mod config;
#[cfg(test)]
mod tests;
mod transport;

pub use crate::client::TlsSettings;
pub use config::{Compression, Encoding, OtlpExporterConfig, Protocol};

use std::collections::HashSet;
use std::ops::Range;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use proflow_core::component::{ErrorClass, ExportError, Exporter};
use proflow_core::queue::RetrySettings;
use proflow_core::telemetry::ExporterTelemetry;
use proflow_model::model::{BatchMeta, Envelope, ExportBatch, Labels};
use proflow_model::otlp::{self, OtlpProfiles};

use self::transport::{PartialSuccess, Transport};

/// The header Pyroscope, Mimir-style gateways and the Collector's
/// `headers_setter` read the tenant from.
pub const TENANT_HEADER: &str = "X-Scope-OrgID";

/// Path appended to an OTLP/HTTP `endpoint` (as `otlphttp` appends
/// `/v1/traces` for traces).
pub const HTTP_PROFILES_PATH: &str = "/v1development/profiles";

/// Distinct partial-success messages remembered for log-once; past this, new
/// messages are logged at debug level only.
const MAX_REMEMBERED_MESSAGES: usize = 256;

/// One request of an export: the batch indexes it carries and the tenant it
/// is sent for (`None`: no tenant header beyond the configured ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    pub tenant: Option<String>,
    pub indexes: Range<usize>,
}

/// A dictionary with at least this many strings and locations together is
/// sent on as it arrived, in a request of its own profiles: re-indexing it
/// into a merged dictionary costs more than the request it saves (measured:
/// merging four ~61 KB requests took 25 times as long as writing one by
/// reference).
pub(crate) const PASS_THROUGH_ENTRIES: usize = 512;

/// Requests whose profiles account for at most this many bytes are encoded
/// on the async worker (see [`OtlpExporter::encode`]).
const ENCODE_INLINE_MAX: usize = 256 << 10;

/// The dictionary a profile is sent with as it is, when it is large enough
/// (see [`PASS_THROUGH_ENTRIES`]); `None` for profiles worth merging.
fn large_dictionary(e: &Envelope) -> Option<usize> {
    let o = e.payload.otlp().ok()?;
    let d = &o.dictionary;
    (d.entries() >= PASS_THROUGH_ENTRIES).then_some(Arc::as_ptr(d) as usize)
}

/// The requests of one export, in batch order: consecutive runs with the
/// same tenant share requests; each request holds at most `max_batch_size`
/// profiles. With a configured `X-Scope-OrgID` (`tenant_configured`) the
/// batch's own tenants are not used and only the size splits. Profiles of a
/// large dictionary ([`PASS_THROUGH_ENTRIES`]) go in requests of their own,
/// which write that dictionary as it arrived; consecutive profiles of small
/// dictionaries share requests, each with one merged dictionary.
pub(crate) fn plan<'a>(
    sources: impl Iterator<Item = (&'a BatchMeta, &'a [Envelope])>,
    max_batch_size: usize,
    tenant_configured: bool,
) -> Vec<Planned> {
    // (tenant, dictionary key, range)
    let mut runs: Vec<(Option<String>, Option<usize>, Range<usize>)> = Vec::new();
    let mut at = 0;
    for (meta, envelopes) in sources {
        for e in envelopes {
            let tenant = if tenant_configured {
                None
            } else {
                meta.tenant_of(&e.labels).map(str::to_owned)
            };
            let key = large_dictionary(e);
            match runs.last_mut() {
                Some((t, k, range)) if *t == tenant && *k == key => range.end = at + 1,
                _ => runs.push((tenant.clone(), key, at..at + 1)),
            }
            at += 1;
        }
    }
    let step = max_batch_size.max(1);
    let mut planned = Vec::new();
    for (tenant, _, range) in runs {
        let mut from = range.start;
        while from < range.end {
            let to = (from + step).min(range.end);
            planned.push(Planned {
                tenant: tenant.clone(),
                indexes: from..to,
            });
            from = to;
        }
    }
    planned
}

/// The running `otlp` exporter.
#[derive(Debug)]
pub struct OtlpExporter {
    id: String,
    transport: Transport,
    max_batch_size: usize,
    /// `X-Scope-OrgID` is among the configured headers: it wins over the
    /// tenants profiles arrived with.
    tenant_configured: bool,
    retry: RetrySettings,
    telemetry: ExporterTelemetry,
    /// Partial-success messages already logged.
    logged: Mutex<HashSet<String>>,
}

/// What became of the requests of one export so far.
#[derive(Debug, Default)]
struct Outcome {
    delivered: usize,
    refused: Vec<usize>,
    /// The first permanent failure, for the report.
    first: Option<ExportError>,
}

impl Outcome {
    fn refuse(&mut self, indexes: impl IntoIterator<Item = usize>, error: ExportError) {
        self.refused.extend(indexes);
        self.first.get_or_insert(error);
    }
}

impl OtlpExporter {
    /// Encodes the profiles of one request: a small one on the async worker
    /// itself (a hop to the blocking pool costs two thread switches and, per
    /// blocking thread, an allocator arena), a larger one on the blocking
    /// pool (merging dictionaries, encoding and gzip can take milliseconds).
    async fn encode(&self, items: Vec<(Labels, Arc<OtlpProfiles>)>) -> Result<Bytes, ExportError> {
        let json = self.transport.wants_json();
        let gzip = self.transport.wants_gzipped_body();
        let size: usize = items.iter().map(|(_, o)| o.size_bytes()).sum();
        let encoded = if size <= ENCODE_INLINE_MAX && !json {
            Ok(encode_request(&items, json, gzip))
        } else {
            tokio::task::spawn_blocking(move || encode_request(&items, json, gzip)).await
        };
        match encoded {
            Ok(Ok(bytes)) => Ok(bytes),
            Ok(Err(e)) => Err(ExportError::permanent(
                "encode",
                format!("could not build the OTLP request: {e}; the profiles were dropped"),
            )),
            Err(join) => Err(ExportError::retryable(
                "encode",
                format!("the encoding task did not finish ({join}); the batch will be retried"),
            )),
        }
    }

    /// Sends one request; once part of the batch is delivered
    /// (`in_place`), retryable failures are retried here (see the module docs).
    async fn send(
        &self,
        body: Bytes,
        tenant: Option<&str>,
        in_place: bool,
    ) -> Result<PartialSuccess, ExportError> {
        let mut extra = Vec::new();
        if let Some(tenant) = tenant {
            match HeaderValue::from_str(tenant) {
                Ok(v) => extra.push((HeaderName::from_static("x-scope-orgid"), v)),
                Err(_) => {
                    return Err(ExportError::permanent(
                        "invalid_tenant",
                        format!("tenant `{tenant}` cannot be sent as an {TENANT_HEADER} header"),
                    ));
                }
            }
        }
        let started = Instant::now();
        let mut wait = self.retry.initial_interval.get();
        loop {
            let err = match self.transport.send(body.clone(), &extra).await {
                Ok(p) => return Ok(p),
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
            tracing::debug!(exporter = %self.id, error = %err, ?delay, "part of the batch is delivered; retrying the rest in place");
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

    /// Counts and logs (once per distinct message) what a delivered request's
    /// answer says was rejected.
    fn note_partial_success(&self, p: &PartialSuccess) {
        if p.rejected_profiles <= 0 && p.error_message.is_empty() {
            return;
        }
        if p.rejected_profiles > 0 {
            self.telemetry
                .dropped("rejected_by_peer", p.rejected_profiles as u64);
        }
        let first_time = {
            let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
            logged.len() < MAX_REMEMBERED_MESSAGES && logged.insert(p.error_message.clone())
        };
        if first_time {
            tracing::warn!(
                exporter = %self.id,
                peer = %self.transport.shown(),
                rejected = p.rejected_profiles,
                error = %p.error_message,
                "the peer accepted a request but rejected some of its profiles (OTLP does not say which); this message is logged once"
            );
        } else {
            tracing::debug!(exporter = %self.id, rejected = p.rejected_profiles, error = %p.error_message, "the peer rejected some profiles of a request");
        }
    }
}

/// One request's bytes: protobuf (or OTLP JSON), gzipped if asked.
fn encode_request(
    items: &[(Labels, Arc<OtlpProfiles>)],
    json: bool,
    gzip: bool,
) -> Result<Bytes, otlp::ConvertError> {
    let mut builder = otlp::RequestBuilder::new();
    for (labels, profiles) in items {
        builder.push(labels, profiles);
    }
    let request = builder.build()?;
    let bytes = if json {
        otlp::json::encode_request(&request.to_message()?)
    } else {
        request.encode()
    };
    if !gzip {
        return Ok(Bytes::from(bytes));
    }
    // One call of libdeflate, its compressor kept per thread (a zlib state
    // per request was about 300 KB allocated and zeroed).
    Ok(proflow_model::pprof::gzip(&bytes))
}

#[async_trait]
impl Exporter for OtlpExporter {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let envelopes = batch.envelopes();
        let requests = plan(batch.sources(), self.max_batch_size, self.tenant_configured);
        let mut outcome = Outcome::default();
        let mut gave_up_at = None;
        for (n, request) in requests.iter().enumerate() {
            let mut items = Vec::with_capacity(request.indexes.len());
            let mut carried = Vec::with_capacity(request.indexes.len());
            for i in request.indexes.clone() {
                match envelopes[i].payload.otlp() {
                    Ok(o) => {
                        items.push((envelopes[i].labels.clone(), o));
                        carried.push(i);
                    }
                    Err(e) => outcome.refuse(
                        [i],
                        ExportError::permanent(
                            "decode",
                            format!(
                                "profile {} has no OTLP form ({e}); it was dropped",
                                envelopes[i].labels.to_selector_string()
                            ),
                        ),
                    ),
                }
            }
            if items.is_empty() {
                continue;
            }
            let in_place = outcome.delivered > 0;
            let sent = match self.encode(items).await {
                Ok(body) => self.send(body, request.tenant.as_deref(), in_place).await,
                Err(e) => Err(e),
            };
            match sent {
                Ok(p) => {
                    self.note_partial_success(&p);
                    outcome.delivered += carried.len();
                }
                Err(e) if matches!(e.class, ErrorClass::Permanent) => outcome.refuse(carried, e),
                // Nothing delivered yet: the queue retries the whole batch
                // (profiles refused so far are refused again, not duplicated).
                Err(e) if !in_place => return Err(e),
                // Retried in place until `retry_on_failure` gave up: what is
                // left is reported as refused, never resent with the rest.
                Err(e) => {
                    outcome.refuse(carried, e);
                    gave_up_at = Some(n + 1);
                    break;
                }
            }
        }
        if let Some(next) = gave_up_at {
            outcome
                .refused
                .extend(requests[next..].iter().flat_map(|r| r.indexes.clone()));
        }
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
