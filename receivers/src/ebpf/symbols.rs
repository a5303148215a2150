//! Addresses → function, file and line, inside the receiver (`symbolize:
//! local`): kernel frames from `/proc/kallsyms` (read once into one sorted
//! table of text symbols: about 4 MB for 120,000 symbols, a fifth of what a
//! general symbolizer keeps for them); user frames with blazesym from each
//! ELF file's symbol table and DWARF (inlined functions as extra lines of
//! one location, innermost first, as pprof has them; Rust and C++ names
//! demangled).
//!
//! DWARF costs memory about its own size while a file is open (more when
//! it is compressed, as Go compresses it; without `.debug_aranges`, as Rust
//! writes none, finding an address's unit walks all of `.debug_info`). So a
//! file whose DWARF (every `.debug_*` section, uncompressed) is larger than
//! `max_debug_info` (16MiB) is symbolized from its symbol table only
//! (function names, no files, lines or inlined frames), and files are
//! closed, least recently used first, while the DWARF of the open ones adds
//! up to more than twice that.
//!
//! Two bounded caches:
//! - resolved frames, keyed by file (build id, or path when there is none)
//!   and file offset, at most `symbol_cache_entries`; when full it is
//!   emptied and refilled from what is sampled next, so its memory is
//!   bounded and the common addresses come back within an interval;
//! - open files: blazesym keeps each file's parsed symbols and DWARF; past
//!   `open_binaries` files the least recently used is closed (evicted).
//!
//! A file is opened through the first live process that maps it
//! (`/proc/PID/root/...`, so files inside containers are found); that path
//! keeps working while the file stays open, and a new one is taken if it
//! had to be reopened after its process ended.

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::source::{Elf, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer};

use super::procs::Mapping;

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

/// What identifies a file's symbols across processes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum FileKey {
    BuildId(Arc<str>),
    Path(Arc<str>),
}

pub struct Symbols {
    blaze: Symbolizer,
    /// `/proc/kallsyms`, read at the first kernel frame.
    kallsyms: Option<Kallsyms>,
    frames: HashMap<(FileKey, u64), Lines>,
    kernel: HashMap<u64, Lines>,
    max_entries: usize,
    /// Files blazesym has open, least recently used first, with the path
    /// each was opened by and the DWARF bytes it was opened with.
    open: VecDeque<(FileKey, PathBuf, u64)>,
    max_open: usize,
    max_debug_info: u64,
    empty: Lines,
    /// Interned function and file names.
    names: HashMap<Arc<str>, ()>,
}

