//! The files an ELF file's DWARF names ([`Links`]), found and opened here
//! with [`super::open`] rather than by blazesym, which looks for them by
//! path and opens what it finds with a plain `open` (a FIFO there would
//! block it):
//!
//! - **`.gnu_debuglink`**: the separate debug file, looked for where GDB
//!   looks (by the binary's build id in each debug directory, then next to
//!   the binary, in its `.debug/`, and under each debug directory at the
//!   binary's own directory) and taken when its build id is the binary's,
//!   or, for a binary without one, when its CRC-32 is the link's.
//! - **`.gnu_debugaltlink`** (dwz): the supplementary file, by its build id
//!   in each debug directory, else at the path the link names, taken when
//!   its build id is the link's. blazesym finds it by build id in its own
//!   debug directory: a private one ([`Supplements`], mode 0700) holding
//!   `.build-id/ab/cdef….debug` symlinks to `/proc/self/fd/N` of the files
//!   opened here, so what it opens is what was checked. The directory is
//!   named after its process; a proflow that was killed cannot remove its
//!   own, so the next one removes those of processes gone.
//!
//! A file whose links cannot be followed this way is read without DWARF.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path, PathBuf};

use super::elf::{ElfFile, ElfInfo, build_id_path};
use super::open::fd_path;

/// Longest file whose CRC-32 is computed to match a debuglink (only for a
/// binary without a build id); a larger candidate is not taken.
pub const MAX_CRC_BYTES: u64 = 1 << 30;

/// The separate debug file `.gnu_debuglink` names, for the binary `info`
/// opened at `path`.
pub fn find_debuglink(path: &Path, info: &ElfInfo, debug_dirs: &[PathBuf]) -> Option<ElfFile> {
    let (name, crc) = info.links.debuglink.as_ref()?;
    let plain = Path::new(name);
    let mut parts = plain.components();
    if !matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    ) {
        // A name, not a path: `../../x` must not lead elsewhere.
        return None;
    }
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(id) = &info.build_id {
        candidates.extend(debug_dirs.iter().filter_map(|d| build_id_path(d, id)));
    }
    if let Some(dir) = path.parent() {
        candidates.push(dir.join(plain));
        candidates.push(dir.join(".debug").join(plain));
        let relative = within_root(dir);
        candidates.extend(debug_dirs.iter().map(|d| d.join(&relative).join(plain)));
    }
    candidates.into_iter().find_map(|c| {
        let found = ElfFile::open(&c)?;
        if found.info.file == info.file {
            return None;
        }
        let same = match (&info.build_id, &found.info.build_id) {
            (Some(want), Some(have)) => want == have,
            (Some(_), None) => false,
            (None, _) => crc32(&found.file).is_ok_and(|c| c == *crc),
        };
        same.then_some(found)
    })
}

/// `dir` relative to the root it is in: `/proc/<pid>/root` (a process's
/// root, as the `ebpf` receiver and the processor open files of containers)
/// or `/`.
fn within_root(dir: &Path) -> PathBuf {
    let mut parts = dir.components().peekable();
    let _ = parts.next_if_eq(&Component::RootDir);
    let rest: Vec<Component<'_>> = parts.collect();
    let in_proc_root = rest.len() >= 3
        && rest[0] == Component::Normal("proc".as_ref())
        && matches!(rest[1], Component::Normal(p) if p.to_str().is_some_and(|p| p.bytes().all(|b| b.is_ascii_digit())))
        && rest[2] == Component::Normal("root".as_ref());
    let skip = if in_proc_root { 3 } else { 0 };
    rest.iter()
        .skip(skip)
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect()
}

/// The standard CRC-32 (as zlib) of a whole file, which `.gnu_debuglink`
/// records; read through the open descriptor.
fn crc32(file: &File) -> io::Result<u32> {
    let len = file.metadata()?.len();
    if len > MAX_CRC_BYTES {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "too large"));
    }
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut at = 0u64;
    loop {
        let n = file.read_at(&mut buf, at)?;
        if n == 0 {
            return Ok(hasher.finalize());
        }
        hasher.update(&buf[..n]);
        at += n as u64;
    }
}

/// The supplementary files blazesym may open, each behind a symlink in a
/// private directory (see the module docs), held while a file that needs
/// it is open.
pub struct Supplements {
    /// `None` when it could not be made: files that need a supplementary
    /// file are then read without DWARF.
    dir: Option<tempfile::TempDir>,
    /// By build id: the open file and how many open files need it.
    held: HashMap<String, (File, usize)>,
}

impl Supplements {
    pub fn new() -> Supplements {
        Supplements::in_dir(&std::env::temp_dir())
    }

    /// Its directory made in `parent`, named after this process (see
    /// [`Owner`]), and the directories there of processes gone without
    /// removing theirs (killed, or crashed) removed.
    pub fn in_dir(parent: &Path) -> Supplements {
        let me = Owner::of_this_process();
        let dir = me
            .as_ref()
            .ok_or_else(|| io::Error::other("/proc/self cannot be read"))
            .and_then(|me| {
                tempfile::Builder::new()
                    .prefix(&me.prefix())
                    .tempdir_in(parent)
            })
            .inspect_err(|e| {
                tracing::warn!(error = %e, "symbolize: no private directory for supplementary (dwz) debug files; files that need one are named without DWARF");
            })
            .ok();
        if let (Some(dir), Some(me)) = (&dir, &me) {
            remove_stale(parent, dir.path(), me.pid_ns);
        }
        Supplements {
            dir,
            held: HashMap::new(),
        }
    }

