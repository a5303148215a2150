//! JIT code named from the perf map its runtime writes: `/tmp/perf-PID.map`,
//! one line per compiled function, `START SIZE NAME` (hexadecimal, with or
//! without `0x`). Node (`--perf-basic-prof`), CPython 3.12+ (`-X perf`), the
//! JVM (`jcmd PID Compiler.perfmap`) and .NET (`DOTNET_PerfMapEnabled=1`)
//! write it; `perf report` reads it the same way.
//!
//! A process's map is read only once one of its samples lands in code no
//! file backs, and then again (only what was appended) when an address is
//! not found in it, at most once a second. The file is looked up inside the
//! process's own root (`/proc/PID/root`, so a container's `/tmp` is meant;
//! the PID in its name is the one the process has in its own PID namespace)
//! with every symbolic link resolved inside that root, and is read only if
//! it is a regular file owned by the process's user or root (as `perf`
//! requires): another user's file, or one a link points at outside the
//! container, names nothing. At most `max_size` bytes of one process's map
//! are read; entries past it stay unnamed.
//!
//! What every process's map holds together is bounded too, within the
//! receiver's state budget ([`StateBudget`], `max_state_size`): each entry is
//! charged as it is taken (its name's allocation and a share of the tree),
//! and given back when it is replaced or its process goes. A map the budget
//! has no room for stops at the line that did not fit, and goes on from
//! there once room is freed: a user who writes huge maps for many processes
//! cannot take the agent past its limits.
//!
//! What may depend on this: the receiver's process table (`procs.rs`) and
//! the `perf_map` fuzz target (through feature `perf-map`).

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::state_budget::{StateBudget, Use};

/// How often a map whose lookups miss is looked at again for new lines.
const REREAD_EVERY: Duration = Duration::from_secs(1);
/// How much of a map is read at once.
const CHUNK: usize = 1 << 20;
/// The longest line taken (a name is cut at `MAX_NAME` characters anyway).
const MAX_LINE: usize = 64 << 10;
/// How many of a map's first bytes tell one written again from its start.
const HEAD: usize = 64;
/// The longest name kept, in characters (JVM signatures can run long).
pub const MAX_NAME: usize = 1024;

/// Bytes an entry is counted as besides its name's allocation: the tree's
/// key and value (8 + 24) and their share of its nodes (at most 11 entries
/// a node; a map read in address order leaves its nodes about half full),
/// with the allocator's overhead. Measured: a 16 MiB map of one-letter
/// names took about 118 bytes of RSS an entry, name included.
const ENTRY_BYTES: usize = 96;

/// What an entry named `name` is charged: [`ENTRY_BYTES`] and the `Arc<str>`
/// (two counts and the bytes, rounded up to the allocator's 8).
fn entry_cost(name: &str) -> usize {
    ENTRY_BYTES + (16 + name.len()).next_multiple_of(8)
}

/// Who may have written a process's perf map, and where it is.
#[derive(Debug, Clone)]
pub struct Owner {
    /// The process's pid in its own PID namespace (the map's name).
    pub ns_pid: u32,
    /// The process's effective user.
    pub uid: u32,
}

/// One function of a perf map.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub start: u64,
    pub end: u64,
    pub name: Arc<str>,
}

/// One process's perf map, as far as it has been read.
#[derive(Debug, Default)]
pub struct PerfMap {
    /// By start address: (end, name). A later line for the same start
    /// replaces the earlier one (code moved and rewritten).
    entries: BTreeMap<u64, (u64, Arc<str>)>,
    /// Bytes of the file read up to the last whole line.
    read: u64,
    /// The file's identity when read (a new file is read from its start).
    file: Option<(u64, u64)>,
    /// Its first bytes as read: when they differ, the file was written
    /// again from its start (the JVM's `Compiler.perfmap` does that).
    head: Vec<u8>,
    last_read: Option<Instant>,
    /// The budget its entries are charged to (`None`: not bounded, for the
    /// fuzz targets), and what they are charged now.
    budget: Option<Arc<StateBudget>>,
    charged: usize,
}

impl Drop for PerfMap {
    fn drop(&mut self) {
        self.give_back();
    }
}

impl PerfMap {
    /// An empty map whose entries are charged to `budget`.
    pub fn with_budget(budget: Arc<StateBudget>) -> Self {
        let mut map = PerfMap::default();
        map.budget = Some(budget);
        map
    }

