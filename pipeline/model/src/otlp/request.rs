//! One `ExportProfilesServiceRequest` from the OTLP forms of many payloads
//! ([`RequestBuilder`]), with one shared, deduplicated dictionary.
//!
//! Profiles that all refer to the same dictionary (the profiles of one
//! received request, the common gateway case) are written with that
//! dictionary as it is: nothing is copied or re-indexed, and
//! [`Request::encode`] writes the profiles and the dictionary by reference.
//! Profiles from several dictionaries are re-indexed into a new one: on
//! their bytes when all arrived as bytes ([`WireMerge`]: every entry of
//! every dictionary, deduplicated, nothing decoded), else decoded into one
//! that holds only what they use (as is every request when `compact` is
//! asked, for a file holding one profile of a large request).
//!
//! Profiles of equal resource and scope share one `ResourceProfiles` /
//! `ScopeProfiles`; resource and scope come from
//! [`OtlpProfiles::resource_and_scope`], so label changes on the way are
//! written back.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use super::check::get;
use super::common::{AnyValue, InstrumentationScope, any_value};
use super::{
    ConvertError, DictionaryBuilder, OtlpProfiles, ProfileData, Resource, SharedDictionary,
    WireMerge, collector, proto,
};
use crate::model::Labels;

/// A request being built; see the module docs.
#[derive(Debug)]
pub struct Request<'a> {
    dictionary: Cow<'a, SharedDictionary>,
    resources: Vec<ResourceGroup<'a>>,
    profiles: usize,
}

#[derive(Debug)]
struct ResourceGroup<'a> {
    resource: Resource,
    schema_url: String,
    scopes: Vec<ScopeGroup<'a>>,
}

#[derive(Debug)]
struct ScopeGroup<'a> {
    scope: InstrumentationScope,
    schema_url: String,
    profiles: Vec<Cow<'a, ProfileData>>,
}

/// Builds a [`Request`] from `(labels, profiles)` items.
#[derive(Debug, Default)]
pub struct RequestBuilder<'a> {
    items: Vec<(&'a Labels, &'a OtlpProfiles)>,
    compact: bool,
}

impl<'a> RequestBuilder<'a> {
    pub fn new() -> Self {
        RequestBuilder::default()
    }

    /// Always re-index into a dictionary holding only what the profiles use.
    pub fn compact(mut self) -> Self {
        self.compact = true;
        self
    }

    pub fn push(&mut self, labels: &'a Labels, profiles: &'a OtlpProfiles) {
        self.items.push((labels, profiles));
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// The request. Fails only on an index out of range, which a receiver's
    /// checks rule out before a profile is accepted.
    pub fn build(self) -> Result<Request<'a>, ConvertError> {
        let shared = self.shared_dictionary();
        let mut builder = DictionaryBuilder::new();
        // Merging everything as it arrived: on the wire, no decoding.
        let on_wire = shared.is_none()
            && !self.compact
            && self
                .items
                .iter()
                .all(|(_, o)| o.dictionary.is_raw() && o.profiles.iter().all(ProfileData::is_raw));
        let mut wire = on_wire.then(WireMerge::new);
        let mut sources = SourceDictionaries::default();
        if shared.is_none() {
            sources.add_all(&self.items, wire.as_mut())?;
        }
        let mut remaps: Vec<Remap<'_>> = sources.decoded.iter().map(|d| Remap::new(d)).collect();
        let mut resources: Vec<ResourceGroup<'a>> = Vec::new();
        let mut profiles = 0;
        // The last item's context and labels: consecutive profiles of one
        // scope with the same labels land in the same group without
        // recomputing their resource.
        let mut last: Option<(*const super::OtlpContext, &'a Labels, usize, usize)> = None;
        for (labels, o) in self.items {
            let ctx_ptr = o.context.as_ref().map_or(std::ptr::null(), Arc::as_ptr);
            let (r, s) = match last {
                Some((p, l, r, s)) if p == ctx_ptr && (std::ptr::eq(l, labels) || l == labels) => {
                    (r, s)
                }
                _ => scope_group(&mut resources, o, labels),
            };
            last = Some((ctx_ptr, labels, r, s));
            let group = &mut resources[r].scopes[s].profiles;
            for p in &o.profiles {
                profiles += 1;
                if shared.is_some() {
                    group.push(Cow::Borrowed(p));
                } else {
                    let reindexed =
                        sources.reindexed(o, p, wire.as_ref(), &mut remaps, &mut builder)?;
                    group.push(Cow::Owned(reindexed));
                }
            }
        }
        let dictionary = match (shared, wire) {
            (Some(d), _) => Cow::Borrowed(d),
            (None, Some(wire)) => Cow::Owned(SharedDictionary::from_raw_entries(
                wire.finish().into(),
                wire.entries(),
            )),
            (None, None) => Cow::Owned(SharedDictionary::from_decoded(builder.finish())),
        };
        Ok(Request {
            dictionary,
            resources,
            profiles,
        })
    }

    /// The dictionary every item refers to, when they all refer to one and
    /// `compact` is not asked: the request is written with it as it is.
    fn shared_dictionary(&self) -> Option<&'a SharedDictionary> {
        match self.items.first() {
            Some((_, first)) if !self.compact => self
                .items
                .iter()
                .all(|(_, o)| Arc::ptr_eq(&o.dictionary, &first.dictionary))
                .then(|| first.dictionary.as_ref()),
            _ => None,
        }
    }
}

