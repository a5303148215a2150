//! The metadata event (type id 0): the classes of a chunk, with their ids
//! and fields, which say how every other event and constant-pool entry is
//! laid out. Ids differ between writers (the JDK's `jdk.ExecutionSample` is
//! not async-profiler's), so everything is looked up by class name.
//!
//! Layout: size, type id 0, start time, duration, metadata id; a string
//! table (count, strings); then a tree of elements, each an index into the
//! table for its name, its attributes (pairs of indexes) and its children.
//! `root` holds `metadata`, whose `class` children hold `field`s.

use super::HashMap;

use super::cursor::{Cursor, JfrString};
use super::{JfrError, Meter, Result};

/// The deepest element tree taken: real ones are five deep (root,
/// metadata, class, field, annotation); a deeper one is not metadata.
const MAX_DEPTH: usize = 16;

/// One field of a class, in the order values are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Field {
    pub name: String,
    /// The id of the field's class.
    pub class: u64,
    /// Written as a key into that class's constant pool.
    pub constant_pool: bool,
    /// Written as a count and that many values.
    pub array: bool,
    /// The primitive its class is, if it is one (known once every class
    /// is read).
    pub primitive: Option<Primitive>,
}

/// How a primitive is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Primitive {
    /// `boolean`, `byte`: one byte.
    Byte,
    /// `char`, `short`, `int`, `long`: a compressed integer.
    Varint,
    /// Four bytes, big-endian.
    Float,
    /// Eight bytes, big-endian.
    Double,
    /// `java.lang.String`: an encoding byte and its data.
    String,
}

impl Primitive {
    /// The primitive the class named `name` is, if it is one.
    pub fn of(name: &str) -> Option<Primitive> {
        Some(match name {
            "boolean" | "byte" => Primitive::Byte,
            "char" | "short" | "int" | "long" => Primitive::Varint,
            "float" => Primitive::Float,
            "double" => Primitive::Double,
            "java.lang.String" => Primitive::String,
            _ => return None,
        })
    }
}

/// One class: an event type, a constant-pool type or a primitive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    pub id: u64,
    pub name: String,
    pub super_type: Option<String>,
    pub fields: Vec<Field>,
    /// The fewest bytes one value of the class takes (0 for a class of no
    /// fields, or one whose fields take none).
    pub min_bytes: usize,
    /// Has a field, neither a key nor an array, whose values take no bytes
    /// (no writer makes one; the reader refuses values of such a class).
    pub empty_field: bool,
    /// Whether it is a primitive, and which.
    pub primitive: Option<Primitive>,
}

impl Class {
    /// The index of the field named `name`, if the class has one.
    pub fn field(&self, name: &str) -> Option<usize> {
        self.fields.iter().position(|f| f.name == name)
    }
}

/// Every class of a chunk.
#[derive(Debug, Clone, Default)]
pub struct Metadata {
    pub classes: HashMap<u64, Class>,
}

impl Metadata {
    /// The class named `name`.
    pub fn class_named(&self, name: &str) -> Option<&Class> {
        self.classes.values().find(|c| c.name == name)
    }

    /// Reads the metadata event that starts where `c` stands.
    pub fn read(c: &mut Cursor<'_>, meter: &mut Meter<'_>) -> Result<Metadata> {
        let before = meter.held();
        let start = c.position();
        let (size, end) = read_event_head(c)?;
        let strings = read_strings(c, meter)?;
        let root = element(c, &strings, 0, meter)?;
        let held = meter.held() - before;
        if c.position() > end {
            return Err(JfrError::Invalid {
                what: format!("the metadata runs past its size of {size} bytes"),
                at: start,
            });
        }
        let mut metadata = Metadata::default();
        for class in root
            .children
            .iter()
            .filter(|e| e.name == "metadata")
            .flat_map(|m| m.children.iter().filter(|e| e.name == "class"))
        {
            let class = class_of(class, meter)?;
            metadata.classes.insert(class.id, class);
        }
        metadata.link_primitives();
        metadata.set_min_bytes();
        // The element tree and its strings are dropped here.
        meter.give_back(held);
        Ok(metadata)
    }

    /// Gives every field the primitive its class is, if it is one.
    fn link_primitives(&mut self) {
        let primitives: HashMap<u64, Primitive> = self
            .classes
            .values()
            .filter_map(|c| Some((c.id, c.primitive?)))
            .collect();
        for class in self.classes.values_mut() {
            for field in &mut class.fields {
                field.primitive = primitives.get(&field.class).copied();
            }
        }
    }