    /// Bytes its entries are charged.
    pub fn charged_bytes(&self) -> usize {
        self.charged
    }

    /// Gives back what its entries are charged (they are being dropped).
    fn give_back(&mut self) {
        if let Some(b) = &self.budget {
            b.give(self.charged);
        }
        self.charged = 0;
    }

    /// The JIT function holding `addr`, reading what the runtime appended
    /// since the last look if it is not known yet.
    pub fn lookup(
        &mut self,
        proc_dir: &Path,
        owner: &Owner,
        addr: u64,
        max_size: u64,
    ) -> Option<Entry> {
        if let Some(entry) = self.find(addr) {
            return Some(entry);
        }
        if self.last_read.is_some_and(|t| t.elapsed() < REREAD_EVERY) {
            return None;
        }
        self.last_read = Some(Instant::now());
        if let Err(e) = self.read_more(proc_dir, owner, max_size) {
            tracing::trace!(dir = %proc_dir.display(), error = %e, "no perf map read");
        }
        self.find(addr)
    }

    /// Entries known.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether no entry is known.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn find(&self, addr: u64) -> Option<Entry> {
        let (&start, (end, name)) = self.entries.range(..=addr).next_back()?;
        (addr < *end).then(|| Entry {
            start,
            end: *end,
            name: name.clone(),
        })
    }

    fn read_more(&mut self, proc_dir: &Path, owner: &Owner, max_size: u64) -> std::io::Result<()> {
        let mut file = open_in_root(
            &proc_dir.join("root"),
            &format!("tmp/perf-{}.map", owner.ns_pid),
        )?;
        let meta = file.metadata()?;
        if !meta.file_type().is_file() {
            return Err(std::io::Error::other("not a regular file"));
        }
        if meta.uid() != owner.uid && meta.uid() != 0 {
            return Err(std::io::Error::other(format!(
                "owned by uid {}, not the process's {} or root",
                meta.uid(),
                owner.uid
            )));
        }
        let id = (meta.dev(), meta.ino());
        let mut head = vec![0; self.head.len()];
        file.read_exact(&mut head).ok();
        if self.file != Some(id) || meta.len() < self.read || head != self.head {
            // A new file, or one written again from its start.
            self.entries.clear();
            self.read = 0;
            self.file = Some(id);
            self.head.clear();
            self.give_back();
        }
        let until = meta.len().min(max_size);
        if until <= self.read {
            return Ok(());
        }
        file.seek(SeekFrom::Start(self.read))?;
        self.read_chunks(&mut file, until, CHUNK, MAX_LINE)
    }

    /// Reads `file` from `self.read` up to `until`, `chunk` bytes at a time
    /// (a large map is never held whole), taking its whole lines; a line
    /// longer than `max_line` is passed over.
    fn read_chunks(
        &mut self,
        file: &mut File,
        until: u64,
        chunk: usize,
        max_line: usize,
    ) -> std::io::Result<()> {
        let mut pending: Vec<u8> = Vec::new();
        let mut at = self.read;
        while at < until {
            let n = usize::try_from(until - at).unwrap_or(usize::MAX).min(chunk);
            let start = pending.len();
            pending.resize(start + n, 0);
            file.read_exact(&mut pending[start..])?;
            at += n as u64;
            // Only whole lines: the runtime may be writing the next one.
            let (used, full) = self.add_lines(&pending);
            if self.head.len() < HEAD {
                let more = (HEAD - self.head.len()).min(used);
                self.head.extend_from_slice(&pending[..more]);
            }
            self.read += used as u64;
            pending.drain(..used);
            if full {
                // The budget has no room: go on from this line later.
                return Ok(());
            }
            if pending.len() > max_line {
                // Longer than any line of a map: passed over.
                if self.head.len() < HEAD {
                    let more = (HEAD - self.head.len()).min(pending.len());
                    self.head.extend_from_slice(&pending[..more]);
                }
                self.read += pending.len() as u64;
                pending.clear();
            }
        }
        Ok(())
    }

    /// Takes the entries of the whole lines of `bytes` (what follows the
    /// last newline waits for the next read); returns the bytes used, and
    /// whether it stopped before a line the budget had no room for.
    fn add_lines(&mut self, bytes: &[u8]) -> (usize, bool) {
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return (0, false);
        };
        let mut used = 0;
        for line in bytes[..end].split(|&b| b == b'\n') {
            if let Some((start, size, name)) = parse_line(line) {
                // A line for a start already known replaces its entry: only
                // what the new one takes beyond the old is asked for.
                let cost = entry_cost(&name);
                let old = self.entries.get(&start).map_or(0, |(_, n)| entry_cost(n));
                if let Some(b) = &self.budget
                    && cost > old
                    && !b.take(Use::PerfMap, cost - old)
                {
                    return (used, true);
                }
                self.entries
                    .insert(start, (start.saturating_add(size), name));
                if let Some(b) = &self.budget
                    && old > cost
                {
                    b.give(old - cost);
                }
                self.charged = self.charged - old + cost;
            }
            used += line.len() + 1;
        }
        (end + 1, false)
    }
}

