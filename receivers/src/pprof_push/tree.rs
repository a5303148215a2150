//! The binary `tree` and `trie` bodies of `/ingest` (`format=tree`,
//! `format=trie`, or `Content-Type: binary/octet-stream+tree` / `+trie`),
//! which older Pyroscope agents sent: nodes in depth-first pre-order, each
//! a name (LEB128 length, then the bytes), a value and a child count
//! (LEB128 each).
//!
//! - In a **tree** a node's name is one frame and its value its own samples;
//!   the first node is the root, whose name is not a frame. A stack is the
//!   names from the root's child down, joined by `;`.
//! - In a **trie** a node's name is a piece of the `;`-joined stack: the
//!   stack of a node is its ancestors' pieces and its own, put together.
//!
//! Bytes after a tree's last node are ignored, as Pyroscope ignores them,
//! and counted as lost (`after_tree`: the nodes there with a value, at
//! least 1).
//!
//! Both read as Pyroscope reads them, into the stacks the folded text
//! conversion takes ([`Stacks`]); every stack made is charged before it is
//! copied, and so is every open node kept on the way down; the distinct
//! stacks are capped, so a deep chain of nodes (each a copy of the path
//! above it, or nameless and empty) is refused when the budget runs out.

use super::folded::{Charge, FoldedError, StackSums, Stacks, TextLimits};

/// Reads a LEB128 integer (Go's `binary.Uvarint`: at most 10 bytes).
fn uvarint(body: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for i in 0..10 {
        let b = *body.get(*at)?;
        *at += 1;
        value |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn malformed(what: &str, at: usize) -> FoldedError {
    FoldedError::Malformed(format!(
        "{what} at byte {at}; send a tree or trie as Pyroscope agents write them (nodes of a length-prefixed name, a value and a child count)"
    ))
}

/// One node: its name and value and how many children it has.
fn node<'b>(body: &'b [u8], at: &mut usize) -> Result<(&'b [u8], i64, u64), FoldedError> {
    let start = *at;
    let len =
        uvarint(body, at).ok_or_else(|| malformed("a node's name length is cut off", start))?;
    let name = usize::try_from(len)
        .ok()
        .and_then(|len| body.get(*at..at.checked_add(len)?))
        .ok_or_else(|| malformed("a node's name runs past the body", start))?;
    *at += name.len();
    let value = uvarint(body, at)
        .ok_or_else(|| malformed("a node's value is cut off", start))
        .and_then(|v| {
            i64::try_from(v).map_err(|_| malformed("a node's value is over 2^63", start))
        })?;
    let children =
        uvarint(body, at).ok_or_else(|| malformed("a node's child count is cut off", start))?;
    Ok((name, value, children))
}

/// Sums stacks, each copied from the bytes that make it (lossy UTF-8,
/// charged first: it may triple invalid bytes).
struct Collect<'c, 'd> {
    sums: StackSums,
    charge: &'c mut Charge<'d>,
}

impl Collect<'_, '_> {
    fn add(&mut self, stack: &[u8], value: i64) -> Result<(), FoldedError> {
        if value <= 0 {
            return Ok(());
        }
        (self.charge)(3 * stack.len()).map_err(FoldedError::Memory)?;
        let stack = String::from_utf8_lossy(stack);
        self.sums.add(&stack, value, self.charge)
    }
}

/// The stacks of a `tree` body.
pub(crate) fn parse_tree(
    body: &[u8],
    limits: TextLimits,
    charge: &mut Charge<'_>,
) -> Result<Stacks<'static>, FoldedError> {
    let mut out = Collect {
        sums: StackSums::new(limits),
        charge,
    };
    let mut at = 0;
    // The path to the node being read (`;root;a;b`), and per open ancestor
    // where its part of the path ends and how many children it still has
    // to come.
    let mut path: Vec<u8> = Vec::new();
    let mut open: Vec<(usize, u64)> = Vec::new();
    loop {
        let (name, value, children) = node(body, &mut at)?;
        match open.last_mut() {
            Some((end, waiting)) => {
                *waiting -= 1;
                path.truncate(*end);
            }
            None => path.clear(),
        }
        (out.charge)(name.len() + 1).map_err(FoldedError::Memory)?;
        path.push(b';');
        path.extend_from_slice(name);
        // Pyroscope cuts the first two bytes (`;` before the root's empty
        // name, and the `;` after it) and takes keys longer than that.
        if path.len() > 2 {
            out.add(&path[2..], value)?;
        } else if value > 0 {
            // The root's own value has no frame to go to.
            out.sums.lost.add("empty_stack", 1);
        }
        if children > 0 {
            (out.charge)(2 * std::mem::size_of::<(usize, u64)>()).map_err(FoldedError::Memory)?;
            open.push((path.len(), children));
            continue;
        }
        // A leaf: every ancestor whose children have all come is done.
        while open.last().is_some_and(|(_, waiting)| *waiting == 0) {
            open.pop();
        }
        if open.is_empty() {
            let after = values_after(body, at);
            if after > 0 {
                out.sums.lost.add("after_tree", after);
            }
            return Ok(out.sums.into_stacks());
        }
    }
}

