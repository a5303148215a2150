//! Addresses → function, file and line, for every component that names
//! frames (the `ebpf` receiver with `symbolize: local`, the `symbolize`
//! processor): one implementation, so both name frames alike.
//!
//! - [`Symbols`]: user frames with blazesym from an ELF file's symbol table
//!   and DWARF (inlined functions as extra lines of one location, innermost
//!   first, as pprof has them; Rust and C++ names demangled), and kernel
//!   frames from [`kallsyms`].
//! - [`elf`]: build id, DWARF size, segments and links of a file, read
//!   before it is handed to blazesym, and the `.build-id/xx/rest.debug`
//!   layout.
//! - [`open`]: every file is opened only if it is a regular file, without
//!   blocking (a FIFO, a device), and read through that descriptor: blazesym
//!   is given `/proc/self/fd/N`, kept open while the file is.
//! - [`links`]: the debug file a `.gnu_debuglink` names and the dwz file a
//!   `.gnu_debugaltlink` names, found and opened here (blazesym would look
//!   for them by path, and open what it finds plainly).
//! - [`resident`]: the pages of the files read in place, handed back to the
//!   page cache, for a caller that looks up in bursts (the `ebpf`
//!   receiver, at the end of each interval, and within it after a file
//!   is opened or many lookups read files: [`Symbols::files_opened`],
//!   [`Symbols::file_lookups`]).
//!
//! DWARF costs memory about its own size while a file is open (more when
//! it is compressed, as Go compresses it; without `.debug_aranges`, as Rust
//! writes none, finding an address's unit walks all of `.debug_info`). So a
//! file whose DWARF (every `.debug_*` section, uncompressed) is larger than
//! `max_debug_info` is symbolized from its symbol table only (function
//! names, no files, lines or inlined frames), and files are closed, least
//! recently used first, while the DWARF of the open ones adds up to more
//! than twice that (with less, two files a node uses all the time, such as
//! libc's debug file and a Python built with DWARF, took turns being
//! inflated and parsed: 1.3% of a core under process churn instead of
//! 0.4%). A file no new address needed for [`IDLE_CLOSE`] is closed too:
//! once the addresses of a process are cached, its files' DWARF (parsed
//! units and line tables, which grow with every new address looked up) is
//! let go rather than held for addresses that may never come.
//!
//! Two bounded caches:
//! - resolved frames, keyed by file (build id, or path when there is none)
//!   and address, at most `max_entries`; when full it is emptied and
//!   refilled from what is asked next, so its memory is bounded and the
//!   common addresses come back soon;
//! - open files: blazesym keeps each file's parsed symbols and DWARF; past
//!   `max_open` files the least recently used is closed (evicted), its
//!   descriptors with it. A file stays what it was while open: a binary
//!   replaced on disk is read as it was until it is closed (a file known by
//!   path, not build id, is reopened once the caller sees another file
//!   there).

pub mod elf;
pub mod kallsyms;
pub mod links;
pub mod open;
pub mod resident;

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use elf::{ElfFile, ElfInfo};
use kallsyms::Kallsyms;
use links::Supplements;
pub use open::FileId;

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
    /// The file's identity: equal keys share cached frames and the open
    /// file.
    pub key: &'a FileKey,
    /// Where to open it now.
    pub path: &'a Path,
    /// The file the caller read (its build id, its segments), when it did:
    /// another file found at `path` by now is not used.
    pub id: Option<FileId>,
    /// Where the caller keeps that very file open (`/proc/self/fd/N`), when
    /// it does: tried first, so the file is still read after `path` is gone
    /// (a process's `/proc/PID/root/...` once it exited). The debug file
    /// its `.gnu_debuglink` names is still looked for beside `path`.
    pub held: Option<&'a Path>,
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

/// An open file no new address needed for this long is closed (addresses
/// answered from the cache do not count).
pub const IDLE_CLOSE: Duration = Duration::from_secs(60);

