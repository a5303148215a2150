//! HotSpot's own description of its structs, as the Serviceability Agent
//! reads it: `libjvm.so` exports tables (`gHotSpotVMStructs`,
//! `gHotSpotVMTypes`, `gHotSpotVMIntConstants`) of every field the agent
//! may need (type name, field name, offset or a static's address), every
//! type's size, and constants, with exported strides and offsets for the
//! tables' entries. They are read once per process from its memory, and the
//! few fields the unwinder needs are picked out by name ([`Layout`]); a
//! version that lacks one of them is not read.
//!
//! Everything read is untrusted: the tables are walked a bounded number of
//! entries, every name read at most [`MAX_NAME`] bytes.

use std::collections::HashMap;

use super::super::interp::{read_mem, read_u64, u64_at};

/// The symbols of `libjvm.so` that describe the tables, in this order.
pub const SYMBOLS: [&str; 15] = [
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
];

/// Entries of one table read at most (JDK 17 and 25 have about 2,000
/// fields, 1,200 types and 700 constants).
const MAX_ENTRIES: usize = 20_000;
/// The longest name read.
const MAX_NAME: usize = 128;
/// The largest stride or entry offset taken as sane.
const MAX_STRIDE: u64 = 256;

/// Where the unwinder finds what it reads, for one JVM's version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The address of `CodeCache::_heaps` (a `GrowableArray<CodeHeap*>*`).
    pub heaps: u64,
    /// `GrowableArrayBase::_len`, `GrowableArray<T>::_data`.
    pub array_len: u32,
    pub array_data: u32,
    /// `CodeHeap::_memory` and `_segmap` (`VirtualSpace`s), and
    /// `_log2_segment_size`.
    pub heap_memory: u32,
    pub heap_segmap: u32,
    pub heap_log2_segment: u32,
    /// `VirtualSpace::_low_boundary`, `_high_boundary` (what is reserved;
    /// `_low`, `_high` is what is committed so far).
    pub space_low_boundary: u32,
    pub space_high_boundary: u32,
    /// `sizeof(HeapBlock)` (a `CodeBlob` follows its block's header) and
    /// `HeapBlock::Header::_used`.
    pub block_size: u32,
    pub block_used: u32,
    /// `CodeBlob::_name` (a C string: `nmethod`, `Interpreter`, stubs'
    /// names) and `_frame_size` (in words).
    pub blob_name: u32,
    pub blob_frame_size: u32,
    /// `nmethod::_method` (JDK 23 on) or `CompiledMethod::_method`, and
    /// `sizeof(nmethod)` (a blob's header is read whole, at most that).
    pub nmethod_method: u32,
    pub nmethod_size: u32,
    /// Where an nmethod's code, `PcDesc`s, scopes and metadata are.
    pub nmethod: Nmethod,
    /// `sizeof(PcDesc)`, `PcDesc::_pc_offset`, `_scope_decode_offset`.
    pub pc_desc_size: u32,
    pub pc_desc_pc: u32,
    pub pc_desc_scope: u32,
    /// `Method::_constMethod`.
    pub method_const: u32,
    /// `ConstMethod::_constants`, `_name_index` (u2), `_code_size` (u2),
    /// `_flags` (u2 to JDK 20, then a u4), `sizeof(ConstMethod)` (its
    /// bytecodes follow it, then its compressed line number table).
    pub const_constants: u32,
    pub const_name_index: u32,
    pub const_code_size: u32,
    pub const_flags: u32,
    pub const_flags_u4: bool,
    pub const_size: u32,
    /// The flag of `_flags` that says a line number table follows.
    pub has_line_table: u32,
    /// `sizeof(ConstantPool)` (its entries follow it), `_pool_holder`,
    /// `_source_file_name_index` (u2).
    pub pool_size: u32,
    pub pool_holder: u32,
    pub pool_source_file: u32,
    /// `Klass::_name`, `Symbol::_length` (u2) and `_body`.
    pub klass_name: u32,
    pub symbol_length: u32,
    pub symbol_body: u32,
}

