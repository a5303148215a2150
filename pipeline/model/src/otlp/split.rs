//! One `ExportProfilesServiceRequest` split into envelopes, one per
//! (resource, scope, profile), for every receiver that takes OTLP requests
//! (the `otlp` receiver's two protocols, the `kafka` receiver).
//!
//! - Protobuf ([`split_raw`]) is never decoded but for resources and scopes:
//!   the dictionary and each profile are checked on the wire
//!   ([`check_dictionary_wire`](super::check_dictionary_wire),
//!   [`check_profile_wire`](super::check_profile_wire)) and the payloads hold
//!   slices of the body, so the body is all a request holds.
//! - A decoded request ([`split_decoded`], from OTLP JSON) is checked with
//!   [`check_profile`](super::check_profile).
//! - A broken dictionary refuses the whole request ([`SplitError`]); a broken
//!   profile is refused alone and counted in [`Split::rejected`]; when every
//!   profile is broken the whole request is refused.
//! - Every envelope shares the request's dictionary (one `Arc`) and its
//!   scope's [`OtlpContext`]; its labels come from the resource and scope
//!   attributes ([`AttributeLabels`]), `service_name` defaults to
//!   `unknown_service` (Pyroscope's fallback) and `__name__` comes from the
//!   sample type.

use std::sync::Arc;

use bytes::Bytes;
use prost::Message;

use super::{
    AttributeLabels, ConvertError, DictionaryIndex, OtlpContext, OtlpProfiles, ProfileData,
    ProfileFacts, SharedDictionary, collector, proto,
};
use crate::lost::LostSamples;
use crate::model::{
    Envelope, Payload, SERVICE_NAME_LABEL, UNKNOWN_SERVICE, ValueType, now_unix_nanos,
};
use crate::profile_type::profile_name_from_sample_types;

/// The profiles of one request, as envelopes.
#[derive(Debug, Default)]
pub struct Split {
    pub envelopes: Vec<Envelope>,
    /// The request was OTLP profiles 1.9, made 1.10 first (see
    /// [`upgrade_1_9`](super::upgrade_1_9)).
    pub from_1_9: bool,
    /// Profiles refused alone (reported in `partial_success`).
    pub rejected: u64,
    /// Why, for `partial_success.error_message`.
    pub error_message: String,
    /// Attributes of resources and scopes with profiles that became no
    /// label, by reason (see [`AttributeLabels::labels`]).
    pub lost_labels: LostSamples,
}

/// Why a whole request was refused: `profiles` of it (0 when it could not
/// even be counted).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct SplitError {
    pub message: String,
    pub profiles: u64,
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
    use crate::wire::{Value, fields};
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
/// hold slices of `body` (or of its 1.10 copy, for a 1.9 request).
pub fn split_raw(body: &Bytes, mapping: &AttributeLabels) -> Result<Split, SplitError> {
    if let Some(upgraded) = super::upgrade_1_9(body) {
        let mut split = split_raw_1_10(&upgraded, mapping)?;
        split.from_1_9 = true;
        return Ok(split);
    }
    split_raw_1_10(body, mapping)
}

/// [`split_raw`] of a request in the 1.10 layout.
fn split_raw_1_10(body: &Bytes, mapping: &AttributeLabels) -> Result<Split, SplitError> {
    let WalkedRequest {
        dictionary,
        resources,
    } = walk_request(body)?;
    let count: usize = resources
        .iter()
        .flat_map(|(_, scopes)| scopes)
        .map(|s| s.items.len())
        .sum();
    if count == 0 {
        return Ok(Split::default());
    }
    let refuse_all = |message: String| SplitError {
        message,
        profiles: count as u64,
    };
    let Some(dictionary) = dictionary else {
        return Err(refuse_all(format!(
            "the request carries {count} profiles but no dictionary; OTLP profiles 1.10 (v1development) puts the tables every profile refers to in ExportProfilesServiceRequest.dictionary: is the sender on an earlier version?"
        )));
    };
    let index = super::check_dictionary_wire(dictionary)
        .map_err(|e| refuse_all(format!("the request's dictionary is invalid: {e}")))?;
    let shared_dictionary = Arc::new(SharedDictionary::from_raw_entries(
        body.slice_ref(dictionary),
        index.strings.len() + index.locations,
    ));

    let mut checked = CheckedProfiles {
        valid: Vec::with_capacity(count),
        rejected: 0,
        first_error: None,
        lost_labels: LostSamples::default(),
        shared: body.len(),
    };
    for (r, scopes) in resources {
        checked.check_resource(&r, scopes, &index, mapping);
    }
    let CheckedProfiles {
        valid,
        rejected,
        first_error,
        lost_labels,
        shared,
    } = checked;
    let error_message = match first_error {
        Some(first) => format!("{rejected} of {count} profiles were refused; the first: {first}"),
        None => String::new(),
    };
    if valid.is_empty() {
        return Err(refuse_all(error_message));
    }
    let envelopes = raw_envelopes(valid, shared, &index, body, &shared_dictionary);
    Ok(Split {
        envelopes,
        from_1_9: false,
        rejected,
        error_message,
        lost_labels,
    })
}

