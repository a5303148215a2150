//! The located YAML tree: every value knows its line and column.

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

use crate::error::Error;

/// A YAML value with its position in the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    pub value: NodeValue,
    /// 1-based; 0 when unknown.
    pub line: usize,
    /// 1-based; 0 when unknown.
    pub column: usize,
    /// For numbers and booleans: the text as written (`1.10` stays `1.10`
    /// when a string field reads it).
    pub raw: Option<String>,
    /// Byte offset and length in the source, when known.
    span: Option<(usize, usize)>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum NodeValue {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Node>),
    /// Keys in file order.
    Map(Vec<(Node, Node)>),
}

impl Node {
    /// The value alone, positions left out, as text: equal for two nodes
    /// that say the same thing wherever they sit in their files (what a
    /// reload compares to find the components whose config changed).
    pub fn fingerprint(&self) -> String {
        let mut out = String::new();
        self.write_fingerprint(&mut out);
        out
    }

    fn write_fingerprint(&self, out: &mut String) {
        use std::fmt::Write;
        match &self.value {
            NodeValue::Null => out.push('~'),
            NodeValue::Bool(b) => {
                let _ = write!(out, "{b}");
            }
            NodeValue::Int(i) => {
                let _ = write!(out, "{i}");
            }
            NodeValue::UInt(u) => {
                let _ = write!(out, "{u}");
            }
            NodeValue::Float(f) => {
                let _ = write!(out, "{}", self.raw.clone().unwrap_or_else(|| f.to_string()));
            }
            NodeValue::Str(s) => {
                let _ = write!(out, "{s:?}");
            }
            NodeValue::Seq(items) => {
                out.push('[');
                for i in items {
                    i.write_fingerprint(out);
                    out.push(',');
                }
                out.push(']');
            }
            NodeValue::Map(entries) => {
                out.push('{');
                for (k, v) in entries {
                    k.write_fingerprint(out);
                    out.push(':');
                    v.write_fingerprint(out);
                    out.push(',');
                }
                out.push('}');
            }
        }
    }

    pub fn new(value: NodeValue, line: usize, column: usize) -> Self {
        Node {
            value,
            line,
            column,
            raw: None,
            span: None,
        }
    }

    /// Parses a YAML document. An empty document is an empty map.
    pub fn parse(text: &str) -> Result<Node, Error> {
        if text.trim().is_empty() {
            return Ok(Node::new(NodeValue::Map(Vec::new()), 1, 1));
        }
        let options = serde_saphyr::options! {
            duplicate_keys: serde_saphyr::DuplicateKeyPolicy::Error,
            // YAML 1.2: `on`, `y`, `no` are strings, not booleans.
            strict_booleans: true,
        };
        let mut node = serde_saphyr::from_str_with_options::<Node>(text, options).map_err(|e| {
            let (line, column) = e
                .location()
                .map(|l| (l.line() as usize, l.column() as usize))
                .unwrap_or((0, 0));
            Error::new(
                "",
                line,
                column,
                format!("invalid YAML: {}", e.without_snippet()),
            )
        })?;
        node.fill_raw(text);
        Ok(node)
    }

    fn fill_raw(&mut self, source: &str) {
        match &mut self.value {
            NodeValue::Bool(_) | NodeValue::Int(_) | NodeValue::UInt(_) | NodeValue::Float(_) => {
                if let Some((off, len)) = self.span
                    && let Some(t) = source.get(off..off + len)
                {
                    self.raw = Some(t.trim().to_owned());
                }
            }
            NodeValue::Seq(items) => items.iter_mut().for_each(|n| n.fill_raw(source)),
            NodeValue::Map(entries) => entries.iter_mut().for_each(|(k, v)| {
                k.fill_raw(source);
                v.fill_raw(source);
            }),
            _ => {}
        }
    }