/// The index of the group of `o`'s resource and scope (as `labels` make
/// them) in `resources`, and of its scope in that group; each added if
/// new.
fn scope_group<'a>(
    resources: &mut Vec<ResourceGroup<'a>>,
    o: &OtlpProfiles,
    labels: &Labels,
) -> (usize, usize) {
    let (resource, scope) = o.resource_and_scope(labels);
    let (rs, ss) = o
        .context
        .as_ref()
        .map_or((String::new(), String::new()), |c| {
            (c.resource_schema_url.clone(), c.scope_schema_url.clone())
        });
    let r = match resources
        .iter()
        .position(|g| g.resource == resource && g.schema_url == rs)
    {
        Some(r) => r,
        None => {
            resources.push(ResourceGroup {
                resource,
                schema_url: rs,
                scopes: Vec::new(),
            });
            resources.len() - 1
        }
    };
    let scopes = &mut resources[r].scopes;
    let s = match scopes
        .iter()
        .position(|g| g.scope == scope && g.schema_url == ss)
    {
        Some(s) => s,
        None => {
            scopes.push(ScopeGroup {
                scope,
                schema_url: ss,
                profiles: Vec::new(),
            });
            scopes.len() - 1
        }
    };
    (r, s)
}

/// The distinct dictionaries of items that do not share one, each merged
/// on the wire or decoded once, up front, so the re-indexing can borrow
/// them all.
#[derive(Default)]
struct SourceDictionaries<'a> {
    /// Where the entries of each dictionary merged on the wire went.
    wire_remaps: Vec<super::Remap>,
    /// Each dictionary decoded.
    decoded: Vec<Cow<'a, proto::ProfilesDictionary>>,
    /// Each dictionary's index in `wire_remaps` or `decoded`.
    which: HashMap<*const SharedDictionary, usize>,
}

impl<'a> SourceDictionaries<'a> {
    /// Adds the dictionary of every item, once each: to `wire` when there
    /// is one and it arrived as bytes, else decoded.
    fn add_all(
        &mut self,
        items: &[(&'a Labels, &'a OtlpProfiles)],
        mut wire: Option<&mut WireMerge>,
    ) -> Result<(), ConvertError> {
        for (_, o) in items {
            let key = Arc::as_ptr(&o.dictionary);
            if let std::collections::hash_map::Entry::Vacant(slot) = self.which.entry(key) {
                match (wire.as_deref_mut(), o.dictionary.raw()) {
                    (Some(wire), Some(raw)) => {
                        slot.insert(self.wire_remaps.len());
                        self.wire_remaps.push(wire.add_dictionary(raw)?);
                    }
                    _ => {
                        slot.insert(self.decoded.len());
                        self.decoded.push(o.dictionary.decoded()?);
                    }
                }
            }
        }
        Ok(())
    }

