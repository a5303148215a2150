//! V8's source position tables and scripts' line ends, as the `ebpf`
//! receiver's Node walker ([`super::v8`]) decodes them from a profiled
//! process's memory (so untrusted: every read is bounded by the bytes
//! given, and a table gives at most one entry per byte).
//!
//! A source position table maps offsets in a function's code (its
//! bytecode, or an optimized function's machine code) to positions in its
//! script. Each entry is two zigzag base-128 integers, deltas from the
//! entry before, starting at code offset -1 (the function's entry) and
//! position 0: the code offset's delta, whose sign says whether the entry
//! starts a statement (`-delta - 1` when it does not), then the
//! position's. A position packs a flag (bit 0: not a script offset), the
//! script offset plus one (bits 1 to 30) and, in optimized code, which
//! inlined function it is in (bits 31 to 46, 0 for the function itself).
//!
//! A script offset counts UTF-16 code units of the script's source; its
//! line is one more than the number of line ends before it ([`LineEnds`]:
//! `\n`, a `\r` not followed by `\n`, U+2028, U+2029).
//!
//! What may depend on this: the Node walker, and the `v8_lines` fuzz
//! target (through feature `perf-map`).

/// The code offset of a function's entry, where every table starts.
pub const FUNCTION_ENTRY: i64 = -1;

/// One zigzag base-128 integer of `b` at `pos` (7 bits a byte, lowest
/// first, the top bit set on every byte but the last); `None` past the end
/// or past ten bytes.
pub fn zigzag(b: &[u8], pos: &mut usize) -> Option<i64> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*pos)?;
        *pos += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Some(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
    }
    None
}

/// The entries of `table`, in order: (code offset, position). Stops at the
/// first integer that does not decode.
pub fn entries(table: &[u8]) -> impl Iterator<Item = (i64, u64)> + '_ {
    let mut pos = 0;
    let (mut code, mut position) = (FUNCTION_ENTRY, 0u64);
    std::iter::from_fn(move || {
        let delta = zigzag(table, &mut pos)?;
        let delta = if delta >= 0 {
            delta
        } else {
            delta.wrapping_neg().wrapping_sub(1)
        };
        let moved = zigzag(table, &mut pos)?;
        code = code.wrapping_add(delta);
        position = position.wrapping_add(moved as u64);
        Some((code, position))
    })
}

/// A decoded table: (code offset, position), in the table's order (V8
/// writes them ascending).
pub type Table = Box<[(i64, u64)]>;

/// Decodes `bytes` (at most one entry per two bytes).
pub fn table(bytes: &[u8]) -> Table {
    entries(bytes).take(bytes.len() / 2).collect()
}

/// The position of the last entry at or before `code_offset` (a binary
/// search: for a table whose offsets do not ascend, one of the entries
/// before the first greater one); `None` when the table has none there.
pub fn position_in(table: &[(i64, u64)], code_offset: i64) -> Option<u64> {
    let i = table.partition_point(|&(c, _)| c <= code_offset);
    i.checked_sub(1).map(|i| table[i].1)
}

/// Where an optimized function's code inlined other functions: per
/// inlined function, where its caller called it and its index in
/// `functions`; `functions` the `SharedFunctionInfo`s of its literal array
/// (0 where a slot holds none).
#[derive(Debug, Default)]
pub struct Inlining {
    pub inlined: Box<[(u64, u32)]>,
    pub functions: Box<[u64]>,
}

/// The frames at `position` of optimized code whose own function is
/// `outer`, innermost first: (function, position), each inlined function
/// then its caller at the position of the call, until the outer one; at
/// most 64. A position whose inlined function is not known gives the outer
/// function alone, at no position (0).
pub fn inlined_frames(inlining: &Inlining, mut position: u64, outer: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for _ in 0..64 {
        let id = inlining_id(position) as usize;
        if id == 0 {
            out.push((outer, position));
            return out;
        }
        let Some(&(caller, function)) = inlining.inlined.get(id - 1) else {
            break;
        };
        match inlining.functions.get(function as usize) {
            Some(&shared) if shared != 0 => out.push((shared, position)),
            _ => break,
        }
        position = caller;
    }
    // Unknown (or a cycle): the outer function, at its first line.
    out.clear();
    out.push((outer, 0));
    out
}