/// What follows a tree's last node, which Pyroscope ignores (and so does
/// this reader, answering 200): the nodes there with a value, or 1 when
/// the rest holds bytes but no such node, so that nothing goes unseen.
fn values_after(body: &[u8], mut at: usize) -> u64 {
    if at >= body.len() {
        return 0;
    }
    let mut values = 0;
    // Each node takes at least 3 bytes: the loop ends within the body.
    while at < body.len() {
        match node(body, &mut at) {
            Ok((_, value, _)) => values += u64::from(value > 0),
            Err(_) => break,
        }
    }
    values.max(1)
}

/// The stacks of a `trie` body, read to its end.
pub(crate) fn parse_trie(
    body: &[u8],
    limits: TextLimits,
    charge: &mut Charge<'_>,
) -> Result<Stacks<'static>, FoldedError> {
    let mut out = Collect {
        sums: StackSums::new(limits),
        charge,
    };
    let mut at = 0;
    let mut key: Vec<u8> = Vec::new();
    // Per open node: how many descendants it waits for, and the length of
    // its piece. As Pyroscope's reader, a node with an empty name keeps the
    // previous node's piece length.
    let mut offsets: Vec<(u64, usize)> = Vec::new();
    let mut copied = 0usize;
    while at < body.len() {
        let (name, value, children) = node(body, &mut at)?;
        if !name.is_empty() {
            (out.charge)(name.len()).map_err(FoldedError::Memory)?;
            key.extend_from_slice(name);
            copied = name.len();
        }
        out.add(&key, value)?;
        if children != 0 {
            // An open node costs 3 bytes on the wire and more here: charged
            // as the vector holds it at its fullest (twice, as it grows).
            (out.charge)(2 * std::mem::size_of::<(u64, usize)>()).map_err(FoldedError::Memory)?;
            offsets.push((children, copied));
            continue;
        }
        key.truncate(key.len().saturating_sub(copied));
        let Some(last) = offsets.len().checked_sub(1) else {
            continue;
        };
        offsets[last].0 = offsets[last].0.saturating_sub(1);
        let mut i = last;
        while i > 0 {
            if offsets[i].0 != 0 {
                break;
            }
            key.truncate(key.len().saturating_sub(offsets[i].1));
            offsets.truncate(i);
            let p = offsets.len() - 1;
            if p > 0 {
                offsets[p].0 = offsets[p].0.saturating_sub(1);
            }
            i -= 1;
        }
    }
    Ok(out.sums.into_stacks())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof_push::folded::TextLimits;

    fn put(out: &mut Vec<u8>, name: &str, value: u64, children: u64) {
        out.push(name.len() as u8);
        out.extend_from_slice(name.as_bytes());
        out.push(value as u8);
        out.push(children as u8);
    }

    fn stacks(s: Stacks<'_>) -> Vec<(String, i64)> {
        s.stacks
            .into_iter()
            .map(|(k, v)| (k.into_owned(), v))
            .collect()
    }

    fn unlimited() -> impl FnMut(usize) -> Result<(), proflow_model::memory::OverBudget> {
        |_| Ok(())
    }

    /// A budget that refuses once `limit` bytes in all were charged.
    fn capped(limit: usize) -> impl FnMut(usize) -> Result<(), proflow_model::memory::OverBudget> {
        let mut total = 0usize;
        move |n| {
            total += n;
            if total > limit {
                Err(proflow_model::memory::OverBudget {
                    limit,
                    wanted: n,
                    never: true,
                    tenant: None,
                })
            } else {
                Ok(())
            }
        }
    }

    #[test]
    fn a_tree_as_pyroscope_reads_it() {
        // root → main (1 self) → foo (3), bar (2); root → idle (4)
        let mut body = Vec::new();
        put(&mut body, "", 7, 2);
        put(&mut body, "main", 1, 2);
        put(&mut body, "foo", 3, 0);
        put(&mut body, "bar", 2, 0);
        put(&mut body, "idle", 4, 0);
        let got = parse_tree(&body, TextLimits::default(), &mut unlimited()).unwrap();
        // The root's own value has no frame: lost, and counted.
        assert_eq!(
            got.lost.iter().collect::<Vec<_>>(),
            vec![("empty_stack", 1)]
        );
        assert_eq!(
            stacks(got),
            vec![
                ("main".into(), 1),
                ("main;foo".into(), 3),
                ("main;bar".into(), 2),
                ("idle".into(), 4)
            ]
        );
    }

    #[test]
    fn what_follows_a_tree_is_ignored_and_counted() {
        let mut tree = Vec::new();
        put(&mut tree, "", 0, 1);
        put(&mut tree, "main", 5, 0);
        // A second tree after the first: two nodes with a value.
        let mut body = tree.clone();
        put(&mut body, "", 0, 2);
        put(&mut body, "a", 1, 0);
        put(&mut body, "b", 2, 0);
        let got = parse_tree(&body, TextLimits::default(), &mut unlimited()).unwrap();
        assert_eq!(got.lost.iter().collect::<Vec<_>>(), vec![("after_tree", 2)]);
        assert_eq!(stacks(got), vec![("main".into(), 5)]);
        // Bytes that are no node.
        let mut body = tree.clone();
        body.extend_from_slice(b"\xff\xff");
        let got = parse_tree(&body, TextLimits::default(), &mut unlimited()).unwrap();
        assert_eq!(got.lost.iter().collect::<Vec<_>>(), vec![("after_tree", 1)]);
        // Nothing after it.
        let got = parse_tree(&tree, TextLimits::default(), &mut unlimited()).unwrap();
        assert!(got.lost.is_empty());
    }

    #[test]
    fn a_trie_as_pyroscope_reads_it() {
        // "" → "main;" → "foo" (3), "bar" (2); then a second root-level key.
        let mut body = Vec::new();
        put(&mut body, "", 0, 2);
        put(&mut body, "main;", 0, 2);
        put(&mut body, "foo", 3, 0);
        put(&mut body, "bar", 2, 0);
        put(&mut body, "idle", 4, 0);
        let got = parse_trie(&body, TextLimits::default(), &mut unlimited()).unwrap();
        assert_eq!(
            stacks(got),
            vec![
                ("main;foo".into(), 3),
                ("main;bar".into(), 2),
                ("idle".into(), 4)
            ]
        );
    }

    #[test]
    fn cut_and_hostile_bodies_are_refused() {
        let mut body = Vec::new();
        put(&mut body, "", 0, 2);
        put(&mut body, "main", 1, 0);
        // The root waits for a second child that never comes.
        assert!(matches!(
            parse_tree(&body, TextLimits::default(), &mut unlimited()),
            Err(FoldedError::Malformed(_))
        ));
        // A name longer than the body.
        let body = [0x7f, b'a'];
        assert!(parse_tree(&body, TextLimits::default(), &mut unlimited()).is_err());
        assert!(parse_trie(&body, TextLimits::default(), &mut unlimited()).is_err());
        // A chain of 20,000 nodes, each a copy of the path above it: refused
        // by the budget long before the copies add up to 2 GB.
        let mut body = Vec::new();
        put(&mut body, "", 0, 1);
        for _ in 0..20_000 {
            put(&mut body, "frame", 1, 1);
        }
        put(&mut body, "leaf", 1, 0);
        let mut budget = capped(64 << 20);
        assert!(matches!(
            parse_tree(&body, TextLimits::default(), &mut budget),
            Err(FoldedError::Memory(_))
        ));
    }

    #[test]
    fn a_trie_of_nameless_open_nodes_is_charged_for_each() {
        // 3 bytes a node on the wire, each kept open: a million of them
        // (3 MB) charge at least 16 bytes each, so a 8 MiB budget refuses
        // them; an unlimited one reads them (no stack has a value).
        let body = b"\x00\x00\x01".repeat(1 << 20);
        let mut charged = 0usize;
        let got = parse_trie(&body, TextLimits::default(), &mut |n| {
            charged += n;
            Ok(())
        });
        assert!(got.unwrap().stacks.is_empty());
        assert!(charged >= 16 << 20, "charged {charged} bytes");
        let mut budget = capped(8 << 20);
        assert!(matches!(
            parse_trie(&body, TextLimits::default(), &mut budget),
            Err(FoldedError::Memory(_))
        ));
    }
}
