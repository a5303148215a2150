//! Node (V8) processes, named with no flag and no perf map: V8 keeps a
//! frame pointer in every frame of JavaScript it runs (interpreted, baseline
//! or optimized), with the function being run at a fixed slot below it. The
//! native unwinder already walks those frames by their frame pointers; here
//! a frame whose code is V8's (its JIT code, which no file maps, or the
//! builtins embedded in the `node` binary, the interpreter among them) is
//! looked at: if the slot holds a `JSFunction`, the frame is that
//! function's, named from its `SharedFunctionInfo` (its name, or the one V8
//! inferred for an anonymous function, `Module._compile`) and its script's
//! name (the file, or `node:internal/...`).
//!
//! Where the slot and the fields are comes from V8's post-mortem metadata,
//! the `v8dbg_*` symbols the `node` binary exports (as llnode reads them):
//! offsets of fields, instance types, string tags. A function's name sits in
//! its scope info after the context locals' names and details; a function
//! with none is named `(anonymous)`, as Node's own profiler names it.
//!
//! Not yet: lines (0), and functions the optimizing compiler inlined (their
//! samples are the outer function's). Objects are read from the process's
//! memory after the sample, and kept by address: a function moved by the
//! garbage collector is read again at its new address, and one whose old
//! address a new function takes shows the old name until the cache starts
//! over.
//!
//! What may depend on this: [`super::runtime`], and the unwinder, which
//! asks [`V8Process::function_at`] for frames in V8's code.

use std::ops::Range;
use std::sync::Arc;

use super::interp::{Code, InterpFrame, ReadCache, read_mem, read_u16, read_u32, read_u64};
use super::state_budget::StateBudget;

/// The `v8dbg_` symbols read (each an `int`), in this order.
const SYMBOLS: [&str; 22] = [
    "v8dbg_off_fp_function",
    "v8dbg_type_JSFunction__JS_FUNCTION_TYPE",
    "v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE",
    "v8dbg_type_Script__SCRIPT_TYPE",
    "v8dbg_FirstNonstringType",
    "v8dbg_class_HeapObject__map__Map",
    "v8dbg_class_Map__instance_type__uint16_t",
    "v8dbg_class_JSFunction__shared__SharedFunctionInfo",
    "v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object",
    "v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject",
    "v8dbg_class_Script__name__Object",
    "v8dbg_class_String__length__int32_t",
    "v8dbg_class_SeqOneByteString__chars__char",
    "v8dbg_class_SeqTwoByteString__chars__char",
    "v8dbg_class_ConsString__first__String",
    "v8dbg_class_ConsString__second__String",
    "v8dbg_class_ThinString__actual__String",
    "v8dbg_StringRepresentationMask",
    "v8dbg_StringEncodingMask",
    "v8dbg_SeqStringTag",
    "v8dbg_ConsStringTag",
    "v8dbg_ThinStringTag",
];
/// Also read: one-byte strings' tag, and the scope info's slots.
const MORE: [&str; 3] = [
    "v8dbg_OneByteStringTag",
    "v8dbg_scopeinfo_idx_first_vars",
    "v8dbg_scopeinfo_idx_ncontextlocals",
];
const N: usize = SYMBOLS.len() + MORE.len();

/// Functions kept per process at most, and their bytes.
const MAX_FUNCTIONS: usize = 8192;
const MAX_FUNCTION_BYTES: usize = 8 << 20;
/// The longest name read, in characters, and the deepest cons string.
const MAX_CHARS: usize = 256;
const MAX_CONS_DEPTH: usize = 8;
/// V8 keeps at most this many context locals' names in the scope info
/// itself (more go to a hash table in one slot).
const MAX_INLINED_LOCAL_NAMES: u64 = 75;

/// Whether `path` is Node's executable (or its shared library).
pub fn is_node(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "node" || name == "nodejs" || name.starts_with("libnode.so")
}

/// Where a `node` binary's metadata and embedded builtins are (file
/// addresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V8Binary {
    symbols: [u64; N],
    builtins: Range<u64>,
}

/// Reads the metadata's symbols and the builtins' range (from the
/// `Builtins_*` symbols); `None` when one is missing.
pub fn read_symbols<'d, R: object::ReadRef<'d>>(elf: &object::File<'d, R>) -> Option<V8Binary> {
    use object::{Object, ObjectSymbol};
    let mut symbols = [0u64; N];
    let (mut low, mut high) = (u64::MAX, 0);
    for sym in elf.dynamic_symbols().chain(elf.symbols()) {
        let Ok(name) = sym.name() else { continue };
        if name.starts_with("Builtins_") && sym.address() != 0 {
            low = low.min(sym.address());
            high = high.max(sym.address().saturating_add(sym.size().max(1)));
        } else if let Some(i) = SYMBOLS.iter().chain(&MORE).position(|&s| s == name) {
            symbols[i] = sym.address();
        }
    }
    (symbols.iter().all(|&a| a != 0) && low < high).then_some(V8Binary {
        symbols,
        builtins: low..high,
    })
}

