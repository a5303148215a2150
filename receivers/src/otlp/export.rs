//! The handler both protocols share: one `ExportProfilesServiceRequest`,
//! from bytes to a batch in the pipeline.
//!
//! 1. Protobuf ([`build_raw`]) is never decoded but for resources and scopes:
//!    the dictionary and each profile are checked on the wire
//!    ([`otlp::check_dictionary_wire`], [`otlp::check_profile_wire`]) and the
//!    payloads hold slices of the body, so the body is all a request holds.
//!    JSON ([`build`]) is decoded: its decoded size is estimated first
//!    ([`JSON_DECODE_FACTOR`] times its size), refused past
//!    `max_decoded_size`, and the request's memory grant grown by it.
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
use proflow_pipeline::component::{Admission, ConsumeError, Consumer};
use proflow_pipeline::memory::{self, MemoryBudget, MemoryGrant};
use proflow_pipeline::model::{
    Batch, BatchMeta, Envelope, Payload, SERVICE_NAME_LABEL, ValueType, batch_bytes, now_unix_nanos,
};
use proflow_pipeline::otlp::{
    self, AttributeLabels, OtlpContext, OtlpProfiles, ProfileData, SharedDictionary, collector,
    proto,
};
use proflow_pipeline::profile_type::profile_name_from_sample_types;
use proflow_pipeline::telemetry::ReceiverTelemetry;
use prost::Message;

use super::error::{OtlpError, Refused};

/// What reading OTLP JSON may take per byte of it: `serde_json`'s tree of a
/// document of small numbers is about 16 times its text.
pub(crate) const JSON_DECODE_FACTOR: usize = 16;

/// Bodies up to this size are decoded on the async worker itself (a few
/// hundred microseconds at most; a hop to the blocking pool costs two thread
/// switches per request); larger ones on the blocking pool, so they never
/// stall the async workers.
const DECODE_INLINE_MAX: usize = 256 << 10;

/// `service_name` of profiles whose resource names no service (Pyroscope's
/// fallback, as the `pprof_push` receiver does).
const UNKNOWN_SERVICE: &str = "unknown_service";

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
}

/// The profiles of one request, ready for the pipeline.
#[derive(Debug, Default)]
pub(crate) struct Built {
    pub envelopes: Vec<Envelope>,
    /// Profiles refused alone (reported in `partial_success`).
    pub rejected: u64,
    /// Why, for `partial_success.error_message`.
    pub error_message: String,
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
        // Protobuf is checked on the wire and kept as it arrived: nothing is
        // decoded but resources and scopes, so the body is all it holds.
        let estimate = match encoding {
            Encoding::Protobuf => 0,
            Encoding::Json => body.len().saturating_mul(JSON_DECODE_FACTOR),
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
            .map_err(|e| OtlpError::MemoryLimit(e.to_string()))?;
        let inline = body.len() <= DECODE_INLINE_MAX;
        let mapping = self.labels.clone();
        let work = move || -> Result<(Built, MemoryGrant), Refused> {
            let built = match encoding {
                // Profiles and dictionary travel on as slices of `body`.
                Encoding::Protobuf => build_raw(&body, &mapping)?,
                Encoding::Json => build(decode(&body, encoding)?, &mapping)?,
            };
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
        if built.rejected > 0 {
            self.telemetry.refused("invalid_profile", built.rejected);
        }
        let partial_success =
            (built.rejected > 0).then(|| collector::ExportProfilesPartialSuccess {
                rejected_profiles: i64::try_from(built.rejected).unwrap_or(i64::MAX),
                error_message: built.error_message.clone(),
            });
        self.deliver(built.envelopes, origin).await?;
        drop(grant);
        Ok(collector::ExportProfilesServiceResponse { partial_success })
    }

    /// Hands one request's profiles to the pipeline, once.
    async fn deliver(&self, envelopes: Vec<Envelope>, origin: Origin) -> Result<(), Refused> {
        if envelopes.is_empty() {
            return Ok(());
        }
        let profiles = envelopes.len() as u64;
        let bytes = batch_bytes(&envelopes) as u64;
        let meta = Arc::new(BatchMeta {
            receiver: self.receiver.clone(),
            tenant: origin.tenant.filter(|t| !t.is_empty()),
            client: origin.client,
        });
        match self
            .consumer
            .consume(Batch::new(envelopes, meta), Admission::Refuse)
            .await
        {
            Ok(()) => {
                self.telemetry.accepted(profiles, bytes);
                Ok(())
            }
            Err(ConsumeError::Backpressure {
                exporter,
                retry_after,
            }) => Err(Refused {
                error: OtlpError::Backpressure {
                    retry_after,
                    detail: format!(
                        "the collector is busy: exporter `{exporter}` is behind and its queue is full"
                    ),
                },
                profiles,
            }),
            Err(ConsumeError::ShuttingDown) => Err(Refused {
                error: OtlpError::ShuttingDown,
                profiles,
            }),
        }
    }

    /// Counts and logs a refusal.
    pub fn refused(&self, refused: &Refused) {
        let Refused { error, profiles } = refused;
        self.telemetry.refused(error.reason(), *profiles);
        if matches!(error, OtlpError::Internal(_)) {
            tracing::error!(receiver = %self.id, error = %error, "request failed");
        } else {
            tracing::debug!(
                receiver = %self.id,
                reason = error.reason(),
                message = %error,
                "request refused"
            );
        }
    }
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

/// One resource's or scope's parts as the wire holds them.
struct Walked<'a> {
    /// The `Resource` or `InstrumentationScope` message.
    head: &'a [u8],
    schema_url: &'a [u8],
    /// Scopes of a resource, or profiles of a scope.
    items: Vec<&'a [u8]>,
}

/// Walks one `ResourceProfiles` or `ScopeProfiles` message: field 1 the
/// head, field 2 repeated items, field 3 the schema url.
fn walk(message: &[u8]) -> Result<Walked<'_>, String> {
    use proflow_pipeline::wire::{Value, fields};
    let mut w = Walked {
        head: &[],
        schema_url: &[],
        items: Vec::new(),
    };
    for f in fields(message) {
        match f.map_err(|e| e.to_string())? {
            (1, Value::Bytes(b)) => w.head = b,
            (2, Value::Bytes(b)) => w.items.push(b),
            (3, Value::Bytes(b)) => w.schema_url = b,
            (1..=3, _) => return Err("a field has the wrong wire type".to_owned()),
            _ => {}
        }
    }
    Ok(w)
}

