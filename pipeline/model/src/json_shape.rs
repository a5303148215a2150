//! What decoding a JSON document will take, known before decoding it: one
//! pass over the bytes counts its objects, members, array elements, scalars
//! and string bytes ([`JsonShape`]), from which each decoder states an upper
//! bound of the memory it allocates ([`JsonShape::tree_bytes`] for
//! `serde_json::Value`, plus what the decoder builds from each object). A
//! receiver grants that bound from the memory budget, or refuses the
//! request, before the first allocation: a flat factor of the body's size
//! is either far too high for ordinary documents or far too low for
//! hostile ones (`[{},{},…]` decodes to tens of bytes per byte).
//!
//! The scan does not validate: malformed JSON gets a bound as well, and the
//! decoder refuses it afterwards.
//!
//! What may depend on this: the JSON decoders of OTLP profiles and spans,
//! and the receivers that grant memory for them.

use std::mem::size_of;

/// The counts of one JSON document.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JsonShape {
    /// Objects, empty or not.
    pub objects: usize,
    /// Objects with at least one member.
    pub nonempty_objects: usize,
    /// Members of every object (key and value pairs).
    pub members: usize,
    /// Arrays, empty or not.
    pub arrays: usize,
    /// Non-empty arrays whose first element is an object.
    pub object_arrays: usize,
    /// Non-empty arrays whose first element is not an object.
    pub other_arrays: usize,
    /// Elements of every array.
    pub elements: usize,
    /// Numbers, strings (not keys), booleans and nulls.
    pub scalars: usize,
    /// Bytes between the quotes of every string, keys included.
    pub string_bytes: usize,
}

/// What a decoder takes whatever the document: the error it may make and
/// its message, the path it names.
pub const BASE: usize = 4096;
/// The deepest nesting decoders read (`serde_json`'s limit); the scan, and
/// its own stack, stop there.
pub const MAX_DEPTH: usize = 128;
/// What one `serde_json::Value` takes where it is stored.
const VALUE: usize = 32;
/// A B-tree node of a `serde_json::Map`: 11 keys (`String`) and values.
const MAP_NODE: usize = 16 + 11 * (size_of::<String>() + VALUE);
/// A member beyond a node's first: non-root nodes are at least 5 of 11
/// full, and internal nodes add their edges.
const MAP_MEMBER: usize = MAP_NODE / 5 + 8 * 12 / 5;

impl JsonShape {
    /// Counts the shape of `bytes` in one pass.
    pub fn scan(bytes: &[u8]) -> JsonShape {
        let mut shape = JsonShape::default();
        // For each open container: is it an object, and has it an element yet.
        let mut open: Vec<(bool, bool)> = Vec::new();
        let mut i = 0;
        // A value (`object`: an object) started in the innermost container.
        let started = |open: &mut Vec<(bool, bool)>, shape: &mut JsonShape, object: bool| {
            if let Some((is_object, has)) = open.last_mut()
                && !*has
            {
                *has = true;
                if *is_object {
                    shape.nonempty_objects += 1;
                } else if object {
                    shape.object_arrays += 1;
                } else {
                    shape.other_arrays += 1;
                }
            }
        };
        while i < bytes.len() {
            match bytes[i] {
                b'"' => {
                    let start = i + 1;
                    i = start;
                    while i < bytes.len() && bytes[i] != b'"' {
                        i += if bytes[i] == b'\\' { 2 } else { 1 };
                    }
                    shape.string_bytes += i.min(bytes.len()) - start;
                    // A key is followed by `:`; anything else is a value.
                    let mut j = i + 1;
                    while j < bytes.len() && bytes[j].is_ascii_whitespace() {
                        j += 1;
                    }
                    let is_key = bytes.get(j) == Some(&b':');
                    if is_key {
                        shape.members += 1;
                    } else {
                        shape.scalars += 1;
                        if matches!(open.last(), Some((false, _))) {
                            shape.elements += 1;
                        }
                    }
                    started(&mut open, &mut shape, false);
                }
                b'{' | b'[' => {
                    let is_object = bytes[i] == b'{';
                    if matches!(open.last(), Some((false, _))) {
                        shape.elements += 1;
                    }
                    started(&mut open, &mut shape, is_object);
                    if is_object {
                        shape.objects += 1;
                    } else {
                        shape.arrays += 1;
                    }
                    if open.len() >= MAX_DEPTH {
                        // Decoders refuse deeper documents without reading
                        // on: what they built so far is all there is.
                        return shape;
                    }
                    open.push((is_object, false));
                }
                b'}' | b']' => {
                    open.pop();
                }
                b',' | b':' => {}
                b if b.is_ascii_whitespace() => {}
                _ => {
                    // A number, `true`, `false` or `null`: up to the next delimiter.
                    while i + 1 < bytes.len()
                        && !matches!(bytes[i + 1], b',' | b']' | b'}' | b':' | b'"')
                        && !bytes[i + 1].is_ascii_whitespace()
                    {
                        i += 1;
                    }
                    shape.scalars += 1;
                    if matches!(open.last(), Some((false, _))) {
                        shape.elements += 1;
                    }
                    started(&mut open, &mut shape, false);
                }
            }
            i += 1;
        }
        shape
    }

