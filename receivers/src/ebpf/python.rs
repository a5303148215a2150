//! CPython processes, without any flag or restart (3.8 to 3.13).
//!
//! A process is a Python one when it maps an interpreter: `python3.X` or
//! `libpython3.X.so…`, whose minor version says which struct layout
//! ([`Layout`]) its interpreter has. From that file's symbols come
//! `_PyRuntime` (where the interpreter state begins) and the ranges of
//! `_PyEval_EvalFrameDefault` (the evaluation function). The BPF program
//! gets the runtime's address and the layout's offsets (`interp_procs`), finds
//! the sampled thread's thread state (its `thread_id` is the thread's
//! `pthread_self`, its fs base) and sends its frames: each frame's code
//! object address and where in the code the thread is.
//!
//! Here each code object is read once from the process's memory
//! (`process_vm_readv`): its qualified name (3.11 on; its name before),
//! file, first line and line table, kept per process (at most
//! [`MAX_CODES`] holding [`MAX_CODE_BYTES`], charged to the state budget;
//! the cache starts over when full). A frame's line comes from the line table at its instruction,
//! decoded once per instruction.
//!
//! [`super::interp::merge`] puts the Python frames in the native stack:
//! each call of the evaluation function is replaced by the Python frames it
//! was running (3.8 to 3.10: one frame each; 3.11 on: the frames up to the
//! one that entered it). The offsets below were read from each
//! version's own headers (`offsetof` on the x86_64 release build).

use std::ops::Range;
use std::sync::Arc;

use super::interp::{
    Code, InterpFrame, InterpProcValue, ReadCache, START_THREAD_STATES, Walk, read_mem, u64_at,
};
use super::pylines::{linetable_line, lnotab_line, locations_line};
use super::sample::RawInterpFrame;
use super::state_budget::StateBudget;

/// Code objects kept per process.
pub const MAX_CODES: usize = 4096;
/// Bytes of names, files and line tables kept per process.
pub const MAX_CODE_BYTES: usize = 8 << 20;
/// Longest name or file name read.
const MAX_STR: usize = 1024;
/// Longest line table read; a longer one gives the function's first line.
const MAX_LINE_TABLE: usize = 64 << 10;

/// Frame layouts: 3.8 to 3.10, a `PyFrameObject` per call of the evaluation
/// function.
const FRAME_OBJECTS: u32 = 1;
/// 3.11: `_PyInterpreterFrame`s, `is_entry` marks the first of a call's.
const IS_ENTRY: u32 = 2;
/// 3.12 on: `_PyInterpreterFrame`s, a call's begin after a frame owned by
/// the C stack (`owner` [`OWNED_BY_CSTACK`]), which is no Python frame.
const OWNER: u32 = 3;
const OWNED_BY_CSTACK: u8 = 3;

/// The Python frames of a sample (innermost first), as `l`'s version lays
/// them out: the frames each evaluation call ran end at one marked `last`.
pub fn frames(l: &Layout, raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
    let mut out: Vec<InterpFrame> = Vec::with_capacity(raw.len());
    for f in raw {
        match l.walk.kind {
            FRAME_OBJECTS => out.push(InterpFrame {
                code: f.code,
                instr: u64::from(f.instr as u32),
                last: true,
            }),
            OWNER if f.end == OWNED_BY_CSTACK => {
                if let Some(prev) = out.last_mut() {
                    prev.last = true;
                }
            }
            _ => out.push(InterpFrame {
                code: f.code,
                instr: u64::from(f.instr.wrapping_sub(f.code) as u32),
                last: l.walk.kind == IS_ENTRY && f.end != 0,
            }),
        }
    }
    out
}

/// Where things are in one CPython minor version's structs (x86_64).
#[derive(Debug, PartialEq, Eq)]
pub struct Layout {
    pub minor: u8,
    walk: Walk,
    code_filename: u32,
    code_name: u32,
    /// `co_qualname` (3.11 on).
    code_qualname: Option<u32>,
    /// `co_lnotab` (3.8, 3.9), `co_linetable` (3.10 on).
    code_lines: u32,
    code_firstlineno: u32,
    /// `co_code_adaptive`: where the instructions begin (3.11 on).
    code_instructions: u32,
    /// `sizeof(PyASCIIObject)` and `sizeof(PyCompactUnicodeObject)`.
    ascii_size: u32,
    compact_size: u32,
}

