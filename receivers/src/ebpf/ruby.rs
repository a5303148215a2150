//! Ruby 3.1 processes (Debian's `ruby`, whose VM is `libruby-3.1.so`),
//! without any flag or gem.
//!
//! A process is a Ruby one when it maps `libruby-3.1.so…` (or a `ruby3.1`
//! built with its VM inside) exporting `ruby_current_vm_ptr` and
//! `rb_vm_exec`, the function that runs the VM's loop. The BPF program reads,
//! for the main thread (the GVL lets one thread run Ruby at a time; the
//! others are not walked), the VM's main thread's execution context and its
//! control frames from the current one outwards: each frame's iseq, its pc,
//! and the low byte of its flags (`ep[0]`).
//!
//! Here each frame of Ruby code becomes a frame named by its iseq's label
//! (`proflow_hot_two`, `block in run`, `<main>`) and path, at the line of its
//! pc (decoded from the iseq's line table, its succinct index as Ruby reads
//! it: [`super::rubylines`]); a frame of a C function (`VM_FRAME_FLAG_CFRAME`) is left out (its
//! native frame is in the stack). A frame with `VM_FRAME_FLAG_FINISH` began
//! a run of the VM's loop: it ends a group that replaces one call of
//! `rb_vm_exec` in the native stack.
//!
//! The offsets were read from Ruby 3.1's own headers (`offsetof` on
//! Debian's ruby3.1 source, 3.1.2, with its `ruby/config.h`, x86_64).

use std::ops::Range;
use std::sync::Arc;

use super::interp::{
    Code, InterpFrame, InterpProcValue, ReadCache, START_RUBY, Walk, read_mem, read_u64, u32_at,
    u64_at,
};
use super::rubylines::{LineTable, line_of};
use super::sample::RawInterpFrame;
use super::state_budget::StateBudget;

/// Iseqs kept per process.
pub const MAX_ISEQS: usize = 4096;
/// Bytes of names and paths kept per process.
pub const MAX_ISEQ_BYTES: usize = 8 << 20;
/// Longest label or path read.
const MAX_STR: usize = 1024;

/// [`Walk::kind`] of Ruby 3.1.
const RUBY_31: u32 = 0x0301;
/// `rb_vm_t.ractor.main_thread`, `rb_thread_t.ec`.
const VM_MAIN_THREAD: u32 = 40;
const TH_EC: u32 = 40;
/// `rb_execution_context_t`: `vm_stack`, `vm_stack_size` (VALUEs), `cfp`.
const EC_VM_STACK: u32 = 0;
const EC_VM_STACK_SIZE: i32 = 8;
const EC_CFP: u32 = 16;
/// `rb_control_frame_t`: `pc`, `iseq`, `ep`, its size.
const CFP_PC: u32 = 0;
const CFP_ISEQ: u32 = 16;
const CFP_EP: u32 = 32;
const CFP_SIZE: u32 = 64;
/// Frame flags in `ep[0]`'s low byte.
const FLAG_FINISH: u8 = 0x20;
const FLAG_CFRAME: u8 = 0x80;
/// `rb_iseq_t.body`.
const ISEQ_BODY: u64 = 16;
/// `struct rb_iseq_constant_body`: `iseq_size` (u32), `iseq_encoded`,
/// `location.pathobj`, `location.label`, `location.first_lineno` (a
/// Fixnum), `insns_info.body`, `.size` (u32), `.succ_index_table`.
const BODY_ISEQ_SIZE: u32 = 4;
const BODY_ISEQ_ENCODED: u32 = 8;
const BODY_PATHOBJ: u32 = 64;
const BODY_LABEL: u32 = 80;
const BODY_FIRST_LINENO: u32 = 88;
const BODY_INSNS_INFO: u32 = 120;
const BODY_INSNS_INFO_SIZE: u32 = 136;
const BODY_SUCC_INDEX: u32 = 144;
const BODY_LEN: usize = 152;
/// `RBasic.flags`: the type (`T_MASK`), `T_STRING`, `T_ARRAY`.
const T_MASK: u64 = 0x1f;
const T_STRING: u64 = 0x05;
const T_ARRAY: u64 = 0x07;
/// `struct RString`: not embedded (`RSTRING_NOEMBED`): `as.heap.len`,
/// `as.heap.ptr`; embedded: the length in the flags
/// (`RSTRING_EMBED_LEN_MASK` >> 14), the bytes at `as.embed.ary`.
const STR_NOEMBED: u64 = 0x2000;
const STR_EMBED_LEN_MASK: u64 = 0x7c000;
const STR_EMBED_LEN_SHIFT: u32 = 14;
const STR_HEAP_LEN: u32 = 16;
const STR_HEAP_PTR: u32 = 24;
const STR_EMBED: u64 = 16;
/// `struct RArray`: embedded (`RARRAY_EMBED_FLAG`): the elements at
/// `as.ary`; else `as.heap.ptr`.
const ARY_EMBED: u64 = 0x2000;
const ARY_EMBED_AT: u64 = 16;
const ARY_HEAP_PTR: u32 = 32;

