//! Reading and writing correlation in OTLP payloads: sample links (the
//! dictionary's link table) and sample attributes with the label keys.
//!
//! Payloads cut from one request share their dictionary; links and
//! attributes the processor adds go into one new dictionary per shared one,
//! again shared by those payloads.

use std::collections::HashMap;
use std::sync::Arc;

use proflow_model::otlp::{common, proto};

use super::ids::{self, Found, Key};
use super::{Link, Outputs, Rules};

/// A correlation attribute of the dictionary, read once.
#[derive(Debug, Clone)]
struct Attr {
    key: Key,
    text: Option<String>,
    num: i64,
}

/// What a dictionary holds for correlation: its correlation attributes by
/// index, and its links by index (valid ones only).
pub struct Table {
    attrs: HashMap<i32, Attr>,
    links: Vec<Option<(ids::TraceId, ids::SpanId)>>,
    /// Links that are not valid ids (wrong length), by index.
    bad_links: Vec<bool>,
}

impl Table {
    /// `None` when the dictionary has no correlation at all.
    pub fn of(dict: &proto::ProfilesDictionary) -> Option<Table> {
        let string = |i: i32| {
            usize::try_from(i)
                .ok()
                .and_then(|i| dict.string_table.get(i))
                .map_or("", String::as_str)
        };
        let mut attrs = HashMap::new();
        for (i, a) in dict.attribute_table.iter().enumerate() {
            let Some(key) = Key::of(string(a.key_strindex)) else {
                continue;
            };
            use common::any_value::Value;
            let (text, num) = match a.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(Value::StringValue(s)) => (Some(s.clone()), 0),
                Some(Value::StringValueStrindex(s)) => (Some(string(*s).to_owned()), 0),
                Some(Value::IntValue(n)) => (None, *n),
                _ => (None, 0),
            };
            attrs.insert(i as i32, Attr { key, text, num });
        }
        let mut links = Vec::with_capacity(dict.link_table.len());
        let mut bad_links = Vec::with_capacity(dict.link_table.len());
        for (i, l) in dict.link_table.iter().enumerate() {
            let t = <ids::TraceId>::try_from(l.trace_id.as_slice()).ok();
            let s = <ids::SpanId>::try_from(l.span_id.as_slice()).ok();
            let valid = match (t, s) {
                (Some(t), Some(s)) if t != [0; 16] && s != [0; 8] => Some((t, s)),
                _ => None,
            };
            // Entry 0 is the zero value: no link.
            bad_links.push(i > 0 && valid.is_none());
            links.push(valid);
        }
        let any_link = links.iter().any(Option::is_some) || bad_links.iter().any(|b| *b);
        (any_link || !attrs.is_empty()).then_some(Table {
            attrs,
            links,
            bad_links,
        })
    }

    /// What each sample of `p` says, or `None` when no sample says anything.
    pub fn read(&self, p: &proto::Profile) -> Option<Vec<Option<Found>>> {
        let mut any = false;
        let out = p
            .samples
            .iter()
            .map(|s| {
                let mut found: Option<Found> = None;
                if s.link_index > 0 {
                    let i = s.link_index as usize;
                    let f = found.get_or_insert_with(Found::default);
                    f.any = true;
                    match self.links.get(i).copied().flatten() {
                        Some(link) => f.link = Some(link),
                        None => f.malformed = self.bad_links.get(i).copied().unwrap_or(true),
                    }
                }
                for a in &s.attribute_indices {
                    if let Some(attr) = self.attrs.get(a) {
                        found.get_or_insert_with(Found::default).read(
                            attr.key,
                            attr.text.as_deref(),
                            attr.num,
                        );
                    }
                }
                any |= found.is_some();
                found
            })
            .collect();
        any.then_some(out)
    }

    fn key_of(&self, attribute: i32) -> Option<Key> {
        self.attrs.get(&attribute).map(|a| a.key)
    }

    /// True for an id attribute whose id is all zeros (no id).
    fn is_zero_id(&self, attribute: i32) -> bool {
        self.attrs.get(&attribute).is_some_and(|a| {
            a.key != Key::SpanName
                && match &a.text {
                    Some(t) => ids::is_zero(t),
                    None => a.num == 0,
                }
        })
    }
}

/// Adds links and attributes to one dictionary, each once.
pub struct DictionaryWriter {
    pub dict: proto::ProfilesDictionary,
    links: HashMap<(ids::TraceId, ids::SpanId), i32>,
    strings: HashMap<String, i32>,
    attrs: HashMap<(Key, String), i32>,
    pub changed: bool,
}

