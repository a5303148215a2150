//! CPython's line tables, read from a profiled process's memory (so
//! untrusted): which line an instruction is at. Pure functions over the
//! table's bytes, linear in its length, with every sum checked; used by
//! [`super::python`] and by the fuzz target `python_lines`.

/// 3.8 and 3.9 `co_lnotab`: (byte offset increment, signed line increment)
/// pairs; the line of the last pair starting at or before `offset`.
pub fn lnotab_line(t: &[u8], first: u32, offset: i32) -> Option<u32> {
    let (mut addr, mut line) = (0i64, i64::from(first));
    for p in t.chunks_exact(2) {
        addr += i64::from(p[0]);
        if addr > i64::from(offset) {
            break;
        }
        line += i64::from(p[1] as i8);
    }
    u32::try_from(line).ok()
}

/// 3.10 `co_linetable`: (byte length, signed line increment) pairs, -128
/// for a range without a line.
pub fn linetable_line(t: &[u8], first: u32, offset: i32) -> Option<u32> {
    let (mut end, mut line) = (0i64, i64::from(first));
    let offset = i64::from(offset);
    for p in t.chunks_exact(2) {
        let start = end;
        end += i64::from(p[0]);
        let delta = p[1] as i8;
        if delta != -128 {
            line += i64::from(delta);
        }
        if start <= offset && offset < end {
            return if delta == -128 {
                None
            } else {
                u32::try_from(line).ok()
            };
        }
    }
    None
}

/// 3.11 and later location table: entries of one header byte (bit 7 set;
/// bits 3–6 the form; bits 0–2 the length in code units, minus one) and
/// the form's data. Forms: 15 no location; 14 long (signed varint line
/// delta, then end line, column and end column varints); 13 no column
/// (signed varint line delta); 10–12 one line (line delta = form − 10, then
/// two column bytes); 0–9 short (same line, one column byte).
pub fn locations_line(t: &[u8], first: u32, unit: i64) -> Option<u32> {
    fn varint(t: &[u8], i: &mut usize) -> Option<u64> {
        let (mut v, mut shift) = (0u64, 0u32);
        loop {
            let b = *t.get(*i)?;
            *i += 1;
            v |= u64::from(b & 63) << shift;
            if b & 64 == 0 || shift > 56 {
                return Some(v);
            }
            shift += 6;
        }
    }
    fn svarint(t: &[u8], i: &mut usize) -> Option<i64> {
        let v = varint(t, i)?;
        Some(if v & 1 != 0 {
            -((v >> 1) as i64)
        } else {
            (v >> 1) as i64
        })
    }
    let (mut i, mut at, mut line) = (0usize, 0i64, i64::from(first));
    while i < t.len() {
        let head = t[i];
        i += 1;
        let form = (head >> 3) & 15;
        let len = i64::from(head & 7) + 1;
        let has_line = form != 15;
        match form {
            15 => {}
            14 => {
                line = line.checked_add(svarint(t, &mut i)?)?;
                for _ in 0..3 {
                    varint(t, &mut i)?;
                }
            }
            13 => line = line.checked_add(svarint(t, &mut i)?)?,
            10..=12 => {
                line = line.checked_add(i64::from(form - 10))?;
                i += 2;
            }
            _ => i += 1,
        }
        if unit >= at && unit < at + len {
            return has_line.then(|| u32::try_from(line).ok()).flatten();
        }
        at = at.checked_add(len)?;
    }
    None
}
