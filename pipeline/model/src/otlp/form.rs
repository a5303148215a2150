//! The OTLP form of a payload ([`OtlpProfiles`]) and the one mapping between
//! OTLP attributes and series labels ([`AttributeLabels`]).
//!
//! ## Labels from attributes
//! Resource attributes, then scope attributes (a scope attribute wins over a
//! resource attribute of the same name), become series labels:
//! - `service.name` → `service_name`; any other key has every character that
//!   a Prometheus label name cannot hold (`.`, `-`, `/`, ...) replaced by `_`,
//!   and a leading digit prefixed with `_`;
//! - string, int, double and bool values become labels; bytes, arrays and
//!   key-value lists do not (they stay attributes), nor do keys starting
//!   `__`; each such attribute, and each one whose label another attribute
//!   takes, is counted (`proflow_receiver_lost_parts_total{part="label"}`);
//! - `include` (when set) keeps only the listed keys, `exclude` drops keys;
//!   `service.name` is always kept;
//! - `__name__` comes from the sample type by Pyroscope's rules
//!   ([`crate::profile_type`]).
//!
//! ## Attributes from labels
//! An exporter that writes OTLP writes the original attributes back, changed
//! only where the labels changed on the way ([`OtlpProfiles::resource_and_scope`]):
//! a label a processor removed removes its attribute, a changed value replaces
//! it (as a string), a new label becomes a resource attribute. With labels as
//! they arrived, the attributes are written exactly as they arrived. A profile
//! made from pprof gets all its labels (but `__*`) as resource attributes.
//! A new label that is the label form of a semantic-convention key
//! ([`SEMCONV_KEYS`]: `service_name`, `k8s_pod_name`, `container_id`, …)
//! is written under that key (`k8s.pod.name`).

use std::collections::HashSet;
use std::sync::Arc;

use serde::Deserialize;

use super::common::{AnyValue, InstrumentationScope, KeyValue, any_value};
use super::{ProfileData, Resource, SharedDictionary, proto};
use crate::lost::LostSamples;
use crate::model::{Labels, SERVICE_NAME_LABEL};

/// The resource attribute holding the service name.
pub const SERVICE_NAME_KEY: &str = "service.name";

/// Where a group of OTLP profiles came from: the resource and scope of one
/// `ScopeProfiles`, with attributes written inline (a reference into the
/// dictionary resolved when the receiver built this), and the labels the
/// receiver derived from them. Shared (`Arc`) by every profile of the scope.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OtlpContext {
    pub resource: Resource,
    pub resource_schema_url: String,
    pub scope: InstrumentationScope,
    pub scope_schema_url: String,
    /// The series labels made from the attributes (without `__name__`).
    pub labels: Labels,
}

/// The OTLP form of one payload: profiles referring to one dictionary, which
/// every profile of the request it came with shares (`Arc`, never copied).
/// A payload that arrived as OTLP holds one profile; one converted from pprof
/// holds a profile per pprof sample type. Profiles and dictionary that
/// arrived as protobuf are held as those bytes ([`SharedDictionary`],
/// [`ProfileData`]).
#[derive(Debug, Clone)]
pub struct OtlpProfiles {
    pub dictionary: Arc<SharedDictionary>,
    /// `None` for profiles made from pprof: their labels are all there is.
    pub context: Option<Arc<OtlpContext>>,
    pub profiles: Vec<ProfileData>,
    /// Bytes of memory these account for: the profiles' heap plus this
    /// payload's share of the dictionary and context (see [`OtlpProfiles::new`]).
    size: usize,
}

impl OtlpProfiles {
    /// `shared_bytes` is this payload's share of what it holds with others
    /// (the request's dictionary and context split over its profiles, so the
    /// shares add up to the whole once).
    pub fn new(
        dictionary: Arc<SharedDictionary>,
        context: Option<Arc<OtlpContext>>,
        profiles: Vec<ProfileData>,
        shared_bytes: usize,
    ) -> Self {
        let size = std::mem::size_of::<Self>()
            + profiles.iter().map(ProfileData::heap_size).sum::<usize>()
            + shared_bytes;
        OtlpProfiles {
            dictionary,
            context,
            profiles,
            size,
        }
    }