    /// Non-empty arrays.
    pub fn nonempty_arrays(&self) -> usize {
        self.object_arrays + self.other_arrays
    }

    /// An upper bound of the heap a `serde_json::Value` of this document
    /// takes: every array's elements (a vector of `n` has room for at most
    /// `max(4, 2n)`), every object's B-tree nodes, every string.
    pub fn tree_bytes(&self) -> usize {
        let arrays = self
            .elements
            .saturating_mul(2 * VALUE)
            .saturating_add(self.nonempty_arrays().saturating_mul(4 * VALUE));
        let objects = self
            .nonempty_objects
            .saturating_mul(MAP_NODE)
            .saturating_add(self.members.saturating_mul(MAP_MEMBER));
        arrays
            .saturating_add(objects)
            .saturating_add(self.string_bytes)
            .saturating_add(BASE)
    }

    /// An upper bound of what a decoder builds from this document when it
    /// makes at most a `message`-byte struct of each object and a
    /// `scalar`-byte value of each scalar, each in a vector (which has room
    /// for at most `max(4, 2n)` of its `n`), and copies every string.
    pub fn built_bytes(&self, message: usize, scalar: usize) -> usize {
        let objects = self
            .objects
            .saturating_mul(2 * message)
            .saturating_add(self.object_arrays.saturating_mul(4 * message));
        let scalars = self
            .scalars
            .saturating_mul(2 * scalar)
            .saturating_add(self.other_arrays.saturating_mul(4 * scalar));
        objects
            .saturating_add(scalars)
            .saturating_add(self.string_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_what_a_document_holds() {
        let s = JsonShape::scan(
            br#"{"a": [1, 2.5e3, "x\"y"], "b": {}, "c": {"d": null}, "e": [[], [true]]}"#,
        );
        assert_eq!(s.objects, 3);
        assert_eq!(s.nonempty_objects, 2, "the outer one and c");
        assert_eq!(s.members, 5);
        assert_eq!(s.arrays, 4);
        assert_eq!(
            (s.object_arrays, s.other_arrays),
            (0, 3),
            "a, e and e's second"
        );
        assert_eq!(s.elements, 3 + 2 + 1);
        assert_eq!(s.scalars, 3 + 1 + 1);
        assert_eq!(s.string_bytes, 5 + 4);
    }

    #[test]
    fn never_panics_on_broken_documents() {
        for doc in [&b""[..], b"\"", b"\"\\", b"}}]]", b"{\"a\"", b"[1,", b"nul"] {
            let s = JsonShape::scan(doc);
            assert!(s.tree_bytes() >= BASE);
        }
    }

    #[test]
    fn the_tree_bound_holds_for_what_serde_json_builds() {
        // Empty objects cost a value each; full ones a node: both bounded.
        let empties = format!("[{}{{}}]", "{},".repeat(9999));
        let s = JsonShape::scan(empties.as_bytes());
        assert_eq!(
            (s.objects, s.nonempty_objects, s.elements),
            (10_000, 0, 10_000)
        );
        let ones = format!("[{}{{\"a\":0}}]", "{\"a\":0},".repeat(9999));
        let s1 = JsonShape::scan(ones.as_bytes());
        assert_eq!((s1.nonempty_objects, s1.members), (10_000, 10_000));
        assert!(s1.tree_bytes() > 10_000 * MAP_NODE);
    }
}