const fn frame_objects(minor: u8, frame_lasti: u32) -> Layout {
    Layout {
        minor,
        walk: Walk {
            kind: FRAME_OBJECTS,
            runtime_interp: 32,
            interp_threads: 8,
            tstate_next: 8,
            tstate_thread_id: 176,
            tstate_frame: 24,
            cframe_frame: -1,
            frame_code: 32,
            frame_back: 24,
            frame_instr: frame_lasti,
            frame_end: 0,
            start: START_THREAD_STATES,
        },
        code_filename: 104,
        code_name: 112,
        code_qualname: None,
        code_lines: 120,
        code_firstlineno: 40,
        code_instructions: 0,
        ascii_size: 48,
        compact_size: 72,
    }
}

static LAYOUTS: [Layout; 6] = [
    frame_objects(8, 104),
    frame_objects(9, 104),
    // 3.10's f_lasti counts 2-byte instructions, not bytes.
    frame_objects(10, 96),
    Layout {
        minor: 11,
        walk: Walk {
            kind: IS_ENTRY,
            runtime_interp: 40,
            interp_threads: 16,
            tstate_next: 8,
            tstate_thread_id: 152,
            tstate_frame: 56,
            cframe_frame: 8,
            frame_code: 32,
            frame_back: 48,
            frame_instr: 56,
            frame_end: 68,
            start: START_THREAD_STATES,
        },
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_lines: 136,
        code_firstlineno: 72,
        code_instructions: 184,
        ascii_size: 48,
        compact_size: 72,
    },
    Layout {
        minor: 12,
        walk: Walk {
            kind: OWNER,
            runtime_interp: 40,
            interp_threads: 72,
            tstate_next: 8,
            tstate_thread_id: 136,
            tstate_frame: 56,
            cframe_frame: 0,
            frame_code: 0,
            frame_back: 8,
            frame_instr: 56,
            frame_end: 70,
            start: START_THREAD_STATES,
        },
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_lines: 136,
        code_firstlineno: 68,
        code_instructions: 192,
        ascii_size: 40,
        compact_size: 56,
    },
    Layout {
        minor: 13,
        walk: Walk {
            kind: OWNER,
            runtime_interp: 632,
            interp_threads: 7344,
            tstate_next: 8,
            tstate_thread_id: 152,
            tstate_frame: 72,
            cframe_frame: -1,
            frame_code: 0,
            frame_back: 8,
            frame_instr: 56,
            frame_end: 70,
            start: START_THREAD_STATES,
        },
        code_filename: 112,
        code_name: 120,
        code_qualname: Some(128),
        code_lines: 136,
        code_firstlineno: 68,
        code_instructions: 200,
        ascii_size: 40,
        compact_size: 56,
    },
];

/// The layout of CPython 3.`minor`, if known.
pub fn layout(minor: u8) -> Option<&'static Layout> {
    LAYOUTS.iter().find(|l| l.minor == minor)
}

/// The CPython 3 minor version a mapped file is the interpreter of, from
/// its name: `python3.X` or `libpython3.X.so` (with any suffix).
pub fn version_of(path: &str) -> Option<u8> {
    let name = path.rsplit('/').next()?;
    let rest = name
        .strip_prefix("libpython3.")
        .and_then(|r| r.split_once(".so").map(|(v, _)| v))
        .or_else(|| name.strip_prefix("python3."))?;
    let minor: u8 = rest.parse().ok()?;
    layout(minor).map(|l| l.minor)
}

/// What an interpreter file gives: its version, and (as file addresses)
/// `_PyRuntime` and the evaluation function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PyBinary {
    pub minor: u8,
    pub runtime: u64,
    pub eval: Vec<Range<u64>>,
}