    /// Sets every class's `min_bytes`, and `empty_field` on those with a
    /// field whose values take no bytes.
    fn set_min_bytes(&mut self) {
        let known = min_bytes(self);
        for (id, least) in &known {
            if let Some(class) = self.classes.get_mut(id) {
                class.min_bytes = *least;
            }
        }
        let empty: Vec<u64> = self
            .classes
            .values()
            .filter(|class| {
                class.fields.iter().any(|f| {
                    !f.constant_pool && !f.array && known.get(&f.class).copied().unwrap_or(0) == 0
                })
            })
            .map(|class| class.id)
            .collect();
        for id in empty {
            if let Some(class) = self.classes.get_mut(&id) {
                class.empty_field = true;
            }
        }
    }
}

/// Reads the metadata event's head where `c` stands (its size, type 0,
/// start time, duration and id): its size and where it ends.
fn read_event_head(c: &mut Cursor<'_>) -> Result<(u64, usize)> {
    let start = c.position();
    let available = c.remaining();
    // The size counts the whole event, its own bytes included.
    let size = c.varint("the metadata event's size")?;
    let end = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0 && s <= available)
        .map(|s| start + s)
        .ok_or(JfrError::Truncated {
            what: "the metadata event",
            at: start,
        })?;
    let ty = c.varint("the metadata event's type")?;
    if ty != 0 {
        return Err(JfrError::Invalid {
            what: format!("the metadata offset points at an event of type {ty}, not 0"),
            at: start,
        });
    }
    for what in [
        "the metadata start time",
        "the metadata duration",
        "the metadata id",
    ] {
        c.varint(what)?;
    }
    Ok((size, end))
}

/// Reads the metadata's string table, each string taken from the meter.
fn read_strings(c: &mut Cursor<'_>, meter: &mut Meter<'_>) -> Result<Vec<String>> {
    let n = c.count(1, "the metadata string count")?;
    meter.take_items::<String>(n)?;
    let mut strings = Vec::with_capacity(n);
    for _ in 0..n {
        strings.push(match c.string("a metadata string")? {
            JfrString::Text(s) => {
                meter.take(s.len())?;
                s
            }
            JfrString::Null => String::new(),
            JfrString::PoolKey(_) => {
                return Err(JfrError::Invalid {
                    what: "a metadata string refers to a constant pool".into(),
                    at: c.position(),
                });
            }
        });
    }
    Ok(strings)
}