/// The reader's parsing without files, for the fuzz targets in `fuzz/`.
#[doc(hidden)]
pub mod fuzzing {
    pub use super::{Entry, MAX_NAME, PerfMap};

    /// Adds the whole lines of `bytes` to `map`; the bytes used.
    pub fn add_lines(map: &mut PerfMap, bytes: &[u8]) -> usize {
        map.add_lines(bytes).0
    }

    /// Every entry, by start.
    pub fn entries(map: &PerfMap) -> Vec<Entry> {
        map.entries
            .iter()
            .map(|(&start, (end, name))| Entry {
                start,
                end: *end,
                name: name.clone(),
            })
            .collect()
    }

    /// The entry holding `addr`, from what was read.
    pub fn find(map: &PerfMap, addr: u64) -> Option<Entry> {
        map.find(addr)
    }
}

/// `START SIZE NAME`, hexadecimal, `0x` optional; `None` for anything else.
fn parse_line(line: &[u8]) -> Option<(u64, u64, Arc<str>)> {
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.splitn(3, ' ');
    let hex = |s: &str| {
        let s = s.strip_prefix("0x").unwrap_or(s);
        u64::from_str_radix(s, 16).ok()
    };
    let start = hex(parts.next()?)?;
    let size = hex(parts.next()?)?;
    let name = parts.next()?.trim();
    // An empty name or range, or one past the end of the address space,
    // is no function.
    if size == 0 || name.is_empty() || start.checked_add(size).is_none() {
        return None;
    }
    let name = match name.char_indices().nth(MAX_NAME) {
        Some((cut, _)) => &name[..cut],
        None => name,
    };
    Some((start, size, Arc::from(name)))
}