fn utf8(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a schema_url is not valid UTF-8".to_owned())
}

/// The envelopes of a protobuf request, checked on the wire without
/// decoding its profiles or dictionary (see the module docs): the payloads
/// hold slices of `body`.
pub(crate) fn build_raw(body: &Bytes, mapping: &AttributeLabels) -> Result<Built, Refused> {
    use proflow_pipeline::wire::{Value, fields};
    let not_otlp = |e: String| Refused {
        error: OtlpError::bad_request(format!(
            "the body is not an OTLP ExportProfilesServiceRequest: {e}"
        )),
        profiles: 0,
    };
    let mut dictionary: Option<&[u8]> = None;
    let mut resources = Vec::new();
    for f in fields(body) {
        match f.map_err(|e| not_otlp(e.to_string()))? {
            (1, Value::Bytes(rp)) => {
                let r = walk(rp).map_err(not_otlp)?;
                let scopes = r
                    .items
                    .iter()
                    .map(|sp| walk(sp))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(not_otlp)?;
                resources.push((r, scopes));
            }
            (2, Value::Bytes(_)) if dictionary.is_some() => {
                return Err(not_otlp("the dictionary is given twice".to_owned()));
            }
            (2, Value::Bytes(d)) => dictionary = Some(d),
            (1 | 2, _) => return Err(not_otlp("a field has the wrong wire type".to_owned())),
            _ => {}
        }
    }
    let count: usize = resources
        .iter()
        .flat_map(|(_, scopes)| scopes)
        .map(|s| s.items.len())
        .sum();
    if count == 0 {
        return Ok(Built::default());
    }
    let refuse_all = |message: String| Refused {
        error: OtlpError::BadRequest(message),
        profiles: count as u64,
    };
    let Some(dictionary) = dictionary else {
        return Err(refuse_all(format!(
            "the request carries {count} profiles but no dictionary; OTLP profiles 1.10 (v1development) puts the tables every profile refers to in ExportProfilesServiceRequest.dictionary: is the sender on an earlier version?"
        )));
    };
    let index = otlp::check_dictionary_wire(dictionary)
        .map_err(|e| refuse_all(format!("the request's dictionary is invalid: {e}")))?;
    let shared_dictionary = Arc::new(SharedDictionary::from_raw_entries(
        body.slice_ref(dictionary),
        index.strings.len() + index.locations,
    ));
    let string = |i: i32| {
        index
            .string(i)
            .ok_or_else(|| otlp::ConvertError(format!("string index {i} is out of range")))
    };

    let mut rejected = 0u64;
    let mut first_error: Option<String> = None;
    let mut refuse = |n: usize, why: String| {
        rejected += n as u64;
        first_error.get_or_insert(why);
    };
    let mut shared = body.len();
    let mut valid: Vec<(Arc<OtlpContext>, otlp::ProfileFacts, &[u8])> = Vec::with_capacity(count);
    for (r, scopes) in resources {
        let head = |what: &str, e: prost::DecodeError| format!("{what}: {e}");
        let resource = otlp::Resource::decode(r.head)
            .map_err(|e| head("resource", e))
            .and_then(|mut res| {
                otlp::inline_attributes_with(&mut res.attributes, string)
                    .map_err(|e| e.to_string())?;
                Ok((res, utf8(r.schema_url)?))
            });
        for s in scopes {
            let made = resource
                .clone()
                .and_then(|(resource, resource_schema_url)| {
                    let mut scope = otlp::common::InstrumentationScope::decode(s.head)
                        .map_err(|e| head("scope", e))?;
                    otlp::inline_attributes_with(&mut scope.attributes, string)
                        .map_err(|e| e.to_string())?;
                    let labels = mapping.labels(&resource, &scope);
                    Ok(Arc::new(OtlpContext {
                        resource,
                        resource_schema_url,
                        scope,
                        scope_schema_url: utf8(s.schema_url)?,
                        labels,
                    }))
                });
            let context = match made {
                Ok(c) => c,
                Err(e) => {
                    refuse(s.items.len(), format!("resource or scope: {e}"));
                    continue;
                }
            };
            shared += otlp::context_heap_size(&context);
            for p in s.items {
                match otlp::check_profile_wire(&index, p) {
                    Ok(facts) => valid.push((context.clone(), facts, p)),
                    Err(e) => refuse(1, e.to_string()),
                }
            }
        }
    }
    let error_message = match first_error {
        Some(first) => format!("{rejected} of {count} profiles were refused; the first: {first}"),
        None => String::new(),
    };
    if valid.is_empty() {
        return Err(refuse_all(error_message));
    }
    // Each profile counts its own bytes; the rest of the body (dictionary,
    // refused profiles, framing) and the contexts are shared out so the
    // shares add up to the whole once.
    let own: usize = valid.iter().map(|(_, _, p)| p.len()).sum();
    let shared = shared.saturating_sub(own);
    let n = valid.len();
    let (each, rest) = (shared / n, shared % n);
    let now = now_unix_nanos();
    let name = |i: i32| index.string(i).unwrap_or("");
    let envelopes = valid
        .into_iter()
        .enumerate()
        .map(|(i, (context, facts, p))| {
            let share = if i == 0 { each + rest } else { each };
            let value_type = |(t, u): (i32, i32)| ValueType::new(name(t), name(u));
            let mut labels = context.labels.clone();
            if labels.get(SERVICE_NAME_LABEL).is_none() {
                labels.set(SERVICE_NAME_LABEL, UNKNOWN_SERVICE);
            }
            if let Some((t, _)) = facts.sample_type
                && let Some(n) = profile_name_from_sample_types([name(t)], None)
            {
                labels.set("__name__", n);
            }
            let start = match i64::try_from(facts.time_unix_nano) {
                Ok(0) | Err(_) => now,
                Ok(t) => t,
            };
            let duration = i64::try_from(facts.duration_nano).unwrap_or(i64::MAX);
            Envelope {
                labels,
                start_unix_nanos: start,
                end_unix_nanos: start.saturating_add(duration),
                sample_types: facts.sample_type.map(value_type).into_iter().collect(),
                period_type: facts.period_type.map(value_type),
                period: facts.period,
                payload: Payload::from_otlp(OtlpProfiles::new(
                    shared_dictionary.clone(),
                    Some(context),
                    vec![ProfileData::from_raw(body.slice_ref(p))],
                    share,
                )),
            }
        })
        .collect();
    Ok(Built {
        envelopes,
        rejected,
        error_message,
    })
}

