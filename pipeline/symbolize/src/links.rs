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
//!   opened here, so what it opens is what was checked.
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
        let dir = tempfile::Builder::new()
            .prefix("proflow-symbolize-")
            .tempdir()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "symbolize: no private directory for supplementary (dwz) debug files; files that need one are named without DWARF");
            })
            .ok();
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