/// The class a `class` element declares, taken from the meter (its sizes
/// and primitive fields are filled in once every class is read).
fn class_of(class: &Element<'_>, meter: &mut Meter<'_>) -> Result<Class> {
    let id = class.number("id")?;
    let fields = class
        .children
        .iter()
        .filter(|e| e.name == "field")
        .map(|f| {
            Ok(Field {
                name: f.attr("name").unwrap_or_default().to_owned(),
                class: f.number("class")?,
                constant_pool: f.attr("constantPool") == Some("true"),
                array: f.attr("dimension").is_some_and(|d| d != "0"),
                primitive: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let name = class.attr("name").unwrap_or_default().to_owned();
    let super_type = class.attr("superType").map(str::to_owned);
    meter.take(
        std::mem::size_of::<Class>()
            + name.len()
            + super_type.as_ref().map_or(0, String::len)
            + fields
                .iter()
                .map(|f| std::mem::size_of::<Field>() + f.name.len())
                .sum::<usize>(),
    )?;
    let primitive = Primitive::of(&name);
    Ok(Class {
        id,
        name,
        super_type,
        fields,
        min_bytes: 0,
        empty_field: false,
        primitive,
    })
}

/// The fewest bytes a value of each class takes: a primitive its own, a
/// key or an array one, a class the sum of its fields. Worked out once per
/// class, depth first without recursion (a chain of classes may be as long
/// as the metadata), in the order of class ids so the answer never depends
/// on a map's order. A class met again while it is being worked out (one
/// that holds itself inline) counts 0 there: no value of it can be read.
fn min_bytes(md: &Metadata) -> HashMap<u64, usize> {
    let mut known: HashMap<u64, usize> = HashMap::default();
    let mut ids: Vec<u64> = md.classes.keys().copied().collect();
    ids.sort_unstable();
    // Classes being worked out: id, the next field to add, the sum so far.
    let mut open: Vec<(u64, usize, usize)> = Vec::new();
    let mut in_progress: HashMap<u64, ()> = HashMap::default();
    for id in ids {
        if known.contains_key(&id) {
            continue;
        }
        open.push((id, 0, 0));
        in_progress.insert(id, ());
        while let Some(&mut (class_id, ref mut next, ref mut sum)) = open.last_mut() {
            let class = &md.classes[&class_id];
            let own = match class.primitive {
                Some(Primitive::Float) => Some(4),
                Some(Primitive::Double) => Some(8),
                Some(_) => Some(1),
                None => None,
            };
            if own.is_none() && *next < class.fields.len() {
                let field = &class.fields[*next];
                *next += 1;
                if field.constant_pool || field.array {
                    *sum = sum.saturating_add(1);
                } else if let Some(&n) = known.get(&field.class) {
                    *sum = sum.saturating_add(n);
                } else if md.classes.contains_key(&field.class)
                    && !in_progress.contains_key(&field.class)
                {
                    in_progress.insert(field.class, ());
                    open.push((field.class, 0, 0));
                }
                // Else undeclared, or met again while being worked out: 0.
                continue;
            }
            let total = own.unwrap_or(*sum);
            open.pop();
            in_progress.remove(&class_id);
            known.insert(class_id, total);
            if let Some((_, _, parent)) = open.last_mut() {
                *parent = parent.saturating_add(total);
            }
        }
    }
    known
}

/// One element of the tree, its strings resolved.
struct Element<'s> {
    name: &'s str,
    attributes: Vec<(&'s str, &'s str)>,
    children: Vec<Element<'s>>,
}

impl<'s> Element<'s> {
    fn attr(&self, key: &str) -> Option<&'s str> {
        self.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| *v)
    }

    fn number(&self, key: &str) -> Result<u64> {
        let v = self.attr(key).unwrap_or_default();
        v.parse().map_err(|_| JfrError::Invalid {
            what: format!("a metadata {} has {key}={v:?}, not a number", self.name),
            at: 0,
        })
    }
}

fn element<'s>(
    c: &mut Cursor<'_>,
    strings: &'s [String],
    depth: usize,
    meter: &mut Meter<'_>,
) -> Result<Element<'s>> {
    if depth > MAX_DEPTH {
        return Err(JfrError::Invalid {
            what: format!("the metadata is nested deeper than {MAX_DEPTH}"),
            at: c.position(),
        });
    }
    let string = |c: &mut Cursor<'_>, what: &'static str| -> Result<&'s str> {
        let at = c.position();
        let i = c.varint(what)?;
        usize::try_from(i)
            .ok()
            .and_then(|i| strings.get(i))
            .map(String::as_str)
            .ok_or_else(|| JfrError::Invalid {
                what: format!(
                    "{what} {i} is not in the {} metadata strings",
                    strings.len()
                ),
                at,
            })
    };
    let name = string(c, "an element name")?;
    // An attribute is at least two bytes, an element at least three.
    let n = c.count(2, "an attribute count")?;
    meter.take_items::<(&str, &str)>(n)?;
    let mut attributes = Vec::with_capacity(n);
    for _ in 0..n {
        attributes.push((
            string(c, "an attribute key")?,
            string(c, "an attribute value")?,
        ));
    }
    let n = c.count(3, "a child count")?;
    meter.take_items::<Element<'_>>(n)?;
    let mut children = Vec::with_capacity(n);
    for _ in 0..n {
        children.push(element(c, strings, depth + 1, meter)?);
    }
    Ok(Element {
        name,
        attributes,
        children,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes what the tests need: JFR's compressed integers and UTF-8
    /// strings.
    pub(crate) fn varint(out: &mut Vec<u8>, mut v: u64) {
        for _ in 0..8 {
            if v < 0x80 {
                out.push(v as u8);
                return;
            }
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        // The ninth byte holds the last 8 bits whole.
        out.push(v as u8);
    }

    pub(crate) fn utf8(out: &mut Vec<u8>, s: &str) {
        out.push(3);
        varint(out, s.len() as u64);
        out.extend(s.as_bytes());
    }

    /// A field for [`metadata_event`]: name, class id, constant pool. A
    /// name ending in `[]` declares an array (`dimension="1"`) of that name.
    pub(crate) type TestField<'a> = (&'a str, u64, bool);

    /// A metadata event declaring `classes`: (id, name, fields).
    pub(crate) fn metadata_event(classes: &[(u64, &str, &[TestField<'_>])]) -> Vec<u8> {
        let mut strings: Vec<String> = Vec::new();
        let mut index = |s: &str| -> u64 {
            if let Some(i) = strings.iter().position(|x| x == s) {
                return i as u64;
            }
            strings.push(s.to_owned());
            (strings.len() - 1) as u64
        };
        let mut tree = Vec::new();
        varint(&mut tree, index("root"));
        varint(&mut tree, 0);
        varint(&mut tree, 1);
        varint(&mut tree, index("metadata"));
        varint(&mut tree, 0);
        varint(&mut tree, classes.len() as u64);
        for (id, name, fields) in classes {
            varint(&mut tree, index("class"));
            varint(&mut tree, 2);
            for (k, v) in [("name", name.to_string()), ("id", id.to_string())] {
                varint(&mut tree, index(k));
                varint(&mut tree, index(&v));
            }
            varint(&mut tree, fields.len() as u64);
            for (fname, class, cp) in fields.iter() {
                varint(&mut tree, index("field"));
                let (fname, array) = match fname.strip_suffix("[]") {
                    Some(n) => (n, true),
                    None => (*fname, false),
                };
                let mut attrs = vec![("name", fname.to_string()), ("class", class.to_string())];
                if array {
                    attrs.push(("dimension", "1".into()));
                }
                if *cp {
                    attrs.push(("constantPool", "true".into()));
                }
                varint(&mut tree, attrs.len() as u64);
                for (k, v) in attrs {
                    varint(&mut tree, index(k));
                    varint(&mut tree, index(&v));
                }
                varint(&mut tree, 0);
            }
        }
        let mut body = Vec::new();
        varint(&mut body, 0); // type
        for _ in 0..3 {
            varint(&mut body, 0); // start, duration, metadata id
        }
        varint(&mut body, strings.len() as u64);
        for s in &strings {
            utf8(&mut body, s);
        }
        body.extend(tree);
        sized(body)
    }

    /// `body` behind its size, which counts itself: written padded to four
    /// bytes, as writers do for sizes they patch later.
    pub(crate) fn sized(body: Vec<u8>) -> Vec<u8> {
        let size = body.len() as u64 + 4;
        let mut event = vec![
            (size as u8 & 0x7f) | 0x80,
            ((size >> 7) as u8 & 0x7f) | 0x80,
            ((size >> 14) as u8 & 0x7f) | 0x80,
            (size >> 21) as u8 & 0x7f,
        ];
        event.extend(body);
        event
    }

    #[test]
    fn classes_and_fields_by_name() {
        let bytes = metadata_event(&[
            (11, "long", &[]),
            (20, "java.lang.String", &[]),
            (
                101,
                "jdk.ExecutionSample",
                &[("startTime", 11, false), ("stackTrace", 30, true)],
            ),
        ]);
        let m = Metadata::read(&mut Cursor::new(&bytes), &mut Meter::unbounded()).unwrap();
        let sample = m.class_named("jdk.ExecutionSample").unwrap();
        assert_eq!(sample.id, 101);
        assert_eq!(sample.field("stackTrace"), Some(1));
        assert!(sample.fields[1].constant_pool && !sample.fields[1].array);
        assert_eq!(m.classes[&20].name, "java.lang.String");
    }

    #[test]
    fn refuses_bad_indexes_deep_trees_and_counts_past_the_end() {
        let mut bytes = metadata_event(&[(11, "long", &[])]);
        // The last byte is the class's child count: 127 children, which
        // the bytes left cannot hold.
        let last = bytes.len() - 1;
        bytes[last] = 0x7f;
        assert!(Metadata::read(&mut Cursor::new(&bytes), &mut Meter::unbounded()).is_err());

        // Elements nested past the limit, each with no attributes and one
        // child: refused, not a stack overflow.
        let mut deep = Vec::new();
        varint(&mut deep, 0);
        for _ in 0..3 {
            varint(&mut deep, 0);
        }
        varint(&mut deep, 1);
        utf8(&mut deep, "e");
        for _ in 0..10_000 {
            deep.extend([0, 0, 1]);
        }
        let event = sized(deep);
        let err = Metadata::read(&mut Cursor::new(&event), &mut Meter::unbounded()).unwrap_err();
        assert!(err.to_string().contains("nested deeper"), "{err}");
    }
}