/// Where an nmethod keeps its code, its `PcDesc`s (by code offset, the
/// scopes at each), its scopes' data and its metadata (the `Method*`s the
/// scopes name by index).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nmethod {
    /// To JDK 22: `CodeBlob::_code_begin` and
    /// `CompiledMethod::_scopes_data_begin` are pointers; the `PcDesc`s
    /// (`nmethod::_scopes_pcs_offset` to `_dependencies_offset`) and the
    /// metadata (`_metadata_offset`) are at offsets from the blob.
    Blob {
        code_begin: u32,
        pcs: u32,
        pcs_end: u32,
        scopes_data: u32,
        metadata: u32,
    },
    /// JDK 23 on: the code at `CodeBlob::_code_offset`; the `PcDesc`s and
    /// scopes in the immutable data (`nmethod::_immutable_data`, at
    /// `_scopes_pcs_offset` and `_scopes_data_offset`, the one ending where
    /// the other starts); the metadata in the mutable data after the
    /// relocations (`CodeBlob::_mutable_data`, `_relocation_size`).
    Split {
        code_offset: u32,
        immutable: u32,
        pcs: u32,
        scopes_data: u32,
        mutable: u32,
        relocation_size: u32,
    },
}

/// The tables' symbols' addresses in the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tables(pub [u64; SYMBOLS.len()]);

impl Tables {
    /// The `u64` each symbol holds (a table's address, a stride, an
    /// offset).
    fn values(&self, pid: u32) -> Option<[u64; SYMBOLS.len()]> {
        let mut out = [0; SYMBOLS.len()];
        for (o, &addr) in out.iter_mut().zip(&self.0) {
            *o = read_u64(pid, addr)?;
        }
        Some(out)
    }
}

/// The C string at `addr`, at most [`MAX_NAME`] bytes; `None` at 0.
fn c_string(pid: u32, addr: u64, seen: &mut HashMap<u64, Option<String>>) -> Option<String> {
    if addr == 0 {
        return None;
    }
    if let Some(s) = seen.get(&addr) {
        return s.clone();
    }
    let mut buf = [0u8; MAX_NAME];
    // Read to the end of its page first: a name near a page's end may be
    // followed by an unmapped page.
    let to_page = (0x1000 - (addr & 0xfff)) as usize;
    let first = to_page.min(MAX_NAME);
    let mut n = 0;
    if read_mem(pid, addr, &mut buf[..first]) {
        n = first;
        if n < MAX_NAME
            && !buf[..n].contains(&0)
            && read_mem(pid, addr.wrapping_add(n as u64), &mut buf[n..])
        {
            n = MAX_NAME;
        }
    }
    let s = buf[..n]
        .iter()
        .position(|&b| b == 0)
        .map(|end| String::from_utf8_lossy(&buf[..end]).into_owned());
    seen.insert(addr, s.clone());
    s
}

/// One table: its address, stride, and where its entries' fields are.
struct Table {
    at: u64,
    stride: u64,
}

impl Table {
    fn new(at: u64, stride: u64, offsets: &[u64]) -> Option<Self> {
        (at != 0
            && (8..=MAX_STRIDE).contains(&stride)
            && offsets
                .iter()
                .all(|&o| o.checked_add(8).is_some_and(|end| end <= stride)))
        .then_some(Table { at, stride })
    }

    /// Reads entries until one whose first field (a name) is null, each
    /// whole; `f` takes each entry's bytes.
    fn each(&self, pid: u32, name_offset: u64, mut f: impl FnMut(&[u8]) -> bool) -> Option<()> {
        let stride = self.stride as usize;
        let mut chunk = vec![0u8; stride * 64];
        for i in 0..MAX_ENTRIES / 64 {
            let at = self.at.wrapping_add((i * chunk.len()) as u64);
            if !read_mem(pid, at, &mut chunk) {
                // The table's end may be near its mapping's end: one entry
                // at a time.
                return self.each_one(pid, i * 64, name_offset, f);
            }
            for e in chunk.chunks_exact(stride) {
                if word(e, name_offset) == 0 || !f(e) {
                    return Some(());
                }
            }
        }
        None
    }

