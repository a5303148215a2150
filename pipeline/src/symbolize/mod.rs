//! Addresses → function, file and line, for every component that names
//! frames (the `ebpf` receiver with `symbolize: local`, the `symbolize`
//! processor): one implementation, so both name frames alike.
//!
//! - [`Symbols`]: user frames with blazesym from an ELF file's symbol table
//!   and DWARF (inlined functions as extra lines of one location, innermost
//!   first, as pprof has them; Rust and C++ names demangled), and kernel
//!   frames from [`kallsyms`].
//! - [`elf`]: build id, DWARF size and segments of a file, read before it is
//!   handed to blazesym, and the `.build-id/xx/rest.debug` layout.
//!
//! DWARF costs memory about its own size while a file is open (more when
//! it is compressed, as Go compresses it; without `.debug_aranges`, as Rust
//! writes none, finding an address's unit walks all of `.debug_info`). So a
//! file whose DWARF (every `.debug_*` section, uncompressed) is larger than
//! `max_debug_info` is symbolized from its symbol table only (function
//! names, no files, lines or inlined frames), and files are closed, least
//! recently used first, while the DWARF of the open ones adds up to more
//! than twice that.
//!
//! Two bounded caches:
//! - resolved frames, keyed by file (build id, or path when there is none)
//!   and address, at most `max_entries`; when full it is emptied and
//!   refilled from what is asked next, so its memory is bounded and the
//!   common addresses come back soon;
//! - open files: blazesym keeps each file's parsed symbols and DWARF; past
//!   `max_open` files the least recently used is closed (evicted).

pub mod elf;
pub mod kallsyms;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use kallsyms::Kallsyms;

/// A map keyed by what profiles say (addresses, build ids, names, a
/// profile's ids and strings): foldhash, seeded at random per process and
/// per map, so keys chosen to collide cannot be written into a profile
/// ahead of time (the unseeded multiply-rotate hash it replaced put keys
/// that differ only in their high bits in one bucket), at a fraction of
/// SipHash's cost (which was a tenth of the processor's time). Its
/// `quality` variant: `fast` hashes an integer with one multiply by a
/// per-process seed, and with some seeds integers that differ only in
/// their high bits still share low bits.
pub type FastMap<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// One line of a location: a function and where in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    pub function: Arc<str>,
    pub file: Option<Arc<str>>,
    pub line: u32,
}

/// The lines of one address, innermost (inlined) first; empty when it
/// could not be symbolized.
pub type Lines = Arc<[Line]>;

/// What identifies a file's symbols wherever it is found.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum FileKey {
    BuildId(Arc<str>),
    Path(Arc<str>),
}

/// An address to look up in a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Addr {
    /// An offset into the file (a runtime address less its mapping's start,
    /// plus the mapping's file offset): valid in the file that was mapped.
    FileOffset(u64),
    /// An ELF virtual address (as DWARF and symbol tables give them): valid
    /// in the file and in its separate debug file.
    Virtual(u64),
}

/// A file to look an address up in.
#[derive(Debug, Clone, Copy)]
pub struct FileRef<'a> {
    /// The file's identity: equal keys share cached frames.
    pub key: &'a FileKey,
    /// Where to open it now.
    pub path: &'a Path,
    /// Its DWARF size ([`elf::ElfInfo::debug_size`]).
    pub debug_size: u64,
}

/// Bounds of a [`Symbols`].
#[derive(Debug, Clone)]
pub struct Limits {
    /// Most resolved addresses cached.
    pub max_entries: usize,
    /// Most files open at once.
    pub max_open: usize,
    /// Files with more DWARF are named from their symbol table only.
    pub max_debug_info: u64,
}

/// A symbolizer with bounded caches; see the module docs.
pub struct Symbols {
    blaze: Symbolizer,
    /// `/proc/kallsyms`, read at the first kernel frame.
    kallsyms: Option<Kallsyms>,
    frames: FastMap<(FileKey, Addr), Lines>,
    kernel: FastMap<u64, Lines>,
    limits: Limits,
    /// Files blazesym has open, least recently used first, with the path
    /// each was opened by and the DWARF bytes it was opened with.
    open: VecDeque<(FileKey, PathBuf, u64)>,
    empty: Lines,
    /// Interned function and file names.
    names: FastMap<Arc<str>, ()>,
    /// Lookups answered from the cache since [`Symbols::take_hits`].
    hits: u64,
}

impl Symbols {
    /// A symbolizer that follows a file's `.gnu_debuglink` into
    /// `debug_dirs` (blazesym's defaults, `/usr/lib/debug` and
    /// `/lib/debug`, when `None`).
    pub fn new(limits: Limits, debug_dirs: Option<Vec<PathBuf>>) -> Self {
        Symbols {
            kallsyms: None,
            blaze: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .set_debug_dirs(debug_dirs)
                .build(),
            frames: FastMap::default(),
            kernel: FastMap::default(),
            limits,
            open: VecDeque::new(),
            empty: Arc::from(Vec::new()),
            names: FastMap::default(),
            hits: 0,
        }
    }

