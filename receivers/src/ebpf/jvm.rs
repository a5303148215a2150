//! HotSpot JVMs, named with no flag and no perf map: their Java frames are
//! walked in user space from the stack the BPF program copies, the way the
//! JVM's own Serviceability Agent reads a JVM from outside.
//!
//! `libjvm.so` describes its own structs ([`vmstructs`]); from them the
//! code cache is read ([`codecache`]): a frame whose instruction pointer is
//! in a compiled method or the template interpreter is stepped by HotSpot's
//! frame layout rather than by frame pointers (which compiled Java code does
//! not keep), and named by its `Method*`: `package/Class.method`, its
//! source file, and for an interpreted frame the line of its bytecode (the
//! method's compressed line number table, decoded here). Native frames
//! around them (the JVM's own C++, JNI code, the thread's start) are
//! unwound as any other.
//!
//! A compiled frame is every method it was running at its pc ([`scopes`]):
//! those the JIT inlined, innermost first, then the one it compiled, each at
//! the line of its bytecode. Java 17 and 25 are tested; versions between
//! them are read with the same rules where their tables have the same
//! fields.
//!
//! What may depend on this: [`super::runtime`] (which runtime a process
//! runs) and the collector, which walks a Java thread's stack through
//! [`JvmProcess::blob`] and [`step`].

mod codecache;
mod scopes;
mod vmstructs;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use codecache::Named;
pub use codecache::{Blob, Frame as JavaFrame, Regs, step};

use super::interp::{Code, InterpFrame, ReadCache, read_mem, read_u16, read_u32, read_u64};
use super::jvmlines::{decode_lines, line_at};
use super::state_budget::StateBudget;
use codecache::Heap;
use vmstructs::{Layout, NoLayout, SYMBOLS, Tables};

/// Methods (and blobs) kept per process at most, and their bytes.
const MAX_METHODS: usize = 8192;
const MAX_METHOD_BYTES: usize = 8 << 20;
/// How long after a failed read of the tables or the heaps they are read
/// again (a JVM starting up has not filled them yet).
const RETRY: Duration = Duration::from_secs(1);
/// [`InterpFrame::instr`] of a compiled scope: this bit, and its bytecode
/// index plus one (0: at the method's entry); an interpreted frame's is its
/// bytecode pointer.
const COMPILED: u64 = 1 << 63;
/// Blob names kept per process at most (libjvm has a few dozen).
const MAX_NAMES: usize = 256;
/// The longest class or method name read.
const MAX_SYMBOL: usize = 512;
/// The most bytes of a line number table read.
const MAX_LINE_TABLE: usize = 16 << 10;

/// Whether `path` is HotSpot's library.
pub fn is_jvm(path: &str) -> bool {
    path.rsplit('/').next() == Some("libjvm.so")
}

/// Where `libjvm.so`'s tables are (file addresses of [`SYMBOLS`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JvmBinary {
    tables: [u64; SYMBOLS.len()],
}

/// Reads `libjvm.so`'s table symbols; `None` when one is missing.
pub fn read_symbols<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<JvmBinary> {
    use object::{Object, ObjectSymbol};
    let mut tables = [0u64; SYMBOLS.len()];
    for sym in elf.dynamic_symbols() {
        let Ok(name) = sym.name() else { continue };
        if let Some(i) = SYMBOLS.iter().position(|&s| s == name) {
            tables[i] = sym.address();
        }
    }
    tables
        .iter()
        .all(|&a| a != 0)
        .then_some(JvmBinary { tables })
}

/// The methods (`Method*`) at a compiled frame's pc, innermost first, each
/// with its bytecode index plus one.
type Scopes = Arc<[(u64, u32)]>;

/// A method as read: its name and file, and its line number table.
#[derive(Debug, Clone)]
struct Method {
    code: Arc<Code>,
    /// Where its bytecodes start in the process, and how many there are.
    bytecodes: u64,
    code_size: u64,
    /// (bytecode index, line), in the table's order.
    lines: Arc<[(u32, u32)]>,
}