    /// Profile `p` of `o` re-indexed into the new dictionary: on the wire
    /// when it arrived as bytes and `wire` merges, else decoded and added
    /// to `builder`.
    fn reindexed(
        &self,
        o: &OtlpProfiles,
        p: &ProfileData,
        wire: Option<&WireMerge>,
        remaps: &mut [Remap<'_>],
        builder: &mut DictionaryBuilder,
    ) -> Result<ProfileData, ConvertError> {
        if let (Some(wire), Some(raw)) = (wire, p.raw()) {
            let remap = &self.wire_remaps[self.which[&Arc::as_ptr(&o.dictionary)]];
            let mut bytes = Vec::with_capacity(raw.len() + raw.len() / 8);
            wire.add_profile(raw, remap, &mut bytes)?;
            Ok(ProfileData::from_raw(bytes.into()))
        } else {
            let i = self.which[&Arc::as_ptr(&o.dictionary)];
            let remapped = remaps[i].profile(builder, &*p.decoded()?)?;
            Ok(ProfileData::from_decoded(remapped))
        }
    }
}

impl Request<'_> {
    /// Profiles in the request.
    pub fn profiles(&self) -> usize {
        self.profiles
    }

    /// The request's protobuf encoding, written from references (no profile
    /// or dictionary is copied on the way).
    pub fn encode(&self) -> Vec<u8> {
        let scope_len = |g: &ScopeGroup<'_>| {
            prost::encoding::message::encoded_len(1, &g.scope)
                + g.profiles.iter().map(|p| p.encoded_len(2)).sum::<usize>()
                + string_len(3, &g.schema_url)
        };
        let resource_len = |g: &ResourceGroup<'_>| {
            prost::encoding::message::encoded_len(1, &g.resource)
                + g.scopes
                    .iter()
                    .map(|s| framed_len(2, scope_len(s)))
                    .sum::<usize>()
                + string_len(3, &g.schema_url)
        };
        let total: usize = self
            .resources
            .iter()
            .map(|r| framed_len(1, resource_len(r)))
            .sum::<usize>()
            + self.dictionary.encoded_len(2);
        let mut buf = Vec::with_capacity(total);
        for r in &self.resources {
            frame(1, resource_len(r), &mut buf);
            prost::encoding::message::encode(1, &r.resource, &mut buf);
            for s in &r.scopes {
                frame(2, scope_len(s), &mut buf);
                prost::encoding::message::encode(1, &s.scope, &mut buf);
                for p in &s.profiles {
                    p.encode(2, &mut buf);
                }
                if !s.schema_url.is_empty() {
                    prost::encoding::string::encode(3, &s.schema_url, &mut buf);
                }
            }
            if !r.schema_url.is_empty() {
                prost::encoding::string::encode(3, &r.schema_url, &mut buf);
            }
        }
        self.dictionary.encode(2, &mut buf);
        buf
    }

    /// The request as a message (copies or decodes everything; for OTLP JSON).
    pub fn to_message(&self) -> Result<collector::ExportProfilesServiceRequest, ConvertError> {
        let mut resource_profiles = Vec::with_capacity(self.resources.len());
        for r in &self.resources {
            let mut scope_profiles = Vec::with_capacity(r.scopes.len());
            for s in &r.scopes {
                scope_profiles.push(proto::ScopeProfiles {
                    scope: Some(s.scope.clone()),
                    profiles: s
                        .profiles
                        .iter()
                        .map(|p| p.decoded().map(Cow::into_owned))
                        .collect::<Result<_, _>>()?,
                    schema_url: s.schema_url.clone(),
                });
            }
            resource_profiles.push(proto::ResourceProfiles {
                resource: Some(r.resource.clone()),
                scope_profiles,
                schema_url: r.schema_url.clone(),
            });
        }
        Ok(collector::ExportProfilesServiceRequest {
            resource_profiles,
            dictionary: Some(self.dictionary.decoded()?.into_owned()),
        })
    }
}

fn string_len(tag: u32, s: &str) -> usize {
    if s.is_empty() {
        0
    } else {
        prost::encoding::string::encoded_len(tag, &s.to_owned())
    }
}

fn framed_len(tag: u32, len: usize) -> usize {
    key_len(tag) + encoded_len_varint(len as u64) + len
}

fn frame(tag: u32, len: usize, buf: &mut Vec<u8>) {
    encode_key(tag, WireType::LengthDelimited, buf);
    encode_varint(len as u64, buf);
}