/// What a Ruby file gives, as file addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RubyBinary {
    pub vm_ptr: u64,
    pub vm_exec: Range<u64>,
}

/// Whether a mapped file is named as Ruby 3.1's VM.
pub fn is_ruby(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.starts_with("libruby-3.1.so") || name == "ruby3.1"
}

/// Reads a Ruby file's two symbols; `None` when either is missing.
pub fn read_symbols<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    release: &dyn Fn(),
) -> Option<RubyBinary> {
    use object::ObjectSymbol;
    let (mut vm_ptr, mut vm_exec) = (None, None);
    for sym in super::interp::symbols(elf, release, true) {
        let Ok(name) = sym.name() else { continue };
        if sym.address() == 0 {
            continue;
        }
        match name {
            "ruby_current_vm_ptr" => vm_ptr = Some(sym.address()),
            "rb_vm_exec" if sym.size() > 0 => {
                vm_exec = sym
                    .address()
                    .checked_add(sym.size())
                    .map(|end| sym.address()..end);
            }
            _ => {}
        }
    }
    Some(RubyBinary {
        vm_ptr: vm_ptr?,
        vm_exec: vm_exec?,
    })
}

/// An iseq as read: its name and path, and where its lines are.
#[derive(Debug, Clone)]
struct Iseq {
    code: Arc<Code>,
    lines: LineTable,
}

/// A Ruby process: where its VM and `rb_vm_exec` are, and the iseqs read.
#[derive(Debug)]
pub struct RubyProcess {
    /// Address of `ruby_current_vm_ptr` in the process.
    pub vm_ptr: u64,
    /// `rb_vm_exec`'s address range in the process.
    pub vm_exec: Range<u64>,
    pid: u32,
    /// Iseqs by address, and lines by iseq and pc.
    iseqs: ReadCache<Iseq>,
}

impl RubyProcess {
    /// `bias` is what the file's addresses are moved by in the process.
    pub fn new(pid: u32, binary: &RubyBinary, bias: u64, budget: &Arc<StateBudget>) -> Self {
        let r = &binary.vm_exec;
        RubyProcess {
            vm_ptr: binary.vm_ptr.wrapping_add(bias),
            vm_exec: r.start.wrapping_add(bias)..r.end.wrapping_add(bias),
            pid,
            iseqs: ReadCache::new(budget, MAX_ISEQS, MAX_ISEQ_BYTES),
        }
    }

    /// What the BPF program needs to walk its control frames.
    pub fn bpf_value(&self, start_time: u64) -> InterpProcValue {
        InterpProcValue {
            start_time,
            runtime: self.vm_ptr,
            walk: Walk {
                kind: RUBY_31,
                runtime_interp: 0,
                interp_threads: VM_MAIN_THREAD,
                tstate_next: EC_VM_STACK,
                tstate_thread_id: TH_EC,
                tstate_frame: EC_CFP,
                cframe_frame: EC_VM_STACK_SIZE,
                frame_code: CFP_ISEQ,
                frame_back: CFP_SIZE,
                frame_instr: CFP_PC,
                frame_end: CFP_EP,
                start: START_RUBY,
            },
        }
    }

    /// The frames of Ruby code of a sample (innermost first); one that began
    /// a run of the VM's loop is marked `last` (a C function's mark goes to
    /// the frame before it). A frame whose pc is still at its iseq's first
    /// instruction has not run (the top-level binding's, below the
    /// script's): it is left out.
    pub fn frames(&mut self, raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
        let mut out: Vec<InterpFrame> = Vec::with_capacity(raw.len());
        for f in frames(raw) {
            if self
                .iseq(f.code)
                .is_some_and(|i| f.instr == i.lines.encoded)
            {
                if f.last
                    && let Some(prev) = out.last_mut()
                {
                    prev.last = true;
                }
                continue;
            }
            out.push(f);
        }
        out
    }

    /// The iseq at `addr`, read once.
    fn iseq(&mut self, addr: u64) -> Option<Iseq> {
        let pid = self.pid;
        self.iseqs.get(
            addr,
            || read_iseq(pid, addr),
            |i| i.code.name.len() + i.code.file.len(),
        )
    }

    /// The iseq of `f`, and the line of its pc.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let iseq = self.iseq(f.code)?;
        let pid = self.pid;
        let mem = |addr: u64, buf: &mut [u8]| read_mem(pid, addr, buf);
        let line = self.iseqs.line((f.code, f.instr), || {
            line_of(&mem, &iseq.lines, f.instr).unwrap_or(iseq.code.first_line)
        });
        Some((iseq.code, line))
    }
}

