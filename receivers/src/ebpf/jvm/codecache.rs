//! HotSpot's code cache, and one step of a Java thread's stack through it.
//!
//! The code cache is a few heaps (`CodeCache::_heaps`), each a range of
//! segments with a map (`_segmap`) from every segment to the start of the
//! block that holds it: 0 at a block's first segment, else how many
//! segments to go back (again and again, for a long block), 0xFF where no
//! block is. A block's header is followed by a `CodeBlob`: a compiled
//! method (`nmethod`, with its `Method*`), the template interpreter
//! (`Interpreter`), or a stub. ([`Heap::blob_at`].)
//!
//! A frame of compiled code (or of a stub with a frame) is `_frame_size`
//! words above the stack pointer its callee left (the unextended one, where
//! an interpreted callee grew the stack for its locals): the return address
//! is the top word, the caller's frame pointer the one below. An
//! interpreted frame keeps a frame pointer: the `Method*` is three words
//! below it, the bytecode pointer eight, the caller's unextended stack
//! pointer one; the return address and the caller's frame pointer are
//! above it. A stub with no frame size (the call stub that enters Java from
//! C++) keeps a frame pointer too. ([`step`].)

use super::super::interp::{read_mem, read_u32, read_u64, u32_at, u64_at};
use super::vmstructs::{Layout, Nmethod};

/// Heaps read at most (JDK 17 and 25 have three: non-nmethods, profiled
/// and non-profiled nmethods).
const MAX_HEAPS: u64 = 8;
/// Segment map entries followed back at most.
const MAX_HOPS: usize = 4096;

/// One heap of the code cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heap {
    pub low: u64,
    pub high: u64,
    segmap: u64,
    log2_segment: u32,
}

/// What a blob of the code cache is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Compiled(Compiled),
    Interpreter,
    Stub,
}

/// A compiled Java method: its `Method*`, where its code starts, and where
/// its `PcDesc`s (`pcs..pcs_end`), scopes' data and metadata are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compiled {
    pub method: u64,
    pub code_begin: u64,
    pub pcs: u64,
    pub pcs_end: u64,
    pub scopes: u64,
    pub metadata: u64,
}

/// The nmethod at `blob`, from its header `h` (read whole), whose
/// `Method*` is `method`.
fn compiled(l: &Layout, blob: u64, h: &[u8], method: u64) -> Option<Compiled> {
    let int = |field: u32| u64::from(u32_at(h, field));
    let ptr = |field: u32| u64_at(h, field);
    let c = match l.nmethod {
        Nmethod::Blob {
            code_begin,
            pcs,
            pcs_end,
            scopes_data,
            metadata,
        } => Compiled {
            method,
            code_begin: ptr(code_begin),
            pcs: blob.wrapping_add(int(pcs)),
            pcs_end: blob.wrapping_add(int(pcs_end)),
            scopes: ptr(scopes_data),
            metadata: blob.wrapping_add(int(metadata)),
        },
        Nmethod::Split {
            code_offset,
            immutable,
            pcs,
            scopes_data,
            mutable,
            relocation_size,
        } => {
            let immutable = ptr(immutable);
            let scopes = immutable.wrapping_add(int(scopes_data));
            Compiled {
                method,
                code_begin: blob.wrapping_add(int(code_offset)),
                pcs: immutable.wrapping_add(int(pcs)),
                pcs_end: scopes,
                scopes,
                metadata: ptr(mutable).wrapping_add(int(relocation_size)),
            }
        }
    };
    (c.pcs <= c.pcs_end).then_some(c)
}

/// A blob of the code cache as a frame in it needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Blob {
    pub kind: Kind,
    /// Its frames' size in bytes (0: it keeps a frame pointer, or none).
    pub frame_bytes: u64,
}

