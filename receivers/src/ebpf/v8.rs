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
//! offsets of fields, instance types, string tags ([`names`]).
//!
//! Lines ([`code`], [`source`], [`super::v8lines`]): an interpreted frame
//! is at its bytecode's line, an optimized one (Maglev, TurboFan) at its
//! pc's, with the functions the compiler inlined there as frames of their
//! own; a baseline frame, code replaced on the stack, and any frame whose
//! position is not found, at its function's first line. Positions become
//! lines by the script's line ends, found by reading its source once
//! (at most 64 Mi characters a minute per process). Four offsets are not in
//! the metadata ([`Layout`]); they are known for V8 11.3 (Node 20), read
//! from its version symbols. What they lead to is checked before it is
//! used: the pc must be inside the instructions a function's code header
//! gives, and the tables, bytecode, deoptimization data, literal array and
//! functions read must be of the type expected. Another V8 is named with
//! every frame at line 0.
//!
//! At the sample, the function's slot and its bytecode offset are read from
//! the copied stack, and, the first time a pc is seen in a function's code,
//! that code's header from the process. The rest is read from the
//! process's memory after the sample, and kept by address (functions,
//! optimized code, scripts' line ends, code ranges): a function moved by the
//! garbage collector is read again at its new address, and one whose old
//! address a new function (or script, or code) takes is shown as the old
//! one until the cache starts over. An interpreted function's slot holds
//! the bytecode offset of its last call, so the innermost frame, if
//! interpreted and in a loop without calls, is at that call's line.
//!
//! What may depend on this: [`super::runtime`], and the unwinder, which
//! asks [`V8Process::functions_at`] for frames in V8's code.

mod code;
mod names;
mod source;

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use super::interp::{Code, InterpFrame, ReadCache, read_u16, read_u32, read_u64};
use super::state_budget::{CacheCharge, StateBudget};
use super::v8lines::{FUNCTION_ENTRY, Table, position_in, script_offset};
use code::Optimized;
use source::Scripts;

/// The `v8dbg_` symbols every process needs (each an `int`), in this order.
const SYMBOLS: [&str; 25] = [
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
    "v8dbg_OneByteStringTag",
    "v8dbg_scopeinfo_idx_first_vars",
    "v8dbg_scopeinfo_idx_ncontextlocals",
];
/// Read when there, for lines: without them frames are at line 0.
const LINE_SYMBOLS: [&str; 27] = [
    "v8dbg_off_fp_bytecode_offset",
    "v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE",
    "v8dbg_type_ByteArray__BYTE_ARRAY_TYPE",
    "v8dbg_type_Code__CODE_TYPE",
    "v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE",
    "v8dbg_type_FixedArray__FIXED_ARRAY_TYPE",
    "v8dbg_type_WeakFixedArray__WEAK_FIXED_ARRAY_TYPE",
    "v8dbg_class_BytecodeArray__data__uintptr_t",
    "v8dbg_class_SharedFunctionInfo__function_data__Object",
    "v8dbg_class_Script__source__Object",
    "v8dbg_class_Code__source_position_table__ByteArray",
    "v8dbg_class_Code__deoptimization_data__FixedArray",
    "v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject",
    "v8dbg_class_FixedArray__data__uintptr_t",
    "v8dbg_class_FixedArrayBase__length__SMI",
    "v8dbg_CodeKindFieldMask",
    "v8dbg_CodeKindFieldShift",
    "v8dbg_CodeKindBaseline",
    "v8dbg_DeoptimizationDataInliningPositionsIndex",
    "v8dbg_DeoptimizationDataLiteralArrayIndex",
    "v8dbg_class_SlicedString__parent__String",
    "v8dbg_class_SlicedString__offset__SMI",
    "v8dbg_SlicedStringTag",
    "v8dbg_ExternalStringTag",
    "v8dbg_class_ExternalString__resource__Object",
    // Not metadata: V8's version, `v8::internal::Version::major_`, `minor_`.
    "_ZN2v88internal7Version6major_E",
    "_ZN2v88internal7Version6minor_E",
];
const N: usize = SYMBOLS.len() + LINE_SYMBOLS.len();

/// Functions kept per process at most, and their bytes; the same for
/// optimized code objects and for scripts' line ends.
const MAX_FUNCTIONS: usize = 8192;
const MAX_FUNCTION_BYTES: usize = 8 << 20;
const MAX_CODES: usize = 4096;
const MAX_CODE_BYTES: usize = 8 << 20;
/// The largest optimized function believed, in bytes of instructions.
const MAX_CODE_SIZE: u64 = 64 << 20;
/// Bytes a known code range is charged.
const RANGE_BYTES: usize = 64;

