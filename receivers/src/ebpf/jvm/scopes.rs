//! What a compiled frame was running: the Java methods at a pc of an
//! nmethod, the one the JIT compiled and those it inlined, each at its
//! bytecode index.
//!
//! An nmethod has a `PcDesc` for each pc where the JVM may look at its
//! frame (calls, safepoints), sorted by offset from the code's start, each
//! with the offset of its innermost scope in the scopes' data. A scope is
//! three variable-length integers (HotSpot's UNSIGNED5, as in the line
//! tables): its caller scope's offset (0: none), its method's index in the
//! nmethod's metadata (1-based), and its bytecode index plus one. A return
//! address has a `PcDesc` of its own; a sample's pc between two takes the
//! next one's, as HotSpot answers an approximate lookup.

use super::super::interp::{read_mem, read_u32, read_u64};
use super::super::jvmlines::unsigned5;
use super::codecache::Compiled;
use super::vmstructs::Layout;

/// Scopes of one pc read at most (inlining depth).
const MAX_DEPTH: usize = 32;
/// `PcDesc`s of one nmethod taken as sane at most.
const MAX_PC_DESCS: u64 = 1 << 20;

/// The methods at `pc` of `c`, innermost first, each with its bytecode
/// index plus one (0: at its entry); `return_address` for a caller's frame
/// (an exact `PcDesc`), else a sample's pc. Empty when the scopes cannot be
/// read.
pub fn at(pid: u32, l: &Layout, c: &Compiled, pc: u64, return_address: bool) -> Vec<(u64, u32)> {
    let mut out = Vec::new();
    let Some(offset) = pc.checked_sub(c.code_begin) else {
        return out;
    };
    let Some(scope) = pc_desc(pid, l, c, offset, return_address) else {
        return out;
    };
    let mut at = u64::from(scope);
    while at != 0 && out.len() < MAX_DEPTH {
        let mut b = [0u8; 15];
        if !read_mem(pid, c.scopes.wrapping_add(at), &mut b) {
            break;
        }
        let mut pos = 0;
        let mut next = || unsigned5(&b, &mut pos, l.const_flags_u4);
        let (Some(sender), Some(index), Some(bci)) = (next(), next(), next()) else {
            break;
        };
        let method = match index {
            0 => c.method,
            i => match read_u64(pid, c.metadata.wrapping_add(8 * (u64::from(i) - 1))) {
                Some(m) => m,
                None => break,
            },
        };
        out.push((method, bci));
        if u64::from(sender) >= at && sender != 0 {
            // A caller's scope is written before its callee's.
            break;
        }
        at = u64::from(sender);
    }
    out
}

/// The scope offset of the `PcDesc` at code offset `offset` (a return
/// address's), or of the first one at or past it (a sample's pc).
fn pc_desc(pid: u32, l: &Layout, c: &Compiled, offset: u64, exact: bool) -> Option<u32> {
    let size = u64::from(l.pc_desc_size);
    if size < 8 {
        return None;
    }
    let n = ((c.pcs_end - c.pcs) / size).min(MAX_PC_DESCS);
    let pc_of = |i: u64| {
        let at = c.pcs.wrapping_add(i * size + u64::from(l.pc_desc_pc));
        read_u32(pid, at).map(|v| i64::from(v as i32))
    };
    let target = i64::try_from(offset).ok()?;
    // The first whose offset is at or past `target`.
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let at = pc_of(mid)?;
        if at < target {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    if lo == n || (exact && pc_of(lo)? != target) {
        return None;
    }
    read_u32(
        pid,
        c.pcs.wrapping_add(lo * size + u64::from(l.pc_desc_scope)),
    )
}
