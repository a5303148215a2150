//! [`DictionaryBuilder`]: one deduplicated `ProfilesDictionary` for the
//! profiles of one OTLP request.

use std::collections::HashMap as StdHashMap;

use super::common::{AnyValue, any_value};
use super::{index, proto};

/// The conversion and request tables' maps (keys are a sender's ids,
/// addresses, short vectors and strings): foldhash, seeded at random per
/// process and per map. The multiply-rotate hash these tables had before
/// started from a secret seed, but its low bits (the bucket a key lands in)
/// depended only on the key's low bits, so ids that differ only in their
/// high bits shared one bucket whatever the seed: a profile could make
/// every lookup walk all of them. foldhash's `quality` variant, not `fast`:
/// `fast` hashes an integer with one multiply by a per-process seed, and
/// with some seeds integers that differ only in their high bits still
/// share low bits (8 to a bucket in one process measured); `quality` mixes
/// once more, for about a nanosecond a key.
pub(crate) type HashMap<K, V> = StdHashMap<K, V, foldhash::quality::RandomState>;

/// An attribute value as the builder writes them (what pprof labels hold).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum AttrValue {
    Str(String),
    Int(i64),
    /// Any other value, by its protobuf encoding (kept as it came).
    Other(Vec<u8>),
}

/// A location by value: mapping, address, lines (function, line, column), attributes.
type LocationKey = (i32, u64, Vec<(i32, i64, i64)>, Vec<i32>);

/// Builds a `ProfilesDictionary` whose tables hold each distinct entry once,
/// entry 0 of every table being the zero value.
#[derive(Debug)]
pub struct DictionaryBuilder {
    dict: proto::ProfilesDictionary,
    strings: HashMap<String, i32>,
    mappings: HashMap<(u64, u64, u64, i32, Vec<i32>), i32>,
    functions: HashMap<(i32, i32, i32, i64), i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    attributes: HashMap<(i32, AttrValue, i32), i32>,
    links: HashMap<(Vec<u8>, Vec<u8>), i32>,
}

impl Default for DictionaryBuilder {
    fn default() -> Self {
        DictionaryBuilder::new()
    }
}

impl DictionaryBuilder {
    pub fn new() -> Self {
        let dict = proto::ProfilesDictionary {
            mapping_table: vec![proto::Mapping::default()],
            location_table: vec![proto::Location::default()],
            function_table: vec![proto::Function::default()],
            link_table: vec![proto::Link::default()],
            string_table: vec![String::new()],
            attribute_table: vec![proto::KeyValueAndUnit::default()],
            stack_table: vec![proto::Stack::default()],
        };
        let mut strings = HashMap::default();
        strings.insert(String::new(), 0);
        DictionaryBuilder {
            dict,
            strings,
            mappings: HashMap::default(),
            functions: HashMap::default(),
            locations: HashMap::default(),
            stacks: HashMap::default(),
            attributes: HashMap::default(),
            links: HashMap::default(),
        }
    }

