//! Values as the metadata lays them out: a primitive by its class name, a
//! constant-pool field as its key, an array as a count and its items, any
//! other class as its fields in order. Read into a small tree ([`Value`]),
//! or skipped. Nesting is bounded (a class that holds itself inline would
//! never end), an array's count is checked against the bytes left at the
//! least size of its items (an array of values that take no bytes is
//! refused: it could claim any count), and every value is taken from the
//! [`Meter`] before it is made.

use super::cursor::{Cursor, JfrString};
use super::metadata::{Class, Field, Metadata, Primitive};
use super::{JfrError, Meter, Result};

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

/// What a value holds beyond its own [`Value`]: its fields, items and text.
pub fn held_bytes(v: &Value) -> usize {
    match v {
        Value::Str(JfrString::Text(s)) => s.len(),
        Value::Object(items) | Value::Array(items) => items
            .iter()
            .map(|i| std::mem::size_of::<Value>() + held_bytes(i))
            .sum(),
        _ => 0,
    }
}

/// Reads one value of `class` flat, allocating nothing: each field that is
/// an integer (or a key into a pool) as its value in `out`, every other
/// field passed over and given 0. Events are read this way: what makes a
/// profile of them is all integers and keys.
pub fn read_flat(
    c: &mut Cursor<'_>,
    md: &Metadata,
    class: &Class,
    out: &mut Vec<u64>,
) -> Result<()> {
    check(c, class, 0)?;
    out.clear();
    for field in &class.fields {
        let value = if field.array {
            let n = array_len(c, md, field)?;
            for _ in 0..n {
                skip_one(c, md, field, 1)?;
            }
            0
        } else if field.constant_pool {
            c.varint("a constant-pool key")?
        } else {
            match field.primitive {
                Some(Primitive::Varint) => c.varint("an integer")?,
                Some(Primitive::Byte) => u64::from(c.u8("a byte")?),
                Some(p) => {
                    skip_primitive(c, p)?;
                    0
                }
                None => {
                    skip_class(c, md, field_class(c, md, field)?, 1)?;
                    0
                }
            }
        };
        out.push(value);
    }
    Ok(())
}

/// Passes over one field's value (an array's items too), allocating
/// nothing.
pub fn skip_field(c: &mut Cursor<'_>, md: &Metadata, field: &Field, depth: usize) -> Result<()> {
    if field.array {
        let n = array_len(c, md, field)?;
        for _ in 0..n {
            skip_one(c, md, field, depth)?;
        }
        return Ok(());
    }
    skip_one(c, md, field, depth)
}

/// Passes over one value of `class`, allocating nothing.
pub fn skip_class(c: &mut Cursor<'_>, md: &Metadata, class: &Class, depth: usize) -> Result<()> {
    check(c, class, depth)?;
    if let Some(p) = class.primitive {
        return skip_primitive(c, p);
    }
    for field in &class.fields {
        if field.array {
            let n = array_len(c, md, field)?;
            for _ in 0..n {
                skip_one(c, md, field, depth + 1)?;
            }
        } else {
            skip_one(c, md, field, depth + 1)?;
        }
    }
    Ok(())
}

fn skip_one(c: &mut Cursor<'_>, md: &Metadata, field: &Field, depth: usize) -> Result<()> {
    if field.constant_pool {
        return c.varint("a constant-pool key").map(drop);
    }
    if let Some(p) = field.primitive {
        return skip_primitive(c, p);
    }
    skip_class(c, md, field_class(c, md, field)?, depth)
}

fn skip_primitive(c: &mut Cursor<'_>, p: Primitive) -> Result<()> {
    match p {
        Primitive::Byte => c.u8("a byte").map(drop),
        Primitive::Varint => c.varint("an integer").map(drop),
        Primitive::Float => c.take(4, "a float").map(drop),
        Primitive::Double => c.take(8, "a double").map(drop),
        Primitive::String => c.skip_string("a string"),
    }
}

