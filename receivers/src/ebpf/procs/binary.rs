//! The ELF files processes map, as the unwinder and the symbolizer need
//! them ([`Binary`]): build id, executable segments, unwind sections (in
//! place in the mapped file, or copied), a CPython interpreter's symbols,
//! and the file's descriptor held for the symbolizer within [`HeldFiles`]'
//! bound. [`super`] reads each file once and shares it between processes.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use framehop::{ExplicitModuleSectionInfo, Module};
use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};
use proflow_symbolize::FileId;
use proflow_symbolize::open::open_regular;

use super::super::runtime::RuntimeBinary;
use super::super::state_budget::{Charge, StateBudget, Use};
use super::Mapping;
use super::spill::Copied;

/// Largest unwind section kept from one file.
const MAX_SECTION: u64 = 64 << 20;

/// An ELF file as the unwinder and the symbolizer need it.
#[derive(Debug)]
pub struct Binary {
    /// The path in the process's mount namespace, as `/proc/PID/maps` says.
    pub path: Arc<str>,
    /// The GNU build id, hex.
    pub build_id: Option<Arc<str>>,
    /// The file that was read (the symbolizer reads no other one found at
    /// its path later); `None` when it could not be opened.
    pub id: Option<FileId>,
    /// Executable PT_LOAD segments: (p_vaddr, p_offset).
    pub(super) exec_segments: Vec<(u64, u64)>,
    pub(super) unwind: Option<UnwindSections>,
    /// An interpreter's symbols (CPython's, PHP's), when the file is one.
    pub runtime: Option<RuntimeBinary>,
    /// The file kept open for the symbolizer (see [`super`]).
    held: Option<Held>,
    /// The state budget refused one of its unwind sections.
    pub(super) state_refused: bool,
}

impl Binary {
    /// Bytes of its unwind sections copied or inflated (charged to the
    /// state budget).
    pub(super) fn copied_bytes(&self) -> usize {
        self.unwind.as_ref().map_or(0, UnwindSections::copied_bytes)
    }

    /// Where the file read is open in this process (`/proc/self/fd/N`),
    /// when it is held.
    pub fn held_path(&self) -> Option<&Path> {
        self.held.as_ref().map(|h| h.path.as_path())
    }
}

/// A file's descriptor held open, counted against [`HeldFiles`]' bound
/// until it is dropped.
#[derive(Debug)]
struct Held {
    path: PathBuf,
    count: Arc<AtomicUsize>,
    _file: std::fs::File,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The bound on the descriptors [`Binary`]s hold: a quarter of this
/// process's open-file limit (its soft limit).
#[derive(Debug, Clone)]
pub(super) struct HeldFiles {
    count: Arc<AtomicUsize>,
    max: usize,
}

impl HeldFiles {
    pub(super) fn new() -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes one rlimit, which `limit` is.
        let soft = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } == 0 {
            usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
        } else {
            0
        };
        HeldFiles::with_max(soft / 4)
    }

    pub(super) fn with_max(max: usize) -> Self {
        HeldFiles {
            count: Arc::new(AtomicUsize::new(0)),
            max,
        }
    }

    /// Holds `file` if the bound allows; else it is closed.
    fn hold(&self, file: std::fs::File) -> Option<Held> {
        let taken = self
            .count
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n < self.max).then_some(n + 1)
            });
        taken.ok().map(|_| Held {
            path: proflow_symbolize::open::fd_path(&file),
            count: self.count.clone(),
            _file: file,
        })
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }
}

/// What framehop needs of a file: `.eh_frame` (with its `.eh_frame_hdr`
/// index) as C, C++ and Rust toolchains write it, else `.debug_frame` as Go
/// writes it (Go has frame pointers, but its frameless leaf functions hide
/// their caller from a frame-pointer walk; the CFI does not).
#[derive(Debug)]
pub(super) struct UnwindSections {
    text_svma: Option<Range<u64>>,
    got_svma: Option<Range<u64>>,
    pub(super) eh_frame: Option<(Range<u64>, Section)>,
    pub(super) eh_frame_hdr: Option<(Range<u64>, Section)>,
    pub(super) debug_frame: Option<Section>,
}

/// The bytes of an unwind section: in place in the file, mapped (only the
/// pages the unwinder reads are in memory, and the kernel may drop them
/// again), or copied or inflated ([`Copied`]: into a private file, mapped).
#[derive(Debug, Clone)]
pub enum Section {
    Mapped(Arc<memmap2::Mmap>, Range<usize>),
    /// Copied from a file only root cannot change, or inflated, and
    /// charged to the receiver's state budget while it is kept.
    Copied(Arc<Copied>),
}

impl Default for Section {
    fn default() -> Self {
        Section::Copied(Arc::new(Copied::empty()))
    }
}

impl std::ops::Deref for Section {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Section::Mapped(map, range) => &map[range.clone()],
            Section::Copied(c) => c.bytes(),
        }
    }
}