/// The envelopes of a decoded request (OTLP JSON; see the module docs).
pub(crate) fn build(
    request: collector::ExportProfilesServiceRequest,
    mapping: &AttributeLabels,
) -> Result<Built, Refused> {
    let count: usize = request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .map(|s| s.profiles.len())
        .sum();
    if count == 0 {
        return Ok(Built::default());
    }
    let refuse_all = |message: String| Refused {
        error: OtlpError::BadRequest(message),
        profiles: count as u64,
    };
    let Some(dictionary) = request.dictionary else {
        return Err(refuse_all(format!(
            "the request carries {count} profiles but no dictionary; OTLP profiles 1.10 (v1development) puts the tables every profile refers to in ExportProfilesServiceRequest.dictionary: is the sender on an earlier version?"
        )));
    };
    otlp::check_dictionary(&dictionary)
        .and_then(|()| otlp::check_dictionary_references(&dictionary))
        .map_err(|e| refuse_all(format!("the request's dictionary is invalid: {e}")))?;
    let mut shared = otlp::dictionary_heap_size(&dictionary);
    let shared_dictionary = SharedDictionary::from_decoded(dictionary.clone());
    let shared_dictionary = Arc::new(shared_dictionary);

    let mut rejected = 0u64;
    let mut first_error: Option<String> = None;
    let mut refuse = |n: usize, why: String| {
        rejected += n as u64;
        first_error.get_or_insert(why);
    };
    let mut valid: Vec<(Arc<OtlpContext>, proto::Profile)> = Vec::with_capacity(count);
    for rp in request.resource_profiles {
        let mut resource = rp.resource.unwrap_or_default();
        let resource_ok =
            otlp::inline_attributes(&mut resource.attributes, &dictionary.string_table);
        for sp in rp.scope_profiles {
            let mut scope = sp.scope.unwrap_or_default();
            let inlined = resource_ok.clone().and_then(|()| {
                otlp::inline_attributes(&mut scope.attributes, &dictionary.string_table)
            });
            if let Err(e) = inlined {
                refuse(
                    sp.profiles.len(),
                    format!("resource or scope attributes: {e}"),
                );
                continue;
            }
            let labels = mapping.labels(&resource, &scope);
            let context = Arc::new(OtlpContext {
                resource: resource.clone(),
                resource_schema_url: rp.schema_url.clone(),
                scope,
                scope_schema_url: sp.schema_url,
                labels,
            });
            shared += otlp::context_heap_size(&context);
            for profile in sp.profiles {
                match otlp::check_profile(&dictionary, &profile) {
                    Ok(()) => valid.push((context.clone(), profile)),
                    Err(e) => refuse(1, e.to_string()),
                }
            }
        }
    }
    let error_message = match first_error {
        Some(first) => format!("{rejected} of {count} profiles were refused; the first: {first}"),
        None => String::new(),
    };
    if valid.is_empty() {
        // Nothing of the request can be used: a permanent error, not a
        // partial success (the sender must not count any of it delivered).
        return Err(refuse_all(error_message));
    }

    // Each envelope's share of the dictionary and contexts, so the shares
    // add up to the whole once.
    let n = valid.len().max(1);
    let (each, rest) = (shared / n, shared % n);
    let now = now_unix_nanos();
    let envelopes = valid
        .into_iter()
        .enumerate()
        .map(|(i, (context, profile))| {
            let share = if i == 0 { each + rest } else { each };
            envelope(
                &dictionary,
                &shared_dictionary,
                context,
                profile,
                share,
                now,
            )
        })
        .collect();
    Ok(Built {
        envelopes,
        rejected,
        error_message,
    })
}