/// Nesting within bounds, and no field that takes no bytes: a value of
/// such a class would cost work for nothing read, without end.
fn check(c: &Cursor<'_>, class: &Class, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(JfrError::Invalid {
            what: format!(
                "values nested deeper than {MAX_DEPTH} (class {})",
                class.name
            ),
            at: c.position(),
        });
    }
    if class.empty_field {
        return Err(JfrError::Invalid {
            what: format!(
                "class {} has a field whose values take no bytes",
                class.name
            ),
            at: c.position(),
        });
    }
    Ok(())
}

/// An array's length, checked against the bytes left at the least size of
/// its items.
pub fn array_len(c: &mut Cursor<'_>, md: &Metadata, field: &Field) -> Result<usize> {
    let least = if field.constant_pool {
        1
    } else {
        field_class(c, md, field)?.min_bytes
    };
    if least == 0 {
        return Err(JfrError::Invalid {
            what: format!(
                "field {} is an array of values that take no bytes; its length could be anything",
                field.name
            ),
            at: c.position(),
        });
    }
    c.count(least, "an array's length")
}

/// Reads one value of `class`.
pub fn read_class(
    c: &mut Cursor<'_>,
    md: &Metadata,
    class: &Class,
    depth: usize,
    meter: &mut Meter<'_>,
) -> Result<Value> {
    check(c, class, depth)?;
    if let Some(p) = class.primitive {
        let value = primitive(c, p)?;
        if let Value::Str(JfrString::Text(s)) = &value {
            meter.take(s.len())?;
        }
        return Ok(value);
    }
    meter.take_items::<Value>(class.fields.len())?;
    let mut fields = Vec::with_capacity(class.fields.len());
    for field in &class.fields {
        fields.push(read_field(c, md, field, depth + 1, meter)?);
    }
    Ok(Value::Object(fields))
}

/// Reads one field's value.
pub fn read_field(
    c: &mut Cursor<'_>,
    md: &Metadata,
    field: &Field,
    depth: usize,
    meter: &mut Meter<'_>,
) -> Result<Value> {
    if field.array {
        let n = array_len(c, md, field)?;
        meter.take_items::<Value>(n)?;
        let mut items = Vec::with_capacity(n);
        for _ in 0..n {
            items.push(read_one(c, md, field, depth, meter)?);
        }
        return Ok(Value::Array(items));
    }
    read_one(c, md, field, depth, meter)
}

pub fn field_class<'m>(c: &Cursor<'_>, md: &'m Metadata, field: &Field) -> Result<&'m Class> {
    md.classes
        .get(&field.class)
        .ok_or_else(|| JfrError::Invalid {
            what: format!(
                "field {} has class id {}, which the metadata does not declare",
                field.name, field.class
            ),
            at: c.position(),
        })
}

fn read_one(
    c: &mut Cursor<'_>,
    md: &Metadata,
    field: &Field,
    depth: usize,
    meter: &mut Meter<'_>,
) -> Result<Value> {
    if field.constant_pool {
        return Ok(Value::Key(c.varint("a constant-pool key")?));
    }
    let class = field_class(c, md, field)?;
    read_class(c, md, class, depth, meter)
}

