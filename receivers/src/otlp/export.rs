//! The handler both protocols share: one `ExportProfilesServiceRequest`,
//! from bytes to a batch in the pipeline.
//!
//! 1. Protobuf ([`otlp::split_raw`]) is never decoded but for resources and
//!    scopes: the dictionary and each profile are checked on the wire and the
//!    payloads hold slices of the body, so the body is all a request holds.
//!    JSON ([`otlp::split_decoded`]) is decoded: what decoding takes is
//!    bounded first from the document's shape ([`otlp::json::decode_cost`]),
//!    refused past `max_decoded_size`, and the request's memory grant grown
//!    by it.
//! 2. A broken dictionary refuses the whole request; a broken profile is
//!    refused alone and reported in `partial_success` (when every profile is
//!    broken the request is refused as invalid, 400 / `INVALID_ARGUMENT`).
//! 3. One envelope per (resource, scope, profile), all sharing the request's
//!    dictionary (one `Arc`) and their scope's [`OtlpContext`].
//! 4. The grant is trued up to what the batch holds and kept until the
//!    pipeline took the batch (its queues count it from then on).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use proflow_core::component::{self, Consumer};
use proflow_core::telemetry::ReceiverTelemetry;
use proflow_model::memory::{self, MemoryBudget, MemoryGrant};
use proflow_model::model::{BatchMeta, Envelope, batch_bytes};
use proflow_model::otlp::{self, AttributeLabels, Split, collector};
use proflow_model::spans::{self, SpanConsumer};
use proflow_net::server::TenantLimiter;
use prost::Message;

use super::error::{OtlpError, Refused};

/// Bodies up to this size are decoded on the async worker itself (a few
/// hundred microseconds at most; a hop to the blocking pool costs two thread
/// switches per request); larger ones on the blocking pool, so they never
/// stall the async workers.
const DECODE_INLINE_MAX: usize = 256 << 10;

/// How a request's body is encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Encoding {
    Protobuf,
    Json,
}

/// Where a request came from.
#[derive(Debug, Clone, Default)]
pub(crate) struct Origin {
    pub tenant: Option<String>,
    /// `tenant` is the one the request's bearer token is bound to.
    pub tenant_bound: bool,
    pub client: Option<SocketAddr>,
}

/// What both protocols share.
pub(crate) struct Handler {
    pub id: String,
    /// The id again, shared by every batch's metadata.
    pub receiver: Arc<str>,
    pub labels: AttributeLabels,
    pub consumer: Arc<dyn Consumer>,
    pub telemetry: ReceiverTelemetry,
    pub memory: MemoryBudget,
    /// False when this receiver is in no profiles pipeline.
    pub takes_profiles: bool,
    /// Where spans go, for a receiver in a traces pipeline.
    pub spans: Option<Arc<dyn SpanConsumer>>,
    /// `limits`: per-tenant ingestion rates, when set.
    pub tenant_limits: Option<Arc<TenantLimiter>>,
}

