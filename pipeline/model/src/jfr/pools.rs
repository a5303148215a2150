//! The constant pools of a chunk: checkpoint events (type id 1), found from
//! the header's offset of the last one, each giving the relative offset of
//! the one before it (negative; 0 ends the chain). A checkpoint holds pools,
//! each a class id and entries of a key and a value of that class. Entries
//! refer to other pools by key (a method to its class, a class to its
//! name), resolved when used.
//!
//! Entries are kept as where they lie in the chunk, and read into values
//! only when asked for: a pool costs a few bytes an entry whatever its
//! values hold.
//!
//! The chain must run backwards, so it ends; every count is checked against
//! the bytes left.

use super::HashMap;

use super::chunk::HEADER_LEN;
use super::cursor::Cursor;
use super::metadata::Class;
use super::metadata::Metadata;
use super::values::{Value, read_class, skip_class};
use super::{JfrError, Meter, Result};

/// Every pool of a chunk: class id → key → where the value starts.
#[derive(Debug)]
pub struct Pools<'c> {
    chunk: &'c [u8],
    by_class: HashMap<u64, HashMap<u64, usize>>,
}

impl<'c> Pools<'c> {
    /// Where the entry `key` of the pool of class `class` starts.
    pub fn offset(&self, class: u64, key: u64) -> Option<usize> {
        self.by_class.get(&class)?.get(&key).copied()
    }

    /// A cursor at the entry `key` of the pool of class `class`.
    pub fn cursor_at(&self, class: u64, key: u64) -> Option<Cursor<'c>> {
        let mut c = Cursor::new(self.chunk);
        c.seek(self.offset(class, key)?).ok()?;
        Some(c)
    }

    /// The keys of the pool of class `class`.
    pub fn keys(&self, class: u64) -> impl Iterator<Item = u64> + '_ {
        self.by_class
            .get(&class)
            .into_iter()
            .flat_map(|p| p.keys().copied())
    }

    /// The entry `key` of the pool of `class`, read now (`None` when the
    /// pool has no such key). What it holds is the caller's to give back.
    pub fn value(
        &self,
        md: &Metadata,
        class: &Class,
        key: u64,
        meter: &mut Meter<'_>,
    ) -> Result<Option<Value>> {
        let Some(at) = self.offset(class.id, key) else {
            return Ok(None);
        };
        let mut c = Cursor::new(self.chunk);
        c.seek(at)?;
        read_class(&mut c, md, class, 0, meter).map(Some)
    }

    /// Reads every checkpoint of `chunk` (the chunk's bytes, header
    /// included), starting from the last at `last_offset`.
    pub fn read(
        chunk: &'c [u8],
        last_offset: usize,
        md: &Metadata,
        meter: &mut Meter<'_>,
    ) -> Result<Pools<'c>> {
        let mut pools = Pools {
            chunk,
            by_class: HashMap::default(),
        };
        let mut at = last_offset;
        while at != 0 {
            let mut c = Cursor::new(chunk);
            c.seek(at)?;
            let delta = checkpoint(&mut c, md, &mut pools, meter)?;
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
fn checkpoint(
    c: &mut Cursor<'_>,
    md: &Metadata,
    pools: &mut Pools<'_>,
    meter: &mut Meter<'_>,
) -> Result<isize> {
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
            // The entry in the map (and a share of its spare room).
            meter.take(2 * std::mem::size_of::<(u64, usize)>())?;
            pool.insert(key, c.position());
            skip_class(c, md, class, 0)?;
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
        Metadata::read(&mut Cursor::new(&bytes), &mut Meter::unbounded()).unwrap()
    }

    #[test]
    fn the_chain_is_followed_back_and_entries_kept() {
        let mut chunk = vec![0u8; HEADER_LEN];
        let first = chunk.len();
        chunk.extend(checkpoint_event(0, &[(1, "main")]));
        let last = chunk.len();
        chunk.extend(checkpoint_event(first as i64 - last as i64, &[(2, "run")]));
        let pools = Pools::read(&chunk, last, &metadata(), &mut Meter::unbounded()).unwrap();
        let md = metadata();
        let symbol = md.class_named("jdk.types.Symbol").unwrap();
        let name = |k| match pools
            .value(&md, symbol, k, &mut Meter::unbounded())
            .unwrap()
        {
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
        assert!(Pools::read(&chunk, at, &metadata(), &mut Meter::unbounded()).is_err());
        let mut chunk = vec![0u8; HEADER_LEN];
        let at = chunk.len();
        chunk.extend(checkpoint_event(-1000, &[(1, "x")]));
        assert!(Pools::read(&chunk, at, &metadata(), &mut Meter::unbounded()).is_err());
    }
}
