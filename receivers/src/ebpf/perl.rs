//! Perl 5.36 processes (Debian's `perl`, built with threads, or a program
//! embedding `libperl.so.5.36`), without any flag or module.
//!
//! A process is a Perl one when it maps a file named `perl…` or
//! `libperl.so…` whose exported `PL_revision`, `PL_version` (5, 36) say its
//! layout, with `PL_thr_key` (a build with threads: each interpreter's state
//! is a struct) and `PL_curinterp`, the program's first interpreter, the one
//! its main thread runs. The BPF program reads, for the main thread only,
//! the interpreter's current COP (`PL_curcop`: the statement running) and
//! its context stacks from the top down: each context's type byte, the 8
//! bytes where a sub's CV is, and the COP it was entered from, with a marker
//! before each outer stack (sort blocks, tie and overload callbacks run on
//! stacks of their own).
//!
//! Here each sub call (`CXt_SUB`) becomes a frame, named from its CV (its
//! glob's name in its stash's, `main::handler`; a lexical sub by its own
//! name) and file, at the line of the COP it was running: the current COP
//! for the innermost (its first statement's line when it has run none
//! yet), for the others the COP the next inner sub was called from. Below them, the file's own code (`main::RUNTIME`, as NYTProf names
//! it) at the line that called the outermost sub. Each stack ends a group
//! that replaces one call of `Perl_runops_standard` in the native stack.
//! Other threads of a threaded program keep their native frames.
//!
//! The offsets were read from Perl 5.36's own headers (`offsetof` on
//! Debian's `/usr/lib/x86_64-linux-gnu/perl/5.36/CORE`, x86_64, threads).

use std::ops::Range;
use std::sync::Arc;

use super::interp::{
    Code, InterpFrame, InterpProcValue, ReadCache, START_PERL, Walk, read_mem, read_u64, u32_at,
    u64_at,
};
use super::sample::RawInterpFrame;
use super::state_budget::StateBudget;

/// Subs kept per process.
pub const MAX_SUBS: usize = 4096;
/// Bytes of names and files kept per process.
pub const MAX_SUB_BYTES: usize = 8 << 20;
/// Longest name or file name read.
const MAX_STR: usize = 1024;

/// [`Walk::kind`] of Perl 5.36.
const PERL_536: u32 = 0x0536;
/// What the BPF program marks entries with (`end`).
const PERL_CURCOP: u8 = 0xfe;
const PERL_STACK: u8 = 0xff;
/// `struct interpreter`: `Icurstackinfo`, `Icurcop`.
const I_CURSTACKINFO: u32 = 224;
const I_CURCOP: u32 = 208;
/// `PERL_SI`: `si_cxstack`, `si_prev`, `si_cxix` (I32), `si_type` (I32).
const SI_CXSTACK: u32 = 8;
const SI_PREV: u32 = 16;
const SI_CXIX: i32 = 32;
const SI_TYPE: u32 = 44;
/// `PERL_CONTEXT`: its size, its type byte, `blk_oldcop`, `blk_sub.cv`.
const CX_SIZE: u32 = 104;
const CX_TYPE: u32 = 0;
const CX_OLDCOP: u32 = 16;
const CX_SUB_CV: u32 = 72;
/// `CXTYPEMASK`, `CXt_SUB`.
const CX_TYPE_MASK: u8 = 0xf;
const CXT_SUB: u8 = 9;
/// `COP`: `cop_line` (u32), `cop_file` (a C string with threads).
const COP_LINE: u64 = 36;
const COP_FILE: u64 = 48;
/// `SV`: `sv_any`, `sv_flags`; `SVf_OOK` (a hash with its aux part).
const SV_ANY: u32 = 0;
const SV_FLAGS: u32 = 12;
const SVF_OOK: u32 = 0x0200_0000;
/// `XPVCV`: `xcv_stash`, `xcv_gv_u`, `xcv_file`, `xcv_flags`; `CVf_NAMED`.
const XCV_STASH: u32 = 32;
const XCV_GV_U: u32 = 56;
const XCV_FILE: u32 = 64;
const XCV_FLAGS: u32 = 92;
/// `XPVCV.xcv_start_u`: the sub's first op (`CvSTART`).
const XCV_START: u32 = 40;
/// `OP`: the 2 bytes holding `op_type` (its low 9 bits), the size of an
/// OP; `OP_NEXTSTATE` and `OP_DBSTATE` (COPs: a statement with its line).
const OP_TYPE: usize = 32;
const OP_SIZE: usize = 40;
const OP_NEXTSTATE: u16 = 195;
const OP_DBSTATE: u16 = 196;
const CVF_NAMED: u32 = 0x8000;
/// `XPVGV`: `xiv_u.xivu_namehek`.
const XGV_NAMEHEK: u32 = 32;
/// `struct xpvhv_with_aux`: `xhv_aux`; in it `xhv_name_u`,
/// `xhv_name_count`.
const XHV_AUX: u32 = 32;
const AUX_NAME_COUNT: u32 = 28;
/// `HEK`: `hek_len` (I32), `hek_key`.
const HEK_LEN: u32 = 4;
const HEK_KEY: u64 = 8;
/// [`InterpFrame::code`] of the file's own code (no CV).
const FILE_CODE: u64 = 0;
/// [`InterpFrame::instr`] of a sub that has not run a statement yet (the
/// current COP is still its caller's): it is at its first line.
const JUST_ENTERED: u64 = 0;