    /// Decoded profiles with their own dictionary (what a conversion makes),
    /// which these alone account for.
    pub fn decoded(dictionary: proto::ProfilesDictionary, profiles: Vec<proto::Profile>) -> Self {
        let dictionary = SharedDictionary::from_decoded(dictionary);
        let shared = dictionary.heap_size();
        OtlpProfiles::new(
            Arc::new(dictionary),
            None,
            profiles
                .into_iter()
                .map(ProfileData::from_decoded)
                .collect(),
            shared,
        )
    }

    /// Bytes of memory this accounts for.
    pub fn size_bytes(&self) -> usize {
        self.size
    }

    /// The resource and scope to write these profiles under, given the
    /// series labels they carry now (see the module docs).
    pub fn resource_and_scope(&self, labels: &Labels) -> (Resource, InstrumentationScope) {
        match &self.context {
            Some(c) => reconcile(c, labels),
            None => (
                Resource {
                    attributes: labels
                        .iter()
                        .filter(|l| !l.name.starts_with("__"))
                        .map(|l| string_attribute(attribute_key(&l.name), l.value.clone()))
                        .collect(),
                    ..Resource::default()
                },
                InstrumentationScope {
                    name: "proflow".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                },
            ),
        }
    }
}

fn string_attribute(key: String, value: String) -> KeyValue {
    KeyValue {
        key,
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value)),
        }),
        key_strindex: 0,
    }
}

/// The original attributes, changed where `labels` differ from the labels
/// they arrived with.
fn reconcile(c: &OtlpContext, labels: &Labels) -> (Resource, InstrumentationScope) {
    let user = |l: &crate::model::Label| !l.name.starts_with("__");
    let unchanged = labels
        .iter()
        .filter(|l| user(l))
        .eq(c.labels.iter().filter(|l| user(l)));
    let mut resource = c.resource.clone();
    let mut scope = c.scope.clone();
    if unchanged {
        return (resource, scope);
    }
    let mut seen: HashSet<String> = HashSet::new();
    let mut apply = |attributes: &mut Vec<KeyValue>| {
        attributes.retain_mut(|kv| {
            let Some(text) = kv.value.as_ref().and_then(value_text) else {
                return true;
            };
            let name = label_name(&kv.key);
            if c.labels.get(&name).is_none() {
                // Never a label (excluded, or lost to a scope attribute of
                // the same name): not the labels' to change.
                return true;
            }
            seen.insert(name.clone());
            match labels.get(&name) {
                None => false,
                Some(v) if v == text => true,
                Some(v) => {
                    kv.value = Some(AnyValue {
                        value: Some(any_value::Value::StringValue(v.to_owned())),
                    });
                    true
                }
            }
        });
    };
    apply(&mut resource.attributes);
    apply(&mut scope.attributes);
    for l in labels.iter().filter(|l| user(l)) {
        if seen.contains(&l.name) || c.labels.get(&l.name).is_some() {
            continue;
        }
        resource
            .attributes
            .push(string_attribute(attribute_key(&l.name), l.value.clone()));
    }
    (resource, scope)
}

/// OpenTelemetry semantic-convention keys whose label form is written back
/// as the key (`k8s_pod_name` → `k8s.pod.name`): the resource attributes
/// proflow's own components add as labels (`k8s_attributes`, the `ebpf`
/// receiver's `container_id`). `service.name` first: `k8s_attributes`
/// takes every key after it as its `extract.metadata` names.
pub const SEMCONV_KEYS: &[&str] = &[
    SERVICE_NAME_KEY,
    "k8s.namespace.name",
    "k8s.pod.name",
    "k8s.pod.uid",
    "k8s.pod.ip",
    "k8s.pod.start_time",
    "k8s.node.name",
    "k8s.container.name",
    "k8s.deployment.name",
    "k8s.replicaset.name",
    "k8s.statefulset.name",
    "k8s.daemonset.name",
    "k8s.job.name",
    "k8s.cronjob.name",
    "container.id",
    "container.image.name",
    "container.image.tag",
];