impl Symbols {
    pub fn new(max_entries: usize, max_open: usize, max_debug_info: u64) -> Self {
        Symbols {
            kallsyms: None,
            blaze: Symbolizer::builder()
                .enable_code_info(true)
                .enable_inlined_fns(true)
                .enable_demangling(true)
                .build(),
            frames: HashMap::new(),
            kernel: HashMap::new(),
            max_entries,
            open: VecDeque::new(),
            max_open,
            max_debug_info,
            empty: Arc::from(Vec::new()),
            names: HashMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.frames.len() + self.kernel.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn make_room(&mut self) {
        if self.len() >= self.max_entries {
            self.frames.clear();
            self.kernel.clear();
            self.names.clear();
        }
    }

    /// A kernel address (`lookup` already adjusted for return addresses).
    pub fn kernel(&mut self, lookup: u64) -> Lines {
        if let Some(l) = self.kernel.get(&lookup) {
            return l.clone();
        }
        self.make_room();
        let table = self.kallsyms.get_or_insert_with(|| {
            Kallsyms::parse(&std::fs::read_to_string("/proc/kallsyms").unwrap_or_default())
        });
        let lines: Lines = match table.lookup(lookup) {
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
        self.kernel.insert(lookup, lines.clone());
        lines
    }

    /// A user address in `mapping` (`lookup` already adjusted for return
    /// addresses).
    pub fn user(&mut self, mapping: &Mapping, lookup: u64) -> Lines {
        let key = match &mapping.binary.build_id {
            Some(id) => FileKey::BuildId(id.clone()),
            None => FileKey::Path(mapping.binary.path.clone()),
        };
        let offset = mapping.file_offset(lookup);
        if let Some(l) = self.frames.get(&(key.clone(), offset)) {
            return l.clone();
        }
        self.make_room();
        let debug = mapping.binary.debug_size <= self.max_debug_info;
        let dwarf = if debug { mapping.binary.debug_size } else { 0 };
        let path = self.opened(&key, &mapping.open_path, dwarf);
        let mut result = self.resolve(&path, offset, debug);
        if result.is_none() && path.as_path() != &*mapping.open_path {
            // Opened through a process that has ended: reopen through this one.
            self.close(&key);
            let path = self.opened(&key, &mapping.open_path, dwarf);
            result = self.resolve(&path, offset, debug);
        }
        let lines = result.unwrap_or_else(|| self.empty.clone());
        self.frames.insert((key, offset), lines.clone());
        lines
    }

    fn resolve(&mut self, path: &Path, offset: u64, debug_syms: bool) -> Option<Lines> {
        let mut elf = Elf::new(path);
        elf.debug_syms = debug_syms;
        let src = Source::Elf(elf);
        match self.blaze.symbolize_single(&src, Input::FileOffset(offset)) {
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
        let budget = self.max_debug_info.saturating_mul(2);
        let over = |open: &VecDeque<(FileKey, PathBuf, u64)>| {
            open.iter().map(|(_, _, d)| d).sum::<u64>() + dwarf > budget
        };
        while self.open.len() >= self.max_open || (!self.open.is_empty() && over(&self.open)) {
            let Some((_, old, _)) = self.open.pop_front() else {
                break;
            };
            let _ = self.blaze.evict(&blazesym::symbolize::evict::Evict::Elf(
                blazesym::symbolize::evict::Elf::new(old),
            ));
        }
        self.open
            .push_back((key.clone(), path.to_path_buf(), dwarf));
        path.to_path_buf()
    }

    fn close(&mut self, key: &FileKey) {
        if let Some(i) = self.open.iter().position(|(k, _, _)| k == key) {
            let (_, old, _) = self.open.remove(i).expect("index from position");
            let _ = self.blaze.evict(&blazesym::symbolize::evict::Evict::Elf(
                blazesym::symbolize::evict::Elf::new(old),
            ));
        }
    }
}

fn intern(names: &mut HashMap<Arc<str>, ()>, s: &str) -> Arc<str> {
    if let Some((k, _)) = names.get_key_value(s) {
        return k.clone();
    }
    let k: Arc<str> = Arc::from(s);
    names.insert(k.clone(), ());
    k
}

/// blazesym's answer as pprof lines.
fn lines(names: &mut HashMap<Arc<str>, ()>, empty: &Lines, s: Symbolized<'_>) -> Lines {
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

/// The kernel's text symbols: addresses sorted, names in one string.
struct Kallsyms {
    addrs: Vec<u64>,
    /// End of each name in `names` (its start is the previous end).
    ends: Vec<u32>,
    names: String,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms` text (`ADDR TYPE NAME [MODULE]`), keeping text
    /// symbols (t, T, w, W). All-zero addresses (kptr_restrict) give none.
    fn parse(text: &str) -> Kallsyms {
        let mut syms: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let ty = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(ty, "t" | "T" | "w" | "W")).then_some((addr, name))
            })
            .collect();
        syms.sort_unstable_by_key(|&(a, _)| a);
        let mut k = Kallsyms {
            addrs: Vec::with_capacity(syms.len()),
            ends: Vec::with_capacity(syms.len()),
            names: String::with_capacity(syms.iter().map(|(_, n)| n.len()).sum()),
        };
        for (addr, name) in syms {
            k.addrs.push(addr);
            k.names.push_str(name);
            k.ends
                .push(u32::try_from(k.names.len()).unwrap_or(u32::MAX));
        }
        k
    }

    /// The symbol at or before `addr`.
    fn lookup(&self, addr: u64) -> Option<&str> {
        let i = self.addrs.partition_point(|&a| a <= addr).checked_sub(1)?;
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        self.names.get(start..self.ends[i] as usize)
    }
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

    #[inline(never)]
    fn a_function_to_find() -> u64 {
        std::hint::black_box(7)
    }

    #[test]
    fn a_function_of_this_binary_is_found_with_file_and_line() {
        // Map this test binary as a process would, from its own maps.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
        let addr = a_function_to_find as *const () as u64;
        let _ = a_function_to_find();
        let me = std::env::current_exe().unwrap();
        let line = maps
            .lines()
            .find(|l| {
                let (range, _) = l.split_once(' ').unwrap();
                let (s, e) = range.split_once('-').unwrap();
                let (s, e) = (
                    u64::from_str_radix(s, 16).unwrap(),
                    u64::from_str_radix(e, 16).unwrap(),
                );
                s <= addr && addr < e
            })
            .unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        let (s, e) = f[0].split_once('-').unwrap();
        let mapping = Mapping {
            start: u64::from_str_radix(s, 16).unwrap(),
            end: u64::from_str_radix(e, 16).unwrap(),
            offset: u64::from_str_radix(f[2], 16).unwrap(),
            binary: Arc::new(super::super::procs::tests_binary(&me)),
            open_path: me.as_path().into(),
        };
        let mut symbols = Symbols::new(10, 2, u64::MAX);
        let lines = symbols.user(&mapping, addr);
        let last = lines.last().expect("symbolized");
        assert!(last.function.contains("a_function_to_find"), "{lines:?}");
        assert!(
            last.file
                .as_deref()
                .is_some_and(|f| f.ends_with("symbols.rs")),
            "{lines:?}"
        );
        // The second time comes from the cache.
        assert_eq!(symbols.user(&mapping, addr), lines);
        assert_eq!(symbols.len(), 1);

        // Over max_debug_info: the symbol table's name, no file or line.
        let mut symbols = Symbols::new(10, 2, 0);
        let lines = symbols.user(&mapping, addr);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].function.contains("a_function_to_find") && lines[0].file.is_none(),
            "{lines:?}"
        );
    }

    #[test]
    fn kallsyms_lookup() {
        let k = Kallsyms::parse(
            "ffffffff81000000 T _stext\nffffffff81000100 t helper\nffffffff81000200 D data\nffffffffc0000000 t mod_fn\t[ext4]\n0000000000000000 T hidden\n",
        );
        assert_eq!(k.lookup(0xffffffff81000050), Some("_stext"));
        assert_eq!(
            k.lookup(0xffffffff81000250),
            Some("helper"),
            "data symbols are skipped"
        );
        assert_eq!(k.lookup(0xffffffffc0000010), Some("mod_fn"));
        assert_eq!(k.lookup(0x1000), None);
    }
}