/// What a Perl file gives, as file addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PerlBinary {
    pub curinterp: u64,
    pub runops: Range<u64>,
}

/// Whether a mapped file is named as a Perl interpreter or its library.
pub fn is_perl(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "perl" || name.starts_with("perl5.") || name.starts_with("libperl.so")
}

/// Reads a Perl file's symbols and version; `None` unless it is Perl 5.36
/// built with threads.
pub fn read_symbols<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    release: &dyn Fn(),
) -> Option<PerlBinary> {
    use object::ObjectSymbol;
    let (mut curinterp, mut runops, mut threads) = (None, None, false);
    let (mut revision, mut version) = (None, None);
    for sym in super::interp::symbols(elf, release, true) {
        let Ok(name) = sym.name() else { continue };
        if sym.address() == 0 {
            continue;
        }
        match name {
            "PL_curinterp" => curinterp = Some(sym.address()),
            "PL_thr_key" => threads = true,
            "Perl_runops_standard" if sym.size() > 0 => {
                runops = sym
                    .address()
                    .checked_add(sym.size())
                    .map(|end| sym.address()..end);
            }
            "PL_revision" => revision = byte_at(elf, sym.address()),
            "PL_version" => version = byte_at(elf, sym.address()),
            _ => {}
        }
    }
    (threads && revision == Some(5) && version == Some(36)).then_some(())?;
    Some(PerlBinary {
        curinterp: curinterp?,
        runops: runops?,
    })
}

/// The byte at file address `addr` (a read-only constant).
fn byte_at<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>, addr: u64) -> Option<u8> {
    use object::{Object, ObjectSection};
    elf.sections().find_map(|s| {
        let at = addr.checked_sub(s.address())?;
        (at < s.size()).then_some(())?;
        s.data().ok()?.get(usize::try_from(at).ok()?).copied()
    })
}

/// A Perl process: where its first interpreter and its run loop are, and
/// the subs read.
#[derive(Debug)]
pub struct PerlProcess {
    /// Address of `PL_curinterp` in the process.
    pub curinterp: u64,
    /// `Perl_runops_standard`'s address range in the process.
    pub runops: Range<u64>,
    pid: u32,
    /// Subs by CV address.
    subs: ReadCache<Arc<Code>>,
    /// By COP address: its line, and the file's own code in its file.
    cops: ReadCache<(u32, Arc<Code>)>,
}