    /// The string when this is a scalar string.
    pub fn as_str(&self) -> Option<&str> {
        match &self.value {
            NodeValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The map entries when this is a map.
    pub fn as_map(&self) -> Option<&[(Node, Node)]> {
        match &self.value {
            NodeValue::Map(m) => Some(m),
            _ => None,
        }
    }

    /// The value under `key` when this is a map.
    pub fn get(&self, key: &str) -> Option<&Node> {
        self.as_map()?
            .iter()
            .find(|(k, _)| k.scalar_text().as_deref() == Some(key))
            .map(|(_, v)| v)
    }

    /// The node at a dotted path relative to this one (`relabel_configs.1.regex`);
    /// sequence items are addressed by index. Returns the deepest node found.
    pub fn lookup(&self, path: &str) -> &Node {
        let mut node = self;
        for part in path.split('.').filter(|p| !p.is_empty()) {
            let next = match &node.value {
                NodeValue::Map(_) => node.get(part),
                NodeValue::Seq(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
                _ => None,
            };
            match next {
                Some(n) => node = n,
                None => break,
            }
        }
        node
    }

    /// The text of a scalar (numbers and booleans as written in YAML).
    pub fn scalar_text(&self) -> Option<String> {
        if let Some(raw) = &self.raw {
            return Some(raw.clone());
        }
        match &self.value {
            NodeValue::Str(s) => Some(s.clone()),
            NodeValue::Bool(b) => Some(b.to_string()),
            NodeValue::Int(i) => Some(i.to_string()),
            NodeValue::UInt(u) => Some(u.to_string()),
            NodeValue::Float(f) => Some(f.to_string()),
            NodeValue::Null => Some(String::new()),
            _ => None,
        }
    }

    /// A short name of the kind of value, for error messages.
    pub fn kind(&self) -> &'static str {
        match self.value {
            NodeValue::Null => "null",
            NodeValue::Bool(_) => "a boolean",
            NodeValue::Int(_) | NodeValue::UInt(_) => "an integer",
            NodeValue::Float(_) => "a number",
            NodeValue::Str(_) => "a string",
            NodeValue::Seq(_) => "a list",
            NodeValue::Map(_) => "a map",
        }
    }

    /// Applies `f` to every string scalar (not to map keys).
    pub fn try_map_strings(
        &mut self,
        f: &mut dyn FnMut(&str) -> Result<Option<String>, String>,
        errors: &mut Vec<(usize, usize, String)>,
    ) {
        match &mut self.value {
            NodeValue::Str(s) => match f(s) {
                Ok(Some(new)) => *s = new,
                Ok(None) => {}
                Err(msg) => errors.push((self.line, self.column, msg)),
            },
            NodeValue::Seq(items) => {
                for i in items {
                    i.try_map_strings(f, errors);
                }
            }
            NodeValue::Map(entries) => {
                for (_, v) in entries {
                    v.try_map_strings(f, errors);
                }
            }
            _ => {}
        }
    }
}

impl<'de> Deserialize<'de> for Node {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let spanned: serde_saphyr::Spanned<NodeValue> = serde_saphyr::Spanned::deserialize(d)?;
        let span = spanned.referenced.span();
        let span = match (span.byte_offset(), span.byte_len()) {
            (Some(o), Some(l)) => usize::try_from(o).ok().zip(usize::try_from(l).ok()),
            _ => None,
        };
        Ok(Node {
            value: spanned.value,
            line: spanned.referenced.line() as usize,
            column: spanned.referenced.column() as usize,
            raw: None,
            span,
        })
    }
}

impl<'de> Deserialize<'de> for NodeValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(NodeVisitor)
    }
}

struct NodeVisitor;

impl<'de> Visitor<'de> for NodeVisitor {
    type Value = NodeValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("any YAML value")
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<NodeValue, E> {
        Ok(NodeValue::Bool(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<NodeValue, E> {
        Ok(NodeValue::Int(v))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<NodeValue, E> {
        Ok(match i64::try_from(v) {
            Ok(i) => NodeValue::Int(i),
            Err(_) => NodeValue::UInt(v),
        })
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<NodeValue, E> {
        Ok(NodeValue::Float(v))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<NodeValue, E> {
        Ok(NodeValue::Str(v.to_owned()))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<NodeValue, E> {
        Ok(NodeValue::Str(v))
    }
    fn visit_unit<E: de::Error>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<NodeValue, E> {
        Ok(NodeValue::Null)
    }
    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<NodeValue, D::Error> {
        NodeValue::deserialize(d)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<NodeValue, A::Error> {
        let mut items = Vec::new();
        while let Some(n) = seq.next_element::<Node>()? {
            items.push(n);
        }
        Ok(NodeValue::Seq(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<NodeValue, A::Error> {
        let mut entries = Vec::new();
        while let Some(k) = map.next_key::<Node>()? {
            let v = map.next_value::<Node>()?;
            entries.push((k, v));
        }
        Ok(NodeValue::Map(entries))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_with_lines() {
        let n = Node::parse("a:\n  b: 1\n  c: [x, y]\nd: hello\n").unwrap();
        let b = n.lookup("a.b");
        assert_eq!(b.value, NodeValue::Int(1));
        assert_eq!(b.line, 2);
        let y = n.lookup("a.c.1");
        assert_eq!(y.as_str(), Some("y"));
        assert_eq!(y.line, 3);
        let (k, _) = &n.as_map().unwrap()[1];
        assert_eq!(k.as_str(), Some("d"));
        assert_eq!(k.line, 4);
    }

    #[test]
    fn numbers_keep_their_written_text() {
        let n = Node::parse("a: 1.10\nb: 0x1F\nc: true\n").unwrap();
        assert_eq!(n.lookup("a").scalar_text().as_deref(), Some("1.10"));
        assert_eq!(n.lookup("b").scalar_text().as_deref(), Some("0x1F"));
        assert_eq!(n.lookup("c").value, NodeValue::Bool(true));
    }

    #[test]
    fn duplicate_keys_and_bad_yaml_are_errors_with_lines() {
        let e = Node::parse("a: 1\na: 2\n").unwrap_err();
        assert!(e.message.contains("invalid YAML"), "{e}");
        let e = Node::parse("a: [1, 2\nb: 3\n").unwrap_err();
        assert!(e.line > 0, "{e:?}");
    }
}