/// `JS_FUNCTION_TYPE` and the types after it that are functions too (class
/// and built-in constructors), in V8 11.
const FUNCTION_TYPES: i64 = 16;

/// A frame's `instr`: where in its function the frame is. 0: not known
/// (the function's first line); else this tag and a script offset, or the
/// other tag and a bytecode offset (resolved by the function's table).
const AT_SCRIPT_OFFSET: u64 = 1 << 62;
const AT_BYTECODE: u64 = 1 << 61;

/// Whether `path` is Node's executable (or its shared library).
pub fn is_node(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name == "node" || name == "nodejs" || name.starts_with("libnode.so")
}

/// Where a `node` binary's metadata and embedded builtins are (file
/// addresses; 0 for a line symbol it lacks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct V8Binary {
    symbols: Box<[u64; N]>,
    builtins: Range<u64>,
}

/// Reads the metadata's symbols and the builtins' range (from the
/// `Builtins_*` symbols); `None` when one every process needs is missing.
pub fn read_symbols<'d, R: object::ReadRef<'d>>(
    elf: &object::File<'d, R>,
    release: &dyn Fn(),
) -> Option<V8Binary> {
    use object::ObjectSymbol;
    let mut symbols = [0u64; N];
    let (mut low, mut high) = (u64::MAX, 0);
    for sym in super::interp::symbols(elf, release, true) {
        let Ok(name) = sym.name() else { continue };
        if name.starts_with("Builtins_") && sym.address() != 0 {
            low = low.min(sym.address());
            high = high.max(sym.address().saturating_add(sym.size().max(1)));
        } else if let Some(i) = SYMBOLS.iter().chain(&LINE_SYMBOLS).position(|&s| s == name) {
            symbols[i] = sym.address();
        }
    }
    let needed = symbols[..SYMBOLS.len()].iter().all(|&a| a != 0);
    (needed && low < high).then_some(V8Binary {
        symbols: Box::new(symbols),
        builtins: low..high,
    })
}

/// The metadata's values, as read from the process (`None`: a line symbol
/// the binary lacks).
#[derive(Debug, Clone, Copy)]
struct Meta([Option<i64>; N]);

impl Meta {
    fn index(name: &str) -> Option<usize> {
        SYMBOLS.iter().chain(&LINE_SYMBOLS).position(|&s| s == name)
    }

    /// A symbol every process has (0 if not, which no caller reaches).
    fn get(&self, name: &str) -> i64 {
        self.opt(name).unwrap_or(0)
    }

    /// A line symbol, when the binary has it.
    fn opt(&self, name: &str) -> Option<i64> {
        self.0[Meta::index(name)?]
    }
}

/// The offsets lines need that the metadata does not give, known for one
/// V8 (11.3) and checked against the metadata's neighbours; `None` for
/// another.
#[derive(Debug, Clone, Copy, Default)]
struct Layout {
    /// `JSFunction::code`: right after `shared`, its feedback cell and
    /// context.
    function_code: Option<i64>,
    /// `Code`'s instruction start (then its flags, builtin id and
    /// instruction size), 16 bytes after its source position table.
    code_entry: Option<u64>,
    /// `BytecodeArray::source_position_table`.
    bytecode_positions: Option<i64>,
    /// An external string's cached pointer to its characters, after its
    /// resource.
    external_data: Option<u64>,
}

impl Layout {
    fn of(m: &Meta) -> Layout {
        let is = |name: &str, v: i64| m.opt(name) == Some(v);
        let v11_3 = is("_ZN2v88internal7Version6major_E", 11)
            && is("_ZN2v88internal7Version6minor_E", 3)
            && is("v8dbg_class_JSFunction__shared__SharedFunctionInfo", 24)
            && is("v8dbg_class_Code__source_position_table__ByteArray", 24)
            && is("v8dbg_class_Code__deoptimization_data__FixedArray", 16)
            && is("v8dbg_class_BytecodeArray__data__uintptr_t", 54)
            && is("v8dbg_class_ExternalString__resource__Object", 16);
        if !v11_3 {
            return Layout::default();
        }
        Layout {
            function_code: Some(48),
            code_entry: Some(40),
            bytecode_positions: Some(32),
            external_data: Some(24),
        }
    }
}

/// A function as kept: its name and file, its script, its bytecode's
/// positions.
#[derive(Debug)]
struct Function {
    code: Arc<Code>,
    script: u64,
    bytecode: Table,
}

