//! A function's name and its script, read from its `SharedFunctionInfo`:
//! its own name or the one V8 inferred (from the scope info, after the
//! context locals' names and details), and its script's name.

use std::sync::Arc;

use super::{Meta, field, instance_type, is_object, smi};
use crate::ebpf::interp::{Code, read_mem, read_u32, read_u64};

/// The longest name read, in characters, and the deepest cons string.
const MAX_CHARS: usize = 256;
const MAX_CONS_DEPTH: usize = 8;
/// V8 keeps at most this many context locals' names in the scope info
/// itself (more go to a hash table in one slot).
const MAX_INLINED_LOCAL_NAMES: u64 = 75;

/// The text of the string `s` (sequential, cons or thin), at most
/// [`MAX_CHARS`] characters; `None` for anything else.
pub(super) fn string(pid: u32, m: &Meta, s: u64, depth: usize) -> Option<String> {
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
    let locals = u64::try_from(smi(slot(count_slot)?)?).ok()?;
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

/// The name (or `(anonymous)`) and script name of the `SharedFunctionInfo`
/// at `shared`, and the script's address (0: none).
pub(super) fn read_names(pid: u32, m: &Meta, shared: u64) -> Option<(Code, u64)> {
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
    });
    let file = script
        .and_then(|s| field(pid, s, m.get("v8dbg_class_Script__name__Object")))
        .and_then(|n| string(pid, m, n, 0));
    let code = Code {
        name: name.unwrap_or_else(|| "(anonymous)".into()).into(),
        file: file.unwrap_or_default().into(),
        first_line: 0,
        lines: Box::new([]),
    };
    Some((code, script.unwrap_or(0)))
}

/// A `Code` as the frames' names share it.
pub(super) fn with_first_line(code: Code, first_line: u32) -> Arc<Code> {
    Arc::new(Code { first_line, ..code })
}
