//! What the symbolizer needs to know of an ELF file before handing it to
//! blazesym: its build id, the size of its DWARF, its loadable segments
//! (to turn a file offset into the virtual address DWARF speaks in), and
//! the other files its DWARF names (which blazesym would open by path).
//! Files are opened with [`super::open::open_regular`], and read through
//! that descriptor.

use std::fs::File;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};

use super::open::{FileId, open_regular};

/// One PT_LOAD segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Load {
    pub vaddr: u64,
    pub offset: u64,
    pub file_size: u64,
    pub executable: bool,
}

/// An ELF file's identity and layout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ElfInfo {
    /// The GNU build id, lowercase hex.
    pub build_id: Option<String>,
    /// Size of its DWARF: every `.debug_*` section, uncompressed (0: none).
    pub debug_size: u64,
    pub loads: Vec<Load>,
    /// The file it was read from (`None` when parsed from memory): a file
    /// found at the same path later is another one if this differs.
    pub file: Option<FileId>,
    /// The other files its DWARF names.
    pub links: Links,
}

/// The files an ELF file's DWARF names, which a DWARF reader looks for by
/// path: the symbolizer finds and opens them itself, or reads no DWARF.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Links {
    /// `.gnu_debuglink`: the separate debug file's name and CRC-32.
    pub debuglink: Option<(String, u32)>,
    /// `.gnu_debugaltlink` (dwz): the supplementary file's path and build
    /// id (lowercase hex).
    pub altlink: Option<(PathBuf, String)>,
    /// A `.debug_sup` section (DWARF 5's supplementary file, by path).
    pub debug_sup: bool,
}

/// An ELF file open for reading, and what was read of it.
#[derive(Debug)]
pub struct ElfFile {
    pub file: File,
    pub info: ElfInfo,
}

impl ElfFile {
    /// Opens `path` (only a regular file: see [`super::open`]) and reads
    /// its headers through that descriptor (lazily: the headers, the
    /// build-id note and the link sections, never the whole file). `None`
    /// when it is not a regular file, not ELF, or cannot be opened.
    pub fn open(path: &Path) -> Option<ElfFile> {
        // Mapped by blazesym, not read into memory: no size bound.
        let regular = open_regular(path, u64::MAX).ok()?;
        let info = {
            let cache = object::ReadCache::new(&regular.file);
            let elf = object::File::parse(&cache).ok()?;
            ElfInfo::of(&elf, Some(regular.id))
        };
        Some(ElfFile {
            file: regular.file,
            info,
        })
    }
}

impl ElfInfo {
    /// [`ElfFile::open`]'s info, the file closed again.
    pub fn read(path: &Path) -> Option<ElfInfo> {
        ElfFile::open(path).map(|f| f.info)
    }

    /// The same of an ELF file in memory (a fetched debug file).
    pub fn parse(bytes: &[u8]) -> Option<ElfInfo> {
        let elf = object::File::parse(bytes).ok()?;
        Some(ElfInfo::of(&elf, None))
    }

    fn of<'data, R: object::ReadRef<'data>>(
        elf: &object::File<'data, R>,
        file: Option<FileId>,
    ) -> ElfInfo {
        let loads = elf
            .segments()
            .map(|s| {
                let (offset, file_size) = s.file_range();
                Load {
                    vaddr: s.address(),
                    offset,
                    file_size,
                    executable: matches!(s.flags(), SegmentFlags::Elf { p_flags } if p_flags & object::elf::PF_X != 0),
                }
            })
            .collect();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        let links = Links {
            debuglink: elf
                .gnu_debuglink()
                .ok()
                .flatten()
                .map(|(name, crc)| (text(name), crc)),
            altlink: elf
                .gnu_debugaltlink()
                .ok()
                .flatten()
                .map(|(path, id)| (PathBuf::from(text(path)), hex(id))),
            debug_sup: elf.section_by_name(".debug_sup").is_some(),
        };
        ElfInfo {
            build_id: elf.build_id().ok().flatten().map(hex),
            debug_size: dwarf_size(elf),
            loads,
            file,
            links,
        }
    }

