//! Where in its function a JavaScript frame is: the source position
//! tables of bytecode and of optimized code, read from the process, and
//! what an optimized function inlined.
//!
//! - An interpreted frame keeps its bytecode offset in a slot below its
//!   frame pointer (`v8dbg_off_fp_bytecode_offset`, as a small integer
//!   counted from the bytecode array's tagged address); the function's
//!   bytecode table ([`bytecode_table`]) gives its position.
//! - A frame of optimized code (V8's Maglev or TurboFan) is at a pc inside
//!   the function's `Code`; the code's own table gives the position, which
//!   says when the pc is in a function the compiler inlined. Then the
//!   code's inlining positions give that function (in its literal array)
//!   and where its caller called it, until the outer function is reached:
//!   one frame each, innermost first.
//! - Baseline code (Sparkplug) maps its pcs to bytecodes through another
//!   table; its frames are at their function's first line for now.

use super::{Layout, Meta, field, instance_type, is_object, smi};
use crate::ebpf::interp::read_mem;
use crate::ebpf::v8lines::{Inlining, Table, inlined_frames, position_in, table};

/// The largest table read, in bytes, and the most inlined functions one
/// optimized function's positions name.
const MAX_TABLE: usize = 1 << 20;
const MAX_INLINED: usize = 4096;

/// The source position table in the byte array `array` (checked to be
/// one), decoded.
fn read_table(pid: u32, m: &Meta, array: u64) -> Option<Table> {
    Some(table(&byte_array(pid, m, array)?))
}

/// The bytes of the byte array `array`, at most [`MAX_TABLE`].
fn byte_array(pid: u32, m: &Meta, array: u64) -> Option<Vec<u8>> {
    if !is_object(array)
        || instance_type(pid, m, array)? != m.opt("v8dbg_type_ByteArray__BYTE_ARRAY_TYPE")?
    {
        return None;
    }
    let length_at = m.opt("v8dbg_class_FixedArrayBase__length__SMI")?;
    let len = usize::try_from(smi(field(pid, array, length_at)?)?).ok()?;
    if len > MAX_TABLE {
        return None;
    }
    let mut bytes = vec![0u8; len];
    let data = (array - 1).checked_add_signed(m.opt("v8dbg_class_FixedArray__data__uintptr_t")?)?;
    read_mem(pid, data, &mut bytes).then_some(bytes)
}

/// The source position table of the function `shared`'s bytecode (its
/// `function_data` is the bytecode, or baseline code that holds it).
pub fn bytecode_table(pid: u32, m: &Meta, layout: &Layout, shared: u64) -> Option<Table> {
    let mut data = field(
        pid,
        shared,
        m.opt("v8dbg_class_SharedFunctionInfo__function_data__Object")?,
    )?;
    if is_object(data) && instance_type(pid, m, data)? == m.opt("v8dbg_type_Code__CODE_TYPE")? {
        data = field(
            pid,
            data,
            m.opt("v8dbg_class_Code__bytecode_or_interpreter_data__HeapObject")?,
        )?;
    }
    if !is_object(data)
        || instance_type(pid, m, data)? != m.opt("v8dbg_type_BytecodeArray__BYTECODE_ARRAY_TYPE")?
    {
        return None;
    }
    read_table(pid, m, field(pid, data, layout.bytecode_positions?)?)
}

/// An optimized function's code: where its instructions are, its table,
/// and what it inlined.
#[derive(Debug)]
pub struct Optimized {
    /// Where its instructions start, and how many bytes they are.
    pub entry: u64,
    pub size: u64,
    table: Table,
    inlining: Inlining,
}

impl Optimized {
    /// Bytes held.
    pub fn size_of(&self) -> usize {
        self.table.len() * 16 + self.inlining.inlined.len() * 16 + self.inlining.functions.len() * 8
    }

    /// The frames at `code_offset`, innermost first: (the function's
    /// `SharedFunctionInfo`, its position), the outer one as `outer`.
    pub fn frames(&self, code_offset: i64, outer: u64) -> Vec<(u64, u64)> {
        match position_in(&self.table, code_offset) {
            Some(position) => inlined_frames(&self.inlining, position, outer),
            None => vec![(outer, 0)],
        }
    }
}