/// The code cache's heaps in process `pid`.
pub fn heaps(pid: u32, l: &Layout) -> Vec<Heap> {
    let mut out = Vec::new();
    let Some(array) = read_u64(pid, l.heaps) else {
        return out;
    };
    let len = read_u32(pid, array.wrapping_add(u64::from(l.array_len))).unwrap_or(0);
    let Some(data) = read_u64(pid, array.wrapping_add(u64::from(l.array_data))) else {
        return out;
    };
    for i in 0..u64::from(len).min(MAX_HEAPS) {
        let Some(heap) = read_u64(pid, data.wrapping_add(i * 8)) else {
            continue;
        };
        let space = |space: u32, field: u32| {
            read_u64(pid, heap.wrapping_add(u64::from(space) + u64::from(field)))
        };
        // The whole reserved range: the heap commits more of it as it
        // fills, and a segment not in use yet reads as free (or not at
        // all).
        let (Some(low), Some(high), Some(segmap), Some(log2)) = (
            space(l.heap_memory, l.space_low_boundary),
            space(l.heap_memory, l.space_high_boundary),
            space(l.heap_segmap, l.space_low_boundary),
            read_u32(pid, heap.wrapping_add(u64::from(l.heap_log2_segment))),
        ) else {
            continue;
        };
        if low < high && (4..=16).contains(&log2) {
            out.push(Heap {
                low,
                high,
                segmap,
                log2_segment: log2,
            });
        }
    }
    out
}

impl Heap {
    /// The address of the block that holds `pc` (in this heap), when one
    /// does (in use or not: [`read_blob`] tells).
    pub fn block_at(&self, pid: u32, pc: u64) -> Option<u64> {
        if !(self.low..self.high).contains(&pc) {
            return None;
        }
        let mut seg = (pc - self.low) >> self.log2_segment;
        // The map is read a window at a time, back from `seg`.
        let mut window = [0u8; 256];
        let mut hops = 0;
        'read: loop {
            let first = seg.saturating_sub(window.len() as u64 - 1);
            let n = (seg - first + 1) as usize;
            if !read_mem(pid, self.segmap.wrapping_add(first), &mut window[..n]) {
                return None;
            }
            loop {
                let b = window[(seg - first) as usize];
                match b {
                    0 => break 'read,
                    0xff => return None,
                    _ => {
                        hops += 1;
                        if hops > MAX_HOPS || u64::from(b) > seg {
                            return None;
                        }
                        seg -= u64::from(b);
                        if seg < first {
                            continue 'read;
                        }
                    }
                }
            }
        }
        Some(self.low + (seg << self.log2_segment))
    }
}

/// What a blob's name (a pointer to one of libjvm's strings) says it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Named {
    /// `nmethod` or `native nmethod`: a compiled Java method (or a native
    /// method's wrapper).
    Nmethod,
    Interpreter,
    Other,
}

/// What the name at `name` says (one read of its first bytes).
pub fn named(pid: u32, name: u64) -> Named {
    let mut text = [0u8; 16];
    // A short read near a page's end is only a name that matches neither.
    if !read_mem(pid, name, &mut text) {
        return Named::Other;
    }
    if text.starts_with(b"nmethod\0") || text.starts_with(b"native nmethod\0") {
        Named::Nmethod
    } else if text.starts_with(b"Interpreter\0") {
        Named::Interpreter
    } else {
        Named::Other
    }
}

/// Reads the blob in the block at `block` (its header, the blob's header
/// after it, in one read), when the block is in use; `name` tells what a
/// blob's name says (kept by the caller: a few static strings).
pub fn read_blob(
    pid: u32,
    l: &Layout,
    block: u64,
    mut name: impl FnMut(u64) -> Named,
) -> Option<Blob> {
    let mut h = vec![0u8; (l.block_size + l.nmethod_size) as usize];
    if !read_mem(pid, block, &mut h) || h.get(l.block_used as usize) == Some(&0) {
        return None;
    }
    let blob = block.wrapping_add(u64::from(l.block_size));
    let h = &h[l.block_size as usize..];
    let words = u32_at(h, l.blob_frame_size) as i32;
    let frame_bytes = u64::try_from(words).ok().filter(|&w| w <= 1 << 16)? * 8;
    let kind = match name(u64_at(h, l.blob_name)) {
        Named::Nmethod => Kind::Compiled(compiled(l, blob, h, u64_at(h, l.nmethod_method))?),
        Named::Interpreter => Kind::Interpreter,
        Named::Other => Kind::Stub,
    };
    Some(Blob { kind, frame_bytes })
}

/// A Java thread's registers as its stack is walked: the instruction,
/// stack and frame pointers, and the stack pointer before an interpreted
/// callee grew the stack (the stack pointer where there was none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Regs {
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    pub unextended_sp: u64,
}

/// What one frame was: a compiled method (its `Method*`), an interpreted
/// one (its `Method*` and bytecode pointer), or a stub.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    Compiled(Compiled),
    Interpreted(u64, u64),
    Stub,
}