/// `v` with every string it refers to (`string_value_strindex`,
/// `key_strindex`, at any depth) written inline from `strings`: the new
/// dictionary's strings are not the source's.
fn inline_strings(v: &AnyValue, strings: &[String]) -> Result<AnyValue, ConvertError> {
    use super::common::{ArrayValue, KeyValue, KeyValueList};
    let string = |i: i32| get(strings, "string", i).cloned();
    let value = match &v.value {
        Some(any_value::Value::StringValueStrindex(i)) => {
            Some(any_value::Value::StringValue(string(*i)?))
        }
        Some(any_value::Value::ArrayValue(a)) => Some(any_value::Value::ArrayValue(ArrayValue {
            values: a
                .values
                .iter()
                .map(|x| inline_strings(x, strings))
                .collect::<Result<_, _>>()?,
        })),
        Some(any_value::Value::KvlistValue(l)) => {
            let mut values = Vec::with_capacity(l.values.len());
            for kv in &l.values {
                values.push(KeyValue {
                    key: if kv.key.is_empty() && kv.key_strindex != 0 {
                        string(kv.key_strindex)?
                    } else {
                        kv.key.clone()
                    },
                    value: kv
                        .value
                        .as_ref()
                        .map(|x| inline_strings(x, strings))
                        .transpose()?,
                    key_strindex: 0,
                });
            }
            Some(any_value::Value::KvlistValue(KeyValueList { values }))
        }
        other => other.clone(),
    };
    Ok(AnyValue { value })
}

/// Where each entry of one source dictionary went in the new one (`-1`: not
/// yet added).
#[derive(Debug)]
struct Remap<'d> {
    src: &'d proto::ProfilesDictionary,
    strings: Vec<i32>,
    mappings: Vec<i32>,
    functions: Vec<i32>,
    locations: Vec<i32>,
    stacks: Vec<i32>,
    attributes: Vec<i32>,
    links: Vec<i32>,
}

fn memo<T>(
    cache: &mut [i32],
    table: &[T],
    what: &str,
    i: i32,
    add: impl FnOnce(&T) -> Result<i32, ConvertError>,
) -> Result<i32, ConvertError> {
    if i == 0 {
        return Ok(0);
    }
    let entry = get(table, what, i)?;
    let slot = &mut cache[i as usize];
    if *slot >= 0 {
        return Ok(*slot);
    }
    let n = add(entry)?;
    cache[i as usize] = n;
    Ok(n)
}

impl<'d> Remap<'d> {
    fn new(src: &'d proto::ProfilesDictionary) -> Self {
        Remap {
            src,
            strings: vec![-1; src.string_table.len()],
            mappings: vec![-1; src.mapping_table.len()],
            functions: vec![-1; src.function_table.len()],
            locations: vec![-1; src.location_table.len()],
            stacks: vec![-1; src.stack_table.len()],
            attributes: vec![-1; src.attribute_table.len()],
            links: vec![-1; src.link_table.len()],
        }
    }

    fn string(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        memo(
            &mut self.strings,
            &self.src.string_table,
            "string",
            i,
            |s| Ok(b.string(s)),
        )
    }

    fn attributes(
        &mut self,
        b: &mut DictionaryBuilder,
        v: &[i32],
    ) -> Result<Vec<i32>, ConvertError> {
        v.iter().map(|&a| self.attribute(b, a)).collect()
    }

    fn attribute(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        let src = self.src;
        if i == 0 {
            return Ok(0);
        }
        let a = get(&src.attribute_table, "attribute", i)?;
        if self.attributes[i as usize] >= 0 {
            return Ok(self.attributes[i as usize]);
        }
        let key = get(&src.string_table, "string", a.key_strindex)?;
        let unit = get(&src.string_table, "string", a.unit_strindex)?;
        let value = match &a.value {
            Some(v) => Some(inline_strings(v, &src.string_table)?),
            None => None,
        };
        let n = b.any_attribute(key, value, unit);
        self.attributes[i as usize] = n;
        Ok(n)
    }

    fn function(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        let src = self.src;
        if i == 0 {
            return Ok(0);
        }
        let f = get(&src.function_table, "function", i)?;
        if self.functions[i as usize] >= 0 {
            return Ok(self.functions[i as usize]);
        }
        let f = proto::Function {
            name_strindex: self.string(b, f.name_strindex)?,
            system_name_strindex: self.string(b, f.system_name_strindex)?,
            filename_strindex: self.string(b, f.filename_strindex)?,
            start_line: f.start_line,
        };
        let n = b.function(f);
        self.functions[i as usize] = n;
        Ok(n)
    }