/// The attribute key a label that is not an attribute already becomes: the
/// semantic-convention key it is the label form of ([`SEMCONV_KEYS`]), else
/// the label name itself.
pub fn attribute_key(label: &str) -> String {
    SEMCONV_KEYS
        .iter()
        .find(|k| label_name(k) == label)
        .map_or_else(|| label.to_owned(), |k| (*k).to_owned())
}

/// The label name an attribute key maps to (see the module docs).
pub fn label_name(key: &str) -> String {
    if key == SERVICE_NAME_KEY {
        return SERVICE_NAME_LABEL.to_owned();
    }
    let mut name: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.starts_with(|c: char| c.is_ascii_digit()) || name.is_empty() {
        name.insert(0, '_');
    }
    name
}

/// A value as label text, for the kinds that become labels.
fn value_text(v: &AnyValue) -> Option<String> {
    match v.value.as_ref()? {
        any_value::Value::StringValue(s) => Some(s.clone()),
        any_value::Value::IntValue(n) => Some(n.to_string()),
        any_value::Value::DoubleValue(d) => Some(d.to_string()),
        any_value::Value::BoolValue(b) => Some(b.to_string()),
        _ => None,
    }
}

/// Which resource and scope attributes become series labels: the `otlp`
/// receiver's `resource_to_labels` block.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AttributeLabels {
    /// Only these attribute keys become labels (all when empty).
    /// `service.name` always does.
    #[serde(default)]
    pub include: Vec<String>,
    /// These attribute keys never become labels.
    #[serde(default)]
    pub exclude: Vec<String>,
}

impl AttributeLabels {
    fn wants(&self, key: &str) -> bool {
        key == SERVICE_NAME_KEY
            || ((self.include.is_empty() || self.include.iter().any(|k| k == key))
                && !self.exclude.iter().any(|k| k == key))
    }

    /// The labels for a resource and scope whose attributes are inline.
    /// A wanted attribute that becomes no label is counted in `lost` by
    /// reason: `not_text` (bytes, an array, a key-value list or no value),
    /// `reserved_name` (a key starting `__`), `name_taken` (a later
    /// attribute maps to the same label name with another value, and wins).
    /// The attributes themselves stay in the OTLP form.
    pub fn labels(
        &self,
        resource: &Resource,
        scope: &InstrumentationScope,
        lost: &mut LostSamples,
    ) -> Labels {
        let mut labels = Labels::new();
        for kv in resource.attributes.iter().chain(&scope.attributes) {
            if !self.wants(&kv.key) {
                continue;
            }
            if kv.key.starts_with("__") {
                lost.add("reserved_name", 1);
                continue;
            }
            let Some(text) = kv.value.as_ref().and_then(value_text) else {
                lost.add("not_text", 1);
                continue;
            };
            let name = label_name(&kv.key);
            if labels.get(&name).is_some_and(|v| v != text) {
                lost.add("name_taken", 1);
            }
            labels.set(name, text);
        }
        labels
    }
}

/// Attributes with their keys and string values written inline: a key or
/// value given by reference (`key_strindex`, `string_value_strindex`, as the
/// collector writes them) is looked up in `strings`. A reference out of range
/// is an error naming it.
pub fn inline_attributes(
    attributes: &mut [KeyValue],
    strings: &[String],
) -> Result<(), super::ConvertError> {
    inline_attributes_with(attributes, |i| {
        super::check::get(strings, "string", i).map(String::as_str)
    })
}

/// [`inline_attributes`] with the strings looked up by `string`.
pub fn inline_attributes_with<'s>(
    attributes: &mut [KeyValue],
    string: impl Fn(i32) -> Result<&'s str, super::ConvertError>,
) -> Result<(), super::ConvertError> {
    let lookup = |i: i32| string(i).map(str::to_owned);
    for kv in attributes {
        if kv.key.is_empty() && kv.key_strindex != 0 {
            kv.key = lookup(kv.key_strindex)?;
        }
        kv.key_strindex = 0;
        if let Some(AnyValue {
            value: Some(v @ any_value::Value::StringValueStrindex(_)),
        }) = kv.value.as_mut()
            && let any_value::Value::StringValueStrindex(i) = *v
        {
            *v = any_value::Value::StringValue(lookup(i)?);
        }
    }
    Ok(())
}