/// The frame at `r` in `blob` (`None` when a word it needs is not
/// there), and its caller's registers (`None` likewise); `read` reads a
/// word of the thread's stack.
pub fn step(
    blob: Blob,
    r: Regs,
    mut read: impl FnMut(u64) -> Option<u64>,
) -> Option<(Frame, Option<Regs>)> {
    let frame = match blob.kind {
        Kind::Interpreter => {
            let method = read(r.fp.checked_sub(3 * 8)?)?;
            let bcp = read(r.fp.checked_sub(8 * 8)?)?;
            Frame::Interpreted(method, bcp)
        }
        Kind::Compiled(method) => Frame::Compiled(method),
        Kind::Stub => Frame::Stub,
    };
    Some((frame, caller(blob, r, read)))
}

/// The caller's registers of the frame at `r` in `blob`.
fn caller(blob: Blob, r: Regs, mut read: impl FnMut(u64) -> Option<u64>) -> Option<Regs> {
    let caller = if blob.kind == Kind::Interpreter || blob.frame_bytes == 0 {
        // A frame pointer: the caller's is saved at it, the return address
        // above; an interpreted frame also saved its caller's stack pointer.
        let unextended_sp = if blob.kind == Kind::Interpreter {
            read(r.fp.checked_sub(8)?)?
        } else {
            r.fp.checked_add(16)?
        };
        Regs {
            pc: read(r.fp.checked_add(8)?)?,
            sp: r.fp.checked_add(16)?,
            fp: read(r.fp)?,
            unextended_sp,
        }
    } else {
        let sender_sp = r.unextended_sp.checked_add(blob.frame_bytes)?;
        Regs {
            pc: read(sender_sp.checked_sub(8)?)?,
            sp: sender_sp,
            fp: read(sender_sp.checked_sub(16)?)?,
            unextended_sp: sender_sp,
        }
    };
    (caller.pc != 0).then_some(caller)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stack of words from `base` up.
    fn stack(base: u64, words: &[u64]) -> impl FnMut(u64) -> Option<u64> + '_ {
        move |a| {
            let i = a.checked_sub(base)? / 8;
            words.get(i as usize).copied()
        }
    }

    #[test]
    fn a_compiled_frame_steps_by_its_size_and_an_interpreted_one_by_its_frame_pointer() {
        // sp = 0x1000: a compiled frame of 4 words (two of its own, the
        // saved frame pointer, the return address into the interpreter),
        // then an interpreted frame whose fp is 0x1040.
        let base = 0x1000;
        let mut words = vec![0u64; 32];
        words[2] = 0x1040; // the interpreted caller's fp, saved
        words[3] = 0x7000; // return address (into the interpreter)
        // The interpreted frame: fp = 0x1040 (word 8).
        words[8] = 0x10c0; // its caller's fp
        words[9] = 0x9000; // its return address (into C++)
        words[7] = 0x1030; // fp - 1: the caller's unextended sp
        words[5] = 0xbc00; // fp - 3: Method*
        words[0] = 0xbc40; // fp - 8: the bytecode pointer
        let method = Compiled {
            method: 0xaa00,
            code_begin: 0x4f00,
            pcs: 0,
            pcs_end: 0,
            scopes: 0,
            metadata: 0,
        };
        let compiled = Blob {
            kind: Kind::Compiled(method),
            frame_bytes: 32,
        };
        let r = Regs {
            pc: 0x5000,
            sp: base,
            fp: 0xdead,
            unextended_sp: base,
        };
        let (f, caller) = step(compiled, r, stack(base, &words)).unwrap();
        let caller = caller.unwrap();
        assert_eq!(f, Frame::Compiled(method));
        assert_eq!(
            caller,
            Regs {
                pc: 0x7000,
                sp: 0x1020,
                fp: 0x1040,
                unextended_sp: 0x1020
            }
        );
        let interp = Blob {
            kind: Kind::Interpreter,
            frame_bytes: 0,
        };
        let (f, caller) = step(interp, caller, stack(base, &words)).unwrap();
        let caller = caller.unwrap();
        assert_eq!(f, Frame::Interpreted(0xbc00, 0xbc40));
        assert_eq!(
            caller,
            Regs {
                pc: 0x9000,
                sp: 0x1050,
                fp: 0x10c0,
                unextended_sp: 0x1030
            }
        );
        // A word past the stack copy: the frame, and no caller.
        let far = Regs {
            unextended_sp: base + 0x1000,
            ..r
        };
        assert_eq!(
            step(compiled, far, stack(base, &words)),
            Some((Frame::Compiled(method), None))
        );
    }
}