    /// Lookups answered from the cache since the last call.
    pub fn take_hits(&mut self) -> u64 {
        std::mem::take(&mut self.hits)
    }

    /// Addresses cached.
    pub fn len(&self) -> usize {
        self.frames.len() + self.kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files open now.
    pub fn open_files(&self) -> usize {
        self.open.len()
    }

    fn make_room(&mut self) {
        if self.len() >= self.limits.max_entries {
            self.frames.clear();
            self.kernel.clear();
            self.names.clear();
        }
    }

    /// A kernel address (already adjusted for return addresses). Empty
    /// lines when this machine's kallsyms does not name it.
    pub fn kernel(&mut self, addr: u64) -> Lines {
        if let Some(l) = self.kernel.get(&addr) {
            self.hits += 1;
            return l.clone();
        }
        self.make_room();
        let table = self.kallsyms.get_or_insert_with(Kallsyms::from_proc);
        let lines: Lines = match table.lookup(addr) {
            Some(name) => {
                let function = intern(&mut self.names, name);
                Arc::from(vec![Line {
                    function,
                    file: None,
                    line: 0,
                }])
            }
            None => self.empty.clone(),
        };
        self.kernel.insert(addr, lines.clone());
        lines
    }

    /// True when this machine's kallsyms names any symbol (it does not for
    /// a user that `kptr_restrict` hides addresses from).
    pub fn has_kallsyms(&mut self) -> bool {
        !self
            .kallsyms
            .get_or_insert_with(Kallsyms::from_proc)
            .is_empty()
    }

    /// `addr` in `file` (already adjusted for return addresses). Empty
    /// lines when the file does not name it.
    pub fn file(&mut self, file: FileRef<'_>, addr: Addr) -> Lines {
        if let Some(l) = self.frames.get(&(file.key.clone(), addr)) {
            self.hits += 1;
            return l.clone();
        }
        self.make_room();
        let debug = file.debug_size <= self.limits.max_debug_info;
        let dwarf = if debug { file.debug_size } else { 0 };
        let path = self.opened(file.key, file.path, dwarf);
        let mut result = self.resolve(&path, addr, debug);
        if result.is_none() && path.as_path() != file.path {
            // Opened by a path that is gone (its process ended): reopen.
            self.close(file.key);
            let path = self.opened(file.key, file.path, dwarf);
            result = self.resolve(&path, addr, debug);
        }
        match result {
            Some(lines) => {
                self.frames.insert((file.key.clone(), addr), lines.clone());
                lines
            }
            // The file could not be read (its process ended before it was
            // opened, say): not remembered, so the next process that maps
            // the same file names the address.
            None => {
                self.close(file.key);
                self.empty.clone()
            }
        }
    }

    fn resolve(&mut self, path: &Path, addr: Addr, debug_syms: bool) -> Option<Lines> {
        let mut elf = Elf::new(path);
        elf.debug_syms = debug_syms;
        let src = Source::Elf(elf);
        let input = match addr {
            Addr::FileOffset(o) => Input::FileOffset(o),
            Addr::Virtual(v) => Input::VirtOffset(v),
        };
        match self.blaze.symbolize_single(&src, input) {
            Ok(s) => Some(lines(&mut self.names, &self.empty, s)),
            Err(_) => None,
        }
    }

    /// The path `key` is open by, opening it (and closing the least
    /// recently used files beyond `max_open` files or twice
    /// `max_debug_info` of DWARF) if needed.
    fn opened(&mut self, key: &FileKey, path: &Path, dwarf: u64) -> PathBuf {
        if let Some(i) = self.open.iter().position(|(k, _, _)| k == key) {
            let entry = self.open.remove(i).expect("index from position");
            let path = entry.1.clone();
            self.open.push_back(entry);
            return path;
        }
        let budget = self.limits.max_debug_info.saturating_mul(2);
        let over = |open: &VecDeque<(FileKey, PathBuf, u64)>| {
            open.iter().map(|(_, _, d)| d).sum::<u64>() + dwarf > budget
        };
        while self.open.len() >= self.limits.max_open || (!self.open.is_empty() && over(&self.open))
        {
            let Some((_, old, _)) = self.open.pop_front() else {
                break;
            };
            self.evict(old);
        }
        self.open
            .push_back((key.clone(), path.to_path_buf(), dwarf));
        path.to_path_buf()
    }

    fn close(&mut self, key: &FileKey) {
        if let Some(i) = self.open.iter().position(|(k, _, _)| k == key) {
            let (_, old, _) = self.open.remove(i).expect("index from position");
            self.evict(old);
        }
    }

    fn evict(&mut self, path: PathBuf) {
        let _ = self.blaze.evict(&blazesym::symbolize::evict::Evict::Elf(
            blazesym::symbolize::evict::Elf::new(path),
        ));
    }
}

fn intern(names: &mut FastMap<Arc<str>, ()>, s: &str) -> Arc<str> {
    if let Some((k, _)) = names.get_key_value(s) {
        return k.clone();
    }
    let k: Arc<str> = Arc::from(s);
    names.insert(k.clone(), ());
    k
}

/// blazesym's answer as pprof lines.
fn lines(names: &mut FastMap<Arc<str>, ()>, empty: &Lines, s: Symbolized<'_>) -> Lines {
    let Symbolized::Sym(sym) = s else {
        return empty.clone();
    };
    let mut out = Vec::with_capacity(1 + sym.inlined.len());
    // blazesym lists inlined calls outermost first, each with the line
    // inside that inlined function; pprof wants the innermost first.
    for f in sym.inlined.iter().rev() {
        let (file, line) = code(f.code_info.as_ref());
        out.push(Line {
            function: intern(names, &f.name),
            file: file.map(|f| intern(names, &f)),
            line,
        });
    }
    let (file, line) = code(sym.code_info.as_deref());
    out.push(Line {
        function: intern(names, &sym.name),
        file: file.map(|f| intern(names, &f)),
        line,
    });
    Arc::from(out)
}

fn code(info: Option<&blazesym::symbolize::CodeInfo<'_>>) -> (Option<String>, u32) {
    match info {
        None => (None, 0),
        Some(c) => {
            let path = match &c.dir {
                Some(d) if !d.as_os_str().is_empty() => d.join(&*c.file),
                _ => PathBuf::from(&*c.file),
            };
            (
                Some(path.to_string_lossy().into_owned()),
                c.line.unwrap_or(0),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys a profile chooses (mapping ids, kernel addresses) that differ
    /// only in their high bits spread over the buckets (the unseeded
    /// multiply-rotate hash before put them in one), and two maps hash a
    /// key differently.
    #[test]
    fn fast_maps_are_seeded_each_and_spread_keys_that_share_low_bits() {
        use std::hash::BuildHasher;
        let keys: Vec<u64> = (1..=4096u64).map(|x| x << 40).collect();
        let (a, b): (FastMap<u64, ()>, FastMap<u64, ()>) = Default::default();
        let buckets: std::collections::HashSet<u64> = keys
            .iter()
            .map(|&k| a.hasher().hash_one(k) & 0xffff)
            .collect();
        assert!(buckets.len() > 3500, "{} buckets", buckets.len());
        assert!(
            keys.iter()
                .any(|&k| a.hasher().hash_one(k) != b.hasher().hash_one(k))
        );
    }

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    /// This test binary's executable mapping: (start, file offset).
    fn own_mapping(addr: u64) -> (u64, u64) {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        maps.lines()
            .find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (s, e) = f[0].split_once('-')?;
                let (s, e) = (
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                );
                (s <= addr && addr < e).then(|| (s, u64::from_str_radix(f[2], 16).unwrap()))
            })
            .unwrap()
    }

    #[test]
    fn a_function_of_this_binary_by_file_offset_and_by_virtual_address() {
        let addr = a_function_to_find as *const () as u64;
        let _ = a_function_to_find();
        let me = std::env::current_exe().unwrap();
        let info = elf::ElfInfo::read(&me).unwrap();
        let (start, offset) = own_mapping(addr);
        let file_offset = addr - start + offset;
        let key = FileKey::Path(me.to_string_lossy().into());
        let file = FileRef {
            key: &key,
            path: &me,
            debug_size: info.debug_size,
        };
        let limits = Limits {
            max_entries: 10,
            max_open: 2,
            max_debug_info: u64::MAX,
        };
        let mut symbols = Symbols::new(limits.clone(), Some(Vec::new()));
        let lines = symbols.file(file, Addr::FileOffset(file_offset));
        let last = lines.last().expect("symbolized");
        assert!(last.function.contains("a_function_to_find"), "{lines:?}");
        assert!(
            last.file.as_deref().is_some_and(|f| f.ends_with("mod.rs")),
            "{lines:?}"
        );
        // The second time comes from the cache.
        assert_eq!(symbols.file(file, Addr::FileOffset(file_offset)), lines);
        assert_eq!(symbols.len(), 1);
        // The same by virtual address.
        let vaddr = info.vaddr_of_offset(file_offset).unwrap();
        assert_eq!(symbols.file(file, Addr::Virtual(vaddr)), lines);

        // Over max_debug_info: the symbol table's name, no file or line.
        let mut symbols = Symbols::new(
            Limits {
                max_debug_info: 0,
                ..limits
            },
            Some(Vec::new()),
        );
        let lines = symbols.file(file, Addr::FileOffset(file_offset));
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].function.contains("a_function_to_find") && lines[0].file.is_none(),
            "{lines:?}"
        );
    }
}