/// The metadata's values, as read from the process.
#[derive(Debug, Clone, Copy)]
struct Meta([i64; N]);

impl Meta {
    fn get(&self, name: &str) -> i64 {
        let i = SYMBOLS.iter().chain(&MORE).position(|&s| s == name);
        i.map_or(0, |i| self.0[i])
    }
}

/// A Node process: where its metadata and builtins are, and the functions
/// read (charged to the state budget).
#[derive(Debug)]
pub struct V8Process {
    pid: u32,
    symbols: [u64; N],
    builtins: Range<u64>,
    meta: Option<Meta>,
    functions: ReadCache<Arc<Code>>,
}

impl V8Process {
    /// `bias` is what the binary's addresses are moved by in the process.
    pub fn new(pid: u32, binary: &V8Binary, bias: u64, budget: &Arc<StateBudget>) -> Self {
        let b = &binary.builtins;
        V8Process {
            pid,
            symbols: binary.symbols.map(|a| a.wrapping_add(bias)),
            builtins: b.start.wrapping_add(bias)..b.end.wrapping_add(bias),
            meta: None,
            functions: ReadCache::new(budget, MAX_FUNCTIONS, MAX_FUNCTION_BYTES),
        }
    }

    /// Where its metadata is: the same until the process runs another V8.
    pub fn id(&self) -> u64 {
        self.symbols[0]
    }

    /// Whether `pc` is in the builtins embedded in the binary (the
    /// interpreter's among them).
    pub fn in_builtins(&self, pc: u64) -> bool {
        self.builtins.contains(&pc)
    }

    fn meta(&mut self) -> Option<Meta> {
        if self.meta.is_none() {
            let mut values = [0i64; N];
            for (v, &addr) in values.iter_mut().zip(&self.symbols) {
                *v = i64::from(read_u32(self.pid, addr)? as i32);
            }
            self.meta = Some(Meta(values));
        }
        self.meta
    }

    /// The JavaScript frame whose frame pointer is `fp`, when the slot
    /// below it holds a function (`read` reads the copied stack): its
    /// `SharedFunctionInfo`'s address as the frame's code.
    pub fn function_at(
        &mut self,
        fp: u64,
        read: impl FnOnce(u64) -> Option<u64>,
    ) -> Option<InterpFrame> {
        let m = self.meta()?;
        let slot = fp.checked_add_signed(m.get("v8dbg_off_fp_function"))?;
        let function = read(slot)?;
        if !is_object(function)
            || instance_type(self.pid, &m, function)?
                != m.get("v8dbg_type_JSFunction__JS_FUNCTION_TYPE")
        {
            return None;
        }
        let shared = field(
            self.pid,
            function,
            m.get("v8dbg_class_JSFunction__shared__SharedFunctionInfo"),
        )?;
        is_object(shared).then_some(InterpFrame {
            code: shared,
            instr: 0,
            last: false,
        })
    }

    /// The function of `f` (its name and script), at line 0 (lines are not
    /// read yet).
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let m = self.meta()?;
        let pid = self.pid;
        let code = self.functions.get(
            f.code,
            || read_function(pid, &m, f.code),
            |c| c.name.len() + c.file.len(),
        )?;
        Some((code, 0))
    }
}

/// Whether `v` is a tagged pointer to a heap object.
fn is_object(v: u64) -> bool {
    v & 3 == 1
}

/// The tagged field at `offset` of the heap object `object`.
fn field(pid: u32, object: u64, offset: i64) -> Option<u64> {
    read_u64(pid, (object - 1).checked_add_signed(offset)?)
}

fn instance_type(pid: u32, m: &Meta, object: u64) -> Option<i64> {
    let map = field(pid, object, m.get("v8dbg_class_HeapObject__map__Map"))?;
    if !is_object(map) {
        return None;
    }
    let at = (map - 1).checked_add_signed(m.get("v8dbg_class_Map__instance_type__uint16_t"))?;
    read_u16(pid, at).map(i64::from)
}