    pub fn string(&mut self, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = index(self.dict.string_table.len());
        self.dict.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    pub fn mapping(&mut self, m: proto::Mapping) -> i32 {
        let key = (
            m.memory_start,
            m.memory_limit,
            m.file_offset,
            m.filename_strindex,
            m.attribute_indices.clone(),
        );
        let table = &mut self.dict.mapping_table;
        *self.mappings.entry(key).or_insert_with(|| {
            table.push(m);
            index(table.len() - 1)
        })
    }

    pub fn function(&mut self, f: proto::Function) -> i32 {
        let key = (
            f.name_strindex,
            f.system_name_strindex,
            f.filename_strindex,
            f.start_line,
        );
        let table = &mut self.dict.function_table;
        *self.functions.entry(key).or_insert_with(|| {
            table.push(f);
            index(table.len() - 1)
        })
    }

    pub fn location(&mut self, l: proto::Location) -> i32 {
        let lines = l
            .lines
            .iter()
            .map(|line| (line.function_index, line.line, line.column))
            .collect();
        let key = (
            l.mapping_index,
            l.address,
            lines,
            l.attribute_indices.clone(),
        );
        let table = &mut self.dict.location_table;
        *self.locations.entry(key).or_insert_with(|| {
            table.push(l);
            index(table.len() - 1)
        })
    }

    pub fn stack(&mut self, location_indices: Vec<i32>) -> i32 {
        let table = &mut self.dict.stack_table;
        *self
            .stacks
            .entry(location_indices.clone())
            .or_insert_with(|| {
                table.push(proto::Stack { location_indices });
                index(table.len() - 1)
            })
    }

    pub fn string_attribute(&mut self, key: &str, value: &str, unit: &str) -> i32 {
        self.attribute(key, AttrValue::Str(value.to_owned()), unit)
    }

    pub fn int_attribute(&mut self, key: &str, value: i64, unit: &str) -> i32 {
        self.attribute(key, AttrValue::Int(value), unit)
    }

    /// An attribute with any value. A string value is written inline, as is
    /// every other kind; a value given by reference must be resolved first.
    pub fn any_attribute(&mut self, key: &str, value: Option<AnyValue>, unit: &str) -> i32 {
        let value = match value.and_then(|v| v.value) {
            Some(any_value::Value::StringValue(s)) => AttrValue::Str(s),
            Some(any_value::Value::IntValue(n)) => AttrValue::Int(n),
            v => AttrValue::Other(prost::Message::encode_to_vec(&AnyValue { value: v })),
        };
        self.attribute(key, value, unit)
    }

    fn attribute(&mut self, key: &str, value: AttrValue, unit: &str) -> i32 {
        let key_strindex = self.string(key);
        let unit_strindex = self.string(unit);
        let table = &mut self.dict.attribute_table;
        *self
            .attributes
            .entry((key_strindex, value.clone(), unit_strindex))
            .or_insert_with(|| {
                let value = match value {
                    AttrValue::Str(s) => AnyValue {
                        value: Some(any_value::Value::StringValue(s)),
                    },
                    AttrValue::Int(n) => AnyValue {
                        value: Some(any_value::Value::IntValue(n)),
                    },
                    // Decoding what was just encoded from a valid value cannot fail.
                    AttrValue::Other(bytes) => {
                        <AnyValue as prost::Message>::decode(bytes.as_slice()).unwrap_or_default()
                    }
                };
                table.push(proto::KeyValueAndUnit {
                    key_strindex,
                    value: Some(value),
                    unit_strindex,
                });
                index(table.len() - 1)
            })
    }

    pub fn link(&mut self, trace_id: Vec<u8>, span_id: Vec<u8>) -> i32 {
        let table = &mut self.dict.link_table;
        *self
            .links
            .entry((trace_id.clone(), span_id.clone()))
            .or_insert_with(|| {
                table.push(proto::Link { trace_id, span_id });
                index(table.len() - 1)
            })
    }

    /// The dictionary built so far.
    pub fn finish(self) -> proto::ProfilesDictionary {
        self.dict
    }
}

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::HashMap;

    /// pprof ids that differ only above their low 32 bits (all in one
    /// bucket under the seeded multiply-rotate hash these tables had: the
    /// seed moved the bucket, not the collision) spread over the buckets,
    /// and two tables hash one id differently.
    #[test]
    fn ids_that_differ_in_their_high_bits_spread_and_each_table_has_its_own_seed() {
        let ids: Vec<u64> = (1..=4096u64).map(|x| x << 32).collect();
        let (a, b): (HashMap<u64, i32>, HashMap<u64, i32>) = Default::default();
        let buckets: std::collections::HashSet<u64> = ids
            .iter()
            .map(|&id| a.hasher().hash_one(id) & 0xffff)
            .collect();
        // 4096 keys over 65536 buckets: about 3970 distinct if spread.
        assert!(buckets.len() > 3500, "{} buckets", buckets.len());
        assert!(
            ids.iter()
                .any(|&id| a.hasher().hash_one(id) != b.hasher().hash_one(id)),
            "two tables, two seeds"
        );
    }
}
