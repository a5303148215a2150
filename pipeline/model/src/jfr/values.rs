//! Values as the metadata lays them out: a primitive by its class name, a
//! constant-pool field as its key, an array as a count and its items, any
//! other class as its fields in order. Read into a small tree ([`Value`]),
//! or skipped. Nesting is bounded (a class that holds itself inline would
//! never end), and an array's count is checked against the bytes left.

use super::cursor::{Cursor, JfrString};
use super::metadata::{Class, Field, Metadata};
use super::{JfrError, Result};

/// The deepest nesting of inline classes taken (real files nest two or
/// three: a stack trace's frames).
const MAX_DEPTH: usize = 16;

/// One value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// Every integer, boolean and char (as its code).
    Int(u64),
    Float(f64),
    Str(JfrString),
    /// A key into the constant pool of the field's class.
    Key(u64),
    Object(Vec<Value>),
    Array(Vec<Value>),
}

impl Value {
    pub fn int(&self) -> Option<u64> {
        match self {
            Value::Int(v) | Value::Key(v) => Some(*v),
            _ => None,
        }
    }

    pub fn fields(&self) -> &[Value] {
        match self {
            Value::Object(f) => f,
            _ => &[],
        }
    }
}

/// Reads one value of `class`.
pub fn read_class(c: &mut Cursor<'_>, md: &Metadata, class: &Class, depth: usize) -> Result<Value> {
    if depth > MAX_DEPTH {
        return Err(JfrError::Invalid {
            what: format!(
                "values nested deeper than {MAX_DEPTH} (class {})",
                class.name
            ),
            at: c.position(),
        });
    }
    if let Some(primitive) = primitive(c, &class.name)? {
        return Ok(primitive);
    }
    let mut fields = Vec::with_capacity(class.fields.len());
    for field in &class.fields {
        fields.push(read_field(c, md, field, depth + 1)?);
    }
    Ok(Value::Object(fields))
}

/// Reads one field's value.
pub fn read_field(c: &mut Cursor<'_>, md: &Metadata, field: &Field, depth: usize) -> Result<Value> {
    if field.array {
        // Every item takes at least a byte.
        let n = c.count(1, "an array's length")?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(read_one(c, md, field, depth)?);
        }
        return Ok(Value::Array(items));
    }
    read_one(c, md, field, depth)
}

fn read_one(c: &mut Cursor<'_>, md: &Metadata, field: &Field, depth: usize) -> Result<Value> {
    if field.constant_pool {
        return Ok(Value::Key(c.varint("a constant-pool key")?));
    }
    let class = md
        .classes
        .get(&field.class)
        .ok_or_else(|| JfrError::Invalid {
            what: format!(
                "field {} has class id {}, which the metadata does not declare",
                field.name, field.class
            ),
            at: c.position(),
        })?;
    read_class(c, md, class, depth)
}

/// A primitive of the class named `name`, or `None` when it is not one.
fn primitive(c: &mut Cursor<'_>, name: &str) -> Result<Option<Value>> {
    Ok(Some(match name {
        "boolean" | "byte" => Value::Int(u64::from(c.u8(name_what(name))?)),
        "char" | "short" | "int" | "long" => Value::Int(c.varint(name_what(name))?),
        "float" => Value::Float(f64::from(f32::from_bits(c.be_u32("a float")?))),
        "double" => Value::Float(f64::from_bits(c.be_i64("a double")? as u64)),
        "java.lang.String" => Value::Str(c.string("a string")?),
        _ => return Ok(None),
    }))
}

fn name_what(name: &str) -> &'static str {
    match name {
        "boolean" => "a boolean",
        "byte" => "a byte",
        "char" => "a char",
        "short" => "a short",
        _ => "an integer",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jfr::metadata::tests::{metadata_event, utf8, varint};

    #[test]
    fn objects_keys_and_arrays_as_declared() {
        let md_bytes = metadata_event(&[
            (10, "int", &[]),
            (11, "long", &[]),
            (20, "java.lang.String", &[]),
            (30, "jdk.types.Symbol", &[("string", 20, false)]),
            (
                40,
                "Pair",
                &[("a", 10, false), ("name", 30, true), ("text", 20, false)],
            ),
        ]);
        let md = Metadata::read(&mut Cursor::new(&md_bytes)).unwrap();
        let pair = md.class_named("Pair").unwrap();
        let mut bytes = Vec::new();
        varint(&mut bytes, 7);
        varint(&mut bytes, 3);
        utf8(&mut bytes, "hi");
        let v = read_class(&mut Cursor::new(&bytes), &md, pair, 0).unwrap();
        assert_eq!(
            v,
            Value::Object(vec![
                Value::Int(7),
                Value::Key(3),
                Value::Str(JfrString::Text("hi".into()))
            ])
        );
    }

    #[test]
    fn a_class_holding_itself_inline_is_refused() {
        let md_bytes = metadata_event(&[(50, "Loop", &[("me", 50, false)])]);
        let md = Metadata::read(&mut Cursor::new(&md_bytes)).unwrap();
        let class = md.class_named("Loop").unwrap();
        let err = read_class(&mut Cursor::new(&[0u8; 64]), &md, class, 0).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
    }
}