/// The frames of the BPF program's entries (see [`RubyProcess::frames`]).
fn frames(raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
    let mut out: Vec<InterpFrame> = Vec::with_capacity(raw.len());
    for f in raw {
        let finish = f.end & FLAG_FINISH != 0;
        if f.end & FLAG_CFRAME != 0 || f.code == 0 {
            if finish && let Some(prev) = out.last_mut() {
                prev.last = true;
            }
            continue;
        }
        out.push(InterpFrame {
            code: f.code,
            instr: f.instr,
            last: finish,
        });
    }
    out
}

/// Reads the iseq at `addr`: its label, path and first line, and where its
/// line table is.
fn read_iseq(pid: u32, addr: u64) -> Option<Iseq> {
    let body = read_u64(pid, addr.checked_add(ISEQ_BODY)?)?;
    let mut b = [0u8; BODY_LEN];
    if body == 0 || !read_mem(pid, body, &mut b) {
        return None;
    }
    let name = read_string(pid, u64_at(&b, BODY_LABEL))?;
    let file = read_path(pid, u64_at(&b, BODY_PATHOBJ)).unwrap_or_default();
    let first = u64_at(&b, BODY_FIRST_LINENO);
    Some(Iseq {
        code: Arc::new(Code {
            name: name.into(),
            file: file.into(),
            // A Fixnum: (n << 1) | 1.
            first_line: u32::try_from(first >> 1).unwrap_or(0),
            lines: Box::default(),
        }),
        lines: LineTable {
            encoded: u64_at(&b, BODY_ISEQ_ENCODED),
            size: u64::from(u32_at(&b, BODY_ISEQ_SIZE)),
            info: u64_at(&b, BODY_INSNS_INFO),
            info_size: u64::from(u32_at(&b, BODY_INSNS_INFO_SIZE)),
            succ: u64_at(&b, BODY_SUCC_INDEX),
        },
    })
}

/// The text of the String at `addr` (at most [`MAX_STR`] bytes).
fn read_string(pid: u32, addr: u64) -> Option<String> {
    let mut head = [0u8; 32];
    if addr == 0 || addr & 7 != 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let flags = u64_at(&head, 0);
    if flags & T_MASK != T_STRING {
        return None;
    }
    let (len, at) = if flags & STR_NOEMBED != 0 {
        (u64_at(&head, STR_HEAP_LEN), u64_at(&head, STR_HEAP_PTR))
    } else {
        (
            (flags & STR_EMBED_LEN_MASK) >> STR_EMBED_LEN_SHIFT,
            addr.wrapping_add(STR_EMBED),
        )
    };
    let len = usize::try_from(len).ok().filter(|&l| l <= MAX_STR)?;
    let mut data = vec![0u8; len];
    read_mem(pid, at, &mut data).then(|| String::from_utf8_lossy(&data).into_owned())
}

/// The path of an iseq's `pathobj`: a String, or an Array whose first
/// element is the path (the second its real path).
fn read_path(pid: u32, addr: u64) -> Option<String> {
    let flags = read_u64(pid, addr)?;
    match flags & T_MASK {
        T_STRING => read_string(pid, addr),
        T_ARRAY => {
            let first = if flags & ARY_EMBED != 0 {
                read_u64(pid, addr.wrapping_add(ARY_EMBED_AT))?
            } else {
                read_u64(
                    pid,
                    read_u64(pid, addr.wrapping_add(u64::from(ARY_HEAP_PTR)))?,
                )?
            };
            read_string(pid, first)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreter_files_by_name() {
        assert!(is_ruby("/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1.2"));
        assert!(is_ruby("/usr/lib/x86_64-linux-gnu/libruby-3.1.so.3.1"));
        assert!(!is_ruby("/usr/lib/x86_64-linux-gnu/libruby-3.2.so.3.2"));
        assert!(!is_ruby("/usr/bin/ruby"), "the executable without the VM");
    }

    #[test]
    fn c_frames_are_left_out_and_a_finish_ends_a_group() {
        let raw = |code: u64, end: u8| RawInterpFrame {
            code,
            instr: code + 8,
            end,
        };
        // The innermost first: a C function (Integer#times) called by a
        // block, itself run by the VM's loop that C function began (the
        // block's frame has FINISH), then the method that called times,
        // the script's top frame (FINISH), and the dummy frame (C).
        let f = frames(&[
            raw(0x900, FLAG_CFRAME | 0x01),
            raw(0x100, FLAG_FINISH | 0x01),
            raw(0x901, FLAG_CFRAME | 0x01),
            raw(0x200, 0x01),
            raw(0x300, FLAG_FINISH | 0x01),
            raw(0, FLAG_CFRAME | FLAG_FINISH | 0x01),
        ]);
        assert_eq!(
            f.iter().map(|f| (f.code, f.last)).collect::<Vec<_>>(),
            [(0x100, true), (0x200, false), (0x300, true)]
        );
    }
}