    fn mapping(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        let src = self.src;
        if i == 0 {
            return Ok(0);
        }
        let m = get(&src.mapping_table, "mapping", i)?;
        if self.mappings[i as usize] >= 0 {
            return Ok(self.mappings[i as usize]);
        }
        let m = proto::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex: self.string(b, m.filename_strindex)?,
            attribute_indices: self.attributes(b, &m.attribute_indices)?,
        };
        let n = b.mapping(m);
        self.mappings[i as usize] = n;
        Ok(n)
    }

    fn location(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        let src = self.src;
        if i == 0 {
            return Ok(0);
        }
        let l = get(&src.location_table, "location", i)?;
        if self.locations[i as usize] >= 0 {
            return Ok(self.locations[i as usize]);
        }
        let mut lines = Vec::with_capacity(l.lines.len());
        for line in &l.lines {
            lines.push(proto::Line {
                function_index: self.function(b, line.function_index)?,
                line: line.line,
                column: line.column,
            });
        }
        let l = proto::Location {
            mapping_index: self.mapping(b, l.mapping_index)?,
            address: l.address,
            lines,
            attribute_indices: self.attributes(b, &l.attribute_indices)?,
        };
        let n = b.location(l);
        self.locations[i as usize] = n;
        Ok(n)
    }

    fn stack(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        let src = self.src;
        if i == 0 {
            return Ok(0);
        }
        let s = get(&src.stack_table, "stack", i)?;
        if self.stacks[i as usize] >= 0 {
            return Ok(self.stacks[i as usize]);
        }
        let mut locations = Vec::with_capacity(s.location_indices.len());
        for &l in &s.location_indices {
            locations.push(self.location(b, l)?);
        }
        let n = b.stack(locations);
        self.stacks[i as usize] = n;
        Ok(n)
    }

    fn link(&mut self, b: &mut DictionaryBuilder, i: i32) -> Result<i32, ConvertError> {
        memo(&mut self.links, &self.src.link_table, "link", i, |l| {
            Ok(b.link(l.trace_id.clone(), l.span_id.clone()))
        })
    }

    fn value_type(
        &mut self,
        b: &mut DictionaryBuilder,
        t: &Option<proto::ValueType>,
    ) -> Result<Option<proto::ValueType>, ConvertError> {
        Ok(match t {
            Some(t) => Some(proto::ValueType {
                type_strindex: self.string(b, t.type_strindex)?,
                unit_strindex: self.string(b, t.unit_strindex)?,
            }),
            None => None,
        })
    }

    fn profile(
        &mut self,
        b: &mut DictionaryBuilder,
        p: &proto::Profile,
    ) -> Result<proto::Profile, ConvertError> {
        let mut samples = Vec::with_capacity(p.samples.len());
        for s in &p.samples {
            samples.push(proto::Sample {
                stack_index: self.stack(b, s.stack_index)?,
                attribute_indices: self.attributes(b, &s.attribute_indices)?,
                link_index: self.link(b, s.link_index)?,
                values: s.values.clone(),
                timestamps_unix_nano: s.timestamps_unix_nano.clone(),
            });
        }
        Ok(proto::Profile {
            sample_type: self.value_type(b, &p.sample_type)?,
            samples,
            time_unix_nano: p.time_unix_nano,
            duration_nano: p.duration_nano,
            period_type: self.value_type(b, &p.period_type)?,
            period: p.period,
            profile_id: p.profile_id.clone(),
            dropped_attributes_count: p.dropped_attributes_count,
            original_payload_format: p.original_payload_format.clone(),
            original_payload: p.original_payload.clone(),
            attribute_indices: self.attributes(b, &p.attribute_indices)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{Lost, OtlpContext, pprof_to_otlp};
    use crate::pprof::ProfileBuilder;

    fn otlp(funcs: &[&str], value: i64) -> OtlpProfiles {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds");
        b.sample_root_first(funcs.iter().copied(), vec![value]);
        let mut dict = DictionaryBuilder::new();
        let profiles = pprof_to_otlp(&b.build(), &mut dict, &mut Lost::default()).unwrap();
        OtlpProfiles::decoded(dict.finish(), profiles)
    }

    fn decode(bytes: &[u8]) -> collector::ExportProfilesServiceRequest {
        prost::Message::decode(bytes).unwrap()
    }

    #[test]
    fn one_shared_dictionary_is_written_as_it_is() {
        let a = otlp(&["main", "a"], 1);
        let b = OtlpProfiles::new(a.dictionary.clone(), None, a.profiles.clone(), 0);
        let labels = Labels::from_pairs([("service_name", "x")]);
        let mut rb = RequestBuilder::new();
        rb.push(&labels, &a);
        rb.push(&labels, &b);
        let req = rb.build().unwrap();
        assert!(matches!(req.dictionary, Cow::Borrowed(_)));
        let bytes = req.encode();
        let msg = decode(&bytes);
        assert_eq!(
            msg,
            req.to_message().unwrap(),
            "hand encoding matches prost's"
        );
        assert_eq!(
            msg.dictionary.as_ref(),
            Some(a.dictionary.decoded().unwrap().as_ref())
        );
        assert_eq!(msg.resource_profiles.len(), 1);
        assert_eq!(msg.resource_profiles[0].scope_profiles[0].profiles.len(), 2);
        assert_eq!(prost::Message::encode_to_vec(&msg), bytes);
    }

    #[test]
    fn several_dictionaries_merge_into_one_deduplicated() {
        let a = otlp(&["main", "a"], 1);
        let b = otlp(&["main", "b"], 2);
        let la = Labels::from_pairs([("service_name", "x")]);
        let lb = Labels::from_pairs([("service_name", "y")]);
        let mut rb = RequestBuilder::new();
        rb.push(&la, &a);
        rb.push(&lb, &b);
        let msg = decode(&rb.build().unwrap().encode());
        let d = msg.dictionary.as_ref().unwrap();
        crate::otlp::check_dictionary(d).unwrap();
        crate::otlp::check_dictionary_references(d).unwrap();
        let names: Vec<&str> = d.string_table.iter().map(String::as_str).collect();
        assert_eq!(
            names.iter().filter(|s| **s == "main").count(),
            1,
            "{names:?}"
        );
        assert_eq!(
            msg.resource_profiles.len(),
            2,
            "two services, two resources"
        );
        // Both convert back to the same stacks and values.
        let mut lost = Lost::default();
        for (r, (want_leaf, want)) in msg.resource_profiles.iter().zip([("a", 1), ("b", 2)]) {
            let p = &r.scope_profiles[0].profiles;
            crate::otlp::check_profile(d, &p[0]).unwrap();
            let pp = crate::otlp::otlp_to_pprof(d, p, &mut lost).unwrap();
            assert_eq!(pp[0].sample[0].value, vec![want]);
            let leaf = pp[0].sample[0].location_id[0];
            let loc = &pp[0].location[(leaf - 1) as usize];
            let f = &pp[0].function[(loc.line[0].function_id - 1) as usize];
            assert_eq!(pp[0].string_table[f.name as usize], want_leaf);
        }
    }

    #[test]
    fn compact_keeps_only_what_is_used_and_contexts_group() {
        let a = otlp(&["main", "a"], 1);
        let ctx = Arc::new(OtlpContext {
            labels: Labels::from_pairs([("service_name", "x")]),
            resource: Resource {
                attributes: vec![super::super::common::KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("x".into())),
                    }),
                    key_strindex: 0,
                }],
                ..Default::default()
            },
            resource_schema_url: "https://opentelemetry.io/schemas/1.30.0".into(),
            ..Default::default()
        });
        let one = OtlpProfiles::new(
            a.dictionary.clone(),
            Some(ctx.clone()),
            a.profiles.clone(),
            0,
        );
        let two = OtlpProfiles::new(
            a.dictionary.clone(),
            Some(ctx.clone()),
            a.profiles.clone(),
            0,
        );
        let labels = ctx.labels.clone();
        let mut rb = RequestBuilder::new().compact();
        rb.push(&labels, &one);
        rb.push(&labels, &two);
        let msg = decode(&rb.build().unwrap().encode());
        assert_eq!(msg.resource_profiles.len(), 1);
        assert_eq!(msg.resource_profiles[0].schema_url, ctx.resource_schema_url);
        assert_eq!(
            msg.resource_profiles[0].resource.as_ref(),
            Some(&ctx.resource)
        );
        assert_eq!(msg.resource_profiles[0].scope_profiles[0].profiles.len(), 2);
    }
}