/// A file blazesym reads, through the descriptor kept here.
struct Readable {
    file: File,
    /// blazesym reads its DWARF (else its symbol table only).
    dwarf: bool,
    /// DWARF bytes it counts against the budget (0 without DWARF).
    dwarf_bytes: u64,
    /// The build id of the supplementary file it needs, held in
    /// [`Supplements`] while it is open.
    supplement: Option<String>,
}

/// An open file (see [`Symbols`]).
struct Open {
    key: FileKey,
    id: Option<FileId>,
    main: Readable,
    /// The separate debug file its `.gnu_debuglink` names, with the main
    /// file's segments (a file offset in the main file becomes the virtual
    /// address the debug file knows).
    debug: Option<(Readable, ElfInfo)>,
    /// The main file's segments: a file offset in it becomes the virtual
    /// address blazesym is asked for, translated here with checked
    /// arithmetic (blazesym's own translation overflows on a segment whose
    /// offset and size wrap, found by the `debug_file` fuzz target).
    segments: ElfInfo,
    /// When a new address last needed it.
    used: Instant,
}

impl Open {
    fn dwarf_bytes(&self) -> u64 {
        self.main.dwarf_bytes + self.debug.as_ref().map_or(0, |(d, _)| d.dwarf_bytes)
    }
}

/// A symbolizer with bounded caches; see the module docs.
pub struct Symbols {
    blaze: Symbolizer,
    /// Where a `.gnu_debuglink`'s and a dwz file's targets are looked for.
    debug_dirs: Vec<PathBuf>,
    supplements: Supplements,
    /// `/proc/kallsyms`, read at the first kernel frame unless given.
    kallsyms: Option<Kallsyms>,
    frames: FastMap<(FileKey, Addr), Lines>,
    kernel: FastMap<u64, Lines>,
    limits: Limits,
    /// Files open, least recently used first.
    open: VecDeque<Open>,
    empty: Lines,
    /// Interned function and file names.
    names: FastMap<Arc<str>, ()>,
    /// Lookups answered from the cache since [`Symbols::take_hits`].
    hits: u64,
    /// Lookups that read a file (not answered from the cache), and files
    /// opened, ever.
    file_lookups: u64,
    files_opened: u64,
}

/// blazesym's default debug directories, where separate debug files are
/// looked for when none are given.
const DEFAULT_DEBUG_DIRS: [&str; 2] = ["/usr/lib/debug", "/lib/debug"];

