//! Runtimes whose state the BPF program reads at each sample: interpreters
//! whose frames it walks (what every one of them shares), Go programs whose
//! goroutines' pprof labels it reads ([`super::golang`]), and [`Runtime`],
//! the runtime of one process.
//!
//! The BPF program knows four walks, each from offsets user space gave
//! ([`Walk`], the tail of `struct interp_proc`): along a chain of frames,
//! from the thread's state found among CPython's ([`START_THREAD_STATES`])
//! or from a global pointer (PHP's, [`START_GLOBAL`]), reading at each frame
//! the same three fields; down Perl's arrays of contexts ([`START_PERL`]);
//! up Ruby's control frames ([`START_RUBY`]). The slots of [`Walk`] are
//! named after CPython's structs; each interpreter's module says what they
//! hold for it. What the
//! fields mean is the interpreter's module's business: [`super::python`]
//! (CPython 3.8 to 3.13), [`super::php`] (PHP 8.2), [`super::perl`] (Perl
//! 5.36, whose contexts are an array: a walk of its own) and
//! [`super::ruby`] (Ruby 3.1, control frames up to the VM stack's end: a
//! walk of its own). Each names a frame
//! as a [`Code`] (function, file, first line) and a line, read once from
//! the process's memory and kept per process.
//!
//! [`merge`] puts an interpreter's frames in the native stack: each call of
//! the interpreter's evaluation function (CPython's
//! `_PyEval_EvalFrameDefault`, PHP's `execute_ex`, Perl's
//! `Perl_runops_standard`, Ruby's `rb_vm_exec`) is replaced by the frames
//! it was running, so a stack reads `main → handler → parse` where the
//! interpreter ran them.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::Arc;

use super::frame::Frame;
use super::golang::{GoBinary, GoProcValue};
use super::perl::{PerlBinary, PerlProcess};
use super::php::{PhpBinary, PhpProcess};
use super::python::{PyBinary, PyProcess};
use super::ruby::{RubyBinary, RubyProcess};
use super::sample::RawInterpFrame;
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

/// Which runtimes' state is read (the receiver's `python`, `php`, `perl`,
/// `ruby` and `go_labels` keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Runtimes {
    pub python: bool,
    pub php: bool,
    pub perl: bool,
    pub ruby: bool,
    pub go_labels: bool,
}

/// What a runtime's file gives (as file addresses), when the file is one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuntimeBinary {
    Python(PyBinary),
    Php(PhpBinary),
    Perl(PerlBinary),
    Ruby(RubyBinary),
    Go(GoBinary),
}

/// What the BPF program is given for one process, and in which map.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BpfValue {
    /// `interp_procs`.
    Interp(InterpProcValue),
    /// `go_procs`.
    Go(GoProcValue),
}

impl RuntimeBinary {
    /// Reads a runtime's symbols from a file named like an interpreter of
    /// a known version, or from a Go program of a known version; `None`
    /// for any other file.
    pub fn read<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>, path: &str) -> Option<Self> {
        if super::python::version_of(path).is_some() {
            return super::python::read_symbols(elf, path).map(RuntimeBinary::Python);
        }
        if super::php::is_php(path) {
            return super::php::read_symbols(elf).map(RuntimeBinary::Php);
        }
        if super::perl::is_perl(path) {
            return super::perl::read_symbols(elf).map(RuntimeBinary::Perl);
        }
        if super::ruby::is_ruby(path) {
            return super::ruby::read_symbols(elf).map(RuntimeBinary::Ruby);
        }
        super::golang::read(elf).map(RuntimeBinary::Go)
    }
}

/// The runtime of one process, with what was read of its functions.
#[derive(Debug)]
pub enum Runtime {
    Python(PyProcess),
    Php(PhpProcess),
    Perl(PerlProcess),
    Ruby(RubyProcess),
    Go(GoBinary),
}

