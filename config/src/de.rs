//! A serde deserializer over a located [`Node`]: every error it returns carries
//! the YAML path and the line of the value that caused it.
//!
//! Scalars are read leniently where YAML typing and `${env:...}` expansion meet:
//! a string `"8080"` fills an integer field and `"true"` a boolean one.
//!
//! A struct may embed one settings block shared by many components (the
//! listener settings of every receiver that listens, the sending settings of
//! every exporter) with its keys written beside the struct's own: name the
//! field [`EMBEDDED`] (`#[serde(rename = "__proflow_embedded", default)]`). Every key
//! the struct does not declare goes to that block, which refuses what it does
//! not declare either, so unknown keys are still refused, with their line and
//! with every key of both in the message. serde's `flatten` is not used for
//! this: it reads through a buffer that loses the lines, the lenient scalars
//! and `deny_unknown_fields`.

use std::fmt;

use serde::de::{self, DeserializeOwned, DeserializeSeed, Error as _, IntoDeserializer, Visitor};

use crate::error::Error;
use crate::node::{Node, NodeValue};

/// Deserializes `T` from `node`; `path` is the YAML path of `node`, used in errors.
pub fn from_node<T: DeserializeOwned>(node: &Node, path: &str) -> Result<T, Error> {
    T::deserialize(NodeDe {
        node,
        path: path.to_owned(),
    })
    .map_err(|e| e.into_error(node, path))
}

/// A value with the position it was read from. Only works through [`from_node`].
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Located<T> {
    pub value: T,
    pub line: usize,
    pub column: usize,
    pub path: String,
}

const LOCATED: &str = "__proflow_located";

/// The field name (`#[serde(rename = "__proflow_embedded", default)]`) of a settings
/// block whose keys are written beside its struct's own; see the module docs.
pub const EMBEDDED: &str = "__proflow_embedded";
const LOCATED_FIELDS: &[&str] = &["value", "line", "column", "path"];

impl<'de, T: de::Deserialize<'de>> de::Deserialize<'de> for Located<T> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: de::Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Located<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a located value")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut map: A) -> Result<Located<T>, A::Error> {
                let mut value = None;
                let (mut line, mut column, mut path) = (0usize, 0usize, String::new());
                while let Some(k) = map.next_key::<String>()? {
                    match k.as_str() {
                        "value" => value = Some(map.next_value::<T>()?),
                        "line" => line = map.next_value()?,
                        "column" => column = map.next_value()?,
                        "path" => path = map.next_value()?,
                        _ => return Err(de::Error::custom("unexpected field in located value")),
                    }
                }
                let value = value.ok_or_else(|| de::Error::custom("located value missing"))?;
                Ok(Located {
                    value,
                    line,
                    column,
                    path,
                })
            }
        }
        d.deserialize_struct(LOCATED, LOCATED_FIELDS, V(std::marker::PhantomData))
    }
}

/// The deserializer's error: a message plus, once known, where it happened.
#[derive(Debug)]
pub struct DeError {
    message: String,
    at: Option<(String, usize, usize)>,
    /// For an unknown key: the key and the keys that were expected, so a
    /// struct embedding the block that refused it can add its own.
    unknown: Option<(String, Vec<&'static str>)>,
}

/// "unknown field `x`, expected one of `a`, `b`", without the marker of an
/// embedded block.
fn unknown_message(field: &str, expected: &[&'static str]) -> String {
    let names: Vec<String> = expected
        .iter()
        .filter(|e| **e != EMBEDDED)
        .map(|e| format!("`{e}`"))
        .collect();
    match names.len() {
        0 => format!("unknown field `{field}`, there are no fields"),
        1 => format!("unknown field `{field}`, expected {}", names[0]),
        _ => format!(
            "unknown field `{field}`, expected one of {}",
            names.join(", ")
        ),
    }
}

impl DeError {
    /// The error as it leaves a value nested in a map or a list: an unknown
    /// key in there is not a key of any block embedded above it, so no
    /// struct above adds its keys to the message.
    fn nested(mut self) -> Self {
        self.unknown = None;
        self
    }

    /// Adds the keys of a struct that embeds the block which refused a key.
    fn also_expected(mut self, fields: &[&'static str]) -> Self {
        if let Some((field, expected)) = &mut self.unknown {
            expected.extend(fields.iter().filter(|f| **f != EMBEDDED));
            self.message = unknown_message(field, expected);
        }
        self
    }

    fn into_error(self, root: &Node, root_path: &str) -> Error {
        match self.at {
            Some((path, line, column)) => Error::new(path, line, column, self.message),
            None => Error::new(root_path, root.line, root.column, self.message),
        }
    }

    fn located(mut self, node: &Node, path: &str) -> Self {
        if self.at.is_none() {
            self.at = Some((path.to_owned(), node.line, node.column));
        }
        self
    }
}

impl fmt::Display for DeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for DeError {}

impl de::Error for DeError {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        DeError {
            message: msg.to_string(),
            at: None,
            unknown: None,
        }
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        DeError {
            message: unknown_message(field, expected),
            at: None,
            unknown: Some((field.to_owned(), expected.to_vec())),
        }
    }
}

fn join(path: &str, part: &str) -> String {
    if path.is_empty() {
        part.to_owned()
    } else {
        format!("{path}.{part}")
    }
}

struct NodeDe<'a> {
    node: &'a Node,
    path: String,
}

impl<'a> NodeDe<'a> {
    fn invalid(&self, expected: &str) -> DeError {
        let shown = match &self.node.value {
            NodeValue::Str(s) => format!("the string {s:?}"),
            _ => match self.node.scalar_text() {
                Some(t) if !t.is_empty() => format!("{} ({t})", self.node.kind()),
                _ => self.node.kind().to_string(),
            },
        };
        DeError::custom(format!("expected {expected}, found {shown}"))
            .located(self.node, &self.path)
    }