/// Why a body that is no `ExportProfilesServiceRequest` is refused.
fn not_otlp(e: String) -> SplitError {
    SplitError {
        message: format!("the body is not an OTLP ExportProfilesServiceRequest: {e}"),
        profiles: 0,
    }
}

/// A protobuf request's parts as the wire holds them.
struct WalkedRequest<'a> {
    /// The `dictionary` message, if there is one.
    dictionary: Option<&'a [u8]>,
    /// Each `ResourceProfiles`, with its `ScopeProfiles`.
    resources: Vec<(Walked<'a>, Vec<Walked<'a>>)>,
}

/// Walks an `ExportProfilesServiceRequest`: field 1 its resources (and
/// their scopes), field 2 its dictionary, given at most once.
fn walk_request(body: &[u8]) -> Result<WalkedRequest<'_>, SplitError> {
    use crate::wire::{Value, fields};
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
    Ok(WalkedRequest {
        dictionary,
        resources,
    })
}

/// The string at index `i` of the request's dictionary.
fn dictionary_string<'d>(index: &'d DictionaryIndex<'_>, i: i32) -> Result<&'d str, ConvertError> {
    index
        .string(i)
        .ok_or_else(|| ConvertError(format!("string index {i} is out of range")))
}

/// A profile that passed its checks: its scope's context, its facts and
/// its bytes (a slice of the body).
type CheckedProfile<'b> = (Arc<OtlpContext>, ProfileFacts, &'b [u8]);

/// What checking a raw request's resources, scopes and profiles finds.
struct CheckedProfiles<'b> {
    /// The profiles that passed.
    valid: Vec<CheckedProfile<'b>>,
    /// How many profiles were refused alone.
    rejected: u64,
    /// Why the first was.
    first_error: Option<String>,
    /// Attributes of resources and scopes with profiles that became no label.
    lost_labels: LostSamples,
    /// The bytes the profiles share: the body and the contexts.
    shared: usize,
}

impl<'b> CheckedProfiles<'b> {
    /// Counts `n` profiles refused for `why` (a broken resource or scope
    /// without profiles refuses nothing).
    fn refuse(&mut self, n: usize, why: String) {
        if n > 0 {
            self.rejected += n as u64;
            self.first_error.get_or_insert(why);
        }
    }

    /// Checks resource `r`, its `scopes` and their profiles, keeping the
    /// profiles that pass and refusing the rest.
    fn check_resource(
        &mut self,
        r: &Walked<'_>,
        scopes: Vec<Walked<'b>>,
        index: &DictionaryIndex<'_>,
        mapping: &AttributeLabels,
    ) {
        let string = |i: i32| dictionary_string(index, i);
        let resource = super::Resource::decode(r.head)
            .map_err(|e| format!("resource: {e}"))
            .and_then(|mut res| {
                super::inline_attributes_with(&mut res.attributes, string)
                    .map_err(|e| e.to_string())?;
                Ok((res, utf8(r.schema_url)?))
            });
        for s in scopes {
            let made = resource
                .clone()
                .and_then(|(resource, resource_schema_url)| {
                    scope_context(
                        resource,
                        resource_schema_url,
                        &s,
                        index,
                        mapping,
                        &mut self.lost_labels,
                    )
                });
            let context = match made {
                Ok(c) => c,
                Err(e) => {
                    self.refuse(s.items.len(), format!("resource or scope: {e}"));
                    continue;
                }
            };
            self.shared += super::context_heap_size(&context);
            for p in s.items {
                match super::check_profile_wire(index, p) {
                    Ok(facts) => self.valid.push((context.clone(), facts, p)),
                    Err(e) => self.refuse(1, e.to_string()),
                }
            }
        }
    }
}

/// The context of scope `s` of `resource`: its scope decoded and its
/// labels made (what became no label is counted in `lost_labels` when the
/// scope has profiles).
fn scope_context(
    resource: super::Resource,
    resource_schema_url: String,
    s: &Walked<'_>,
    index: &DictionaryIndex<'_>,
    mapping: &AttributeLabels,
    lost_labels: &mut LostSamples,
) -> Result<Arc<OtlpContext>, String> {
    let mut scope =
        super::common::InstrumentationScope::decode(s.head).map_err(|e| format!("scope: {e}"))?;
    super::inline_attributes_with(&mut scope.attributes, |i| dictionary_string(index, i))
        .map_err(|e| e.to_string())?;
    let mut lost = LostSamples::default();
    let labels = mapping.labels(&resource, &scope, &mut lost);
    if !s.items.is_empty() {
        lost_labels.merge(&lost);
    }
    Ok(Arc::new(OtlpContext {
        resource,
        resource_schema_url,
        scope,
        scope_schema_url: utf8(s.schema_url)?,
        labels,
    }))
}