/// The code of the function at `function`: its `Code`'s address, its
/// instructions' start and size from its header, and whether it is
/// optimized (Maglev or TurboFan), in two reads. Its type is not read: the
/// caller checks the pc is inside the instructions, and [`read_optimized`]
/// checks the table's type.
pub fn code_of(
    pid: u32,
    m: &Meta,
    layout: &Layout,
    function: u64,
) -> Option<(u64, u64, u64, bool)> {
    let code = field(pid, function, layout.function_code?)?;
    if !is_object(code) {
        return None;
    }
    let mut header = [0u8; 24];
    let at = (code - 1).checked_add(layout.code_entry?)?;
    if !read_mem(pid, at, &mut header) {
        return None;
    }
    let word = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
    let entry = word(0);
    let flags = word(8) & 0xffff_ffff;
    let size = word(16) & 0xffff_ffff;
    let shift = u32::try_from(m.opt("v8dbg_CodeKindFieldShift")?).ok()?;
    let kind = flags.checked_shr(shift)? & u64::try_from(m.opt("v8dbg_CodeKindFieldMask")?).ok()?;
    let optimized = kind > u64::try_from(m.opt("v8dbg_CodeKindBaseline")?).ok()?;
    Some((code, entry, size, optimized))
}

/// Reads the optimized `Code` at `code` (whose header [`code_of`] read).
pub fn read_optimized(pid: u32, m: &Meta, code: u64, entry: u64, size: u64) -> Option<Optimized> {
    let positions = field(
        pid,
        code,
        m.opt("v8dbg_class_Code__source_position_table__ByteArray")?,
    )?;
    let table = read_table(pid, m, positions)?;
    let deopt = field(
        pid,
        code,
        m.opt("v8dbg_class_Code__deoptimization_data__FixedArray")?,
    )?;
    Some(Optimized {
        entry,
        size,
        table,
        inlining: inlining(pid, m, deopt).unwrap_or_default(),
    })
}

/// The inlining positions and literal functions of deoptimization data
/// `deopt` (`None` for code that inlined nothing, or unreadable data:
/// then a position in an inlined function is the outer one's first line).
fn inlining(pid: u32, m: &Meta, deopt: u64) -> Option<Inlining> {
    let fixed = m.opt("v8dbg_type_FixedArray__FIXED_ARRAY_TYPE")?;
    if !is_object(deopt) || instance_type(pid, m, deopt)? != fixed {
        return None;
    }
    let data = m.opt("v8dbg_class_FixedArray__data__uintptr_t")?;
    let slot = |array: u64, i: i64| field(pid, array, data.checked_add(i.checked_mul(8)?)?);
    let positions = slot(
        deopt,
        m.opt("v8dbg_DeoptimizationDataInliningPositionsIndex")?,
    )?;
    let bytes = byte_array(pid, m, positions)?;
    // Each: the caller's position (8 bytes), the function's index (4), padding.
    let inlined: Box<[(u64, u32)]> = bytes
        .chunks_exact(16)
        .take(MAX_INLINED)
        .map(|e| {
            let position = u64::from_le_bytes(e[..8].try_into().expect("8 bytes"));
            (
                position,
                u32::from_le_bytes(e[8..12].try_into().expect("4 bytes")),
            )
        })
        .collect();
    if inlined.is_empty() {
        return None;
    }
    // The literal array (a weak fixed array): its slots up to the highest
    // one named, in one read; only the slots named are checked.
    let literals = slot(deopt, m.opt("v8dbg_DeoptimizationDataLiteralArrayIndex")?)?;
    let weak = m.opt("v8dbg_type_WeakFixedArray__WEAK_FIXED_ARRAY_TYPE")?;
    if !is_object(literals) || ![weak, fixed].contains(&instance_type(pid, m, literals)?) {
        return None;
    }
    let length_at = m.opt("v8dbg_class_FixedArrayBase__length__SMI")?;
    let count = usize::try_from(smi(field(pid, literals, length_at)?)?).ok()?;
    let wanted = inlined
        .iter()
        .map(|&(_, f)| f as usize + 1)
        .max()
        .unwrap_or(0);
    let n = count.min(wanted).min(MAX_INLINED);
    let mut raw = vec![0u8; n * 8];
    if !read_mem(pid, (literals - 1).checked_add_signed(data)?, &mut raw) {
        return None;
    }
    let sfi_type = m.opt("v8dbg_type_SharedFunctionInfo__SHARED_FUNCTION_INFO_TYPE")?;
    let mut functions: Box<[u64]> = raw
        .chunks_exact(8)
        // A weak reference has bit 1 set as well.
        .map(|w| u64::from_le_bytes(w.try_into().expect("8 bytes")) & !2)
        .collect();
    let mut named: Vec<usize> = inlined.iter().map(|&(_, f)| f as usize).collect();
    named.sort_unstable();
    named.dedup();
    for (i, f) in functions.iter_mut().enumerate() {
        let checked = named.binary_search(&i).is_ok()
            && is_object(*f)
            && instance_type(pid, m, *f) == Some(sfi_type);
        if !checked {
            *f = 0;
        }
    }
    Some(Inlining { inlined, functions })
}