    fn wrap<T>(&self, r: Result<T, DeError>) -> Result<T, DeError> {
        r.map_err(|e| e.located(self.node, &self.path))
    }

    fn int<T>(&self, expected: &str) -> Result<T, DeError>
    where
        T: TryFrom<i64> + TryFrom<u64> + std::str::FromStr,
    {
        let v: Option<T> = match &self.node.value {
            NodeValue::Int(i) => T::try_from(*i).ok(),
            NodeValue::UInt(u) => T::try_from(*u).ok(),
            NodeValue::Str(s) => s.trim().parse::<T>().ok(),
            _ => None,
        };
        v.ok_or_else(|| self.invalid(expected))
    }
}

impl<'a> NodeDe<'a> {
    /// A struct with an [`EMBEDDED`] block: its own keys as they are, then
    /// every other key as one map under [`EMBEDDED`] (empty when there is
    /// none, so the block's defaults apply).
    fn deserialize_embedding<'de, V: Visitor<'de>>(
        self,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let entries: &[(Node, Node)] = match &self.node.value {
            NodeValue::Map(entries) => entries,
            NodeValue::Null => &[],
            _ => return Err(self.invalid("a map")),
        };
        type Entries<'n> = Vec<&'n (Node, Node)>;
        let (own, rest): (Entries<'_>, Entries<'_>) = entries.iter().partition(|(k, _)| {
            k.as_str()
                .is_some_and(|k| k != EMBEDDED && fields.contains(&k))
        });
        let block = Node::new(
            NodeValue::Map(rest.into_iter().cloned().collect()),
            self.node.line,
            self.node.column,
        );
        let access = EmbeddingAccess {
            own: MapAccess {
                entries: own.into_iter(),
                pending: None,
                path: &self.path,
            },
            block: Some(block),
            block_next: false,
            fields,
        };
        self.wrap(visitor.visit_map(access))
    }
}

macro_rules! de_int {
    ($method:ident, $visit:ident, $ty:ty, $what:literal) => {
        fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
            let v: $ty = self.int($what)?;
            self.wrap(visitor.$visit(v))
        }
    };
}