impl PerlProcess {
    /// `bias` is what the file's addresses are moved by in the process.
    pub fn new(pid: u32, binary: &PerlBinary, bias: u64, budget: &Arc<StateBudget>) -> Self {
        let r = &binary.runops;
        PerlProcess {
            curinterp: binary.curinterp.wrapping_add(bias),
            runops: r.start.wrapping_add(bias)..r.end.wrapping_add(bias),
            pid,
            subs: ReadCache::new(budget, MAX_SUBS, MAX_SUB_BYTES),
            cops: ReadCache::new(budget, MAX_SUBS * 4, MAX_SUB_BYTES),
        }
    }

    /// What the BPF program needs to walk its context stacks.
    pub fn bpf_value(&self, start_time: u64) -> InterpProcValue {
        InterpProcValue {
            start_time,
            runtime: self.curinterp,
            walk: Walk {
                kind: PERL_536,
                runtime_interp: SI_TYPE,
                interp_threads: I_CURSTACKINFO,
                tstate_next: SI_PREV,
                tstate_thread_id: I_CURCOP,
                tstate_frame: SI_CXSTACK,
                cframe_frame: SI_CXIX,
                frame_code: CX_SUB_CV,
                frame_back: CX_SIZE,
                frame_instr: CX_OLDCOP,
                frame_end: CX_TYPE,
                start: START_PERL,
            },
        }
    }

    /// The sub frames of a sample (innermost first), each at the COP it
    /// runs (`instr`), then the file's own code; the last frame of each
    /// stack marked `last`.
    pub fn frames(&mut self, raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
        frames(raw)
    }

    /// The sub of `f` (or the file's code) and the line of its COP.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let pid = self.pid;
        if f.code != FILE_CODE && f.instr == JUST_ENTERED {
            let code = self.sub(f.code)?;
            let line = code.first_line;
            return Some((code, line));
        }
        let (line, file_code) =
            self.cops
                .get(f.instr, || read_cop(pid, f.instr), |(_, c)| c.file.len())?;
        if f.code == FILE_CODE {
            return Some((file_code, line));
        }
        Some((self.sub(f.code)?, line))
    }

    /// The sub whose CV is at `cv`, read once.
    fn sub(&mut self, cv: u64) -> Option<Arc<Code>> {
        let pid = self.pid;
        self.subs.get(
            cv,
            || read_sub(pid, cv).map(Arc::new),
            |c| c.name.len() + c.file.len(),
        )
    }
}

/// Reads the COP at `addr`: its line, and the file's own code
/// (`main::RUNTIME`) in its file.
fn read_cop(pid: u32, addr: u64) -> Option<(u32, Arc<Code>)> {
    let mut head = [0u8; COP_FILE as usize + 8];
    if addr == 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let line = u32_at(&head, COP_LINE as u32);
    let file = read_c_str(pid, u64_at(&head, COP_FILE as u32)).unwrap_or_default();
    let code = Code {
        name: "main::RUNTIME".into(),
        file: file.into(),
        first_line: 0,
        lines: Box::default(),
    };
    Some((line, Arc::new(code)))
}

/// The frames of the BPF program's entries (see the module's docs).
fn frames(raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
    let mut out: Vec<InterpFrame> = Vec::with_capacity(raw.len());
    // The COP the next (outer) sub is at.
    let mut at = 0;
    for f in raw {
        match f.end {
            PERL_CURCOP => at = f.instr,
            PERL_STACK => {
                if let Some(last) = out.last_mut() {
                    last.last = true;
                }
            }
            t if t & CX_TYPE_MASK == CXT_SUB => {
                out.push(InterpFrame {
                    code: f.code,
                    // The current COP is still the call's: no statement of
                    // the sub has run.
                    instr: if at == f.instr { JUST_ENTERED } else { at },
                    last: false,
                });
                at = f.instr;
            }
            _ => {}
        }
    }
    if at != 0 {
        out.push(InterpFrame {
            code: FILE_CODE,
            instr: at,
            last: true,
        });
    }
    out
}

