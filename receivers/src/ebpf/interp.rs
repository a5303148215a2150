//! Interpreters whose frames the BPF program walks: what every one of them
//! shares (and [`symbols`], the symbol scan V8's module uses too). The interpreters' modules ([`super::python`], [`super::php`],
//! [`super::perl`], [`super::ruby`]) build on it, and [`super::runtime`]
//! picks one per process.
//!
//! The BPF program knows four walks, each from offsets user space gave
//! ([`Walk`], the tail of `struct interp_proc`): along a chain of frames,
//! from the thread's state found among CPython's ([`START_THREAD_STATES`])
//! or from a global pointer (PHP's, [`START_GLOBAL`]), reading at each frame
//! the same three fields; down Perl's arrays of contexts ([`START_PERL`]);
//! up Ruby's control frames ([`START_RUBY`]). The slots of [`Walk`] are
//! named after CPython's structs; each interpreter's module says what they
//! hold for it.
//!
//! Each interpreter names a frame as a [`Code`] (function, file, first line)
//! and a line, read once from the process's memory ([`read_mem`]) and kept
//! per process ([`ReadCache`], charged to the state budget).
//!
//! [`merge`] puts an interpreter's frames in the native stack: each call of
//! the interpreter's evaluation function (CPython's
//! `_PyEval_EvalFrameDefault`, PHP's `execute_ex`, Perl's
//! `Perl_runops_standard`, Ruby's `rb_vm_exec`) is replaced by the frames
//! it was running, so a stack reads `main → handler → parse` where the
//! interpreter ran them.

use std::collections::HashMap;
use std::sync::Arc;

use super::frame::Frame;
use super::state_budget::{CacheCharge, StateBudget};

/// [`Walk::start`]: find the sampled thread's state among the
/// interpreter's thread states first (CPython).
pub const START_THREAD_STATES: u32 = 0;
/// [`Walk::start`]: the current frame's pointer is at `runtime +
/// tstate_frame` (PHP without threads).
pub const START_GLOBAL: u32 = 1;
/// [`Walk::start`]: Perl's context stacks (see [`super::perl`]).
pub const START_PERL: u32 = 2;
/// [`Walk::start`]: Ruby's control frames (see [`super::ruby`]).
pub const START_RUBY: u32 = 3;

/// What the BPF program walks frames with (the tail of its `struct
/// interp_proc`): where the first frame is, and the offsets in the
/// version's structs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct Walk {
    /// For user space: how the version's frames read (see each
    /// interpreter's module).
    pub(super) kind: u32,
    /// `_PyRuntimeState`: `interpreters.head`.
    pub(super) runtime_interp: u32,
    /// `PyInterpreterState`: the first thread state.
    pub(super) interp_threads: u32,
    /// `PyThreadState`: `next`, `thread_id`, and `frame` (3.8 to 3.10),
    /// `cframe` (3.11, 3.12) or `current_frame` (3.13); PHP:
    /// `executor_globals.current_execute_data`.
    pub(super) tstate_next: u32,
    pub(super) tstate_thread_id: u32,
    pub(super) tstate_frame: u32,
    /// `_PyCFrame`: `current_frame` (-1: no cframe).
    pub(super) cframe_frame: i32,
    /// The frame's code object (PHP: function), caller, instruction field
    /// and end byte (`is_entry`, `owner`, PHP's call info; 0: none).
    pub(super) frame_code: u32,
    pub(super) frame_back: u32,
    pub(super) frame_instr: u32,
    pub(super) frame_end: u32,
    /// [`START_THREAD_STATES`], [`START_GLOBAL`], [`START_PERL`] or
    /// [`START_RUBY`].
    pub(super) start: u32,
}

/// `struct interp_proc` of the BPF program: one interpreter process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct InterpProcValue {
    pub start_time: u64,
    pub runtime: u64,
    pub(super) walk: Walk,
}

// SAFETY: plain integers, `repr(C)`, no implicit padding (8 + 8 + 12 × 4
// bytes).
unsafe impl aya::Pod for InterpProcValue {}

/// One interpreter frame of a sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InterpFrame {
    /// The code object's (PHP: the function's; Perl: the sub's CV; Ruby:
    /// the iseq's) address in the process.
    pub code: u64,
    /// Where in the code the thread is: CPython's `f_lasti` (3.8 to 3.10),
    /// else the instruction pointer's distance from the code object; PHP:
    /// the opline's address; Perl: the statement's (COP's); Ruby: the pc.
    pub instr: u64,
    /// The last (outermost) frame of one call of the evaluation function.
    pub last: bool,
}