impl Runtime {
    /// The runtime of process `pid` whose file `binary` is mapped moved by
    /// `bias`, when it is read; what is read of it is charged to `budget`.
    pub fn new(
        pid: u32,
        binary: &RuntimeBinary,
        bias: u64,
        on: Runtimes,
        budget: &Arc<StateBudget>,
    ) -> Option<Self> {
        match binary {
            RuntimeBinary::Python(b) if on.python => {
                PyProcess::new(pid, b, bias, budget).map(Runtime::Python)
            }
            RuntimeBinary::Php(b) if on.php => {
                Some(Runtime::Php(PhpProcess::new(pid, b, bias, budget)))
            }
            RuntimeBinary::Perl(b) if on.perl => {
                Some(Runtime::Perl(PerlProcess::new(pid, b, bias, budget)))
            }
            RuntimeBinary::Ruby(b) if on.ruby => {
                Some(Runtime::Ruby(RubyProcess::new(pid, b, bias, budget)))
            }
            RuntimeBinary::Go(b) if on.go_labels => Some(Runtime::Go(b.clone())),
            _ => None,
        }
    }

    /// Where its state is in the process (a new one after an exec or a
    /// reload is another interpreter).
    pub fn runtime(&self) -> u64 {
        match self {
            Runtime::Python(p) => p.runtime,
            Runtime::Php(p) => p.globals,
            Runtime::Perl(p) => p.curinterp,
            Runtime::Ruby(p) => p.vm_ptr,
            Runtime::Go(_) => 0,
        }
    }

    /// What the BPF program needs to walk its frames or read its labels.
    pub fn bpf_value(&self, start_time: u64) -> BpfValue {
        match self {
            Runtime::Python(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Php(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Perl(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Ruby(p) => BpfValue::Interp(p.bpf_value(start_time)),
            Runtime::Go(b) => BpfValue::Go(b.bpf_value(start_time)),
        }
    }

    /// Whether the evaluation function's callee is the VM's loop, to leave
    /// out with it (see [`merge`]).
    pub fn loop_is_callee(&self) -> bool {
        matches!(self, Runtime::Ruby(_))
    }

    /// Whether `addr` is in the evaluation function.
    pub fn is_eval(&self, addr: u64) -> bool {
        let ranges: &[Range<u64>] = match self {
            Runtime::Python(p) => p.eval(),
            Runtime::Php(p) => std::slice::from_ref(&p.execute_ex),
            Runtime::Perl(p) => std::slice::from_ref(&p.runops),
            Runtime::Ruby(p) => std::slice::from_ref(&p.vm_exec),
            Runtime::Go(_) => &[],
        };
        ranges.iter().any(|r| r.contains(&addr))
    }

    /// The frames of a sample as the interpreter's version lays them out
    /// (innermost first): those each evaluation call ran end at one marked
    /// `last`.
    pub fn frames(&mut self, raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
        match self {
            Runtime::Python(p) => super::python::frames(p.layout, raw),
            Runtime::Php(p) => p.frames(raw),
            Runtime::Perl(p) => p.frames(raw),
            Runtime::Ruby(p) => p.frames(raw),
            Runtime::Go(_) => Vec::new(),
        }
    }

    /// The function of `f` and the line the thread is at in it.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        match self {
            Runtime::Python(p) => p.frame(f),
            Runtime::Php(p) => p.frame(f),
            Runtime::Perl(p) => p.frame(f),
            Runtime::Ruby(p) => p.frame(f),
            Runtime::Go(_) => None,
        }
    }

    /// The name of a frame that could not be read.
    pub fn unknown(&self) -> &'static str {
        match self {
            Runtime::Python(_) => "[unknown Python frame]",
            Runtime::Php(_) => "[unknown PHP frame]",
            Runtime::Perl(_) => "[unknown Perl frame]",
            Runtime::Ruby(_) => "[unknown Ruby frame]",
            Runtime::Go(_) => "[unknown frame]",
        }
    }
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