/// The framehop module of a mapping whose file has unwind sections.
pub(super) fn module(m: &Mapping) -> Option<Module<Section>> {
    let u = m.binary.unwind.as_ref()?;
    let bias = m.binary.bias(m)?;
    Some(Module::new(
        m.binary.path.to_string(),
        m.start..m.end,
        bias,
        ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: u.text_svma.clone(),
            got_svma: u.got_svma.clone(),
            eh_frame_svma: u.eh_frame.as_ref().map(|(r, _)| r.clone()),
            eh_frame: u.eh_frame.as_ref().map(|(_, d)| d.clone()),
            debug_frame: u.debug_frame.clone(),
            eh_frame_hdr_svma: u.eh_frame_hdr.as_ref().map(|(r, _)| r.clone()),
            eh_frame_hdr: u.eh_frame_hdr.as_ref().map(|(_, d)| d.clone()),
            ..Default::default()
        },
    ))
}

/// Reads what is kept of an ELF file; a file that cannot be read or parsed
/// gives a binary with no build id and no unwind sections (its frames keep
/// their addresses).
///
/// Sections copied or inflated ([`Copied`]) are charged to `state` first;
/// one that does not fit is left out (its frames are not unwound through
/// that file), counted as the budget's `unwind_section` refusal.
pub(super) fn read_binary(
    open: &Path,
    path: &str,
    held: &HeldFiles,
    state: &Arc<StateBudget>,
) -> Binary {
    let mut b = Binary {
        path: path.into(),
        build_id: None,
        id: None,
        exec_segments: Vec::new(),
        unwind: None,
        runtime: None,
        held: None,
        state_refused: false,
    };
    // Only a regular file, opened without blocking (the path is the
    // process's, and may name a FIFO by now).
    let Ok(regular) = open_regular(open, u64::MAX) else {
        return b;
    };
    b.id = Some(regular.id);
    // A file only root can change is mapped, parsed in place (no copy of
    // its symbol tables on the heap), and its unwind sections are used in
    // place later. Any other file is read and its sections copied: a user
    // could truncate it while it is mapped, and reading a mapped page past
    // the file's end kills the reader.
    let root_only = regular
        .file
        .metadata()
        .is_ok_and(|m| m.uid() == 0 && m.mode() & 0o022 == 0);
    // SAFETY: the map is only read, and the file can only be truncated by
    // root (who could kill this process anyway); files are replaced by
    // rename in practice, which leaves this map valid.
    let map = root_only
        .then(|| unsafe { memmap2::Mmap::map(&regular.file) }.ok())
        .flatten()
        .map(Arc::new);
    match &map {
        Some(map) => {
            read_elf(&mut b, &map[..], &regular.file, Some(map), path, state);
            // The pages the parse read (headers, symbol tables) leave this
            // process's memory; the unwinder brings back only those it reads.
            // SAFETY: a private read-only file mapping: its pages are dropped
            // and read again from the file on the next access.
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
        None => read_elf(
            &mut b,
            &object::ReadCache::new(&regular.file),
            &regular.file,
            None,
            path,
            state,
        ),
    }
    b.held = held.hold(regular.file);
    tracing::debug!(
        path,
        unwind_bytes = b.unwind.as_ref().map_or(0, UnwindSections::bytes),
        "read a mapped file's unwind sections"
    );
    b
}

/// Fills `b` from the ELF file `data` (read from `file`); its unwind
/// sections refer to `map` when the file is mapped, else are copied.
fn read_elf<'d, R: object::ReadRef<'d>>(
    b: &mut Binary,
    data: R,
    file: &std::fs::File,
    map: Option<&Arc<memmap2::Mmap>>,
    path: &str,
    state: &Arc<StateBudget>,
) {
    let Ok(elf) = object::File::parse(data) else {
        return;
    };
    if let Ok(Some(id)) = elf.build_id() {
        b.build_id = Some(proflow_symbolize::elf::hex(id).into());
    }
    for seg in elf.segments() {
        if let SegmentFlags::Elf { p_flags } = seg.flags()
            && p_flags & object::elf::PF_X != 0
        {
            b.exec_segments.push((seg.address(), seg.file_range().0));
        }
    }
    // SAFETY: a private read-only file mapping: its pages are dropped and
    // read again from the file on the next access (as after the parse).
    let release = || {
        if let Some(map) = map {
            let _ = unsafe { map.unchecked_advise(memmap2::UncheckedAdvice::DontNeed) };
        }
    };
    b.runtime = RuntimeBinary::read(&elf, path, &release);
    // Whether the state budget refused a section (the binary is then read
    // again by the next process that maps it, when there may be room).
    let refused = std::cell::Cell::new(false);
    // Charged before anything is copied or inflated.
    let charge = |size: u64| {
        let charge = Charge::take(state, Use::UnwindSection, usize::try_from(size).ok()?);
        refused.set(refused.get() || charge.is_none());
        charge
    };
    // Uncompressed sections are used in place, from the file mapped, or
    // copied.
    let section = |name: &str| -> Option<(Range<u64>, Section)> {
        let s = elf.section_by_name(name)?;
        let (offset, size) = s.file_range()?;
        let compressed = s.compressed_file_range().ok()?.format;
        if size > MAX_SECTION || compressed != object::CompressionFormat::None {
            return None;
        }
        let bytes = match map {
            Some(map) => {
                let range = usize::try_from(offset).ok()?..usize::try_from(offset + size).ok()?;
                map.get(range.clone())?;
                Section::Mapped(map.clone(), range)
            }
            None => Section::Copied(Arc::new(
                Copied::copy(file, offset, size, charge(size)?)
                    .inspect_err(|e| tracing::debug!(path, name, error = %e, "section not copied"))
                    .ok()?,
            )),
        };
        Some((s.address()..s.address() + s.size(), bytes))
    };
    let range = |name: &str| {
        elf.section_by_name(name)
            .map(|s| s.address()..s.address() + s.size())
    };
    let eh_frame = section(".eh_frame");
    // Compressed in Go binaries (SHF_COMPRESSED): inflated here, if the
    // size its header states is within bound (checked, and charged, before
    // inflating, and nothing past it is written); else left out.
    let debug_frame = if eh_frame.is_none() {
        section(".debug_frame").map(|(_, d)| d).or_else(|| {
            let c = elf
                .section_by_name(".debug_frame")?
                .compressed_file_range()
                .ok()?;
            // Only a compressed one: an uncompressed one `section` left out
            // (too large, or refused by the budget) stays out. Read from the
            // file a buffer at a time, never whole.
            if c.format == object::CompressionFormat::None
                || c.uncompressed_size > MAX_SECTION
                || c.compressed_size > MAX_SECTION
            {
                return None;
            }
            let charge = charge(c.uncompressed_size)?;
            let compressed = (file, c.offset, c.compressed_size);
            Copied::inflate(c.format, compressed, c.uncompressed_size, charge)
                .inspect_err(|e| tracing::debug!(path, error = %e, ".debug_frame not inflated"))
                .ok()
                .map(|c| Section::Copied(Arc::new(c)))
        })
    } else {
        None
    };
    b.state_refused = refused.get();
    if eh_frame.is_some() || debug_frame.is_some() {
        b.unwind = Some(UnwindSections {
            text_svma: range(".text"),
            got_svma: range(".got"),
            eh_frame,
            eh_frame_hdr: section(".eh_frame_hdr"),
            debug_frame,
        });
    }
}

impl Binary {
    /// What its addresses are moved by in the process that maps it as `m`
    /// (an executable mapping): the executable segment `m` starts in (its
    /// offset rounded down to a page, as mmap maps it) gives the load bias.
    pub fn bias(&self, m: &Mapping) -> Option<u64> {
        let (vaddr, offset) = self
            .exec_segments
            .iter()
            .copied()
            .rev()
            .find(|&(_, off)| off & !0xfff <= m.offset)
            .or_else(|| self.exec_segments.first().copied())?;
        let svma_of_start = vaddr.wrapping_sub(offset).wrapping_add(m.offset);
        Some(m.start.wrapping_sub(svma_of_start))
    }
}

impl UnwindSections {
    /// Bytes held.
    fn bytes(&self) -> usize {
        self.eh_frame.as_ref().map_or(0, |(_, d)| d.len())
            + self.eh_frame_hdr.as_ref().map_or(0, |(_, d)| d.len())
            + self.debug_frame.as_ref().map_or(0, |d| d.len())
    }

    /// [`UnwindSections::bytes`] of the sections copied or inflated only.
    fn copied_bytes(&self) -> usize {
        [
            self.eh_frame.as_ref().map(|(_, d)| d),
            self.eh_frame_hdr.as_ref().map(|(_, d)| d),
            self.debug_frame.as_ref(),
        ]
        .into_iter()
        .flatten()
        .filter(|d| matches!(d, Section::Copied(_)))
        .map(|d| d.len())
        .sum()
    }
}

/// The line of this process's `/proc/self/maps` that maps `addr`.
#[cfg(test)]
pub(crate) fn own_maps_line(addr: u64) -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let line = maps.lines().find(|l| {
        let range = l.split(' ').next().unwrap_or_default();
        let Some((s, e)) = range.split_once('-') else {
            return false;
        };
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        s <= addr && addr < e
    });
    line.unwrap_or_else(|| panic!("no mapping of {addr:#x}"))
        .to_owned()
}

#[cfg(test)]
pub(crate) fn tests_binary(path: &Path) -> Binary {
    read_binary(
        path,
        &path.to_string_lossy(),
        &HeldFiles::with_max(0),
        &StateBudget::unbounded(),
    )
}