/// A function (CPython: a code object) as read from the process.
#[derive(Debug, PartialEq, Eq)]
pub struct Code {
    pub name: Arc<str>,
    pub file: Arc<str>,
    pub first_line: u32,
    /// CPython's line table (empty for the others, whose lines are read
    /// with each frame).
    pub(super) lines: Box<[u8]>,
}

/// Bytes an entry of a [`ReadCache`] is charged beyond what it holds (its
/// map slot, the `Arc`), and a line.
const ENTRY_BYTES: usize = 64;
const LINE_BYTES: usize = 32;

/// What was read from one runtime process (functions, code objects, iseqs)
/// by address, and the lines found in them: at most `max_entries` and
/// `max_bytes`, starting over when full, every byte charged to the
/// receiver's state budget (`runtime_cache`). An entry the budget has no
/// room for is used once and not kept.
#[derive(Debug)]
pub struct ReadCache<V> {
    entries: HashMap<u64, Option<V>>,
    lines: HashMap<(u64, u64), u32>,
    charge: CacheCharge,
    max_entries: usize,
    max_bytes: usize,
}

impl<V: Clone> ReadCache<V> {
    pub fn new(budget: &Arc<StateBudget>, max_entries: usize, max_bytes: usize) -> Self {
        ReadCache {
            entries: HashMap::new(),
            lines: HashMap::new(),
            charge: CacheCharge::new(budget),
            max_entries,
            max_bytes,
        }
    }

    /// The entry at `addr`: `read` the first time (`None`: unreadable, kept
    /// so too), `size` its bytes.
    pub fn get(
        &mut self,
        addr: u64,
        read: impl FnOnce() -> Option<V>,
        size: impl Fn(&V) -> usize,
    ) -> Option<V> {
        if let Some(v) = self.entries.get(&addr) {
            return v.clone();
        }
        if self.entries.len() >= self.max_entries || self.charge.bytes() >= self.max_bytes {
            self.clear();
        }
        let v = read();
        if self.charge.take(ENTRY_BYTES + v.as_ref().map_or(0, size)) {
            self.entries.insert(addr, v.clone());
        }
        v
    }

    /// [`ReadCache::get`], but an entry kept is used only if `valid` says
    /// it still holds (the address may hold something else by now), and an
    /// unreadable one is read again. An entry read again is charged again
    /// (the cache's charge errs high until it starts over).
    pub fn get_valid(
        &mut self,
        addr: u64,
        valid: impl Fn(&V) -> bool,
        read: impl FnOnce() -> Option<V>,
        size: impl Fn(&V) -> usize,
    ) -> Option<V> {
        if let Some(Some(v)) = self.entries.get(&addr)
            && valid(v)
        {
            return Some(v.clone());
        }
        self.entries.remove(&addr);
        self.get(addr, read, size)
    }

    /// The line at `key` (an entry's address and where in it), `find` the
    /// first time.
    pub fn line(&mut self, key: (u64, u64), find: impl FnOnce() -> u32) -> u32 {
        if let Some(&line) = self.lines.get(&key) {
            return line;
        }
        let line = find();
        if self.lines.len() < self.max_entries * 4 && self.charge.take(LINE_BYTES) {
            self.lines.insert(key, line);
        }
        line
    }

    fn clear(&mut self) {
        self.entries.clear();
        self.lines.clear();
        self.charge.clear();
    }
}

/// Reads `buf.len()` bytes at `addr` of process `pid`.
pub(super) fn read_mem(pid: u32, addr: u64, buf: &mut [u8]) -> bool {
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: `local` describes `buf`, which is live and writable for its
    // length; the remote side is only read by the kernel, which checks it.
    let n = unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) };
    n >= 0 && n as usize == buf.len()
}

/// The 4 bytes at `addr` of process `pid`; `None` when unreadable.
pub(super) fn read_u32(pid: u32, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    read_mem(pid, addr, &mut b).then(|| u32::from_le_bytes(b))
}

/// The 2 bytes at `addr` of process `pid`; `None` when unreadable.
pub(super) fn read_u16(pid: u32, addr: u64) -> Option<u16> {
    let mut b = [0u8; 2];
    read_mem(pid, addr, &mut b).then(|| u16::from_le_bytes(b))
}

/// The little-endian 4 bytes at `off` of `b` (0 past its end).
pub(super) fn u32_at(b: &[u8], off: u32) -> u32 {
    let off = off as usize;
    b.get(off..off + 4)
        .map_or(0, |s| u32::from_le_bytes(s.try_into().expect("4 bytes")))
}

/// The 8 bytes at `addr` of process `pid`; `None` at 0 or unreadable.
pub(super) fn read_u64(pid: u32, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    (addr != 0 && read_mem(pid, addr, &mut b)).then(|| u64::from_le_bytes(b))
}