impl DictionaryWriter {
    pub fn new(mut dict: proto::ProfilesDictionary, table: &Option<Table>) -> Self {
        // Entry 0 of every table is the zero value.
        if dict.link_table.is_empty() {
            dict.link_table.push(proto::Link::default());
        }
        if dict.string_table.is_empty() {
            dict.string_table.push(String::new());
        }
        if dict.attribute_table.is_empty() {
            dict.attribute_table.push(proto::KeyValueAndUnit::default());
        }
        let mut links = HashMap::new();
        if let Some(t) = table {
            for (i, l) in t.links.iter().enumerate() {
                if let Some(l) = l {
                    links.entry(*l).or_insert(i as i32);
                }
            }
        }
        DictionaryWriter {
            dict,
            links,
            strings: HashMap::new(),
            attrs: HashMap::new(),
            changed: false,
        }
    }

    fn link(&mut self, trace: ids::TraceId, span: ids::SpanId) -> i32 {
        if let Some(&i) = self.links.get(&(trace, span)) {
            return i;
        }
        self.changed = true;
        self.dict.link_table.push(proto::Link {
            trace_id: trace.to_vec(),
            span_id: span.to_vec(),
        });
        let i = self.dict.link_table.len() as i32 - 1;
        self.links.insert((trace, span), i);
        i
    }

    fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = match self.dict.string_table.iter().position(|t| t == s) {
            Some(i) if Key::of(s).is_some() => i as i32,
            _ => {
                self.dict.string_table.push(s.to_owned());
                self.dict.string_table.len() as i32 - 1
            }
        };
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn attribute(&mut self, key: Key, name: &str, value: &str) -> i32 {
        if let Some(&i) = self.attrs.get(&(key, value.to_owned())) {
            return i;
        }
        self.changed = true;
        let key_strindex = self.string(name);
        self.dict.attribute_table.push(proto::KeyValueAndUnit {
            key_strindex,
            value: Some(common::AnyValue {
                value: Some(common::any_value::Value::StringValue(value.to_owned())),
            }),
            unit_strindex: 0,
        });
        let i = self.dict.attribute_table.len() as i32 - 1;
        self.attrs.insert((key, value.to_owned()), i);
        i
    }
}

/// Writes `links` (one per sample) into `p`'s samples and `w`'s dictionary;
/// true when anything changed.
pub fn write(
    p: &mut proto::Profile,
    links: &[Option<Link>],
    table: &Option<Table>,
    w: &mut DictionaryWriter,
    rules: &Rules,
    outputs: Outputs,
) -> bool {
    let Outputs {
        otlp_links,
        labels,
        trace_label,
    } = outputs;
    let mut changed = false;
    for (s, link) in p.samples.iter_mut().zip(links) {
        let Some(link) = link else {
            // All-zero ids mean none: dropped where labels are written.
            if labels && let Some(t) = table {
                let before = s.attribute_indices.len();
                s.attribute_indices.retain(|a| !t.is_zero_id(*a));
                changed |= s.attribute_indices.len() != before;
            }
            continue;
        };
        if otlp_links
            && s.link_index == 0
            && let Some(t) = link.trace
        {
            s.link_index = w.link(t, link.span);
            changed = true;
        }
        let linked = s.link_index != 0;
        let key_of = |a: &i32| table.as_ref().and_then(|t| t.key_of(*a));
        if rules.drop_after_link && linked {
            let before = s.attribute_indices.len();
            s.attribute_indices.retain(|a| match key_of(a) {
                None => true,
                Some(Key::SpanName) => labels,
                Some(_) => false,
            });
            changed |= s.attribute_indices.len() != before;
        }
        if labels || trace_label {
            let has = |k: Key, s: &proto::Sample| {
                s.attribute_indices.iter().any(|a| key_of(a) == Some(k))
            };
            // A sample without a link carries its span (and with
            // `trace_id_label` its trace, when known) as `span_id` and
            // `trace_id` attributes, written afresh in their normal form.
            if !linked {
                s.attribute_indices
                    .retain(|a| !matches!(key_of(a), Some(Key::SpanId | Key::TraceId)));
                let a = w.attribute(Key::SpanId, ids::SPAN_ID, &ids::hex(&link.span));
                s.attribute_indices.push(a);
                if let Some(t) = link.trace.as_ref().filter(|_| trace_label) {
                    let a = w.attribute(Key::TraceId, ids::TRACE_ID, &ids::hex(t));
                    s.attribute_indices.push(a);
                }
                changed = true;
            }
            if let Some(name) = link.name.as_ref().filter(|_| labels)
                && !has(Key::SpanName, s)
            {
                let a = w.attribute(Key::SpanName, ids::SPAN_NAME, name);
                s.attribute_indices.push(a);
                changed = true;
            }
        }
    }
    changed
}

/// A dictionary as a shared one.
pub fn shared(w: DictionaryWriter) -> Arc<proflow_model::otlp::SharedDictionary> {
    Arc::new(proflow_model::otlp::SharedDictionary::from_decoded(w.dict))
}