/// A Node process: where its metadata and builtins are, and the functions,
/// optimized code and scripts read (charged to the state budget).
#[derive(Debug)]
pub struct V8Process {
    pid: u32,
    symbols: [u64; N],
    builtins: Range<u64>,
    meta: Option<(Meta, Layout)>,
    functions: ReadCache<Arc<Function>>,
    codes: ReadCache<Arc<Optimized>>,
    /// Functions' code by where its instructions start, as read:
    /// at most [`MAX_CODES`], charged.
    code_ranges: BTreeMap<u64, CodeRange>,
    ranges_charge: CacheCharge,
    scripts: Scripts,
}

/// A function's code as read: where its instructions end, its `Code`,
/// the function's `SharedFunctionInfo`, whether it is optimized.
#[derive(Debug, Clone, Copy)]
struct CodeRange {
    end: u64,
    code: u64,
    shared: u64,
    optimized: bool,
}

impl V8Process {
    /// `bias` is what the binary's addresses are moved by in the process.
    pub fn new(pid: u32, binary: &V8Binary, bias: u64, budget: &Arc<StateBudget>) -> Self {
        let b = &binary.builtins;
        V8Process {
            pid,
            symbols: binary
                .symbols
                .map(|a| if a == 0 { 0 } else { a.wrapping_add(bias) }),
            builtins: b.start.wrapping_add(bias)..b.end.wrapping_add(bias),
            meta: None,
            functions: ReadCache::new(budget, MAX_FUNCTIONS, MAX_FUNCTION_BYTES),
            codes: ReadCache::new(budget, MAX_CODES, MAX_CODE_BYTES),
            code_ranges: BTreeMap::new(),
            ranges_charge: CacheCharge::new(budget),
            scripts: Scripts::new(budget),
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

    fn meta(&mut self) -> Option<(Meta, Layout)> {
        if self.meta.is_none() {
            let mut values = [None; N];
            for (i, (v, &addr)) in values.iter_mut().zip(&self.symbols).enumerate() {
                let read = if addr == 0 {
                    None
                } else {
                    read_u32(self.pid, addr)
                };
                if read.is_none() && i < SYMBOLS.len() {
                    return None;
                }
                *v = read.map(|r| i64::from(r as i32));
            }
            let m = Meta(values);
            self.meta = Some((m, Layout::of(&m)));
        }
        self.meta
    }

    /// The JavaScript frames of the frame whose frame pointer is `fp` and
    /// whose pc is `pc` (a return address when `is_return`), when the slot
    /// below it holds a function (`read` reads the copied stack): one, or
    /// with the functions optimized code inlined at `pc`, innermost first.
    /// Each has a `SharedFunctionInfo`'s address as its code.
    pub fn functions_at(
        &mut self,
        fp: u64,
        pc: u64,
        is_return: bool,
        mut read: impl FnMut(u64) -> Option<u64>,
    ) -> Vec<InterpFrame> {
        let Some((m, layout)) = self.meta() else {
            return Vec::new();
        };
        let pid = self.pid;
        let Some((function, shared)) = fp
            .checked_add_signed(m.get("v8dbg_off_fp_function"))
            .and_then(&mut read)
            .and_then(|f| function_and_shared(pid, &m, f))
        else {
            return Vec::new();
        };
        let frame = |code, instr| InterpFrame {
            code,
            instr,
            last: false,
        };
        if self.in_builtins(pc) {
            // The interpreter's: the bytecode offset is in its slot.
            let offset = m
                .opt("v8dbg_off_fp_bytecode_offset")
                .and_then(|o| fp.checked_add_signed(o))
                .and_then(&mut read)
                .and_then(smi)
                .and_then(|v| {
                    v.checked_sub(m.opt("v8dbg_class_BytecodeArray__data__uintptr_t")? - 1)
                })
                .and_then(|o| u64::try_from(o).ok())
                .filter(|&o| o < AT_BYTECODE);
            return vec![frame(shared, offset.map_or(0, |o| AT_BYTECODE | o))];
        }
        let Some(optimized) = self.optimized(&m, &layout, function, shared, pc) else {
            return vec![frame(shared, 0)];
        };
        let offset = (pc - optimized.entry) as i64 - i64::from(is_return);
        optimized
            .frames(offset, shared)
            .into_iter()
            .map(|(code, position)| {
                let at = script_offset(position).map_or(0, |o| AT_SCRIPT_OFFSET | u64::from(o));
                frame(code, at)
            })
            .collect()
    }

    /// The optimized code `pc` is in, of the function whose
    /// `SharedFunctionInfo` is `shared`: found by its instructions' range
    /// once read (no read), else read from `function` (two reads).
    fn optimized(
        &mut self,
        m: &Meta,
        layout: &Layout,
        function: u64,
        shared: u64,
        pc: u64,
    ) -> Option<Arc<Optimized>> {
        let pid = self.pid;
        let known = self
            .code_ranges
            .range(..=pc)
            .next_back()
            .filter(|&(_, r)| pc < r.end && r.shared == shared)
            .map(|(&entry, &r)| (entry, r));
        let (entry, range) = match known {
            Some(known) => known,
            None => {
                let (code, entry, size, optimized) = code::code_of(pid, m, layout, function)?;
                let end = entry.checked_add(size).filter(|_| size <= MAX_CODE_SIZE)?;
                if !(entry..end).contains(&pc) {
                    return None;
                }
                if self.code_ranges.len() >= MAX_CODES {
                    self.code_ranges.clear();
                    self.ranges_charge.clear();
                }
                let range = CodeRange {
                    end,
                    code,
                    shared,
                    optimized,
                };
                if self.ranges_charge.take(RANGE_BYTES) {
                    self.code_ranges.insert(entry, range);
                }
                (entry, range)
            }
        };
        if !range.optimized {
            return None;
        }
        let (code, size) = (range.code, range.end - entry);
        self.codes.get_valid(
            code,
            |o| o.entry == entry && o.size == size,
            || code::read_optimized(pid, m, code, entry, size).map(Arc::new),
            |o| o.size_of(),
        )
    }

    /// The function of `f` (its name and script) and its line.
    pub fn frame(&mut self, f: InterpFrame) -> Option<(Arc<Code>, u32)> {
        let (m, layout) = self.meta()?;
        let pid = self.pid;
        let scripts = &mut self.scripts;
        let function = self.functions.get(
            f.code,
            || read_function(pid, &m, &layout, f.code, scripts),
            |c| c.code.name.len() + c.code.file.len() + c.bytecode.len() * 16,
        )?;
        let offset = if f.instr & AT_SCRIPT_OFFSET != 0 {
            u32::try_from(f.instr & !AT_SCRIPT_OFFSET).ok()
        } else if f.instr & AT_BYTECODE != 0 {
            let at = (f.instr & !AT_BYTECODE) as i64;
            position_in(&function.bytecode, at).and_then(script_offset)
        } else {
            None
        };
        let Some(offset) = offset else {
            return Some((function.code.clone(), function.code.first_line));
        };
        let script = function.script;
        let scripts = &mut self.scripts;
        let line = self.functions.line((f.code, f.instr), || {
            scripts.line(pid, &m, &layout, script, offset)
        });
        Some((function.code.clone(), line))
    }
}

/// The function `f` (checked to be one) and its `SharedFunctionInfo`.
fn function_and_shared(pid: u32, m: &Meta, f: u64) -> Option<(u64, u64)> {
    let first = m.get("v8dbg_type_JSFunction__JS_FUNCTION_TYPE");
    let t = instance_type(pid, m, f)?;
    if !(first..first + FUNCTION_TYPES).contains(&t) {
        return None;
    }
    let shared = field(
        pid,
        f,
        m.get("v8dbg_class_JSFunction__shared__SharedFunctionInfo"),
    )?;
    if !is_object(shared) {
        return None;
    }
    // Past `JS_FUNCTION_TYPE` (class and built-in constructors), only with
    // the type of what it points to (two reads more).
    let checked = t == first
        || m.opt("v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE")
            .is_some_and(|sfi| instance_type(pid, m, shared) == Some(sfi));
    checked.then_some((f, shared))
}

/// Reads the `SharedFunctionInfo` at `shared`: its name, its script, its
/// bytecode's positions and first line.
fn read_function(
    pid: u32,
    m: &Meta,
    layout: &Layout,
    shared: u64,
    scripts: &mut Scripts,
) -> Option<Arc<Function>> {
    let (code, script) = names::read_names(pid, m, shared)?;
    let bytecode = code::bytecode_table(pid, m, layout, shared).unwrap_or_default();
    // The function's entry is the table's first position.
    let first_line = position_in(&bytecode, FUNCTION_ENTRY)
        .and_then(script_offset)
        .map_or(0, |offset| scripts.line(pid, m, layout, script, offset));
    Some(Arc::new(Function {
        code: names::with_first_line(code, first_line),
        script,
        bytecode,
    }))
}

/// Whether `v` is a tagged pointer to a heap object.
fn is_object(v: u64) -> bool {
    v & 3 == 1
}

/// The value of a small integer (a tagged word whose low half is 0).
fn smi(v: u64) -> Option<i64> {
    (v & 0xffff_ffff == 0).then_some((v as i64) >> 32)
}

/// The tagged field at `offset` of the heap object `object`; `None` when
/// `object` is not one.
fn field(pid: u32, object: u64, offset: i64) -> Option<u64> {
    if !is_object(object) {
        return None;
    }
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