impl Symbols {
    /// A symbolizer that follows a file's `.gnu_debuglink` and dwz link
    /// into `debug_dirs` (`/usr/lib/debug` and `/lib/debug` when `None`).
    pub fn new(limits: Limits, debug_dirs: Option<Vec<PathBuf>>) -> Self {
        let supplements = Supplements::new();
        // blazesym opens only the /proc/self/fd/N paths it is given and
        // the links of its one debug directory, the private one of checked
        // supplementary files: it never reads DWARF of a file with a
        // .gnu_debuglink or .debug_sup (those are found here, or the file
        // is read without DWARF), the `.dwp` it looks for next to a file
        // (`/proc/self/fd/N.dwp`) cannot exist, and files do not change
        // under the descriptors it is given (no reload checks).
        let blaze_dirs: Vec<PathBuf> = supplements
            .dir()
            .map(Path::to_path_buf)
            .into_iter()
            .collect();
        Symbols {
            kallsyms: None,
            blaze: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .enable_auto_reload(false)
                .set_debug_dirs(Some(blaze_dirs))
                .build(),
            debug_dirs: debug_dirs
                .unwrap_or_else(|| DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from).collect()),
            supplements,
            frames: FastMap::default(),
            kernel: FastMap::default(),
            limits,
            open: VecDeque::new(),
            empty: Arc::from(Vec::new()),
            names: FastMap::default(),
            hits: 0,
            file_lookups: 0,
            files_opened: 0,
        }
    }

    /// Names kernel frames from `kallsyms` (read already) rather than
    /// reading `/proc/kallsyms` at the first kernel frame.
    pub fn with_kallsyms(mut self, kallsyms: Kallsyms) -> Self {
        self.kallsyms = Some(kallsyms);
        self
    }

    /// Lookups answered from the cache since the last call.
    pub fn take_hits(&mut self) -> u64 {
        std::mem::take(&mut self.hits)
    }

    /// Lookups of user addresses that read a file (or tried to), ever:
    /// when it grows, file pages were mapped.
    pub fn file_lookups(&self) -> u64 {
        self.file_lookups
    }

    /// Files opened, ever: when it grows, a file's symbol table (and its
    /// DWARF, if read) was read all at once.
    pub fn files_opened(&self) -> u64 {
        self.files_opened
    }

    /// Addresses cached.
    pub fn len(&self) -> usize {
        self.frames.len() + self.kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Files open now (binaries, debug files and supplementary files).
    pub fn open_files(&self) -> usize {
        self.open
            .iter()
            .map(|o| 1 + usize::from(o.debug.is_some()))
            .sum::<usize>()
            + self.supplements.len()
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

    /// `addr` in `file` (already adjusted for return addresses). Empty
    /// lines when the file does not name it, or is not the regular ELF
    /// file `file.id` says.
    pub fn file(&mut self, file: FileRef<'_>, addr: Addr) -> Lines {
        if let Some(l) = self.frames.get(&(file.key.clone(), addr)) {
            self.hits += 1;
            return l.clone();
        }
        self.make_room();
        self.file_lookups += 1;
        let lines = if !self.opened(file) {
            self.empty.clone()
        } else {
            match self.resolve(addr) {
                Some(lines) => {
                    self.frames.insert((file.key.clone(), addr), lines.clone());
                    lines
                }
                // The file could not be read: not remembered, so the next
                // process that maps the same file names the address.
                None => {
                    self.close(file.key);
                    self.empty.clone()
                }
            }
        };
        // After the lookup, so the file it needed is not closed and opened
        // again: it is the most recently used now.
        self.close_idle(IDLE_CLOSE);
        lines
    }

    /// Looks `addr` up in the most recently used open file: in its debug
    /// file first, then in its own symbols. `None` when it cannot be read.
    fn resolve(&mut self, addr: Addr) -> Option<Lines> {
        let open = self.open.back()?;
        if let Some((debug, binary)) = &open.debug {
            let vaddr = match addr {
                Addr::FileOffset(o) => binary.vaddr_of_offset(o),
                Addr::Virtual(v) => Some(v),
            };
            if let Some(v) = vaddr {
                let src = source(debug);
                if let Ok(s @ Symbolized::Sym(_)) =
                    self.blaze.symbolize_single(&src, Input::VirtOffset(v))
                {
                    return Some(lines(&mut self.names, &self.empty, s));
                }
            }
        }
        let src = source(&open.main);
        let input = match addr {
            Addr::FileOffset(o) => match open.segments.vaddr_of_offset(o) {
                Some(v) => Input::VirtOffset(v),
                // In no segment: the file does not name it.
                None => return Some(self.empty.clone()),
            },
            Addr::Virtual(v) => Input::VirtOffset(v),
        };
        match self.blaze.symbolize_single(&src, input) {
            Ok(s) => Some(lines(&mut self.names, &self.empty, s)),
            Err(_) => None,
        }
    }

    /// Closes the files no new address needed for `idle` (cached addresses
    /// are still answered). The `file` lookups call it with [`IDLE_CLOSE`];
    /// a caller whose lookups may stop for long calls it now and then.
    pub fn close_idle(&mut self, idle: Duration) {
        while self.open.front().is_some_and(|o| o.used.elapsed() >= idle) {
            if let Some(o) = self.open.pop_front() {
                self.evict(o);
            }
        }
    }

    /// Makes `file` the most recently used open file, opening it (and
    /// closing the least recently used files beyond `max_open` files or
    /// twice `max_debug_info` of DWARF) if needed. False when it cannot be
    /// opened as the file the caller means.
    fn opened(&mut self, file: FileRef<'_>) -> bool {
        if let Some(i) = self.open.iter().position(|o| o.key == *file.key) {
            // A file known by its path is another one once the path names
            // another file; one known by build id is the same content
            // wherever it is found.
            let replaced = matches!(file.key, FileKey::Path(_))
                && file.id.is_some()
                && self.open[i].id != file.id;
            if !replaced {
                if let Some(mut o) = self.open.remove(i) {
                    o.used = Instant::now();
                    self.open.push_back(o);
                }
                return true;
            }
            if let Some(o) = self.open.remove(i) {
                self.evict(o);
            }
        }
        let Some(elf) = file
            .held
            .into_iter()
            .chain([file.path])
            .filter_map(ElfFile::open)
            .find(|elf| file.id.is_none() || elf.info.file == file.id)
        else {
            return false;
        };
        let o = self.readable_pair(file.key.clone(), file.path, elf);
        let budget = self.limits.max_debug_info.saturating_mul(2);
        let incoming = o.dwarf_bytes();
        loop {
            let dwarf: u64 = self.open.iter().map(Open::dwarf_bytes).sum();
            if self.open.len() < self.limits.max_open && dwarf + incoming <= budget {
                break;
            }
            let Some(old) = self.open.pop_front() else {
                break;
            };
            self.evict(old);
        }
        self.open.push_back(o);
        self.files_opened += 1;
        true
    }

    /// `elf` as an open file, with the debug file its `.gnu_debuglink`
    /// names when that is found.
    fn readable_pair(&mut self, key: FileKey, path: &Path, elf: ElfFile) -> Open {
        let id = elf.info.file;
        let debug = if elf.info.links.debuglink.is_some() {
            links::find_debuglink(path, &elf.info, &self.debug_dirs)
                .map(|d| (self.readable(d), elf.info.clone()))
        } else {
            None
        };
        let segments = elf.info.clone();
        Open {
            key,
            id,
            main: self.readable(elf),
            debug,
            segments,
            used: Instant::now(),
        }
    }

    /// Whether blazesym may read `elf`'s DWARF: within `max_debug_info`,
    /// and every file that DWARF names found and checked here.
    fn readable(&mut self, elf: ElfFile) -> Readable {
        let info = &elf.info;
        let mut dwarf = info.debug_size > 0
            && info.debug_size <= self.limits.max_debug_info
            && info.links.debuglink.is_none()
            && !info.links.debug_sup;
        let mut supplement = None;
        if dwarf && let Some(alt) = &info.links.altlink {
            dwarf = self.supplements.hold(alt, &self.debug_dirs);
            if dwarf {
                supplement = Some(alt.1.clone());
            }
        }
        Readable {
            dwarf_bytes: if dwarf { info.debug_size } else { 0 },
            dwarf,
            supplement,
            file: elf.file,
        }
    }

    fn close(&mut self, key: &FileKey) {
        if let Some(i) = self.open.iter().position(|o| o.key == *key)
            && let Some(o) = self.open.remove(i)
        {
            self.evict(o);
        }
    }

    /// Makes blazesym forget `o`'s files before their descriptors close
    /// (a descriptor number, and so its path, is reused by the next file).
    fn evict(&mut self, o: Open) {
        let Open { main, debug, .. } = o;
        for r in std::iter::once(main).chain(debug.map(|(d, _)| d)) {
            forget(&mut self.blaze, open::fd_path(&r.file));
            if let Some(id) = &r.supplement
                && let Some(link) = self.supplements.release(id)
            {
                forget(&mut self.blaze, link);
            }
            // Its descriptor closes here, after blazesym let go of it.
            drop(r);
        }
    }
}

/// Makes blazesym drop what it keeps of the file at `path`.
fn forget(blaze: &mut Symbolizer, path: PathBuf) {
    let _ = blaze.evict(&blazesym::symbolize::evict::Evict::Elf(
        blazesym::symbolize::evict::Elf::new(path),
    ));
}

/// How blazesym reads `r`.
fn source(r: &Readable) -> Source<'static> {
    let mut elf = Elf::new(open::fd_path(&r.file));
    elf.debug_syms = r.dwarf;
    Source::Elf(elf)
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
            id: info.file,
            held: None,
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
            last.file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbolize/src/lib.rs")),
            "{lines:?}"
        );
        // The second time comes from the cache.
        assert_eq!(symbols.file(file, Addr::FileOffset(file_offset)), lines);
        assert_eq!(symbols.len(), 1);
        // The same by virtual address.
        let vaddr = info.vaddr_of_offset(file_offset).unwrap();
        assert_eq!(symbols.file(file, Addr::Virtual(vaddr)), lines);
        assert_eq!(symbols.open_files(), 1);
        // Two lookups read the file (the cached one did not); it was opened once.
        assert_eq!((symbols.file_lookups(), symbols.files_opened()), (2, 1));

        // A file idle long enough is closed; its cached addresses are still
        // answered, and a new address opens it again.
        symbols.close_idle(Duration::from_secs(3600));
        assert_eq!(symbols.open_files(), 1, "used just now");
        symbols.close_idle(Duration::ZERO);
        assert_eq!(symbols.open_files(), 0);
        assert_eq!(symbols.file(file, Addr::FileOffset(file_offset)), lines);
        assert_eq!(symbols.open_files(), 0, "answered from the cache");
        let _ = symbols.file(file, Addr::FileOffset(file_offset + 2));
        assert_eq!(symbols.open_files(), 1, "a new address opens it again");
        assert_eq!((symbols.file_lookups(), symbols.files_opened()), (3, 2));

        // Another file than the caller read: not used.
        let other = FileRef {
            id: Some(FileId { dev: 0, ino: 0 }),
            ..file
        };
        assert!(
            symbols
                .file(other, Addr::FileOffset(file_offset + 1))
                .is_empty()
        );

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

    #[test]
    fn a_file_the_caller_holds_is_read_after_its_path_is_gone() {
        let addr = a_function_to_find as *const () as u64;
        let _ = a_function_to_find();
        let me = std::env::current_exe().unwrap();
        let info = elf::ElfInfo::read(&me).unwrap();
        let (start, offset) = own_mapping(addr);
        let at = Addr::FileOffset(addr - start + offset);
        // The path a process that exited mapped the file at (in a
        // directory removed at once).
        let gone = tempfile::tempdir().unwrap().path().join("app");
        let key = FileKey::Path(gone.to_string_lossy().into());
        let limits = Limits {
            max_entries: 10,
            max_open: 2,
            max_debug_info: 0,
        };
        let unheld = FileRef {
            key: &key,
            path: &gone,
            id: info.file,
            held: None,
        };
        let mut symbols = Symbols::new(limits.clone(), Some(Vec::new()));
        assert!(symbols.file(unheld, at).is_empty(), "nothing at the path");

        let file = std::fs::File::open(&me).unwrap();
        let held = open::fd_path(&file);
        let lines = symbols.file(
            FileRef {
                held: Some(&held),
                ..unheld
            },
            at,
        );
        assert!(
            lines
                .last()
                .is_some_and(|l| l.function.contains("a_function_to_find")),
            "{lines:?}"
        );

        // Held, but another file than the caller read: not used.
        let mut symbols = Symbols::new(limits, Some(Vec::new()));
        let not_it = FileRef {
            key: &key,
            path: &gone,
            id: Some(FileId { dev: 0, ino: 0 }),
            held: Some(&held),
        };
        assert!(symbols.file(not_it, at).is_empty());
    }
}