/// One decoded profile's envelope; its indexes passed [`otlp::check_profile`].
fn envelope(
    dictionary: &proto::ProfilesDictionary,
    shared_dictionary: &Arc<SharedDictionary>,
    context: Arc<OtlpContext>,
    profile: proto::Profile,
    share: usize,
    now: i64,
) -> Envelope {
    let string = |i: i32| -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| dictionary.string_table.get(i))
            .map_or("", String::as_str)
    };
    let value_type =
        |t: &proto::ValueType| ValueType::new(string(t.type_strindex), string(t.unit_strindex));
    let mut labels = context.labels.clone();
    if labels.get(SERVICE_NAME_LABEL).is_none() {
        labels.set(SERVICE_NAME_LABEL, UNKNOWN_SERVICE);
    }
    if let Some(t) = &profile.sample_type
        && let Some(name) = profile_name_from_sample_types([string(t.type_strindex)], None)
    {
        labels.set("__name__", name);
    }
    // Time 0 is "not set": the profile is taken as of its arrival.
    let start = match i64::try_from(profile.time_unix_nano) {
        Ok(0) | Err(_) => now,
        Ok(t) => t,
    };
    let duration = i64::try_from(profile.duration_nano).unwrap_or(i64::MAX);
    let sample_types = profile.sample_type.iter().map(value_type).collect();
    let period_type = profile.period_type.as_ref().map(value_type);
    let period = profile.period;
    let payload = Payload::from_otlp(OtlpProfiles::new(
        shared_dictionary.clone(),
        Some(context),
        vec![ProfileData::from_decoded(profile)],
        share,
    ));
    Envelope {
        labels,
        start_unix_nanos: start,
        end_unix_nanos: start.saturating_add(duration),
        sample_types,
        period_type,
        period,
        payload,
    }
}
