//! PHP 8.2 processes (the CLI, FPM, CGI or the embed library, without
//! threads), without any flag, extension or restart.
//!
//! A process is a PHP one when it maps `php8.2`, `php-fpm8.2`,
//! `php-cgi8.2` or `libphp8.2.so` (Debian's and the official images'
//! names) exporting `executor_globals` (a build with threads has none: it
//! keeps its globals per thread, and is not walked) and `execute_ex`, the
//! VM's loop. The BPF program reads `executor_globals.current_execute_data`
//! and follows `prev_execute_data`, sending for each frame its function
//! (`func`), its current op (`opline`) and the byte of its call info that
//! holds `ZEND_CALL_TOP` (the frame that entered this `execute_ex`).
//!
//! Here each function is read once from the process's memory: its name
//! (`Class::method`, `function`, `{closure}`, `{main}` for a file's code),
//! file and first line (kept per process, charged to the state budget); a
//! frame's line is its op's `lineno`. Functions
//! written in C (`strlen`, `usleep`) are left out: their own native frames
//! are in the stack already. The innermost frame's op is where the VM last
//! saved it (its loop keeps it in a register), so its line is a line of the
//! function, not always the one running (its first line when the op saved
//! is not one of the function's: an earlier call's in the same memory).
//!
//! The offsets were read from PHP 8.2's own headers (`offsetof` on Debian's
//! php8.2-dev, x86_64, without threads).

use std::ops::Range;
use std::sync::Arc;

use super::interp::{
    Code, InterpFrame, InterpProcValue, ReadCache, START_GLOBAL, Walk, read_mem, u32_at, u64_at,
};
use super::sample::RawInterpFrame;
use super::state_budget::StateBudget;

/// Functions kept per process.
pub const MAX_FUNCS: usize = 4096;
/// Bytes of names and files kept per process.
pub const MAX_FUNC_BYTES: usize = 8 << 20;
/// Longest name or file name read.
const MAX_STR: usize = 1024;

/// [`Walk::kind`] of PHP 8.2.
const PHP_82: u32 = 0x0802;
/// `zend_executor_globals.current_execute_data`.
const EG_CURRENT_EXECUTE_DATA: u32 = 488;
/// `zend_execute_data`: `opline`, `func`, `prev_execute_data`, and the byte
/// of `This.u1.type_info` (the call info) with bits 16 to 23.
const EX_OPLINE: u32 = 0;
const EX_FUNC: u32 = 24;
const EX_PREV: u32 = 48;
const EX_CALL_INFO_BYTE_2: u32 = 42;
/// `ZEND_CALL_TOP` (1 << 17) in that byte.
const CALL_TOP: u8 = 1 << 1;
/// `zend_function`: `type`, `common.function_name`, `common.scope`,
/// `op_array.filename`, `op_array.line_start`.
const FN_TYPE: u32 = 0;
const FN_NAME: u32 = 8;
const FN_SCOPE: u32 = 16;
const FN_FILENAME: u32 = 152;
const FN_LINE_START: u32 = 160;
/// `zend_op_array`: `last` (u32, how many ops), `opcodes`.
const FN_LAST: u32 = 80;
const FN_OPCODES: u32 = 88;
/// `sizeof(zend_op)`.
const OP_SIZE: u64 = 32;
/// `zend_class_entry.name`.
const CE_NAME: u32 = 8;
/// `zend_string`: `len`, `val`.
const STR_LEN: u32 = 16;
const STR_VAL: u32 = 24;
/// `zend_op.lineno`.
const OP_LINENO: u64 = 24;
/// `zend_function.type` of a function written in PHP, and of `eval`'d code.
const USER_FUNCTION: u8 = 2;
const EVAL_CODE: u8 = 4;

/// Whether a mapped file is named as PHP 8.2's interpreter.
pub fn is_php(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    matches!(
        name,
        "php8.2" | "php-fpm8.2" | "php-cgi8.2" | "libphp8.2.so" | "php8.2-embed"
    )
}

/// What a PHP file gives, as file addresses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhpBinary {
    pub executor_globals: u64,
    pub execute_ex: Range<u64>,
}

/// Reads a PHP file's two symbols (dynamic symbols: Debian's binaries are
/// stripped, and both are exported for extensions); `None` when either is
/// missing (a build with threads has no `executor_globals`).
pub fn read_symbols<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    release: &dyn Fn(),
) -> Option<PhpBinary> {
    use object::ObjectSymbol;
    let mut globals = None;
    let mut execute_ex = None;
    for sym in super::interp::symbols(elf, release, true) {
        let Ok(name) = sym.name() else { continue };
        if sym.address() == 0 {
            continue;
        }
        match name {
            "executor_globals" => globals = Some(sym.address()),
            "execute_ex" if sym.size() > 0 => {
                execute_ex = sym
                    .address()
                    .checked_add(sym.size())
                    .map(|end| sym.address()..end);
            }
            _ => {}
        }
    }
    Some(PhpBinary {
        executor_globals: globals?,
        execute_ex: execute_ex?,
    })
}