    /// The directory to give blazesym as its only debug directory.
    pub fn dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(tempfile::TempDir::path)
    }

    /// Supplementary files held now.
    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Finds the supplementary file `altlink` names (opened and checked
    /// here) and links it where blazesym looks for it; true when it is
    /// there, and then [`Supplements::release`] must follow once the file
    /// that needed it is closed.
    pub fn hold(&mut self, altlink: &(PathBuf, String), debug_dirs: &[PathBuf]) -> bool {
        let (path, build_id) = altlink;
        // blazesym looks a supplementary file up by a build id of 8 bytes
        // or more only; with a shorter one it would go by path.
        if build_id.len() < 16 {
            return false;
        }
        if let Some((_, n)) = self.held.get_mut(build_id) {
            *n += 1;
            return true;
        }
        let Some(link) = self.link_path(build_id) else {
            return false;
        };
        let mut candidates: Vec<PathBuf> = debug_dirs
            .iter()
            .filter_map(|d| build_id_path(d, build_id))
            .collect();
        if path.is_absolute() {
            candidates.push(path.clone());
        }
        let Some(found) = candidates.into_iter().find_map(|c| {
            ElfFile::open(&c).filter(|f| f.info.build_id.as_deref() == Some(build_id))
        }) else {
            return false;
        };
        let linked = link
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| {
                let _ = std::fs::remove_file(&link);
                std::os::unix::fs::symlink(fd_path(&found.file), &link)
            });
        if linked.is_err() {
            return false;
        }
        self.held.insert(build_id.clone(), (found.file, 1));
        true
    }

    /// One file that needed `build_id` is closed: when none is left, the
    /// link goes and its path is returned (for blazesym to forget it).
    pub fn release(&mut self, build_id: &str) -> Option<PathBuf> {
        let (_, n) = self.held.get_mut(build_id)?;
        *n -= 1;
        if *n > 0 {
            return None;
        }
        self.held.remove(build_id);
        let link = self.link_path(build_id)?;
        let _ = std::fs::remove_file(&link);
        Some(link)
    }

    fn link_path(&self, build_id: &str) -> Option<PathBuf> {
        build_id_path(self.dir()?, build_id)
    }
}

/// The prefix of every private directory.
const PREFIX: &str = "proflow-symbolize-";
/// Entries of the temporary directory looked at, at most, for stale ones.
const MAX_SCANNED: usize = 100_000;

/// The process a private directory belongs to, written in its name
/// (`proflow-symbolize-PIDNS-PID-START-random`): its pid namespace, its
/// pid and its start time (clock ticks after boot), so that a later process
/// with the same pid is not taken for it, nor one of another namespace
/// that shares the directory (containers with a common `/tmp`).
#[derive(Debug, PartialEq, Eq)]
struct Owner {
    pid_ns: u64,
    pid: u32,
    start: u64,
}

impl Owner {
    fn of_this_process() -> Option<Owner> {
        Some(Owner {
            pid_ns: pid_ns()?,
            pid: std::process::id(),
            start: start_time(std::process::id())?,
        })
    }

    fn prefix(&self) -> String {
        format!("{PREFIX}{}-{}-{}-", self.pid_ns, self.pid, self.start)
    }

    /// The owner a directory's name gives; `None` for any other name
    /// (an older proflow's, without one, is left).
    fn from_name(name: &str) -> Option<Owner> {
        let mut parts = name.strip_prefix(PREFIX)?.splitn(4, '-');
        let owner = Owner {
            pid_ns: parts.next()?.parse().ok()?,
            pid: parts.next()?.parse().ok()?,
            start: parts.next()?.parse().ok()?,
        };
        parts.next()?;
        Some(owner)
    }

    /// Whether the process is running, seen from pid namespace `here`:
    /// `/proc` tells for a process of `here`; one of another namespace is
    /// taken as running.
    fn is_running(&self, here: u64) -> bool {
        self.pid_ns != here || start_time(self.pid) == Some(self.start)
    }
}

/// The inode of this process's pid namespace (`pid:[4026531836]`).
fn pid_ns() -> Option<u64> {
    let link = std::fs::read_link("/proc/self/ns/pid").ok()?;
    link.to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .parse()
        .ok()
}