/// Opens `path` (relative) for reading with `root` as `/`: links are
/// resolved inside it, never out of it, and no magic `/proc` link is
/// followed (`openat2` with `RESOLVE_IN_ROOT`). Non-blocking, so a FIFO put
/// there does not wait for a writer.
fn open_in_root(root: &Path, path: &str) -> std::io::Result<File> {
    use std::ffi::CString;
    use std::os::unix::ffi::OsStrExt;
    let root_c = CString::new(root.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    let path_c = CString::new(path).map_err(std::io::Error::other)?;
    // SAFETY: a path string that outlives the call; the descriptor returned
    // is owned below.
    let dir = unsafe {
        libc::open(
            root_c.as_ptr(),
            libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if dir < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `dir` was just opened and is owned by nothing else.
    let dir = unsafe { OwnedFd::from_raw_fd(dir) };
    // SAFETY: `open_how` is plain data; zeroed is its documented default.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = (libc::O_RDONLY | libc::O_NONBLOCK | libc::O_NOCTTY | libc::O_CLOEXEC) as u64;
    how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
    // SAFETY: valid descriptor, path and `open_how` of the size given.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            std::os::fd::AsRawFd::as_raw_fd(&dir),
            path_c.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(std::io::Error::other)?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn me() -> Owner {
        // SAFETY: no arguments, no memory.
        let uid = unsafe { libc::geteuid() };
        Owner {
            ns_pid: 4_000_000,
            uid,
        }
    }

    /// A fake `/proc/PID` whose `root` is a directory with a `tmp`.
    fn proc_dir() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("root/tmp")).unwrap();
        dir
    }

    #[test]
    fn lines_of_every_runtime_parse() {
        // Node, CPython -X perf, the JVM's Compiler.perfmap.
        let node = parse_line(b"3b5e0d8c2c0 5c LazyCompile:*hot /app/index.js:3").unwrap();
        assert_eq!(
            (node.0, node.1, &*node.2),
            (0x3b5e0d8c2c0, 0x5c, "LazyCompile:*hot /app/index.js:3")
        );
        let py = parse_line(b"7f3a1c0e1000 b py::spin:/app/x.py").unwrap();
        assert_eq!(&*py.2, "py::spin:/app/x.py");
        let jvm = parse_line(b"0x00007f8b4d0c3a20 0x00000000000001e0 void Hot.spin(long)").unwrap();
        assert_eq!(
            (jvm.0, jvm.1, &*jvm.2),
            (0x7f8b4d0c3a20, 0x1e0, "void Hot.spin(long)")
        );
        for bad in [
            &b""[..],
            b"zz 10 f",
            b"10 zz f",
            b"10 0 f",
            b"10 10",
            b"10 10 ",
            b"\xff 1 f",
        ] {
            assert!(parse_line(bad).is_none(), "{bad:?}");
        }
        let long = format!("10 10 {}", "é".repeat(3000));
        assert_eq!(
            parse_line(long.as_bytes()).unwrap().2.chars().count(),
            MAX_NAME
        );
    }

    #[test]
    fn appended_lines_are_read_when_an_address_is_missed() {
        let dir = proc_dir();
        let owner = me();
        let path = dir
            .path()
            .join(format!("root/tmp/perf-{}.map", owner.ns_pid));
        let mut f = std::fs::File::create(&path).unwrap();
        writeln!(f, "1000 100 first").unwrap();
        // Half a line: not read until it is whole.
        write!(f, "2000 100 sec").unwrap();
        let mut map = PerfMap::default();
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x1050, u64::MAX)
                .map(|e| e.name)
                .as_deref(),
            Some("first")
        );
        assert_eq!(map.lookup(dir.path(), &owner, 0x2050, u64::MAX), None);
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x1100, u64::MAX),
            None,
            "past its end"
        );
        writeln!(f, "ond").unwrap();
        // Within the second since the last read: not read again yet.
        assert_eq!(map.lookup(dir.path(), &owner, 0x2050, u64::MAX), None);
        map.last_read = None;
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x2050, u64::MAX)
                .map(|e| e.name)
                .as_deref(),
            Some("second")
        );
        // Code moved: a later line for the same start wins.
        writeln!(f, "1000 80 moved").unwrap();
        map.last_read = None;
        assert_eq!(map.lookup(dir.path(), &owner, 0x3000, u64::MAX), None);
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x1010, u64::MAX)
                .map(|e| e.name)
                .as_deref(),
            Some("moved")
        );
        assert_eq!(map.len(), 2);
    }

    #[test]
    fn a_map_is_read_up_to_its_bound_and_again_when_rewritten() {
        let dir = proc_dir();
        let owner = me();
        let path = dir
            .path()
            .join(format!("root/tmp/perf-{}.map", owner.ns_pid));
        std::fs::write(&path, "1000 10 a\n2000 10 b\n").unwrap();
        let mut map = PerfMap::default();
        // 12 bytes: the first line only.
        assert_eq!(map.lookup(dir.path(), &owner, 0x2000, 12), None);
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x1000, 12)
                .map(|e| e.name)
                .as_deref(),
            Some("a")
        );
        // Written again, shorter: read from its start.
        std::fs::write(&path, "5000 10 c\n").unwrap();
        map.last_read = None;
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x5000, 12)
                .map(|e| e.name)
                .as_deref(),
            Some("c")
        );
        assert_eq!(map.lookup(dir.path(), &owner, 0x1000, 12), None);
    }

    #[test]
    fn every_map_together_stays_within_the_budget_and_gives_it_back() {
        let dir = proc_dir();
        let owner = me();
        let path = dir
            .path()
            .join(format!("root/tmp/perf-{}.map", owner.ns_pid));
        // Three entries of one-letter names: 96 + 24 bytes each.
        std::fs::write(&path, "1000 10 a\n2000 10 b\n3000 10 c\n").unwrap();
        let one = entry_cost("a");
        assert_eq!(one, 120);
        let budget = StateBudget::new(4 * one);
        let mut first = PerfMap::with_budget(budget.clone());
        assert!(first.lookup(dir.path(), &owner, 0x3000, 1 << 20).is_some());
        assert_eq!(budget.used_bytes(), 3 * one);
        // A second process's map gets the one entry left, and stops at the
        // line that did not fit.
        let mut second = PerfMap::with_budget(budget.clone());
        assert!(second.lookup(dir.path(), &owner, 0x1000, 1 << 20).is_some());
        assert_eq!(second.lookup(dir.path(), &owner, 0x2000, 1 << 20), None);
        assert_eq!(budget.used_bytes(), 4 * one);
        assert_eq!(second.read, "1000 10 a\n".len() as u64);
        assert_eq!(budget.refusals(Use::PerfMap), 1);
        // The first process goes: the second reads on from that line.
        drop(first);
        assert_eq!(budget.used_bytes(), one);
        second.last_read = None;
        assert!(second.lookup(dir.path(), &owner, 0x3000, 1 << 20).is_some());
        assert_eq!(budget.used_bytes(), 3 * one);
        assert_eq!(second.charged_bytes(), 3 * one);
        // A line for a start already known replaces its entry and its charge.
        std::fs::write(
            &path,
            "1000 10 a\n2000 10 b\n3000 10 c\n3000 10 dddddddddd\n",
        )
        .unwrap();
        second.last_read = None;
        assert_eq!(
            second
                .lookup(dir.path(), &owner, 0x3000, 1 << 20)
                .map(|e| e.name)
                .as_deref(),
            Some("c"),
            "a known address is not read again"
        );
        second.last_read = None;
        assert!(second.lookup(dir.path(), &owner, 0x4000, 1 << 20).is_none());
        assert_eq!(budget.used_bytes(), 2 * one + entry_cost("dddddddddd"));
        // Written again from its start: everything is given back first.
        std::fs::write(&path, "9000 10 z\n").unwrap();
        second.last_read = None;
        assert!(second.lookup(dir.path(), &owner, 0x9000, 1 << 20).is_some());
        assert_eq!(budget.used_bytes(), one);
        drop(second);
        assert_eq!(budget.used_bytes(), 0);
    }

    #[test]
    fn a_map_read_in_small_chunks_is_read_the_same() {
        let dir = proc_dir();
        let owner = me();
        let path = dir
            .path()
            .join(format!("root/tmp/perf-{}.map", owner.ns_pid));
        let long = "x".repeat(40);
        let text = format!("1000 10 a\n{long}\n2000 10 bb\n3000 10 c");
        std::fs::write(&path, &text).unwrap();
        let mut map = PerfMap::default();
        let mut file = File::open(&path).unwrap();
        let len = file.metadata().unwrap().len();
        map.read_chunks(&mut file, len, 7, 20).unwrap();
        let names: Vec<String> = fuzzing::entries(&map)
            .into_iter()
            .map(|e| e.name.to_string())
            .collect();
        // Lines cross chunks; the one longer than 20 bytes is passed over;
        // the last, not ended yet, waits.
        assert_eq!(names, ["a", "bb"]);
        assert_eq!(map.read, len - "3000 10 c".len() as u64);
        // Its first bytes are the file's, skipped line and all.
        assert_eq!(map.head, text.as_bytes()[..HEAD.min(map.read as usize)]);
    }

    #[test]
    fn links_out_of_the_root_and_other_owners_name_nothing() {
        let dir = proc_dir();
        let owner = me();
        // A link to an absolute path means that path inside the root.
        let outside = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(outside.path(), "1000 10 secret\n").unwrap();
        let link = dir
            .path()
            .join(format!("root/tmp/perf-{}.map", owner.ns_pid));
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        let mut map = PerfMap::default();
        assert_eq!(map.lookup(dir.path(), &owner, 0x1000, u64::MAX), None);
        // The same file inside the root is read.
        let inside = dir
            .path()
            .join("root")
            .join(outside.path().strip_prefix("/").unwrap());
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::write(&inside, "1000 10 inside\n").unwrap();
        map.last_read = None;
        assert_eq!(
            map.lookup(dir.path(), &owner, 0x1000, u64::MAX)
                .map(|e| e.name)
                .as_deref(),
            Some("inside")
        );
        // Another user's map is not read.
        let mut map = PerfMap::default();
        let other = Owner {
            uid: owner.uid + 1,
            ..owner.clone()
        };
        if owner.uid != 0 {
            assert_eq!(map.lookup(dir.path(), &other, 0x1000, u64::MAX), None);
        } else {
            // Root owns it: root's files are trusted for every process.
            assert!(map.lookup(dir.path(), &other, 0x1000, u64::MAX).is_some());
            std::os::unix::fs::chown(&inside, Some(12345), None).unwrap();
            let mut map = PerfMap::default();
            assert_eq!(map.lookup(dir.path(), &other, 0x1000, u64::MAX), None);
        }
    }
}
