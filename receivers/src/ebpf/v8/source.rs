//! A script's line ends, found by reading its source from the process in
//! pieces: V8 builds its own table only when something asks for a line
//! (an error's stack, the inspector), so a script of a process nobody
//! debugs has none. The source is one of V8's strings: sequential (one or
//! two bytes a character), cons (two strings), thin (another string),
//! sliced (part of another) or external (characters outside the heap,
//! such as Node's own modules in its binary).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Layout, Meta, field, instance_type, is_object, smi};
use crate::ebpf::interp::{ReadCache, read_mem, read_u32, read_u64};
use crate::ebpf::state_budget::StateBudget;
use crate::ebpf::v8lines::{LineEnds, line_of};

/// The most characters of one script read, and its most lines kept.
pub const MAX_SOURCE_UNITS: u32 = 16 << 20;
pub const MAX_LINES: usize = 1 << 20;
/// Characters of sources read per process per minute at most: a script is
/// read once while its line ends are kept, and this bounds the reading
/// when the state budget has no room to keep them.
const UNITS_PER_MINUTE: u64 = 64 << 20;
/// Scripts kept per process at most, and their bytes.
const MAX_SCRIPTS: usize = 1024;
const MAX_SCRIPT_BYTES: usize = 8 << 20;
/// The deepest string inside another followed, the most strings one
/// source is read from, and the bytes read at once.
const MAX_DEPTH: usize = 32;
const MAX_PIECES: usize = 4096;
const CHUNK: usize = 16 << 10;

/// A process's scripts' line ends, by the script's address (charged to
/// the state budget), and what may still be read this minute.
#[derive(Debug)]
pub(super) struct Scripts {
    ends: ReadCache<Arc<[u32]>>,
    allowance: (Instant, u64),
}

impl Scripts {
    pub fn new(budget: &Arc<StateBudget>) -> Self {
        Scripts {
            ends: ReadCache::new(budget, MAX_SCRIPTS, MAX_SCRIPT_BYTES),
            allowance: (Instant::now(), UNITS_PER_MINUTE),
        }
    }

    /// The line of `offset` in the script at `script` (0: none, its source
    /// unreadable, or this minute's reading spent), its line ends read once.
    pub fn line(&mut self, pid: u32, m: &Meta, layout: &Layout, script: u64, offset: u32) -> u32 {
        if script == 0 {
            return 0;
        }
        if self.allowance.0.elapsed() >= Duration::from_secs(60) {
            self.allowance = (Instant::now(), UNITS_PER_MINUTE);
        }
        let allowance = &mut self.allowance.1;
        self.ends
            .get(
                script,
                || line_ends(pid, m, layout, script, allowance).map(Arc::from),
                |ends| ends.len() * 4,
            )
            .map_or(0, |ends| line_of(&ends, offset))
    }
}

/// The line ends of the script at `script`, its length taken from
/// `allowance`; `None` when its source cannot be read, or is longer than
/// [`MAX_SOURCE_UNITS`] or what is allowed.
fn line_ends(
    pid: u32,
    m: &Meta,
    layout: &Layout,
    script: u64,
    allowance: &mut u64,
) -> Option<Vec<u32>> {
    let source = field(pid, script, m.get("v8dbg_class_Script__source__Object"))?;
    let len = length(pid, m, source)?;
    if len > MAX_SOURCE_UNITS || u64::from(len) > *allowance {
        return None;
    }
    *allowance -= u64::from(len);
    let mut ends = LineEnds::new(MAX_LINES);
    let mut reader = Reader {
        pid,
        m,
        layout,
        buf: vec![0u8; CHUNK],
        pieces: 0,
    };
    reader.scan(source, 0, len, 0, &mut ends)?;
    Some(ends.finish())
}

/// The length of the string `s`, in code units.
fn length(pid: u32, m: &Meta, s: u64) -> Option<u32> {
    if !is_object(s) {
        return None;
    }
    let at = (s - 1).checked_add_signed(m.get("v8dbg_class_String__length__int32_t"))?;
    u32::try_from(read_u32(pid, at)? as i32).ok()
}

struct Reader<'a> {
    pid: u32,
    m: &'a Meta,
    layout: &'a Layout,
    buf: Vec<u8>,
    /// Strings read so far, at most [`MAX_PIECES`].
    pieces: usize,
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
        self.pieces += 1;
        if depth > MAX_DEPTH
            || self.pieces > MAX_PIECES
            || start.checked_add(len)? > length(pid, m, s)?
        {
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