    /// The virtual address of file offset `offset`, from the loadable
    /// segment that holds it. Exact for the file that was mapped (not for a
    /// separate debug file: `objcopy --only-keep-debug` rewrites the
    /// segments' offsets and empties them).
    pub fn vaddr_of_offset(&self, offset: u64) -> Option<u64> {
        self.loads
            .iter()
            .find(|l| l.offset <= offset && offset - l.offset < l.file_size.max(1))
            .and_then(|l| (offset - l.offset).checked_add(l.vaddr))
    }

    /// The page-aligned virtual address of the first executable segment:
    /// where an executable mapping of the file starts when only a separate
    /// debug file is at hand (its segments keep their addresses). Compilers
    /// and linkers of the field give a file one executable segment.
    pub fn executable_base(&self) -> Option<u64> {
        self.loads
            .iter()
            .find(|l| l.executable)
            .map(|l| l.vaddr & !0xfff)
    }

    /// The page-aligned virtual address of the first loadable segment:
    /// where a mapping of the whole file (file offset 0) starts.
    pub fn first_base(&self) -> Option<u64> {
        self.loads.first().map(|l| l.vaddr & !0xfff)
    }
}

/// Size of an ELF file's DWARF: every `.debug_*` (and `.zdebug_*`) section,
/// uncompressed (Go compresses its DWARF: a 10 MB `.debug_info` holds 130 MB
/// once inflated).
pub fn dwarf_size<'data, R: object::ReadRef<'data>>(elf: &object::File<'data, R>) -> u64 {
    elf.sections()
        .filter(|s| {
            s.name()
                .is_ok_and(|n| n.starts_with(".debug_") || n.starts_with(".zdebug_"))
        })
        .map(|s| {
            s.compressed_file_range()
                .map_or(s.size(), |r| r.uncompressed_size)
        })
        .sum()
}

/// Where a debug file with `build_id` (lowercase hex) lives under `dir`,
/// as GDB and distributions lay it out: `dir/.build-id/ab/cdef….debug`.
/// `None` for an id too short to be a GNU build id or not hex.
pub fn build_id_path(dir: &Path, build_id: &str) -> Option<PathBuf> {
    if build_id.len() < 4 || !build_id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let id = build_id.to_ascii_lowercase();
    Some(
        dir.join(".build-id")
            .join(&id[..2])
            .join(format!("{}.debug", &id[2..])),
    )
}

/// Bytes as lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_id_paths() {
        assert_eq!(
            build_id_path(Path::new("/usr/lib/debug"), "AB12cd").unwrap(),
            Path::new("/usr/lib/debug/.build-id/ab/12cd.debug")
        );
        assert_eq!(build_id_path(Path::new("/d"), "ab"), None);
        assert_eq!(build_id_path(Path::new("/d"), "../../etc"), None);
    }

    #[test]
    fn this_test_binary_maps_its_own_code() {
        let me = std::env::current_exe().unwrap();
        let info = ElfInfo::read(&me).expect("the test binary is ELF");
        assert!(info.build_id.is_some(), "rustc links with a build id");
        let exec = info.loads.iter().find(|l| l.executable).unwrap();
        assert_eq!(
            info.vaddr_of_offset(exec.offset + 16),
            Some(exec.vaddr + 16)
        );
        assert!(info.executable_base().is_some());
        assert_eq!(ElfInfo::read(Path::new("/proc/self/status")), None);
        assert_eq!(
            ElfInfo::parse(&std::fs::read(&me).unwrap())
                .unwrap()
                .build_id,
            info.build_id
        );
    }

    #[test]
    fn a_fifo_is_refused_without_blocking() {
        let dir = std::env::temp_dir().join(format!("proflow-elf-fifo-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Opening a FIFO for reading blocks until a writer comes.
        assert_eq!(ElfInfo::read(&fifo), None);
        assert_eq!(ElfInfo::read(Path::new("/dev/null")), None);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