/// The script offset of a position; `None` for none, or for a position
/// that is not a script offset.
pub fn script_offset(position: u64) -> Option<u32> {
    if position & 1 != 0 {
        return None;
    }
    u32::try_from((position >> 1) & ((1 << 30) - 1))
        .ok()?
        .checked_sub(1)
}

/// Which inlined function a position of optimized code is in (its index
/// plus one in the code's inlining positions; 0: the function itself).
pub fn inlining_id(position: u64) -> u32 {
    ((position >> 31) & 0xffff) as u32
}

/// The offsets of a script's line ends, found in its source read in pieces.
#[derive(Debug, Default)]
pub struct LineEnds {
    ends: Vec<u32>,
    at: u32,
    after_cr: bool,
    max_lines: usize,
}

impl LineEnds {
    /// At most `max_lines` ends are kept: later lines are numbered as the
    /// last one.
    pub fn new(max_lines: usize) -> Self {
        LineEnds {
            max_lines,
            ..LineEnds::default()
        }
    }

    /// The next code units of the source.
    pub fn push(&mut self, units: impl IntoIterator<Item = u16>) {
        for u in units {
            // A `\r` ends its line unless a `\n` follows: then the `\n` does.
            if self.after_cr && u != u16::from(b'\n') {
                self.end(self.at.wrapping_sub(1));
            }
            self.after_cr = u == u16::from(b'\r');
            if u == u16::from(b'\n') || u == 0x2028 || u == 0x2029 {
                self.end(self.at);
            }
            self.at = self.at.saturating_add(1);
        }
    }

    fn end(&mut self, at: u32) {
        if self.ends.len() < self.max_lines {
            self.ends.push(at);
        }
    }

    /// The line ends, the source's length last (V8's own table is so;
    /// not when `max_lines` were kept before the end).
    pub fn finish(mut self) -> Vec<u32> {
        if self.after_cr {
            self.end(self.at.wrapping_sub(1));
        }
        let at = self.at;
        self.end(at);
        self.ends.shrink_to_fit();
        self.ends
    }
}