/// Reads the name (`Package::sub`) and file of the CV at `cv`.
fn read_sub(pid: u32, cv: u64) -> Option<Code> {
    let body = read_u64(pid, cv.wrapping_add(u64::from(SV_ANY)))?;
    let mut x = [0u8; XCV_FLAGS as usize + 4];
    if body == 0 || !read_mem(pid, body, &mut x) {
        return None;
    }
    let flags = u32_at(&x, XCV_FLAGS);
    let gv_u = u64_at(&x, XCV_GV_U);
    let name = if flags & CVF_NAMED != 0 {
        read_hek(pid, gv_u)?
    } else {
        let gv_body = read_u64(pid, gv_u.wrapping_add(u64::from(SV_ANY)))?;
        read_hek(
            pid,
            read_u64(pid, gv_body.wrapping_add(u64::from(XGV_NAMEHEK)))?,
        )?
    };
    let name = match stash_name(pid, u64_at(&x, XCV_STASH)) {
        Some(package) => format!("{package}::{name}"),
        None => name,
    };
    let file = read_c_str(pid, u64_at(&x, XCV_FILE)).unwrap_or_default();
    Some(Code {
        name: name.into(),
        file: file.into(),
        first_line: first_line(pid, u64_at(&x, XCV_START)).unwrap_or(0),
        lines: Box::default(),
    })
}

/// The line of a sub's first statement: its first op's, when that is a COP.
fn first_line(pid: u32, start: u64) -> Option<u32> {
    let mut op = [0u8; OP_SIZE];
    if start == 0 || !read_mem(pid, start, &mut op) {
        return None;
    }
    let kind = u16::from_le_bytes([op[OP_TYPE], op[OP_TYPE + 1]]) & 0x1ff;
    if kind != OP_NEXTSTATE && kind != OP_DBSTATE {
        return None;
    }
    let mut line = [0u8; 4];
    read_mem(pid, start.wrapping_add(COP_LINE), &mut line).then(|| u32::from_le_bytes(line))
}

/// The name of the stash (package) `hv`, from its aux part.
fn stash_name(pid: u32, hv: u64) -> Option<String> {
    let mut head = [0u8; SV_FLAGS as usize + 4];
    if hv == 0 || !read_mem(pid, hv, &mut head) {
        return None;
    }
    let flags = u32_at(&head, SV_FLAGS);
    if flags & SVF_OOK == 0 {
        return None;
    }
    let aux = u64_at(&head, SV_ANY).checked_add(u64::from(XHV_AUX))?;
    let mut a = [0u8; AUX_NAME_COUNT as usize + 4];
    if !read_mem(pid, aux, &mut a) {
        return None;
    }
    let count = u32_at(&a, AUX_NAME_COUNT) as i32;
    let name = u64_at(&a, 0);
    let hek = if count == 0 {
        name
    } else {
        read_u64(pid, name)?
    };
    read_hek(pid, hek)
}

/// The text of the HEK at `addr`.
fn read_hek(pid: u32, addr: u64) -> Option<String> {
    let mut head = [0u8; 8];
    if addr == 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let len = u32_at(&head, HEK_LEN) as i32;
    let len = usize::try_from(len).ok().filter(|&l| l <= MAX_STR)?;
    let mut data = vec![0u8; len];
    read_mem(pid, addr.wrapping_add(HEK_KEY), &mut data)
        .then(|| String::from_utf8_lossy(&data).into_owned())
}

