//! A script's line ends, found by reading its source from the process in
//! pieces: V8 builds its own table only when something asks for a line
//! (an error's stack, the inspector), so a script of a process nobody
//! debugs has none. The source is one of V8's strings: sequential (one or
//! two bytes a character), cons (two strings), thin (another string),
//! sliced (part of another) or external (characters outside the heap,
//! such as Node's own modules in its binary).

use super::{Layout, Meta, field, instance_type, is_object, smi};
use crate::ebpf::interp::{read_mem, read_u32, read_u64};
use crate::ebpf::v8lines::LineEnds;

/// The most characters of one script read, and its most lines kept.
pub const MAX_SOURCE_UNITS: u32 = 16 << 20;
pub const MAX_LINES: usize = 1 << 20;
/// The deepest string inside another followed, and the bytes read at once.
const MAX_DEPTH: usize = 32;
const CHUNK: usize = 16 << 10;

/// The line ends of the script at `script`; `None` when its source cannot
/// be read (or is longer than [`MAX_SOURCE_UNITS`]).
pub(super) fn line_ends(pid: u32, m: &Meta, layout: &Layout, script: u64) -> Option<Vec<u32>> {
    let source = field(pid, script, m.get("v8dbg_class_Script__source__Object"))?;
    let len = length(pid, m, source)?;
    if len > MAX_SOURCE_UNITS {
        return None;
    }
    let mut ends = LineEnds::new(MAX_LINES);
    let mut reader = Reader {
        pid,
        m,
        layout,
        buf: vec![0u8; CHUNK],
    };
    reader.scan(source, 0, len, 0, &mut ends)?;
    Some(ends.finish())
}

/// The length of the string `s`, in code units.
fn length(pid: u32, m: &Meta, s: u64) -> Option<u32> {
    let at = (s - 1).checked_add_signed(m.get("v8dbg_class_String__length__int32_t"))?;
    u32::try_from(read_u32(pid, at)? as i32).ok()
}

struct Reader<'a> {
    pid: u32,
    m: &'a Meta,
    layout: &'a Layout,
    buf: Vec<u8>,
}

impl Reader<'_> {
    /// Feeds `len` code units of the string `s` from `start` to `ends`.
    fn scan(
        &mut self,
        s: u64,
        start: u32,
        len: u32,
        depth: usize,
        ends: &mut LineEnds,
    ) -> Option<()> {
        let (pid, m) = (self.pid, self.m);
        if !is_object(s) || depth > MAX_DEPTH || start.checked_add(len)? > length(pid, m, s)? {
            return None;
        }
        if len == 0 {
            return Some(());
        }
        let t = instance_type(pid, m, s)?;
        if t >= m.get("v8dbg_FirstNonstringType") {
            return None;
        }
        let one_byte = t & m.get("v8dbg_StringEncodingMask") == m.get("v8dbg_OneByteStringTag");
        let repr = t & m.get("v8dbg_StringRepresentationMask");
        if repr == m.get("v8dbg_SeqStringTag") {
            let chars = if one_byte {
                "v8dbg_class_SeqOneByteString__chars__char"
            } else {
                "v8dbg_class_SeqTwoByteString__chars__char"
            };
            let at = (s - 1).checked_add_signed(m.get(chars))?;
            self.units(at, start, len, one_byte, ends)
        } else if repr == m.get("v8dbg_ConsStringTag") {
            let first = field(pid, s, m.get("v8dbg_class_ConsString__first__String"))?;
            let second = field(pid, s, m.get("v8dbg_class_ConsString__second__String"))?;
            let split = length(pid, m, first)?;
            if start < split {
                let n = len.min(split - start);
                self.scan(first, start, n, depth + 1, ends)?;
            }
            let end = start + len;
            if end > split {
                let from = start.max(split);
                self.scan(second, from - split, end - from, depth + 1, ends)?;
            }
            Some(())
        } else if repr == m.get("v8dbg_ThinStringTag") {
            let actual = field(pid, s, m.get("v8dbg_class_ThinString__actual__String"))?;
            self.scan(actual, start, len, depth + 1, ends)
        } else if repr == m.opt("v8dbg_SlicedStringTag")? {
            let parent = field(pid, s, m.opt("v8dbg_class_SlicedString__parent__String")?)?;
            let offset = field(pid, s, m.opt("v8dbg_class_SlicedString__offset__SMI")?)?;
            let offset = u32::try_from(smi(offset)?).ok()?;
            self.scan(parent, offset.checked_add(start)?, len, depth + 1, ends)
        } else if repr == m.opt("v8dbg_ExternalStringTag")? {
            let data = (s - 1).checked_add(self.layout.external_data?)?;
            let chars = read_u64(pid, data)?;
            self.units(chars, start, len, one_byte, ends)
        } else {
            None
        }
    }

    /// Feeds `len` code units from `start` of the characters at `at`.
    fn units(
        &mut self,
        at: u64,
        start: u32,
        len: u32,
        one_byte: bool,
        ends: &mut LineEnds,
    ) -> Option<()> {
        let width: u32 = if one_byte { 1 } else { 2 };
        let mut addr = at.checked_add(u64::from(start) * u64::from(width))?;
        let mut left = usize::try_from(len).ok()? * width as usize;
        while left > 0 {
            let n = left.min(self.buf.len());
            let piece = &mut self.buf[..n];
            if !read_mem(self.pid, addr, piece) {
                return None;
            }
            if one_byte {
                ends.push(piece.iter().map(|&b| u16::from(b)));
            } else {
                ends.push(
                    piece
                        .chunks_exact(2)
                        .map(|c| u16::from_le_bytes([c[0], c[1]])),
                );
            }
            addr += n as u64;
            left -= n;
        }
        Some(())
    }
}