/// The envelopes of the profiles that passed, each holding its slice of
/// `body` and a share of the `shared` bytes.
fn raw_envelopes(
    valid: Vec<CheckedProfile<'_>>,
    shared: usize,
    index: &DictionaryIndex<'_>,
    body: &Bytes,
    shared_dictionary: &Arc<SharedDictionary>,
) -> Vec<Envelope> {
    // Each profile counts its own bytes; the rest of the body (dictionary,
    // refused profiles, framing) and the contexts are shared out so the
    // shares add up to the whole once.
    let own: usize = valid.iter().map(|(_, _, p)| p.len()).sum();
    let shared = shared.saturating_sub(own);
    let n = valid.len();
    let (each, rest) = (shared / n, shared % n);
    let now = now_unix_nanos();
    let name = |i: i32| index.string(i).unwrap_or("");
    valid
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
        .collect()
}

/// The envelopes of a decoded request (OTLP JSON, say; see the module docs).
pub fn split_decoded(
    request: collector::ExportProfilesServiceRequest,
    mapping: &AttributeLabels,
) -> Result<Split, SplitError> {
    let count: usize = request
        .resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .map(|s| s.profiles.len())
        .sum();
    if count == 0 {
        return Ok(Split::default());
    }
    let refuse_all = |message: String| SplitError {
        message,
        profiles: count as u64,
    };
    let Some(dictionary) = request.dictionary else {
        return Err(refuse_all(format!(
            "the request carries {count} profiles but no dictionary; OTLP profiles 1.10 (v1development) puts the tables every profile refers to in ExportProfilesServiceRequest.dictionary: is the sender on an earlier version?"
        )));
    };
    super::check_dictionary(&dictionary)
        .and_then(|()| super::check_dictionary_references(&dictionary))
        .map_err(|e| refuse_all(format!("the request's dictionary is invalid: {e}")))?;
    let mut shared = super::dictionary_heap_size(&dictionary);
    let shared_dictionary = SharedDictionary::from_decoded(dictionary.clone());
    let shared_dictionary = Arc::new(shared_dictionary);

    let mut rejected = 0u64;
    let mut first_error: Option<String> = None;
    let mut lost_labels = LostSamples::default();
    // A broken resource or scope without profiles refuses nothing.
    let mut refuse = |n: usize, why: String| {
        if n > 0 {
            rejected += n as u64;
            first_error.get_or_insert(why);
        }
    };
    let mut valid: Vec<(Arc<OtlpContext>, proto::Profile)> = Vec::with_capacity(count);
    for rp in request.resource_profiles {
        let mut resource = rp.resource.unwrap_or_default();
        let resource_ok =
            super::inline_attributes(&mut resource.attributes, &dictionary.string_table);
        for sp in rp.scope_profiles {
            let mut scope = sp.scope.unwrap_or_default();
            let inlined = resource_ok.clone().and_then(|()| {
                super::inline_attributes(&mut scope.attributes, &dictionary.string_table)
            });
            if let Err(e) = inlined {
                refuse(
                    sp.profiles.len(),
                    format!("resource or scope attributes: {e}"),
                );
                continue;
            }
            let mut lost = LostSamples::default();
            let labels = mapping.labels(&resource, &scope, &mut lost);
            if !sp.profiles.is_empty() {
                lost_labels.merge(&lost);
            }
            let context = Arc::new(OtlpContext {
                resource: resource.clone(),
                resource_schema_url: rp.schema_url.clone(),
                scope,
                scope_schema_url: sp.schema_url,
                labels,
            });
            shared += super::context_heap_size(&context);
            for profile in sp.profiles {
                match super::check_profile(&dictionary, &profile) {
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
    Ok(Split {
        envelopes,
        from_1_9: false,
        rejected,
        error_message,
        lost_labels,
    })
}

/// One decoded profile's envelope; its indexes passed [`super::check_profile`].
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

#[cfg(test)]
mod tests {
    use super::*;
    use prost::Message;

    /// Found by the `otlp_proto` fuzz target: a resource that does not
    /// decode, with a scope holding no profiles, refuses nothing, so the
    /// request reports no refusal (it reported "0 of N profiles were
    /// refused").
    #[test]
    fn a_broken_resource_without_profiles_refuses_nothing() {
        let request = crate::testdata::otlp_request(1, 4, 3);
        let mut body = request.encode_to_vec();
        // resource_profiles { resource: <a truncated varint>, scope_profiles: {} }
        body.extend_from_slice(&[0x0a, 0x05, 0x0a, 0x01, 0xff, 0x12, 0x00]);
        let body = Bytes::from(body);
        for split in [
            split_raw(&body, &AttributeLabels::default()).unwrap(),
            split_decoded(request, &AttributeLabels::default()).unwrap(),
        ] {
            assert_eq!(split.envelopes.len(), 2);
            assert_eq!(split.rejected, 0);
            assert_eq!(split.error_message, "");
        }
    }
}