/// The C string at `addr`, at most [`MAX_STR`] bytes of it.
fn read_c_str(pid: u32, addr: u64) -> Option<String> {
    if addr == 0 {
        return None;
    }
    let mut out = Vec::new();
    let mut chunk = [0u8; 64];
    while out.len() < MAX_STR {
        // A chunk may cross into an unmapped page: read it byte by byte
        // then.
        if !read_mem(pid, addr.wrapping_add(out.len() as u64), &mut chunk) {
            let mut b = [0u8; 1];
            if !read_mem(pid, addr.wrapping_add(out.len() as u64), &mut b) || b[0] == 0 {
                break;
            }
            out.push(b[0]);
            continue;
        }
        match chunk.iter().position(|&b| b == 0) {
            Some(end) => {
                out.extend_from_slice(&chunk[..end]);
                break;
            }
            None => out.extend_from_slice(&chunk),
        }
    }
    out.truncate(MAX_STR);
    Some(String::from_utf8_lossy(&out).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(code: u64, instr: u64, end: u8) -> RawInterpFrame {
        RawInterpFrame { code, instr, end }
    }

    #[test]
    fn interpreter_files_by_name() {
        assert!(is_perl("/usr/bin/perl"));
        assert!(is_perl("/usr/bin/perl5.36.0"));
        assert!(is_perl("/usr/lib/x86_64-linux-gnu/libperl.so.5.36.0"));
        assert!(!is_perl("/usr/bin/perldoc"));
        assert!(!is_perl(
            "/usr/lib/x86_64-linux-gnu/perl/5.36/auto/POSIX/POSIX.so"
        ));
    }

    #[test]
    fn each_sub_is_at_the_cop_of_the_call_inside_it() {
        // The current COP 0xc0 (in `two`); contexts from the top: sub `two`
        // (CV 0x200, called at COP 0xc1 in `run`), a loop in `run` (COP
        // 0xc9: not a line of any frame), sub `run` (CV 0x100, called at
        // COP 0xc2 in the file's code).
        let f = frames(&[
            raw(0, 0xc0, PERL_CURCOP),
            raw(0x200, 0xc1, CXT_SUB),
            raw(0xdead, 0xc9, 3),
            raw(0x100, 0xc2, CXT_SUB | 0x20),
        ]);
        assert_eq!(
            f.iter()
                .map(|f| (f.code, f.instr, f.last))
                .collect::<Vec<_>>(),
            [
                (0x200, 0xc0, false),
                (0x100, 0xc1, false),
                (FILE_CODE, 0xc2, true)
            ]
        );
        // A sub just entered: the current COP is still its call's.
        let f = frames(&[
            raw(0, 0xc1, PERL_CURCOP),
            raw(0x200, 0xc1, CXT_SUB),
            raw(0x100, 0xc2, CXT_SUB),
        ]);
        assert_eq!(
            f.iter().map(|f| (f.code, f.instr)).collect::<Vec<_>>(),
            [(0x200, JUST_ENTERED), (0x100, 0xc1), (FILE_CODE, 0xc2)]
        );
        // A sort block's stack above the main one: its sub ends a group.
        let f = frames(&[
            raw(0, 0xc0, PERL_CURCOP),
            raw(0x300, 0xc3, CXT_SUB),
            raw(1, 0, PERL_STACK),
            raw(0x100, 0xc2, CXT_SUB),
        ]);
        assert_eq!(
            f.iter()
                .map(|f| (f.code, f.instr, f.last))
                .collect::<Vec<_>>(),
            [
                (0x300, 0xc0, true),
                (0x100, 0xc3, false),
                (FILE_CODE, 0xc2, true)
            ]
        );
    }

    #[test]
    fn this_machines_perl_is_read_when_it_is_5_36() {
        let data = std::fs::read("/usr/bin/perl").expect("/usr/bin/perl (Debian's perl-base)");
        let elf = object::File::parse(&*data).unwrap();
        let is_536 = std::process::Command::new("/usr/bin/perl")
            .args(["-e", "exit(($] >= 5.036 && $] < 5.037) ? 0 : 1)"])
            .status()
            .unwrap()
            .success();
        let b = read_symbols(&elf, &|| {});
        assert_eq!(b.is_some(), is_536, "{b:?}");
        if let Some(b) = b {
            assert!(b.runops.end > b.runops.start && b.curinterp != 0);
        }
    }
}