impl<'de, 'a> de::Deserializer<'de> for NodeDe<'a> {
    type Error = DeError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let r = match &self.node.value {
            NodeValue::Null => visitor.visit_unit(),
            NodeValue::Bool(b) => visitor.visit_bool(*b),
            NodeValue::Int(i) => visitor.visit_i64(*i),
            NodeValue::UInt(u) => visitor.visit_u64(*u),
            NodeValue::Float(f) => visitor.visit_f64(*f),
            NodeValue::Str(s) => visitor.visit_str(s),
            NodeValue::Seq(_) => return self.deserialize_seq(visitor),
            NodeValue::Map(_) => return self.deserialize_map(visitor),
        };
        self.wrap(r)
    }

    fn deserialize_bool<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let b = match &self.node.value {
            NodeValue::Bool(b) => Some(*b),
            NodeValue::Str(s) => match s.trim() {
                "true" | "True" | "TRUE" => Some(true),
                "false" | "False" | "FALSE" => Some(false),
                _ => None,
            },
            _ => None,
        };
        match b {
            Some(b) => self.wrap(visitor.visit_bool(b)),
            None => Err(self.invalid("true or false")),
        }
    }

    de_int!(deserialize_i8, visit_i8, i8, "an integer");
    de_int!(deserialize_i16, visit_i16, i16, "an integer");
    de_int!(deserialize_i32, visit_i32, i32, "an integer");
    de_int!(deserialize_i64, visit_i64, i64, "an integer");
    de_int!(
        deserialize_u8,
        visit_u8,
        u8,
        "a non-negative integer (0 to 255)"
    );
    de_int!(
        deserialize_u16,
        visit_u16,
        u16,
        "a non-negative integer (0 to 65535)"
    );
    de_int!(deserialize_u32, visit_u32, u32, "a non-negative integer");
    de_int!(deserialize_u64, visit_u64, u64, "a non-negative integer");

    fn deserialize_f32<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_f64(visitor)
    }

    fn deserialize_f64<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        let f = match &self.node.value {
            NodeValue::Float(f) => Some(*f),
            NodeValue::Int(i) => Some(*i as f64),
            NodeValue::UInt(u) => Some(*u as f64),
            NodeValue::Str(s) => s.trim().parse().ok(),
            _ => None,
        };
        match f {
            Some(f) => self.wrap(visitor.visit_f64(f)),
            None => Err(self.invalid("a number")),
        }
    }

    fn deserialize_char<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_str<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            NodeValue::Str(s) => self.wrap(visitor.visit_str(s)),
            NodeValue::Seq(_) | NodeValue::Map(_) | NodeValue::Null => {
                Err(self.invalid("a string"))
            }
            _ => {
                let text = self.node.scalar_text().unwrap_or_default();
                self.wrap(visitor.visit_string(text))
            }
        }
    }

    fn deserialize_string<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_bytes<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_byte_buf<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            NodeValue::Null => self.wrap(visitor.visit_none()),
            _ => {
                let (node, path) = (self.node, self.path.clone());
                visitor.visit_some(self).map_err(|e| e.located(node, &path))
            }
        }
    }

    fn deserialize_unit<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            NodeValue::Null => self.wrap(visitor.visit_unit()),
            _ => Err(self.invalid("nothing (null)")),
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_unit(visitor)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        let (node, path) = (self.node, self.path.clone());
        visitor
            .visit_newtype_struct(self)
            .map_err(|e| e.located(node, &path))
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            NodeValue::Seq(items) => {
                let access = SeqAccess {
                    items: items.iter().enumerate(),
                    path: &self.path,
                };
                self.wrap(visitor.visit_seq(access))
            }
            _ => Err(self.invalid("a list")),
        }
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, DeError> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        match &self.node.value {
            NodeValue::Map(entries) => {
                let access = MapAccess {
                    entries: entries.iter(),
                    pending: None,
                    path: &self.path,
                };
                self.wrap(visitor.visit_map(access))
            }
            // An empty value (`key:` with nothing after it) reads as an empty map.
            NodeValue::Null => self.wrap(visitor.visit_map(MapAccess {
                entries: [].iter(),
                pending: None,
                path: &self.path,
            })),
            _ => Err(self.invalid("a map")),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        if name == LOCATED {
            let access = LocatedAccess {
                de: Some(self),
                step: 0,
            };
            return visitor.visit_map(access);
        }
        if fields.contains(&EMBEDDED) {
            return self.deserialize_embedding(fields, visitor);
        }
        self.deserialize_map(visitor)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        match &self.node.value {
            NodeValue::Str(s) => {
                let d: de::value::StrDeserializer<'_, DeError> = s.as_str().into_deserializer();
                self.wrap(visitor.visit_enum(d))
            }
            NodeValue::Map(entries) if entries.len() == 1 => {
                let (k, v) = &entries[0];
                let access = EnumAccess {
                    key: k,
                    value: v,
                    path: &self.path,
                };
                self.wrap(visitor.visit_enum(access))
            }
            _ => Err(self.invalid("one of the allowed words")),
        }
    }

    fn deserialize_identifier<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        self.deserialize_str(visitor)
    }

    fn deserialize_ignored_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, DeError> {
        visitor.visit_unit()
    }
}

struct SeqAccess<'a, I> {
    items: I,
    path: &'a str,
}

impl<'de, 'a, I: Iterator<Item = (usize, &'a Node)>> de::SeqAccess<'de> for SeqAccess<'a, I> {
    type Error = DeError;

    fn next_element_seed<T: DeserializeSeed<'de>>(
        &mut self,
        seed: T,
    ) -> Result<Option<T::Value>, DeError> {
        match self.items.next() {
            Some((i, node)) => {
                let path = join(self.path, &i.to_string());
                seed.deserialize(NodeDe {
                    node,
                    path: path.clone(),
                })
                .map(Some)
                .map_err(|e| e.nested().located(node, &path))
            }
            None => Ok(None),
        }
    }
}

