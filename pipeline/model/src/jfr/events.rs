//! The events of a chunk, one after the other from the end of the header:
//! each is its size (counting itself), its type id and its class's fields.
//! Metadata (type 0) and constant pools (type 1) are passed over, and so is
//! every event of a class the caller does not want; an event that claims
//! more bytes than the chunk has left ends the reading with an error. An
//! event's values are held only while the caller looks at them.

use super::chunk::HEADER_LEN;
use super::cursor::Cursor;
use super::metadata::{Class, Metadata};
use super::values::{Value, read_class, read_flat};
use super::{JfrError, Meter, Result};

/// Calls `f` with each event of a class `wanted` says yes to, in the order
/// of the chunk (`chunk`: its bytes, header included).
pub fn for_each<'m, 'g>(
    chunk: &[u8],
    md: &'m Metadata,
    wanted: impl Fn(&Class) -> bool,
    meter: &mut Meter<'g>,
    mut f: impl FnMut(&'m Class, Value, &mut Meter<'g>) -> Result<()>,
) -> Result<()> {
    let mut c = Cursor::new(chunk);
    c.seek(HEADER_LEN)?;
    while c.remaining() > 0 {
        let start = c.position();
        let (size, end) = event_bounds(&mut c)?;
        let ty = c.varint("an event's type")?;
        if ty > 1
            && let Some(class) = md.classes.get(&ty).filter(|c| wanted(c))
        {
            let before = meter.held();
            let value = read_class(&mut c, md, class, 0, meter)?;
            let held = meter.held() - before;
            if c.position() > end {
                return Err(JfrError::Invalid {
                    what: format!("a {} event runs past its size of {size} bytes", class.name),
                    at: start,
                });
            }
            f(class, value, meter)?;
            // `f` has dropped the event's values.
            meter.give_back(held);
        }
        c.seek(end)?;
    }
    Ok(())
}

/// Calls `f` with each event of a class `wanted` says yes to, read flat
/// (see [`read_flat`]: a value per field, integers and keys, 0 for the
/// rest), in the order of the chunk. Nothing is allocated per event.
pub fn for_each_flat<'m>(
    chunk: &[u8],
    md: &'m Metadata,
    wanted: impl Fn(&Class) -> bool,
    mut f: impl FnMut(&'m Class, &[u64]) -> Result<()>,
) -> Result<()> {
    let mut c = Cursor::new(chunk);
    c.seek(HEADER_LEN)?;
    let mut values = Vec::new();
    while c.remaining() > 0 {
        let start = c.position();
        let (size, end) = event_bounds(&mut c)?;
        let ty = c.varint("an event's type")?;
        if ty > 1
            && let Some(class) = md.classes.get(&ty).filter(|c| wanted(c))
        {
            read_flat(&mut c, md, class, &mut values)?;
            if c.position() > end {
                return Err(JfrError::Invalid {
                    what: format!("a {} event runs past its size of {size} bytes", class.name),
                    at: start,
                });
            }
            f(class, &values)?;
        }
        c.seek(end)?;
    }
    Ok(())
}

/// An event's size and where it ends, read where `c` stands.
fn event_bounds(c: &mut Cursor<'_>) -> Result<(u64, usize)> {
    let start = c.position();
    let available = c.remaining();
    let size = c.varint("an event's size")?;
    let end = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0 && s <= available)
        .map(|s| start + s)
        .ok_or_else(|| JfrError::Invalid {
            what: format!("an event of {size} bytes, with {available} left in the chunk"),
            at: start,
        })?;
    Ok((size, end))
}