    fn each_one(
        &self,
        pid: u32,
        from: usize,
        name_offset: u64,
        mut f: impl FnMut(&[u8]) -> bool,
    ) -> Option<()> {
        let mut e = vec![0u8; self.stride as usize];
        for i in from..MAX_ENTRIES {
            if !read_mem(pid, self.at.wrapping_add(i as u64 * self.stride), &mut e) {
                return None;
            }
            if word(&e, name_offset) == 0 || !f(&e) {
                return Some(());
            }
        }
        None
    }
}

/// The 8 bytes at `off` of `b` (0 past its end; offsets are within a
/// stride, checked by [`Table::new`]).
fn word(b: &[u8], off: u64) -> u64 {
    u64_at(b, u32::try_from(off).unwrap_or(u32::MAX))
}

/// The fields, types and constants the unwinder looks for.
const TYPES: [&str; 16] = [
    "CodeCache",
    "GrowableArrayBase",
    "GrowableArray<int>",
    "CodeHeap",
    "VirtualSpace",
    "HeapBlock",
    "HeapBlock::Header",
    "CodeBlob",
    "CompiledMethod",
    "nmethod",
    "Method",
    "ConstMethod",
    "ConstantPool",
    "Klass",
    "Symbol",
    "PcDesc",
];

/// What was read of the tables: fields (`Type::field` → offset, or a
/// static's address), types' sizes, constants.
#[derive(Debug, Default)]
struct Found {
    fields: HashMap<String, u64>,
    sizes: HashMap<String, u64>,
    constants: HashMap<String, i64>,
}

impl Found {
    fn field(&self, name: &str) -> Option<u32> {
        self.fields.get(name).and_then(|&o| u32::try_from(o).ok())
    }
}

/// Why no [`Layout`] was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NoLayout {
    /// The tables could not be read (yet: a JVM starting up).
    Unreadable,
    /// They lack a field the unwinder needs: a version it does not know.
    Unknown,
}

/// Reads process `pid`'s tables (at `tables`) and picks out its [`Layout`].
pub fn read(pid: u32, tables: &Tables) -> Result<Layout, NoLayout> {
    let found = read_tables(pid, tables).ok_or(NoLayout::Unreadable)?;
    layout(&found).ok_or(NoLayout::Unknown)
}

fn read_tables(pid: u32, tables: &Tables) -> Option<Found> {
    let [
        structs,
        s_stride,
        s_type,
        s_field,
        s_static,
        s_offset,
        s_address,
        types,
        t_stride,
        t_type,
        t_size,
        ints,
        i_stride,
        i_name,
        i_value,
    ] = tables.values(pid)?;
    let mut seen = HashMap::new();
    let mut found = Found::default();
    let table = Table::new(
        structs,
        s_stride,
        &[s_type, s_field, s_static, s_offset, s_address],
    )?;
    table.each(pid, s_type, |e| {
        if let Some(ty) = c_string(pid, word(e, s_type), &mut seen)
            && TYPES.contains(&ty.as_str())
            && let Some(field) = c_string(pid, word(e, s_field), &mut seen)
        {
            let is_static = word(e, s_static) & 0xffff_ffff != 0;
            let v = word(e, if is_static { s_address } else { s_offset });
            found.fields.insert(format!("{ty}::{field}"), v);
        }
        true
    })?;
    let table = Table::new(types, t_stride, &[t_type, t_size])?;
    table.each(pid, t_type, |e| {
        if let Some(ty) = c_string(pid, word(e, t_type), &mut seen)
            && TYPES.contains(&ty.as_str())
        {
            found.sizes.insert(ty, word(e, t_size));
        }
        true
    })?;
    let table = Table::new(ints, i_stride, &[i_name, i_value])?;
    table.each(pid, i_name, |e| {
        if let Some(name) = c_string(pid, word(e, i_name), &mut seen)
            && name.contains("linenumber_table")
        {
            found
                .constants
                .insert(name, i64::from(word(e, i_value) as u32 as i32));
        }
        true
    })?;
    Some(found)
}