/// A primitive's value.
fn primitive(c: &mut Cursor<'_>, p: Primitive) -> Result<Value> {
    Ok(match p {
        Primitive::Byte => Value::Int(u64::from(c.u8("a byte")?)),
        Primitive::Varint => Value::Int(c.varint("an integer")?),
        Primitive::Float => Value::Float(f64::from(f32::from_bits(c.be_u32("a float")?))),
        Primitive::Double => Value::Float(f64::from_bits(c.be_i64("a double")? as u64)),
        Primitive::String => Value::Str(c.string("a string")?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jfr::metadata::tests::{TestField, metadata_event, utf8, varint};

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
        let md = Metadata::read(&mut Cursor::new(&md_bytes), &mut Meter::unbounded()).unwrap();
        let pair = md.class_named("Pair").unwrap();
        let mut bytes = Vec::new();
        varint(&mut bytes, 7);
        varint(&mut bytes, 3);
        utf8(&mut bytes, "hi");
        let v = read_class(
            &mut Cursor::new(&bytes),
            &md,
            pair,
            0,
            &mut Meter::unbounded(),
        )
        .unwrap();
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
        let md = Metadata::read(&mut Cursor::new(&md_bytes), &mut Meter::unbounded()).unwrap();
        let class = md.class_named("Loop").unwrap();
        let err = read_class(
            &mut Cursor::new(&[0u8; 64]),
            &md,
            class,
            0,
            &mut Meter::unbounded(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("take no bytes"), "{err}");
        assert!(skip_class(&mut Cursor::new(&[0u8; 64]), &md, class, 0).is_err());
    }

    #[test]
    fn nesting_past_the_bound_is_refused() {
        // C0 holds C1 inline, C1 holds C2, ... C19 holds an int.
        let names: Vec<String> = (0..20).map(|i| format!("C{i}")).collect();
        let fields: Vec<[(&str, u64, bool); 1]> = (0..20u64)
            .map(|i| [("f", if i == 19 { 10 } else { 101 + i }, false)])
            .collect();
        let mut classes: Vec<(u64, &str, &[TestField<'_>])> = vec![(10, "int", &[])];
        for i in 0..20 {
            classes.push((100 + i as u64, &names[i], &fields[i]));
        }
        let md_bytes = metadata_event(&classes);
        let md = Metadata::read(&mut Cursor::new(&md_bytes), &mut Meter::unbounded()).unwrap();
        let class = md.class_named("C0").unwrap();
        let err = read_class(
            &mut Cursor::new(&[0u8; 64]),
            &md,
            class,
            0,
            &mut Meter::unbounded(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
        // Three deep is read.
        let class = md.class_named("C17").unwrap();
        assert!(
            read_class(
                &mut Cursor::new(&[0u8; 64]),
                &md,
                class,
                0,
                &mut Meter::unbounded()
            )
            .is_ok()
        );
    }

    #[test]
    fn arrays_cannot_claim_more_than_their_bytes_or_the_meter_allows() {
        let md_bytes = metadata_event(&[
            (10, "int", &[]),
            (60, "Empty", &[]),
            (61, "Empties", &[("items[]", 60, false)]),
            (62, "Ints", &[("items[]", 10, false)]),
            (63, "Rows", &[("rows[]", 62, false)]),
        ]);
        let md = Metadata::read(&mut Cursor::new(&md_bytes), &mut Meter::unbounded()).unwrap();
        // An array of values that take no bytes could claim any length.
        let mut bytes = Vec::new();
        varint(&mut bytes, 1_000_000);
        let empties = md.class_named("Empties").unwrap();
        let err = read_class(
            &mut Cursor::new(&bytes),
            &md,
            empties,
            0,
            &mut Meter::unbounded(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("take no bytes"), "{err}");
        // A length past the bytes left is refused before anything is made.
        let ints = md.class_named("Ints").unwrap();
        let err = read_class(
            &mut Cursor::new(&bytes),
            &md,
            ints,
            0,
            &mut Meter::unbounded(),
        )
        .unwrap_err();
        assert!(err.to_string().contains("more than the"), "{err}");
        // Rows of ints within the bytes: made while the meter grants them,
        // refused once it says no.
        let mut bytes = Vec::new();
        varint(&mut bytes, 100);
        for _ in 0..100 {
            varint(&mut bytes, 100);
            bytes.extend([0u8; 100]);
        }
        let rows = md.class_named("Rows").unwrap();
        let mut asked = 0;
        let mut meter = Meter::new(|n| {
            asked += n;
            true
        });
        read_class(&mut Cursor::new(&bytes), &md, rows, 0, &mut meter).unwrap();
        let needed = meter.peak();
        drop(meter);
        assert_eq!(asked, needed);
        assert!(
            needed >= 100 * 100 * std::mem::size_of::<Value>(),
            "{needed}"
        );
        let mut total = 0;
        let mut meter = Meter::new(|n| {
            total += n;
            total <= needed / 2
        });
        let refused = read_class(&mut Cursor::new(&bytes), &md, rows, 0, &mut meter);
        assert!(
            matches!(refused, Err(JfrError::OverBudget { .. })),
            "not refused"
        );
    }
}