/// Estimated heap of one profile (vectors' and strings' capacities).
pub fn profile_heap_size(p: &proto::Profile) -> usize {
    use std::mem::size_of;
    let samples: usize = p
        .samples
        .iter()
        .map(|s| {
            s.attribute_indices.capacity() * 4
                + s.values.capacity() * 8
                + s.timestamps_unix_nano.capacity() * 8
        })
        .sum();
    size_of::<proto::Profile>()
        + p.samples.capacity() * size_of::<proto::Sample>()
        + samples
        + p.profile_id.capacity()
        + p.original_payload_format.capacity()
        + p.original_payload.capacity()
        + p.attribute_indices.capacity() * 4
}

/// Estimated heap of a dictionary (vectors' and strings' capacities; attribute
/// values are estimated by their encoded size).
pub fn dictionary_heap_size(d: &proto::ProfilesDictionary) -> usize {
    use std::mem::size_of;
    let strings: usize = d.string_table.iter().map(String::capacity).sum();
    let locations: usize = d
        .location_table
        .iter()
        .map(|l| l.lines.capacity() * size_of::<proto::Line>() + l.attribute_indices.capacity() * 4)
        .sum();
    let stacks: usize = d
        .stack_table
        .iter()
        .map(|s| s.location_indices.capacity() * 4)
        .sum();
    let mappings: usize = d
        .mapping_table
        .iter()
        .map(|m| m.attribute_indices.capacity() * 4)
        .sum();
    let attributes: usize = d
        .attribute_table
        .iter()
        .map(|a| {
            a.value
                .as_ref()
                .map_or(0, |v| 2 * prost::Message::encoded_len(v))
        })
        .sum();
    let links: usize = d
        .link_table
        .iter()
        .map(|l| l.trace_id.capacity() + l.span_id.capacity())
        .sum();
    size_of::<proto::ProfilesDictionary>()
        + d.string_table.capacity() * size_of::<String>()
        + strings
        + d.location_table.capacity() * size_of::<proto::Location>()
        + locations
        + d.stack_table.capacity() * size_of::<proto::Stack>()
        + stacks
        + d.mapping_table.capacity() * size_of::<proto::Mapping>()
        + mappings
        + d.function_table.capacity() * size_of::<proto::Function>()
        + d.attribute_table.capacity() * size_of::<proto::KeyValueAndUnit>()
        + attributes
        + d.link_table.capacity() * size_of::<proto::Link>()
        + links
}