impl Handler {
    /// Exports one request whose `body` the caller holds `grant` for; the
    /// refusal, if any, is counted by the caller.
    pub async fn export(
        &self,
        body: Bytes,
        encoding: Encoding,
        mut grant: MemoryGrant,
        max_decoded: usize,
        origin: Origin,
    ) -> Result<collector::ExportProfilesServiceResponse, Refused> {
        self.takes_profiles()?;
        if let Some(limiter) = &self.tenant_limits {
            limiter
                .admit(origin.tenant.as_deref(), body.len())
                .map_err(OtlpError::RateLimited)?;
        }
        // Protobuf is checked on the wire and kept as it arrived: nothing is
        // decoded but resources and scopes, so the body is all it holds (a
        // 1.9 request twice, while its 1.10 copy is made).
        let estimate = match encoding {
            Encoding::Protobuf if otlp::is_1_9(&body) => body.len(),
            Encoding::Protobuf => 0,
            Encoding::Json => otlp::json::decode_cost(&body),
        };
        if estimate > max_decoded {
            return Err(OtlpError::TooLarge(format!(
                "the request would take about {estimate} bytes once decoded, more than max_decoded_size ({max_decoded} bytes); send fewer or smaller profiles per request or raise max_decoded_size"
            ))
            .into());
        }
        grant
            .grow(estimate, memory::DEFAULT_WAIT)
            .await
            .map_err(OtlpError::from_memory)?;
        let inline = body.len() <= DECODE_INLINE_MAX;
        let body_bytes = body.len();
        let mapping = self.labels.clone();
        let work = move || -> Result<(Split, MemoryGrant), Refused> {
            let built = split(&body, encoding, &mapping)?;
            Ok((built, grant))
        };
        let (built, mut grant) = if inline {
            work()?
        } else {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| OtlpError::Internal(format!("the decoding task failed: {e}")))??
        };
        // From here on the request holds what its envelopes account for.
        let held = batch_bytes(&built.envelopes);
        if held < grant.held() {
            grant.shrink(grant.held() - held);
        } else if grant.try_grow(held - grant.held()).is_err() {
            // The estimate was low: what is decoded is held anyway, and the
            // queues count it from the moment they take it.
            tracing::debug!(receiver = %self.id, held, "decoded more than estimated");
        }
        if let Some(limiter) = &self.tenant_limits {
            limiter
                .check_series(origin.tenant.as_deref(), &built.envelopes)
                .map_err(|r| Refused {
                    error: OtlpError::Limit(r),
                    profiles: built.envelopes.len() as u64,
                })?;
        }
        if built.rejected > 0 {
            self.telemetry.refused("invalid_profile", built.rejected);
        }
        let format = match encoding {
            Encoding::Protobuf => "otlp_proto",
            Encoding::Json => "otlp_json",
        };
        if built.from_1_9 {
            self.telemetry
                .upgraded("otlp_1_9", origin.client.map(|c| c.ip()));
        }
        self.telemetry.lost_parts(
            "label",
            format,
            origin.client.map(|c| c.ip()),
            &built.lost_labels,
        );
        let partial_success =
            (built.rejected > 0).then(|| collector::ExportProfilesPartialSuccess {
                rejected_profiles: i64::try_from(built.rejected).unwrap_or(i64::MAX),
                error_message: built.error_message.clone(),
            });
        if built.envelopes.is_empty() && built.rejected == 0 && body_bytes > 0 {
            // Answered as the Collector answers it, but not silently.
            self.telemetry
                .empty_request(format, origin.client.map(|c| c.ip()), body_bytes);
        }
        self.deliver(built.envelopes, origin).await?;
        drop(grant);
        Ok(collector::ExportProfilesServiceResponse { partial_success })
    }

    /// Takes one `ExportTraceServiceRequest` for the span-taking processors
    /// of this receiver's traces pipelines. Spans are decoded (ids, name,
    /// times, service; nothing else is allocated) under `grant`, grown by
    /// what they take, and handed on at once; nothing is queued.
    pub async fn export_spans(
        &self,
        body: Bytes,
        encoding: Encoding,
        mut grant: MemoryGrant,
        max_decoded: usize,
    ) -> Result<spans::ExportTraceServiceResponse, OtlpError> {
        let consumer = self.span_consumer()?.clone();
        let estimate = match encoding {
            Encoding::Protobuf => spans::decode_cost(&body),
            Encoding::Json => spans::json_decode_cost(&body),
        };
        if estimate > max_decoded {
            return Err(OtlpError::TooLarge(format!(
                "the request would take about {estimate} bytes once decoded, more than max_decoded_size ({max_decoded} bytes); send fewer spans per request or raise max_decoded_size"
            )));
        }
        grant
            .grow(estimate, memory::DEFAULT_WAIT)
            .await
            .map_err(OtlpError::from_memory)?;
        let inline = body.len() <= DECODE_INLINE_MAX;
        // Decoded and handed on in one go, on the blocking pool for large
        // requests (inserting many spans holds the index's lock a while).
        let work = move || {
            let decoded = match encoding {
                Encoding::Protobuf => spans::decode(&body),
                Encoding::Json => spans::decode_json(&body),
            }?;
            consumer.consume_spans(&decoded.spans);
            Ok::<_, spans::DecodeError>(decoded)
        };
        let decoded = if inline {
            work()
        } else {
            tokio::task::spawn_blocking(work)
                .await
                .map_err(|e| OtlpError::Internal(format!("the decoding task failed: {e}")))?
        }
        .map_err(|e| OtlpError::BadRequest(e.0))?;
        self.telemetry
            .spans(decoded.spans.len() as u64, decoded.rejected as u64);
        drop(grant);
        if decoded.spans.is_empty() && decoded.rejected > 0 {
            return Err(OtlpError::BadRequest(decoded.error_message));
        }
        Ok(decoded.response())
    }

    /// Where spans go, or why this receiver takes none (checked before a
    /// request's body is read).
    pub fn span_consumer(&self) -> Result<&Arc<dyn SpanConsumer>, OtlpError> {
        self.spans.as_ref().ok_or_else(|| {
            OtlpError::NotServed(format!(
                "receiver `{}` is in no traces pipeline, so it takes no traces; list it in a `traces` pipeline with a trace_link processor to feed its span index",
                self.id
            ))
        })
    }

    /// Why this receiver takes no profiles, if it does not (checked before
    /// a request's body is read).
    pub fn takes_profiles(&self) -> Result<(), OtlpError> {
        if self.takes_profiles {
            return Ok(());
        }
        Err(OtlpError::NotServed(format!(
            "receiver `{}` is in no profiles pipeline, so it takes no profiles; list it in one, or send profiles elsewhere",
            self.id
        )))
    }

    /// Hands one request's profiles to the pipeline, once.
    async fn deliver(&self, envelopes: Vec<Envelope>, origin: Origin) -> Result<(), Refused> {
        if envelopes.is_empty() {
            return Ok(());
        }
        let profiles = envelopes.len() as u64;
        let meta = BatchMeta {
            receiver: self.receiver.clone(),
            tenant: origin.tenant.filter(|t| !t.is_empty()),
            tenant_bound: origin.tenant_bound,
            client: origin.client,
            this_host: false,
        };
        component::hand_over(&*self.consumer, &self.telemetry, envelopes, meta)
            .await
            .map_err(|refusal| Refused {
                error: refusal.into(),
                profiles,
            })
    }

    /// Counts and logs a refusal.
    pub fn refused(&self, refused: &Refused) {
        let Refused { error, profiles } = refused;
        self.telemetry.refused(error.reason(), *profiles);
        match error {
            OtlpError::RateLimited(r) => self
                .telemetry
                .tenant_refused(Some(&r.tenant), error.reason()),
            OtlpError::Limit(r) => self
                .telemetry
                .tenant_refused(Some(&r.tenant), error.reason()),
            _ => {}
        }
        if matches!(error, OtlpError::Internal(_)) {
            tracing::error!(receiver = %self.id, error = %error, "request failed");
        } else {
            tracing::debug!(
                receiver = %self.id,
                reason = error.reason(),
                error = %error,
                "request refused"
            );
        }
    }
}

/// The envelopes of one request body (step 1 of [`Handler::export`]).
pub(crate) fn split(
    body: &Bytes,
    encoding: Encoding,
    mapping: &AttributeLabels,
) -> Result<Split, Refused> {
    match encoding {
        // Profiles and dictionary travel on as slices of `body`.
        Encoding::Protobuf => otlp::split_raw(body, mapping),
        Encoding::Json => otlp::split_decoded(decode(body, encoding)?, mapping),
    }
    .map_err(|e| Refused {
        error: OtlpError::BadRequest(e.message),
        profiles: e.profiles,
    })
}

/// Decodes a request body.
pub(crate) fn decode(
    body: &[u8],
    encoding: Encoding,
) -> Result<collector::ExportProfilesServiceRequest, OtlpError> {
    match encoding {
        Encoding::Protobuf => collector::ExportProfilesServiceRequest::decode(body).map_err(|e| {
            OtlpError::bad_request(format!(
                "the body is not an OTLP ExportProfilesServiceRequest: {e}"
            ))
        }),
        Encoding::Json => {
            otlp::json::decode_request(body).map_err(|e| OtlpError::bad_request(e.to_string()))
        }
    }
}