/// The little-endian 8 bytes at `off` of `b` (0 past its end).
pub(super) fn u64_at(b: &[u8], off: u32) -> u64 {
    let off = off as usize;
    b.get(off..off + 8)
        .map_or(0, |s| u64::from_le_bytes(s.try_into().expect("8 bytes")))
}

/// A frame of a merged stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged {
    Native(Frame),
    Interp(InterpFrame),
}

/// The native frames (innermost first) with the interpreter's frames
/// (innermost first) in place of the evaluation function's calls: each
/// call is replaced by its group of interpreter frames (a group ends at a
/// frame marked `last`). Groups left when the native stack ends (it was
/// cut short) go at its outer end; calls left when the groups end (more
/// than the BPF program walked) stay native. With `drop_callee`, the native
/// frame a replaced call called goes too: the VM's loop where it is a
/// function of its own that no symbol names (Ruby's `vm_exec_core`, called
/// by `rb_vm_exec`; whatever else `rb_vm_exec` was calling at the time, its
/// exception handler, goes the same way).
pub fn merge(
    native: &[Frame],
    interp: &[InterpFrame],
    is_eval: impl Fn(u64) -> bool,
    drop_callee: bool,
) -> Vec<Merged> {
    let mut out = Vec::with_capacity(native.len() + interp.len());
    let mut rest = interp;
    let take_group = |rest: &mut &[InterpFrame], out: &mut Vec<Merged>| {
        let end = rest
            .iter()
            .position(|f| f.last)
            .map_or(rest.len(), |i| i + 1);
        out.extend(rest[..end].iter().map(|&f| Merged::Interp(f)));
        *rest = &rest[end..];
    };
    for (i, &f) in native.iter().enumerate() {
        if !rest.is_empty() && is_eval(f.lookup()) {
            // The evaluation function's callee that is the VM's loop.
            if drop_callee && i > 0 && out.last() == Some(&Merged::Native(native[i - 1])) {
                out.pop();
            }
            take_group(&mut rest, &mut out);
        } else {
            out.push(Merged::Native(f));
        }
    }
    while !rest.is_empty() {
        take_group(&mut rest, &mut out);
    }
    out
}

/// Symbols read between two calls of [`symbols`]' `release`.
const RELEASE_SYMBOLS: usize = 8192;

/// The symbols of `elf`: its dynamic ones then its full table (or the other
/// way round), calling `release` every [`RELEASE_SYMBOLS`]. A runtime's
/// symbols are found by reading every name (node's tables are 17 MB, a
/// Python built with debug information's 8 MB); the file is mapped, and
/// `release` hands the pages read so far back to the page cache, so they
/// are not all in this process's memory at once.
pub fn symbols<'d, 'f, R: object::ReadRef<'d>>(
    elf: &'f object::File<'d, R>,
    release: &'f dyn Fn(),
    dynamic_first: bool,
) -> impl Iterator<Item = object::Symbol<'d, 'f, R>> + 'f {
    use object::Object;
    let (first, then) = if dynamic_first {
        (elf.dynamic_symbols(), elf.symbols())
    } else {
        (elf.symbols(), elf.dynamic_symbols())
    };
    first.chain(then).enumerate().map(move |(i, sym)| {
        if i % RELEASE_SYMBOLS == RELEASE_SYMBOLS - 1 {
            release();
        }
        sym
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn native(addr: u64) -> Frame {
        Frame {
            addr,
            is_return: true,
        }
    }

    #[test]
    fn the_loop_the_evaluation_function_called_goes_with_it() {
        // Leaf first: the VM's loop (0x5000, unnamed), rb_vm_exec (in
        // 0x1000..0x2000), main.
        let eval = |a: u64| (0x1000..0x2000).contains(&a);
        let stack = [native(0x5000), native(0x1100), native(0x9000)];
        let frames = [
            InterpFrame {
                code: 1,
                instr: 0,
                last: false,
            },
            InterpFrame {
                code: 2,
                instr: 0,
                last: true,
            },
        ];
        assert_eq!(
            merge(&stack, &frames, eval, true),
            [
                Merged::Interp(frames[0]),
                Merged::Interp(frames[1]),
                Merged::Native(stack[2]),
            ]
        );
        assert_eq!(
            merge(&stack, &frames, eval, false)[0],
            Merged::Native(stack[0]),
            "kept where the loop is the evaluation function itself"
        );
        // A sample in the evaluation function itself: nothing above it.
        assert_eq!(merge(&stack[1..], &frames, eval, true).len(), 3);
    }
}
