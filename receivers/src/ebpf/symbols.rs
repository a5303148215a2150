//! Addresses → function, file and line, inside the receiver (`symbolize:
//! local`), with blazesym: kernel frames from `/proc/kallsyms`, user frames
//! from each ELF file's symbol table and DWARF (inlined functions as extra
//! lines of one location, innermost first, as pprof has them; Rust and C++
//! names demangled).
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

use blazesym::symbolize::source::{Elf, Kernel, Source};
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
    frames: HashMap<(FileKey, u64), Lines>,
    kernel: HashMap<u64, Lines>,
    max_entries: usize,
    /// Files blazesym has open, least recently used first, with the path
    /// each was opened by.
    open: VecDeque<(FileKey, PathBuf)>,
    max_open: usize,
    empty: Lines,
    /// Interned function and file names.
    names: HashMap<Arc<str>, ()>,
}

impl Symbols {
    pub fn new(max_entries: usize, max_open: usize) -> Self {
        Symbols {
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
        let src = Source::Kernel(Kernel {
            vmlinux: blazesym::MaybeDefault::None,
            ..Default::default()
        });
        let lines = match self.blaze.symbolize_single(&src, Input::AbsAddr(lookup)) {
            Ok(s) => lines(&mut self.names, &self.empty, s),
            Err(_) => self.empty.clone(),
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
        let path = self.opened(&key, &mapping.open_path);
        let mut result = self.resolve(&path, offset);
        if result.is_none() && path.as_path() != &*mapping.open_path {
            // Opened through a process that has ended: reopen through this one.
            self.close(&key);
            let path = self.opened(&key, &mapping.open_path);
            result = self.resolve(&path, offset);
        }
        let lines = result.unwrap_or_else(|| self.empty.clone());
        self.frames.insert((key, offset), lines.clone());
        lines
    }

    fn resolve(&mut self, path: &Path, offset: u64) -> Option<Lines> {
        let src = Source::Elf(Elf::new(path));
        match self.blaze.symbolize_single(&src, Input::FileOffset(offset)) {
            Ok(s) => Some(lines(&mut self.names, &self.empty, s)),
            Err(_) => None,
        }
    }

    /// The path `key` is open by, opening it (and closing the least
    /// recently used file beyond `max_open`) if needed.
    fn opened(&mut self, key: &FileKey, path: &Path) -> PathBuf {
        if let Some(i) = self.open.iter().position(|(k, _)| k == key) {
            let entry = self.open.remove(i).expect("index from position");
            let path = entry.1.clone();
            self.open.push_back(entry);
            return path;
        }
        while self.open.len() >= self.max_open {
            let Some((_, old)) = self.open.pop_front() else {
                break;
            };
            let _ = self.blaze.evict(&blazesym::symbolize::evict::Evict::Elf(
                blazesym::symbolize::evict::Elf::new(old),
            ));
        }
        self.open.push_back((key.clone(), path.to_path_buf()));
        path.to_path_buf()
    }

    fn close(&mut self, key: &FileKey) {
        if let Some(i) = self.open.iter().position(|(k, _)| k == key) {
            let (_, old) = self.open.remove(i).expect("index from position");
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
        let mut symbols = Symbols::new(10, 2);
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
    }
}