/// A PHP function as read: named, or one written in C (left out of
/// stacks).
#[derive(Debug, Clone)]
enum Func {
    /// With the address range of its ops.
    User(Arc<Code>, Range<u64>),
    Internal,
}

/// A PHP process: where its globals and VM loop are, and the functions
/// read.
#[derive(Debug)]
pub struct PhpProcess {
    /// Address of `executor_globals` in the process.
    pub globals: u64,
    /// `execute_ex`'s address range in the process.
    pub execute_ex: Range<u64>,
    pid: u32,
    /// Functions by address, and lines by op.
    funcs: ReadCache<Func>,
}

impl PhpProcess {
    /// `bias` is what the file's addresses are moved by in the process.
    pub fn new(pid: u32, binary: &PhpBinary, bias: u64, budget: &Arc<StateBudget>) -> Self {
        let ex = &binary.execute_ex;
        PhpProcess {
            globals: binary.executor_globals.wrapping_add(bias),
            execute_ex: ex.start.wrapping_add(bias)..ex.end.wrapping_add(bias),
            pid,
            funcs: ReadCache::new(budget, MAX_FUNCS, MAX_FUNC_BYTES),
        }
    }

    /// What the BPF program needs to walk its frames.
    pub fn bpf_value(&self, start_time: u64) -> InterpProcValue {
        InterpProcValue {
            start_time,
            runtime: self.globals,
            walk: Walk {
                kind: PHP_82,
                runtime_interp: 0,
                interp_threads: 0,
                tstate_next: 0,
                tstate_thread_id: 0,
                tstate_frame: EG_CURRENT_EXECUTE_DATA,
                cframe_frame: -1,
                frame_code: EX_FUNC,
                frame_back: EX_PREV,
                frame_instr: EX_OPLINE,
                frame_end: EX_CALL_INFO_BYTE_2,
                start: START_GLOBAL,
            },
        }
    }

    /// The frames of a sample, innermost first, without those of functions
    /// written in C; a frame that entered `execute_ex` is marked `last` (a
    /// C function's mark goes to the PHP frame before it).
    pub fn frames(&mut self, raw: &[RawInterpFrame]) -> Vec<InterpFrame> {
        let mut out: Vec<InterpFrame> = Vec::with_capacity(raw.len());
        for f in raw {
            let top = f.end & CALL_TOP != 0;
            if matches!(self.func(f.code), Some(Func::Internal)) {
                if top && let Some(prev) = out.last_mut() {
                    prev.last = true;
                }
                continue;
            }
            out.push(InterpFrame {
                code: f.code,
                instr: f.instr,
                last: top,
            });
        }
        out
    }

    /// The function of `f` and the line its op is at. An op outside the
    /// function's own (the VM keeps the innermost frame's op in a register,
    /// and the frame's memory may still hold an earlier call's) gives the
    /// function's first line.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let Some(Func::User(code, ops)) = self.func(f.code) else {
            return None;
        };
        let pid = self.pid;
        let line = self.funcs.line((f.code, f.instr), || {
            let mut b = [0u8; 4];
            if ops.contains(&f.instr) && read_mem(pid, f.instr.wrapping_add(OP_LINENO), &mut b) {
                u32::from_le_bytes(b)
            } else {
                code.first_line
            }
        });
        Some((code, line))
    }

    /// The function at `addr`, read once.
    fn func(&mut self, addr: u64) -> Option<Func> {
        let pid = self.pid;
        self.funcs.get(
            addr,
            || read_func(pid, addr),
            |f| match f {
                Func::User(c, _) => c.name.len() + c.file.len(),
                Func::Internal => 0,
            },
        )
    }
}