/// A JVM process: its layout once read, its code cache's heaps, and the
/// methods and scopes read (charged to the state budget).
#[derive(Debug)]
pub struct JvmProcess {
    pid: u32,
    tables: Tables,
    layout: Option<Layout>,
    /// Its tables lack a field the walker needs: not read again.
    unknown: bool,
    heaps: Vec<Heap>,
    /// When the layout or the heaps may be read again after a failure.
    retry_at: Option<Instant>,
    /// What each blob name (a static string of libjvm) says, by address.
    names: HashMap<u64, Named>,
    methods: ReadCache<Method>,
    /// The methods and bytecode indices plus one at a compiled frame's pc,
    /// with the `PcDesc`s' address of the nmethod they were read from (the
    /// code cache reuses its blocks: a pc of another nmethod is read
    /// again).
    scopes: ReadCache<(u64, Scopes)>,
}

impl JvmProcess {
    /// `bias` is what `libjvm.so`'s addresses are moved by in the process.
    pub fn new(pid: u32, binary: &JvmBinary, bias: u64, budget: &Arc<StateBudget>) -> Self {
        JvmProcess {
            pid,
            tables: Tables(binary.tables.map(|a| a.wrapping_add(bias))),
            layout: None,
            unknown: false,
            heaps: Vec::new(),
            retry_at: None,
            names: HashMap::new(),
            methods: ReadCache::new(budget, MAX_METHODS, MAX_METHOD_BYTES),
            scopes: ReadCache::new(budget, MAX_METHODS, MAX_METHOD_BYTES),
        }
    }

    /// Where its tables are: the same in a process until it runs another
    /// JVM.
    pub fn id(&self) -> u64 {
        self.tables.0[0]
    }

    /// Reads the layout and the heaps when not yet read (at most once a
    /// second after a failure).
    fn ready(&mut self) -> Option<&Layout> {
        if self.layout.is_none() || self.heaps.is_empty() {
            let now = Instant::now();
            if self.unknown || self.retry_at.is_some_and(|at| now < at) {
                return None;
            }
            if self.layout.is_none() {
                match vmstructs::read(self.pid, &self.tables) {
                    Ok(l) => self.layout = Some(l),
                    Err(NoLayout::Unknown) => {
                        self.unknown = true;
                        return None;
                    }
                    Err(NoLayout::Unreadable) => {}
                }
            }
            if let Some(l) = &self.layout {
                self.heaps = codecache::heaps(self.pid, l);
            }
            if self.layout.is_none() || self.heaps.is_empty() {
                self.retry_at = Some(now + RETRY);
                return None;
            }
        }
        self.layout.as_ref()
    }

    /// The blob of the code cache holding `pc`, when one does: read at
    /// each frame (blocks are freed and reused as code is compiled again or
    /// unloaded), in two reads, the segment map's and the blob's header.
    pub fn blob(&mut self, pc: u64) -> Option<Blob> {
        let pid = self.pid;
        self.ready()?;
        let heap = *self.heaps.iter().find(|h| (h.low..h.high).contains(&pc))?;
        let block = heap.block_at(pid, pc)?;
        let l = self.layout.as_ref()?;
        let names = &mut self.names;
        codecache::read_blob(pid, l, block, |name| {
            if names.len() >= MAX_NAMES {
                names.clear();
            }
            *names
                .entry(name)
                .or_insert_with(|| codecache::named(pid, name))
        })
    }

    /// The Java frames of one frame of the stack, innermost first: a
    /// compiled frame's methods at `pc` (those it inlined, then itself), an
    /// interpreted frame's method at its bytecode, none for a stub.
    /// `return_address`: `pc` is a caller's (not the sample's own).
    pub fn java_frames(
        &mut self,
        frame: JavaFrame,
        pc: u64,
        return_address: bool,
    ) -> Vec<InterpFrame> {
        let frame_of = |code, instr| InterpFrame {
            code,
            instr,
            last: false,
        };
        match frame {
            JavaFrame::Interpreted(method, bcp) => vec![frame_of(method, bcp)],
            JavaFrame::Stub => Vec::new(),
            JavaFrame::Compiled(c) => {
                let (pid, Some(l)) = (self.pid, self.layout.clone()) else {
                    return Vec::new();
                };
                let key = pc ^ (u64::from(return_address) << 63);
                let found = self
                    .scopes
                    .get_valid(
                        key,
                        |&(pcs, _)| pcs == c.pcs,
                        || Some((c.pcs, scopes::at(pid, &l, &c, pc, return_address).into())),
                        |(_, s)| s.len() * 16,
                    )
                    .map_or_else(|| Arc::from([]), |(_, s)| s);
                if found.is_empty() {
                    // No scope at the pc (its code's entry or exit, or a
                    // table that could not be read): the method, at its
                    // entry, as HotSpot answers there.
                    return vec![frame_of(c.method, COMPILED)];
                }
                found
                    .iter()
                    .map(|&(method, bci1)| frame_of(method, COMPILED | u64::from(bci1)))
                    .collect()
            }
        }
    }