/// Estimated heap of a context (its attributes by encoded size).
pub fn context_heap_size(c: &OtlpContext) -> usize {
    std::mem::size_of::<OtlpContext>()
        + 2 * prost::Message::encoded_len(&c.resource)
        + 2 * prost::Message::encoded_len(&c.scope)
        + c.labels
            .iter()
            .map(|l| l.name.len() + l.value.len() + 48)
            .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(key: &str, v: any_value::Value) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue { value: Some(v) }),
            key_strindex: 0,
        }
    }

    fn s(key: &str, v: &str) -> KeyValue {
        kv(key, any_value::Value::StringValue(v.to_owned()))
    }

    fn context(mapping: &AttributeLabels) -> OtlpContext {
        let resource = Resource {
            attributes: vec![
                s("service.name", "checkout"),
                s("k8s.pod.name", "pod-1"),
                kv("process.pid", any_value::Value::IntValue(42)),
                kv("host.ids", any_value::Value::ArrayValue(Default::default())),
            ],
            ..Default::default()
        };
        let scope = InstrumentationScope {
            name: "ebpf".into(),
            attributes: vec![s("profiler.mode", "cpu")],
            ..Default::default()
        };
        let labels = mapping.labels(&resource, &scope, &mut LostSamples::default());
        OtlpContext {
            resource,
            scope,
            labels,
            ..Default::default()
        }
    }

    #[test]
    fn attributes_map_to_labels_by_the_documented_rules() {
        let c = context(&AttributeLabels::default());
        assert_eq!(
            c.labels.to_selector_string(),
            r#"{k8s_pod_name="pod-1", process_pid="42", profiler_mode="cpu", service_name="checkout"}"#
        );
        let only = AttributeLabels {
            include: vec!["k8s.pod.name".into()],
            exclude: vec![],
        };
        assert_eq!(
            context(&only).labels.to_selector_string(),
            r#"{k8s_pod_name="pod-1", service_name="checkout"}"#
        );
        let without = AttributeLabels {
            include: vec![],
            exclude: vec!["process.pid".into(), "service.name".into()],
        };
        let l = context(&without).labels;
        assert_eq!(l.get("process_pid"), None);
        assert_eq!(l.get("service_name"), Some("checkout"), "always kept");
        assert_eq!(label_name("1st-key/x"), "_1st_key_x");
    }

    #[test]
    fn attributes_that_become_no_label_are_counted() {
        let resource = Resource {
            attributes: vec![
                s("k8s.pod.name", "pod-1"),
                kv("host.ids", any_value::Value::ArrayValue(Default::default())),
                s("__name__", "x"),
                s("k8s_pod_name", "pod-2"),
                s("same.value", "v"),
            ],
            ..Default::default()
        };
        let scope = InstrumentationScope {
            attributes: vec![s("same_value", "v")],
            ..Default::default()
        };
        let mut lost = LostSamples::default();
        let labels = AttributeLabels::default().labels(&resource, &scope, &mut lost);
        assert_eq!(labels.get("k8s_pod_name"), Some("pod-2"), "the later wins");
        assert_eq!(
            lost.iter().collect::<Vec<_>>(),
            vec![("not_text", 1), ("reserved_name", 1), ("name_taken", 1)]
        );
    }

    #[test]
    fn unchanged_labels_give_back_the_original_attributes() {
        let c = context(&AttributeLabels::default());
        let mut labels = c.labels.clone();
        labels.set("__name__", "process_cpu");
        let (r, sc) = reconcile(&c, &labels);
        assert_eq!(r, c.resource);
        assert_eq!(sc, c.scope);
    }

    #[test]
    fn changed_labels_change_only_their_attributes() {
        let c = context(&AttributeLabels::default());
        let mut labels = c.labels.clone();
        labels.remove("k8s_pod_name");
        labels.set("process_pid", "7");
        labels.set("team", "payments");
        labels.set("profiler_mode", "wall");
        let (r, sc) = reconcile(&c, &labels);
        let keys: Vec<&str> = r.attributes.iter().map(|kv| kv.key.as_str()).collect();
        assert_eq!(keys, ["service.name", "process.pid", "host.ids", "team"]);
        assert_eq!(
            r.attributes[1]
                .value
                .as_ref()
                .and_then(value_text)
                .as_deref(),
            Some("7")
        );
        assert_eq!(
            sc.attributes[0]
                .value
                .as_ref()
                .and_then(value_text)
                .as_deref(),
            Some("wall")
        );
    }

    #[test]
    fn references_are_written_inline() {
        let strings = vec![String::new(), "service.name".into(), "api".into()];
        let mut attrs = vec![KeyValue {
            key: String::new(),
            key_strindex: 1,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValueStrindex(2)),
            }),
        }];
        inline_attributes(&mut attrs, &strings).unwrap();
        assert_eq!(attrs[0], s("service.name", "api"));
        let mut bad = vec![KeyValue {
            key_strindex: 9,
            ..Default::default()
        }];
        assert!(inline_attributes(&mut bad, &strings).is_err());
    }

    #[test]
    fn semantic_convention_labels_go_back_to_their_keys() {
        assert_eq!(attribute_key("k8s_pod_name"), "k8s.pod.name");
        assert_eq!(attribute_key("container_id"), "container.id");
        assert_eq!(attribute_key("service_name"), "service.name");
        assert_eq!(attribute_key("team"), "team");
        for key in SEMCONV_KEYS {
            assert_eq!(attribute_key(&label_name(key)), *key);
        }
    }
}