/// Reads the `zend_function` at `addr`.
fn read_func(pid: u32, addr: u64) -> Option<Func> {
    let mut head = [0u8; FN_LINE_START as usize + 4];
    const _: () = assert!(FN_OPCODES < FN_LINE_START && FN_LAST < FN_LINE_START);
    if addr == 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let kind = head[FN_TYPE as usize];
    if kind != USER_FUNCTION && kind != EVAL_CODE {
        return Some(Func::Internal);
    }
    let name = match read_str(pid, u64_at(&head, FN_NAME)) {
        Some(name) => name,
        None if u64_at(&head, FN_NAME) == 0 => "{main}".to_owned(),
        None => return None,
    };
    let name = match u64_at(&head, FN_SCOPE) {
        0 => name,
        scope => {
            let mut ce = [0u8; CE_NAME as usize + 8];
            match read_mem(pid, scope, &mut ce)
                .then(|| read_str(pid, u64_at(&ce, CE_NAME)))
                .flatten()
            {
                Some(class) => format!("{class}::{name}"),
                None => name,
            }
        }
    };
    let file = read_str(pid, u64_at(&head, FN_FILENAME)).unwrap_or_default();
    let first = u32_at(&head, FN_LINE_START);
    let opcodes = u64_at(&head, FN_OPCODES);
    let last = u64::from(u32_at(&head, FN_LAST));
    let ops = opcodes..opcodes.saturating_add(last * OP_SIZE);
    Some(Func::User(
        Arc::new(Code {
            name: name.into(),
            file: file.into(),
            first_line: first,
            lines: Box::default(),
        }),
        ops,
    ))
}

/// Reads the `zend_string` at `addr` (at most [`MAX_STR`] bytes of it).
fn read_str(pid: u32, addr: u64) -> Option<String> {
    let mut head = [0u8; STR_VAL as usize];
    if addr == 0 || !read_mem(pid, addr, &mut head) {
        return None;
    }
    let len = usize::try_from(u64_at(&head, STR_LEN)).ok()?;
    if len > MAX_STR {
        return None;
    }
    let mut data = vec![0u8; len];
    read_mem(pid, addr.wrapping_add(u64::from(STR_VAL)), &mut data)
        .then(|| String::from_utf8_lossy(&data).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interpreter_files_by_name() {
        assert!(is_php("/usr/bin/php8.2"));
        assert!(is_php("/usr/sbin/php-fpm8.2"));
        assert!(is_php("/usr/lib/apache2/modules/libphp8.2.so"));
        assert!(!is_php("/usr/bin/php8.1"), "no layout");
        assert!(!is_php("/usr/bin/php"), "a link: maps name the file");
        assert!(!is_php("/usr/lib/php/20220829/opcache.so"));
    }

    fn raw(code: u64, end: u8) -> RawInterpFrame {
        RawInterpFrame {
            code,
            instr: code + 0x40,
            end,
        }
    }

    #[test]
    fn c_functions_are_left_out_and_pass_on_their_mark() {
        let mut p = PhpProcess::new(
            0,
            &PhpBinary {
                executor_globals: 0x1000,
                execute_ex: 0x2000..0x3000,
            },
            0,
            &StateBudget::unbounded(),
        );
        // Functions known as read: 0x100 and 0x300 PHP, 0x200 C.
        let user = |name: &str| {
            Some(Func::User(
                Arc::new(Code {
                    name: name.into(),
                    file: "a.php".into(),
                    first_line: 1,
                    lines: Box::default(),
                }),
                0..0,
            ))
        };
        for (addr, f) in [
            (0x100, user("cb")),
            (0x200, Some(Func::Internal)),
            (0x300, user("{main}")),
            (0x400, Some(Func::Internal)),
        ] {
            p.funcs.get(addr, || f, |_| 0);
        }
        // A callback entered from array_map (itself called from the file's
        // code): cb (top), array_map, {main} (top); then a C function
        // entered at the top (its mark goes to the frame before it).
        let f = p.frames(&[raw(0x100, CALL_TOP), raw(0x200, 0), raw(0x300, CALL_TOP)]);
        assert_eq!(
            f.iter().map(|f| (f.code, f.last)).collect::<Vec<_>>(),
            [(0x100, true), (0x300, true)]
        );
        let f = p.frames(&[raw(0x300, 0), raw(0x400, CALL_TOP)]);
        assert_eq!(
            f.iter().map(|f| (f.code, f.last)).collect::<Vec<_>>(),
            [(0x300, true)]
        );
        assert_eq!(
            p.frame(f[0]).map(|(c, _)| c.name.clone()),
            Some("{main}".into())
        );
    }

    #[test]
    fn the_walk_starts_at_the_globals() {
        let p = PhpProcess::new(
            0,
            &PhpBinary {
                executor_globals: 0x1000,
                execute_ex: 0x2000..0x3000,
            },
            0x7f00_0000_0000,
            &StateBudget::unbounded(),
        );
        let v = p.bpf_value(9);
        assert_eq!(v.runtime, 0x7f00_0000_1000);
        assert_eq!(v.walk.start, START_GLOBAL);
        assert_eq!(p.execute_ex, 0x7f00_0000_2000..0x7f00_0000_3000);
    }
}