/// Reads an interpreter file's symbols (the symbol table, else the dynamic
/// one); `None` when either symbol is missing.
pub fn read_symbols<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    path: &str,
    release: &dyn Fn(),
) -> Option<PyBinary> {
    use object::ObjectSymbol;
    let minor = version_of(path)?;
    let mut runtime = None;
    let mut eval = Vec::new();
    for sym in super::interp::symbols(elf, release, false) {
        let Ok(name) = sym.name() else { continue };
        if name == "_PyRuntime" && sym.address() != 0 {
            runtime = Some(sym.address());
        } else if (name == "_PyEval_EvalFrameDefault"
            || name.starts_with("_PyEval_EvalFrameDefault."))
            && sym.address() != 0
            && sym.size() > 0
            && let Some(end) = sym.address().checked_add(sym.size())
        {
            let r = sym.address()..end;
            if !eval.contains(&r) {
                eval.push(r);
            }
        }
    }
    (!eval.is_empty()).then_some(())?;
    Some(PyBinary {
        minor,
        runtime: runtime?,
        eval,
    })
}

/// A Python process: where its interpreter is, and the code objects read.
#[derive(Debug)]
pub struct PyProcess {
    pub layout: &'static Layout,
    /// Address of `_PyRuntime` in the process.
    pub runtime: u64,
    /// The evaluation function's address ranges in the process.
    eval: Vec<Range<u64>>,
    pid: u32,
    /// Code objects by address, and lines by code object and instruction.
    codes: ReadCache<Arc<Code>>,
}

impl PyProcess {
    /// `bias` is what the file's addresses are moved by in the process.
    pub fn new(pid: u32, binary: &PyBinary, bias: u64, budget: &Arc<StateBudget>) -> Option<Self> {
        Some(PyProcess {
            layout: layout(binary.minor)?,
            runtime: binary.runtime.wrapping_add(bias),
            eval: binary
                .eval
                .iter()
                .map(|r| r.start.wrapping_add(bias)..r.end.wrapping_add(bias))
                .collect(),
            pid,
            codes: ReadCache::new(budget, MAX_CODES, MAX_CODE_BYTES),
        })
    }

    /// What the BPF program needs to walk its threads' frames.
    pub fn bpf_value(&self, start_time: u64) -> InterpProcValue {
        InterpProcValue {
            start_time,
            runtime: self.runtime,
            walk: self.layout.walk,
        }
    }

    /// The evaluation function's address ranges in the process.
    pub fn eval(&self) -> &[std::ops::Range<u64>] {
        &self.eval
    }

    /// The code object of `f` and the line the thread is at in it.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let (pid, layout) = (self.pid, self.layout);
        let code = self.codes.get(
            f.code,
            || read_code(pid, layout, f.code).map(Arc::new),
            |c| c.name.len() + c.file.len() + c.lines.len(),
        )?;
        let line = self
            .codes
            .line((f.code, f.instr), || line_at(layout, &code, f.instr as u32));
        Some((code, line))
    }
}

fn read_code(pid: u32, l: &Layout, addr: u64) -> Option<Code> {
    // Only as far as the last field read: a small code object may end
    // just before an unmapped page.
    let end = [
        l.code_filename,
        l.code_name,
        l.code_qualname.unwrap_or(0),
        l.code_lines,
        l.code_firstlineno,
    ]
    .into_iter()
    .max()
    .unwrap_or(0) as usize
        + 8;
    let mut buf = [0u8; 256];
    let head = &mut buf[..end.min(256)];
    if addr == 0 || !read_mem(pid, addr, head) {
        return None;
    }
    let head = &*head;
    let first = u64_at(head, l.code_firstlineno) as u32;
    let name = read_str(pid, l, u64_at(head, l.code_qualname.unwrap_or(l.code_name)))?;
    let file = read_str(pid, l, u64_at(head, l.code_filename)).unwrap_or_default();
    let lines = read_bytes(pid, u64_at(head, l.code_lines)).unwrap_or_default();
    Some(Code {
        name: name.into(),
        file: file.into(),
        first_line: first,
        lines: lines.into(),
    })
}