/// When process `pid` started: field 22 of `/proc/PID/stat`, counted after
/// the command's closing parenthesis (the command may hold spaces and
/// parentheses).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Removes the private directories in `parent` whose process, of pid
/// namespace `here`, is gone: only directories (not links), and only those
/// of the user that owns `own`, this process's directory.
fn remove_stale(parent: &Path, own: &Path, here: u64) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(entries), Ok(me)) = (std::fs::read_dir(parent), own.metadata()) else {
        return;
    };
    for entry in entries.flatten().take(MAX_SCANNED) {
        let name = entry.file_name();
        let Some(owner) = name.to_str().and_then(Owner::from_name) else {
            continue;
        };
        let path = entry.path();
        if path == own || owner.is_running(here) {
            continue;
        }
        let Ok(meta) = path.symlink_metadata() else {
            continue;
        };
        if meta.is_dir() && meta.uid() == me.uid() {
            match std::fs::remove_dir_all(&path) {
                Ok(()) => {
                    tracing::debug!(path = %path.display(), "symbolize: removed the directory of a proflow gone")
                }
                Err(e) => {
                    tracing::debug!(path = %path.display(), error = %e, "symbolize: cannot remove the directory of a proflow gone")
                }
            }
        }
    }
}

impl Default for Supplements {
    fn default() -> Self {
        Supplements::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_within_a_process_root() {
        assert_eq!(
            within_root(Path::new("/proc/42/root/usr/bin")),
            Path::new("usr/bin")
        );
        assert_eq!(within_root(Path::new("/usr/bin")), Path::new("usr/bin"));
        assert_eq!(
            within_root(Path::new("/proc/self/root/usr")),
            Path::new("proc/self/root/usr")
        );
        assert_eq!(within_root(Path::new("/")), Path::new(""));
    }

    #[test]
    fn a_directory_names_its_process() {
        let me = Owner::of_this_process().expect("/proc/self");
        assert_eq!(me.pid, std::process::id());
        assert!(me.is_running(me.pid_ns));
        let name = format!("{}a1B2c3", me.prefix());
        assert_eq!(Owner::from_name(&name), Some(me));
        // An older proflow's (random only), a name cut short, another's.
        for other in [
            "proflow-symbolize-02ZUvb",
            "proflow-symbolize-1-2-3",
            "proflow-symbolize-1-x-3-abc",
            "proflow-other-1-2-3-abc",
        ] {
            assert_eq!(Owner::from_name(other), None, "{other}");
        }
    }

    #[test]
    fn the_directories_of_processes_gone_are_removed_and_nothing_else() {
        let parent = tempfile::tempdir().unwrap();
        let me = Owner::of_this_process().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let target = outside.path().join("kept");
        std::fs::write(&target, b"x").unwrap();
        let make = |owner: &Owner, what: &str| -> PathBuf {
            let dir = parent.path().join(format!("{}{what}", owner.prefix()));
            // As a killed proflow leaves one: a link to a file.
            let links = dir.join(".build-id/ab");
            std::fs::create_dir_all(&links).unwrap();
            std::os::unix::fs::symlink(&target, links.join("cdef.debug")).unwrap();
            dir
        };
        // Above the kernel's highest pid (2^22): never a process's.
        let gone = make(
            &Owner {
                pid: 4_194_305,
                ..Owner::of_this_process().unwrap()
            },
            "gone1",
        );
        // This pid, but an earlier process's (the pid was reused).
        let reused = make(
            &Owner {
                start: me.start.wrapping_sub(1),
                ..Owner::of_this_process().unwrap()
            },
            "gone2",
        );
        // A running process's: another symbolizer of this one.
        let running = make(&me, "alive");
        // Another pid namespace's: /proc here cannot say.
        let other_ns = make(
            &Owner {
                pid_ns: me.pid_ns + 1,
                pid: 4_194_305,
                start: 1,
            },
            "otherns",
        );
        // A stale name on a file and on a link to a directory.
        let stale = Owner {
            pid: 4_194_305,
            ..Owner::of_this_process().unwrap()
        };
        let file = parent.path().join(format!("{}file", stale.prefix()));
        std::fs::write(&file, b"x").unwrap();
        let link = parent.path().join(format!("{}link", stale.prefix()));
        std::os::unix::fs::symlink(outside.path(), &link).unwrap();
        // An older proflow's, whose process cannot be told.
        let older = parent.path().join("proflow-symbolize-02ZUvb");
        std::fs::create_dir(&older).unwrap();

        let supplements = Supplements::in_dir(parent.path());
        let own = supplements.dir().expect("its directory").to_path_buf();
        assert_eq!(own.parent(), Some(parent.path()));
        assert!(!gone.exists(), "a process that is not running");
        assert!(!reused.exists(), "an earlier process of this pid");
        for kept in [&running, &other_ns, &file, &older, &own] {
            assert!(kept.exists(), "{} was removed", kept.display());
        }
        assert!(link.symlink_metadata().is_ok(), "the link was removed");
        assert!(
            target.exists() && outside.path().exists(),
            "a link was followed"
        );
        drop(supplements);
        assert!(!own.exists(), "its own directory outlives it");
    }

    #[test]
    fn a_debuglink_name_that_is_a_path_is_not_followed() {
        let me = std::env::current_exe().unwrap();
        let mut info = ElfInfo::read(&me).unwrap();
        for name in ["../../etc/passwd", "/etc/passwd", "a/b", ".", ""] {
            info.links.debuglink = Some((name.into(), 0));
            assert!(
                find_debuglink(&me, &info, &[]).is_none(),
                "{name:?} is followed"
            );
        }
    }
}