fn layout(f: &Found) -> Option<Layout> {
    let size = |t: &str| f.sizes.get(t).and_then(|&s| u32::try_from(s).ok());
    let (const_flags, const_flags_u4) = match f.field("ConstMethod::_flags._flags") {
        Some(o) => (o, true),
        None => (f.field("ConstMethod::_flags")?, false),
    };
    let has_line_table = f
        .constants
        .get("ConstMethodFlags::_misc_has_linenumber_table")
        .or_else(|| f.constants.get("ConstMethod::_has_linenumber_table"))
        .and_then(|&c| u32::try_from(c).ok())?;
    let nmethod = match f.field("CodeBlob::_code_offset") {
        Some(code_offset) => Nmethod::Split {
            code_offset,
            immutable: f.field("nmethod::_immutable_data")?,
            pcs: f.field("nmethod::_scopes_pcs_offset")?,
            scopes_data: f.field("nmethod::_scopes_data_offset")?,
            mutable: f.field("CodeBlob::_mutable_data")?,
            relocation_size: f.field("CodeBlob::_relocation_size")?,
        },
        None => Nmethod::Blob {
            code_begin: f.field("CodeBlob::_code_begin")?,
            pcs: f.field("nmethod::_scopes_pcs_offset")?,
            pcs_end: f.field("nmethod::_dependencies_offset")?,
            scopes_data: f.field("CompiledMethod::_scopes_data_begin")?,
            metadata: f.field("nmethod::_metadata_offset")?,
        },
    };
    Some(Layout {
        heaps: *f.fields.get("CodeCache::_heaps")?,
        array_len: f.field("GrowableArrayBase::_len")?,
        array_data: f.field("GrowableArray<int>::_data")?,
        heap_memory: f.field("CodeHeap::_memory")?,
        heap_segmap: f.field("CodeHeap::_segmap")?,
        heap_log2_segment: f.field("CodeHeap::_log2_segment_size")?,
        space_low_boundary: f.field("VirtualSpace::_low_boundary")?,
        space_high_boundary: f.field("VirtualSpace::_high_boundary")?,
        block_size: size("HeapBlock")?,
        block_used: f.field("HeapBlock::Header::_used")?,
        blob_name: f.field("CodeBlob::_name")?,
        blob_frame_size: f.field("CodeBlob::_frame_size")?,
        nmethod_method: f
            .field("nmethod::_method")
            .or_else(|| f.field("CompiledMethod::_method"))?,
        nmethod,
        nmethod_size: size("nmethod").filter(|&n| n <= 4096)?,
        pc_desc_size: size("PcDesc")?,
        pc_desc_pc: f.field("PcDesc::_pc_offset")?,
        pc_desc_scope: f.field("PcDesc::_scope_decode_offset")?,
        method_const: f.field("Method::_constMethod")?,
        const_constants: f.field("ConstMethod::_constants")?,
        const_name_index: f.field("ConstMethod::_name_index")?,
        const_code_size: f.field("ConstMethod::_code_size")?,
        const_flags,
        const_flags_u4,
        const_size: size("ConstMethod")?,
        has_line_table,
        pool_size: size("ConstantPool")?,
        pool_holder: f.field("ConstantPool::_pool_holder")?,
        pool_source_file: f.field("ConstantPool::_source_file_name_index")?,
        klass_name: f.field("Klass::_name")?,
        symbol_length: f.field("Symbol::_length")?,
        symbol_body: f.field("Symbol::_body")?,
    })
}