    /// The method of `f` and its line: its bytecode's (an interpreted
    /// frame's, or a compiled scope's), the method's first at its entry.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let pid = self.pid;
        let l = self.layout.clone()?;
        let m = self.methods.get(
            f.code,
            || read_method(pid, &l, f.code),
            |m| m.code.name.len() + m.code.file.len() + m.lines.len() * 8,
        )?;
        let line = match f.instr.checked_sub(m.bytecodes) {
            _ if f.instr & COMPILED != 0 => match (f.instr as u32).checked_sub(1) {
                Some(bci) => line_at(&m.lines, bci),
                None => m.code.first_line,
            },
            Some(bci) if bci < m.code_size.max(1) => line_at(&m.lines, bci as u32),
            _ => m.code.first_line,
        };
        Some((m.code, line))
    }
}

/// A `Symbol`'s text, at most [`MAX_SYMBOL`] bytes.
fn symbol(pid: u32, l: &Layout, addr: u64) -> Option<String> {
    let len = usize::from(read_u16(
        pid,
        addr.checked_add(u64::from(l.symbol_length))?,
    )?);
    let mut buf = vec![0u8; len.min(MAX_SYMBOL)];
    read_mem(pid, addr.wrapping_add(u64::from(l.symbol_body)), &mut buf)
        .then(|| String::from_utf8_lossy(&buf).into_owned())
}

/// Reads the method at `method`: `package/Class.name`, its file
/// (`package/Source.java`), and its line number table.
fn read_method(pid: u32, l: &Layout, method: u64) -> Option<Method> {
    let cm = read_u64(pid, method.checked_add(u64::from(l.method_const))?)?;
    let pool = read_u64(pid, cm.checked_add(u64::from(l.const_constants))?)?;
    let entry = |index: u16| {
        read_u64(
            pid,
            pool.wrapping_add(u64::from(l.pool_size) + 8 * u64::from(index)),
        )
    };
    let holder = read_u64(pid, pool.checked_add(u64::from(l.pool_holder))?)?;
    let class = symbol(
        pid,
        l,
        read_u64(pid, holder.wrapping_add(u64::from(l.klass_name)))?,
    )?;
    let name_index = read_u16(pid, cm.wrapping_add(u64::from(l.const_name_index)))?;
    let name = symbol(pid, l, entry(name_index)?)?;
    let source = match read_u16(pid, pool.wrapping_add(u64::from(l.pool_source_file))) {
        Some(i) if i != 0 => entry(i).and_then(|s| symbol(pid, l, s)),
        _ => None,
    };
    let file = match (source, class.rsplit_once('/')) {
        (Some(src), Some((package, _))) => format!("{package}/{src}"),
        (Some(src), None) => src,
        (None, _) => format!("{class}.java"),
    };
    let code_size = u64::from(read_u16(
        pid,
        cm.wrapping_add(u64::from(l.const_code_size)),
    )?);
    let flags = if l.const_flags_u4 {
        read_u32(pid, cm.wrapping_add(u64::from(l.const_flags)))?
    } else {
        u32::from(read_u16(pid, cm.wrapping_add(u64::from(l.const_flags)))?)
    };
    let bytecodes = cm.wrapping_add(u64::from(l.const_size));
    let lines: Arc<[(u32, u32)]> = if flags & l.has_line_table != 0 {
        let mut table = vec![0u8; MAX_LINE_TABLE];
        let at = bytecodes.wrapping_add(code_size);
        // To the end of its page first: the table may end near one.
        let first = (0x1000 - (at & 0xfff) as usize).min(table.len());
        let n = if read_mem(pid, at, &mut table) {
            table.len()
        } else if read_mem(pid, at, &mut table[..first]) {
            first
        } else {
            0
        };
        decode_lines(&table[..n], l.const_flags_u4).into()
    } else {
        Arc::from([])
    };
    let first_line = lines.iter().map(|&(_, line)| line).min().unwrap_or(0);
    Some(Method {
        code: Arc::new(Code {
            name: format!("{class}.{name}").into(),
            file: file.into(),
            first_line,
            lines: Box::new([]),
        }),
        bytecodes,
        code_size,
        lines,
    })
}