/// The line (from 1) of `offset` in a script with line ends `ends`.
pub fn line_of(ends: &[u32], offset: u32) -> u32 {
    let i = ends.partition_point(|&end| end < offset);
    u32::try_from(i.min(ends.len().saturating_sub(1))).unwrap_or(u32::MAX - 1) + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes one zigzag base-128 integer, as V8 does.
    fn put(out: &mut Vec<u8>, v: i64) {
        let mut z = ((v << 1) ^ (v >> 63)) as u64;
        loop {
            let byte = (z & 0x7f) as u8;
            z >>= 7;
            if z == 0 {
                out.push(byte);
                break;
            }
            out.push(byte | 0x80);
        }
    }

    /// A table of (code offset, statement, script offset, inlining id).
    fn encode(rows: &[(i64, bool, u32, u32)]) -> Vec<u8> {
        let mut out = Vec::new();
        let (mut code, mut pos) = (FUNCTION_ENTRY, 0i64);
        for &(c, statement, offset, inlined) in rows {
            let p = (i64::from(offset) + 1) << 1 | i64::from(inlined) << 31;
            let d = c - code;
            put(&mut out, if statement { d } else { -d - 1 });
            put(&mut out, p - pos);
            (code, pos) = (c, p);
        }
        out
    }

    #[test]
    fn positions_are_found_by_code_offset() {
        let t = encode(&[
            (-1, false, 100, 0),
            (0, true, 120, 0),
            (7, false, 95, 0),
            (300, true, 70_000, 2),
        ]);
        let t = table(&t);
        let at = |c| position_in(&t, c);
        assert_eq!(at(-1).and_then(script_offset), Some(100));
        assert_eq!(at(0).and_then(script_offset), Some(120));
        assert_eq!(at(6).and_then(script_offset), Some(120));
        assert_eq!(
            at(7).and_then(script_offset),
            Some(95),
            "a position may go back"
        );
        assert_eq!(at(299).and_then(script_offset), Some(95));
        let last = at(10_000).unwrap();
        assert_eq!(script_offset(last), Some(70_000));
        assert_eq!(inlining_id(last), 2);
        assert_eq!(inlining_id(at(0).unwrap()), 0);
        assert_eq!(position_in(&t, -2), None);
        assert_eq!(position_in(&[], 5), None);
    }

    #[test]
    fn a_position_that_is_not_a_script_offset_is_none() {
        assert_eq!(script_offset(0), None, "no position");
        assert_eq!(script_offset((5 + 1) << 1 | 1), None, "external");
        assert_eq!(script_offset((5 + 1) << 1), Some(5));
    }

    #[test]
    fn a_broken_table_ends_where_it_breaks() {
        let mut t = encode(&[(-1, false, 10, 0), (4, true, 20, 0)]);
        t.push(0x80);
        assert_eq!(entries(&t).count(), 2);
        assert_eq!(zigzag(&[0xff; 11], &mut 0), None, "over ten bytes");
    }

    #[test]
    fn inlined_functions_are_frames_innermost_first() {
        // Function 7 (literal 1) inlined at the outer's offset 50; function 8
        // (literal 0) inlined into it at its offset 60.
        let inlining = Inlining {
            inlined: Box::new([((50 + 1) << 1, 1), ((60 + 1) << 1 | 1 << 31, 0)]),
            functions: Box::new([8, 7]),
        };
        let at = |offset: u64, id: u64| (offset + 1) << 1 | id << 31;
        let frames = inlined_frames(&inlining, at(70, 2), 1);
        let offsets: Vec<(u64, Option<u32>)> =
            frames.iter().map(|&(f, p)| (f, script_offset(p))).collect();
        assert_eq!(offsets, [(8, Some(70)), (7, Some(60)), (1, Some(50))]);
        assert_eq!(inlined_frames(&inlining, at(5, 0), 1), [(1, at(5, 0))]);
        // An id past the table, or a cycle: the outer function alone.
        assert_eq!(inlined_frames(&inlining, at(5, 9), 1), [(1, 0)]);
        let cycle = Inlining {
            inlined: Box::new([(at(3, 1), 0)]),
            functions: Box::new([8]),
        };
        assert_eq!(inlined_frames(&cycle, at(5, 1), 1), [(1, 0)]);
        let unknown = Inlining {
            inlined: Box::new([(at(3, 0), 0)]),
            functions: Box::new([0]),
        };
        assert_eq!(inlined_frames(&unknown, at(5, 1), 1), [(1, 0)]);
    }

    #[test]
    fn lines_are_counted_as_v8_counts_them() {
        let src = "a\nbb\r\ncc\rd\u{2028}e";
        let mut ends = LineEnds::new(100);
        let units: Vec<u16> = src.encode_utf16().collect();
        // In two pieces, split between `\r` and `\n`.
        ends.push(units[..5].iter().copied());
        ends.push(units[5..].iter().copied());
        let ends = ends.finish();
        assert_eq!(ends, [1, 5, 8, 10, 12]);
        let line = |needle: &str| {
            let at = src.encode_utf16().count()
                - src[src.find(needle).unwrap()..].encode_utf16().count();
            line_of(&ends, at as u32)
        };
        assert_eq!(line("a"), 1);
        assert_eq!(line("bb"), 2);
        assert_eq!(line("cc"), 3);
        assert_eq!(line("d"), 4);
        assert_eq!(line("e"), 5);
        assert_eq!(line_of(&ends, 10_000), 5, "past the end: the last line");
        assert_eq!(line_of(&[], 3), 1);
    }

    #[test]
    fn lines_past_the_bound_are_the_last_kept() {
        let mut ends = LineEnds::new(2);
        ends.push("1\n2\n3\n4".encode_utf16());
        let ends = ends.finish();
        assert_eq!(ends, [1, 3]);
        assert_eq!(line_of(&ends, 6), 2);
    }
}