struct MapAccess<'a, I> {
    entries: I,
    pending: Option<(&'a Node, String)>,
    path: &'a str,
}

impl<'de, 'a, I: Iterator<Item = &'a (Node, Node)>> de::MapAccess<'de> for MapAccess<'a, I> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        match self.entries.next() {
            Some((k, v)) => {
                let key_text = k.scalar_text().unwrap_or_default();
                let path = join(self.path, &key_text);
                self.pending = Some((v, path.clone()));
                seed.deserialize(NodeDe {
                    node: k,
                    path: path.clone(),
                })
                .map(Some)
                .map_err(|e| e.located(k, &path))
            }
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let (node, path) = self
            .pending
            .take()
            .ok_or_else(|| DeError::custom("value requested before key"))?;
        seed.deserialize(NodeDe {
            node,
            path: path.clone(),
        })
        .map_err(|e| e.nested().located(node, &path))
    }
}

/// The keys of a struct with an [`EMBEDDED`] block: its own, then the block.
struct EmbeddingAccess<'a> {
    own: MapAccess<'a, std::vec::IntoIter<&'a (Node, Node)>>,
    block: Option<Node>,
    block_next: bool,
    fields: &'static [&'static str],
}

impl<'de, 'a> de::MapAccess<'de> for EmbeddingAccess<'a> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        if self.own.entries.len() > 0 {
            return de::MapAccess::next_key_seed(&mut self.own, seed);
        }
        if self.block.is_none() || self.block_next {
            return Ok(None);
        }
        self.block_next = true;
        let key: de::value::StrDeserializer<'_, DeError> = EMBEDDED.into_deserializer();
        seed.deserialize(key).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        if !self.block_next {
            return de::MapAccess::next_value_seed(&mut self.own, seed);
        }
        let block = self
            .block
            .take()
            .ok_or_else(|| DeError::custom("embedded settings read twice"))?;
        seed.deserialize(NodeDe {
            node: &block,
            path: self.own.path.to_owned(),
        })
        .map_err(|e| e.also_expected(self.fields).located(&block, self.own.path))
    }
}

struct EnumAccess<'a> {
    key: &'a Node,
    value: &'a Node,
    path: &'a str,
}

impl<'de, 'a> de::EnumAccess<'de> for EnumAccess<'a> {
    type Error = DeError;
    type Variant = NodeDe<'a>;

    fn variant_seed<V: DeserializeSeed<'de>>(
        self,
        seed: V,
    ) -> Result<(V::Value, NodeDe<'a>), DeError> {
        let key_text = self.key.scalar_text().unwrap_or_default();
        let path = join(self.path, &key_text);
        let v = seed.deserialize(NodeDe {
            node: self.key,
            path: path.clone(),
        })?;
        Ok((
            v,
            NodeDe {
                node: self.value,
                path,
            },
        ))
    }
}

impl<'de, 'a> de::VariantAccess<'de> for NodeDe<'a> {
    type Error = DeError;

    fn unit_variant(self) -> Result<(), DeError> {
        Ok(())
    }

    fn newtype_variant_seed<T: DeserializeSeed<'de>>(self, seed: T) -> Result<T::Value, DeError> {
        seed.deserialize(self)
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, visitor: V) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_seq(self, visitor)
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, DeError> {
        de::Deserializer::deserialize_map(self, visitor)
    }
}

struct LocatedAccess<'a> {
    de: Option<NodeDe<'a>>,
    step: usize,
}

impl<'de, 'a> de::MapAccess<'de> for LocatedAccess<'a> {
    type Error = DeError;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, DeError> {
        if self.step >= LOCATED_FIELDS.len() {
            return Ok(None);
        }
        let key = LOCATED_FIELDS[self.step];
        let d: de::value::StrDeserializer<'_, DeError> = key.into_deserializer();
        seed.deserialize(d).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, DeError> {
        let step = self.step;
        self.step += 1;
        let line;
        let column;
        let path;
        match &self.de {
            Some(d) => {
                line = d.node.line;
                column = d.node.column;
                path = d.path.clone();
            }
            None => return Err(DeError::custom("located value read twice")),
        }
        match step {
            0 => {
                let d = self
                    .de
                    .take()
                    .ok_or_else(|| DeError::custom("located value read twice"))?;
                // Keep position info for the remaining fields.
                let (node, p) = (d.node, d.path.clone());
                let r = seed.deserialize(d);
                self.de = Some(NodeDe { node, path: p });
                r
            }
            1 => seed.deserialize((line as u64).into_deserializer()),
            2 => seed.deserialize((column as u64).into_deserializer()),
            _ => seed.deserialize(de::value::StringDeserializer::<DeError>::new(path)),
        }
    }
}

#[cfg(test)]
mod tests;
