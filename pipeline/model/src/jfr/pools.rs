//! The constant pools of a chunk: checkpoint events (type id 1), found from
//! the header's offset of the last one, each giving the relative offset of
//! the one before it (negative; 0 ends the chain). A checkpoint holds pools,
//! each a class id and entries of a key and a value of that class. Entries
//! refer to other pools by key (a method to its class, a class to its
//! name), resolved when used.
//!
//! The chain must run backwards, so it ends; every count is checked against
//! the bytes left.

use std::collections::HashMap;

use super::chunk::HEADER_LEN;
use super::cursor::Cursor;
use super::metadata::Metadata;
use super::values::{Value, read_class};
use super::{JfrError, Result};

/// Every pool of a chunk: class id → key → value.
#[derive(Debug, Default)]
pub struct Pools {
    pub by_class: HashMap<u64, HashMap<u64, Value>>,
}

impl Pools {
    /// The entry `key` of the pool of class `class`.
    pub fn get(&self, class: u64, key: u64) -> Option<&Value> {
        self.by_class.get(&class)?.get(&key)
    }

    /// Reads every checkpoint of `chunk` (the chunk's bytes, header
    /// included), starting from the last at `last_offset`.
    pub fn read(chunk: &[u8], last_offset: usize, md: &Metadata) -> Result<Pools> {
        let mut pools = Pools::default();
        let mut at = last_offset;
        while at != 0 {
            let mut c = Cursor::new(chunk);
            c.seek(at)?;
            let delta = checkpoint(&mut c, md, &mut pools)?;
            if delta == 0 {
                break;
            }
            // The one before lies before this one, inside the chunk.
            at = at
                .checked_add_signed(delta)
                .filter(|&p| delta < 0 && p >= HEADER_LEN)
                .ok_or_else(|| JfrError::Invalid {
                    what: format!(
                        "a constant pool points {delta} bytes away, not back inside the chunk"
                    ),
                    at,
                })?;
        }
        Ok(pools)
    }
}

/// Reads one checkpoint into `pools`; returns its delta.
fn checkpoint(c: &mut Cursor<'_>, md: &Metadata, pools: &mut Pools) -> Result<isize> {
    let start = c.position();
    let available = c.remaining();
    let size = c.varint("a constant pool's size")?;
    let end = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0 && s <= available)
        .map(|s| start + s)
        .ok_or(JfrError::Truncated {
            what: "a constant pool event",
            at: start,
        })?;
    let ty = c.varint("a constant pool's type")?;
    if ty != 1 {
        return Err(JfrError::Invalid {
            what: format!("the constant pool chain points at an event of type {ty}, not 1"),
            at: start,
        });
    }
    c.varint("a constant pool's start time")?;
    c.varint("a constant pool's duration")?;
    // Two's complement in 64 bits.
    let delta = c.varint("a constant pool's delta")? as i64;
    c.u8("a constant pool's kind")?;
    // A pool is at least its class id and its count.
    let n = c.count(2, "a constant pool count")?;
    for _ in 0..n {
        let at = c.position();
        let class_id = c.varint("a pool's class id")?;
        let class = md.classes.get(&class_id).ok_or_else(|| JfrError::Invalid {
            what: format!("a pool of class id {class_id}, which the metadata does not declare"),
            at,
        })?;
        // An entry is at least its key and one byte of value.
        let entries = c.count(2, "a pool's entry count")?;
        let pool = pools.by_class.entry(class_id).or_default();
        for _ in 0..entries {
            let key = c.varint("a pool entry's key")?;
            let value = read_class(c, md, class, 0)?;
            pool.insert(key, value);
        }
    }
    if c.position() > end {
        return Err(JfrError::Invalid {
            what: format!("a constant pool runs past its size of {size} bytes"),
            at: start,
        });
    }
    isize::try_from(delta).map_err(|_| JfrError::Invalid {
        what: format!("a constant pool delta of {delta}"),
        at: start,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jfr::metadata::tests::{metadata_event, sized, utf8, varint};

    /// A checkpoint holding one `jdk.types.Symbol` pool of `entries`,
    /// pointing `delta` bytes back (as two's complement).
    fn checkpoint_event(delta: i64, entries: &[(u64, &str)]) -> Vec<u8> {
        let mut body = Vec::new();
        varint(&mut body, 1);
        varint(&mut body, 0);
        varint(&mut body, 0);
        varint(&mut body, delta as u64);
        body.push(1);
        varint(&mut body, 1);
        varint(&mut body, 30);
        varint(&mut body, entries.len() as u64);
        for (key, s) in entries {
            varint(&mut body, *key);
            utf8(&mut body, s);
        }
        sized(body)
    }

    fn metadata() -> Metadata {
        let bytes = metadata_event(&[
            (20, "java.lang.String", &[]),
            (30, "jdk.types.Symbol", &[("string", 20, false)]),
        ]);
        Metadata::read(&mut Cursor::new(&bytes)).unwrap()
    }

    #[test]
    fn the_chain_is_followed_back_and_entries_kept() {
        let mut chunk = vec![0u8; HEADER_LEN];
        let first = chunk.len();
        chunk.extend(checkpoint_event(0, &[(1, "main")]));
        let last = chunk.len();
        chunk.extend(checkpoint_event(first as i64 - last as i64, &[(2, "run")]));
        let pools = Pools::read(&chunk, last, &metadata()).unwrap();
        let name = |k| match pools.get(30, k) {
            Some(Value::Object(f)) => format!("{:?}", f[0]),
            other => format!("{other:?}"),
        };
        assert!(name(1).contains("main") && name(2).contains("run"));
    }

    #[test]
    fn a_chain_that_points_forward_or_outside_is_refused() {
        let mut chunk = vec![0u8; HEADER_LEN];
        let at = chunk.len();
        // Points at itself + 1 byte onwards: a loop in the making.
        chunk.extend(checkpoint_event(5, &[(1, "x")]));
        assert!(Pools::read(&chunk, at, &metadata()).is_err());
        let mut chunk = vec![0u8; HEADER_LEN];
        let at = chunk.len();
        chunk.extend(checkpoint_event(-1000, &[(1, "x")]));
        assert!(Pools::read(&chunk, at, &metadata()).is_err());
    }
}