/// A `str` object's text: compact ASCII, Latin-1, UCS-2 or UCS-4 (every
/// name and file name the compiler makes is compact).
fn read_str(pid: u32, l: &Layout, addr: u64) -> Option<String> {
    let mut head = [0u8; 40];
    if addr == 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let len = usize::try_from(u64_at(&head, 16)).ok()?;
    let state = u64_at(&head, 32) as u32;
    let (kind, compact, ascii) = (
        (state >> 2) & 7,
        state & (1 << 5) != 0,
        state & (1 << 6) != 0,
    );
    if !compact || len > MAX_STR || !matches!(kind, 1 | 2 | 4) {
        return None;
    }
    let at = if ascii { l.ascii_size } else { l.compact_size };
    let mut data = vec![0u8; len * kind as usize];
    if !read_mem(pid, addr.wrapping_add(u64::from(at)), &mut data) {
        return None;
    }
    Some(match kind {
        1 => data.iter().map(|&b| char::from(b)).collect(),
        2 => char::decode_utf16(
            data.chunks_exact(2)
                .map(|c| u16::from_le_bytes([c[0], c[1]])),
        )
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect(),
        _ => data
            .chunks_exact(4)
            .map(|c| {
                char::from_u32(u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .unwrap_or(char::REPLACEMENT_CHARACTER)
            })
            .collect(),
    })
}

/// A `bytes` object's contents (at most [`MAX_LINE_TABLE`]).
fn read_bytes(pid: u32, addr: u64) -> Option<Vec<u8>> {
    let mut head = [0u8; 32];
    if addr == 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let len = usize::try_from(u64_at(&head, 16)).ok()?;
    if len > MAX_LINE_TABLE {
        return None;
    }
    let mut data = vec![0u8; len];
    read_mem(pid, addr + 32, &mut data).then_some(data)
}

/// The line of `code` at `instr` (as the BPF program sent it), from the
/// version's line table; the function's first line when it says none.
pub fn line_at(l: &Layout, code: &Code, instr: u32) -> u32 {
    let first = code.first_line;
    let line = match l.walk.kind {
        // f_lasti: bytes in 3.8 and 3.9, 2-byte units in 3.10.
        FRAME_OBJECTS if l.minor < 10 => lnotab_line(&code.lines, first, instr as i32),
        FRAME_OBJECTS => linetable_line(&code.lines, first, (instr as i32).saturating_mul(2)),
        // The instruction pointer's distance from the code object: the
        // instruction running (a caller's: its call).
        _ => {
            let at = i64::from(instr) - i64::from(l.code_instructions);
            locations_line(&code.lines, first, (at / 2).max(0))
        }
    };
    line.unwrap_or(first)
}

#[cfg(test)]
mod tests {
    use super::super::frame::Frame;
    use super::super::interp::{Merged, merge};
    use super::*;

    #[test]
    fn the_bpf_programs_struct_size() {
        // `struct interp_proc` in bpf/profile.bpf.c.
        assert_eq!(std::mem::size_of::<InterpProcValue>(), 64);
    }

    #[test]
    fn interpreter_files_by_name() {
        assert_eq!(version_of("/usr/bin/python3.11"), Some(11));
        assert_eq!(
            version_of("/root/.pyenv/versions/3.8.18/lib/libpython3.8.so.1.0"),
            Some(8)
        );
        assert_eq!(version_of("/usr/lib/libpython3.13.so"), Some(13));
        assert_eq!(version_of("/usr/bin/python3.7m"), None, "too old");
        assert_eq!(
            version_of("/usr/lib/libpython3.so"),
            None,
            "the stable ABI shim"
        );
        assert_eq!(version_of("/usr/bin/python3.14"), None, "no layout yet");
        assert_eq!(version_of("/usr/bin/python3-config"), None);
    }

    fn py(code: u64, last: bool) -> InterpFrame {
        InterpFrame {
            code,
            instr: 0,
            last,
        }
    }

    fn native(addr: u64) -> Frame {
        Frame {
            addr,
            is_return: true,
        }
    }

    #[test]
    fn each_versions_frames_end_their_calls() {
        let raw = |code: u64, instr: u64, end: u8| RawInterpFrame { code, instr, end };
        // 3.10: a frame per call; f_lasti is the low 4 bytes.
        let f = frames(layout(10).unwrap(), &[raw(0x100, 0xdead_0000_0007, 0)]);
        assert_eq!(
            f,
            [InterpFrame {
                code: 0x100,
                instr: 7,
                last: true
            }]
        );
        // 3.11: the entry frame ends a call.
        let f = frames(
            layout(11).unwrap(),
            &[
                raw(0x100, 0x1c0, 0),
                raw(0x200, 0x2d0, 1),
                raw(0x300, 0x3c0, 1),
            ],
        );
        assert_eq!(
            f.iter().map(|f| (f.instr, f.last)).collect::<Vec<_>>(),
            [(0xc0, false), (0xd0, true), (0xc0, true)]
        );
        // 3.12: the C stack's shim frame ends the call before it, and is
        // no frame of its own.
        let f = frames(
            layout(12).unwrap(),
            &[
                raw(0x100, 0x1c0, 0),
                raw(0x200, 0x2c0, 0),
                raw(0, 0, 3),
                raw(0x300, 0x3c0, 0),
                raw(0, 0, 3),
            ],
        );
        assert_eq!(
            f.iter().map(|f| (f.code, f.last)).collect::<Vec<_>>(),
            [(0x100, false), (0x200, true), (0x300, true)]
        );
    }

    #[test]
    fn python_frames_take_the_place_of_the_evaluation_calls() {
        // Native, innermost first: a C function, eval (running frames 1, 2),
        // a C call back into Python, eval (frame 3), main.
        let eval = |a: u64| (0x1000..0x2000).contains(&a);
        let stack = [
            native(0x9000),
            native(0x1100),
            native(0x5000),
            native(0x1200),
        ];
        let frames = [py(1, false), py(2, true), py(3, true)];
        let merged = merge(&stack, &frames, eval, false);
        assert_eq!(
            merged,
            [
                Merged::Native(native(0x9000)),
                Merged::Interp(frames[0]),
                Merged::Interp(frames[1]),
                Merged::Native(native(0x5000)),
                Merged::Interp(frames[2]),
            ]
        );
        // A native stack cut short: the groups left go at its outer end.
        let merged = merge(&stack[..2], &frames, eval, false);
        assert_eq!(merged.len(), 4);
        assert_eq!(merged[3], Merged::Interp(frames[2]));
        // More calls than frames walked: the rest stay native.
        let merged = merge(&stack, &frames[..2], eval, false);
        assert_eq!(merged.last(), Some(&Merged::Native(native(0x1200))));
    }

    fn code(first_line: u32, lines: &[u8]) -> Code {
        Code {
            name: "f".into(),
            file: "f.py".into(),
            first_line,
            lines: lines.into(),
        }
    }

    #[test]
    fn lines_from_each_versions_table() {
        // 3.8/3.9 lnotab: bytes 0..6 line 10, 6..20 line 12, 20.. line 11.
        let t = code(10, &[6, 2, 14, 0xff]);
        let l = layout(9).unwrap();
        assert_eq!(line_at(l, &t, 0), 10);
        assert_eq!(line_at(l, &t, 8), 12);
        assert_eq!(line_at(l, &t, 24), 11);
        // 3.10 linetable in 2-byte units: bytes 0..4 line 5, 4..10 no line,
        // 10..16 line 7.
        let t = code(5, &[4, 0, 6, 0x80, 6, 2]);
        let l = layout(10).unwrap();
        assert_eq!(line_at(l, &t, 1), 5);
        assert_eq!(line_at(l, &t, 3), 5, "no line: the first line");
        assert_eq!(line_at(l, &t, 6), 7);
        // 3.13 locations in units from co_code_adaptive: a no-column entry
        // of 2 units at line +1, a one-line entry of 3 units at +2, a long
        // entry of 1 unit at -3, a short one of 2 units.
        let t = code(
            20,
            &[
                0x80 | 13 << 3 | 1,
                2,
                0x80 | 12 << 3 | 2,
                0,
                0,
                0x80 | 14 << 3,
                7,
                0,
                1,
                1,
                0x81,
                0,
            ],
        );
        let l = layout(13).unwrap();
        let at = |unit: u32| l.code_instructions + unit * 2;
        assert_eq!(line_at(l, &t, at(0)), 21);
        assert_eq!(line_at(l, &t, at(1)), 21);
        assert_eq!(line_at(l, &t, at(2)), 23);
        assert_eq!(line_at(l, &t, at(4)), 23);
        assert_eq!(line_at(l, &t, at(5)), 20);
        assert_eq!(line_at(l, &t, at(6)), 20);
    }
}