/// The text of the string `s` (sequential, cons or thin), at most
/// [`MAX_CHARS`] characters; `None` for anything else.
fn string(pid: u32, m: &Meta, s: u64, depth: usize) -> Option<String> {
    if !is_object(s) || depth > MAX_CONS_DEPTH {
        return None;
    }
    let t = instance_type(pid, m, s)?;
    if t >= m.get("v8dbg_FirstNonstringType") {
        return None;
    }
    let len_at = (s - 1).checked_add_signed(m.get("v8dbg_class_String__length__int32_t"))?;
    let len = usize::try_from(read_u32(pid, len_at)? as i32)
        .ok()?
        .min(MAX_CHARS);
    let repr = t & m.get("v8dbg_StringRepresentationMask");
    if repr == m.get("v8dbg_SeqStringTag") {
        let one_byte = t & m.get("v8dbg_StringEncodingMask") == m.get("v8dbg_OneByteStringTag");
        if one_byte {
            let mut chars = vec![0u8; len];
            let at =
                (s - 1).checked_add_signed(m.get("v8dbg_class_SeqOneByteString__chars__char"))?;
            read_mem(pid, at, &mut chars).then(|| chars.iter().map(|&c| char::from(c)).collect())
        } else {
            let mut chars = vec![0u8; len * 2];
            let at =
                (s - 1).checked_add_signed(m.get("v8dbg_class_SeqTwoByteString__chars__char"))?;
            read_mem(pid, at, &mut chars).then(|| {
                let units: Vec<u16> = chars
                    .chunks_exact(2)
                    .map(|c| u16::from_le_bytes([c[0], c[1]]))
                    .collect();
                String::from_utf16_lossy(&units)
            })
        }
    } else if repr == m.get("v8dbg_ConsStringTag") {
        let first = field(pid, s, m.get("v8dbg_class_ConsString__first__String"))?;
        let second = field(pid, s, m.get("v8dbg_class_ConsString__second__String"))?;
        let mut text = string(pid, m, first, depth + 1)?;
        if text.chars().count() < MAX_CHARS {
            text.push_str(&string(pid, m, second, depth + 1).unwrap_or_default());
        }
        Some(text.chars().take(MAX_CHARS).collect())
    } else if repr == m.get("v8dbg_ThinStringTag") {
        let actual = field(pid, s, m.get("v8dbg_class_ThinString__actual__String"))?;
        string(pid, m, actual, depth + 1)
    } else {
        None
    }
}

/// A function's name from its scope info: the first non-empty string
/// after the context locals' names (or their table) and details: the
/// function's own name, else the one V8 inferred.
fn scope_info_name(pid: u32, m: &Meta, info: u64) -> Option<String> {
    let slot = |i: u64| read_u64(pid, info.wrapping_add(7).wrapping_add(8 * i));
    let first = u64::try_from(m.get("v8dbg_scopeinfo_idx_first_vars")).ok()?;
    let count_slot = u64::try_from(m.get("v8dbg_scopeinfo_idx_ncontextlocals")).ok()?;
    // A Smi: the value in the upper half.
    let locals = slot(count_slot)? >> 32;
    if locals > 1 << 16 {
        return None;
    }
    let names = if locals < MAX_INLINED_LOCAL_NAMES {
        locals
    } else {
        1
    };
    let start = first + names + locals;
    (start..start + 4).find_map(|i| {
        let v = slot(i)?;
        string(pid, m, v, 0).filter(|s| !s.is_empty())
    })
}

/// Reads the `SharedFunctionInfo` at `shared`: its name and its script's.
fn read_function(pid: u32, m: &Meta, shared: u64) -> Option<Arc<Code>> {
    let name_or_info = field(
        pid,
        shared,
        m.get("v8dbg_class_SharedFunctionInfo__name_or_scope_info__Object"),
    )?;
    let name = if !is_object(name_or_info) {
        None
    } else if instance_type(pid, m, name_or_info)? == m.get("v8dbg_type_ScopeInfo__SCOPE_INFO_TYPE")
    {
        scope_info_name(pid, m, name_or_info)
    } else {
        string(pid, m, name_or_info, 0).filter(|s| !s.is_empty())
    };
    let script = field(
        pid,
        shared,
        m.get("v8dbg_class_SharedFunctionInfo__script_or_debug_info__HeapObject"),
    )
    .filter(|&s| {
        is_object(s) && instance_type(pid, m, s) == Some(m.get("v8dbg_type_Script__SCRIPT_TYPE"))
    })
    .and_then(|s| field(pid, s, m.get("v8dbg_class_Script__name__Object")))
    .and_then(|n| string(pid, m, n, 0));
    Some(Arc::new(Code {
        name: name.unwrap_or_else(|| "(anonymous)".into()).into(),
        file: script.unwrap_or_default().into(),
        first_line: 0,
        lines: Box::new([]),
    }))
}
