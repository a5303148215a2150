//! Opening the files the symbolizer reads (binaries, debug files, their
//! debuglink and supplementary files, `/proc/<pid>/root/...` paths,
//! `/proc/kallsyms`) so that no path a profile names, and no file swapped
//! in under it later, can block the reader or wake a device.
//!
//! [`open_regular`] looks the path up with `O_PATH`, which opens nothing:
//! a FIFO does not wait for a writer, a device's driver is not called
//! (opening some devices has effects: a watchdog starts its countdown). The
//! descriptor's own `fstat` must say regular file, within a size bound.
//! Only then is the same file opened for reading, through
//! `/proc/self/fd/N` (the inode that descriptor holds, whatever the path
//! names by now), with `O_NONBLOCK | O_NOCTTY | O_CLOEXEC`, and `fstat` on
//! the descriptor that is read checks that it is still that regular file.
//! There is no window between a check and an open: both look at
//! descriptors, never at the path again.
//!
//! Readers that take a path (blazesym) are given [`fd_path`] of the open
//! file, so they read that very file too.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Which file a descriptor holds: its device and inode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    fn of(m: &std::fs::Metadata) -> FileId {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
        }
    }
}

/// A regular file open for reading.
#[derive(Debug)]
pub struct Regular {
    pub file: File,
    pub id: FileId,
    /// Its size when opened (0 for files of `/proc`, which have none).
    pub size: u64,
}

/// Opens `path` for reading only if it is a regular file of at most
/// `max_size` bytes (see the module docs for how). Anything else (a FIFO,
/// a socket, a device, a directory, a larger file) is an error of kind
/// `InvalidInput`, found without opening it.
pub fn open_regular(path: &Path, max_size: u64) -> io::Result<Regular> {
    let probe = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)?;
    let looked = probe.metadata()?;
    check(&looked, max_size)?;
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(fd_path(&probe))?;
    let opened = file.metadata()?;
    check(&opened, max_size)?;
    let id = FileId::of(&opened);
    if id != FileId::of(&looked) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the file changed while it was opened",
        ));
    }
    Ok(Regular {
        file,
        id,
        size: opened.len(),
    })
}

fn check(m: &std::fs::Metadata, max_size: u64) -> io::Result<()> {
    if !m.file_type().is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file",
        ));
    }
    if m.len() > max_size {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("larger than {max_size} bytes"),
        ));
    }
    Ok(())
}

/// The path that names `file`'s own inode for as long as it is open:
/// opening it opens that file, wherever (and whether) it is linked now.
pub fn fd_path(file: &File) -> PathBuf {
    PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory of this test's own, removed when dropped.
    pub(crate) struct Scratch(pub PathBuf);

    impl Scratch {
        pub(crate) fn new(name: &str) -> Scratch {
            let dir = std::env::temp_dir().join(format!(
                "proflow-open-{name}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            Scratch(dir)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// Makes a FIFO at `path` (std has no mkfifo).
    pub(crate) fn mkfifo(path: &Path) {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path that outlives the call.
        let rc = unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
        assert_eq!(rc, 0, "mkfifo {}", path.display());
    }

    #[test]
    fn only_regular_files_within_the_bound_are_opened() {
        let dir = Scratch::new("kinds");
        let file = dir.0.join("file");
        std::fs::write(&file, b"0123456789").unwrap();
        let r = open_regular(&file, 10).unwrap();
        assert_eq!(r.size, 10);
        assert_eq!(std::fs::read(fd_path(&r.file)).unwrap(), b"0123456789");
        let too_big = open_regular(&file, 9).unwrap_err();
        assert_eq!(too_big.kind(), io::ErrorKind::InvalidInput);

        // A FIFO with no writer: opening it for reading would wait for one.
        let fifo = dir.0.join("fifo");
        mkfifo(&fifo);
        let e = open_regular(&fifo, u64::MAX).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        for other in ["/dev/null", "/dev/zero", "/"] {
            let e = open_regular(Path::new(other), u64::MAX).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{other}: {e}");
        }
        // A symlink is followed to what it names.
        let link = dir.0.join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(open_regular(&link, u64::MAX).is_err());
    }

    #[test]
    fn the_descriptor_keeps_reading_the_file_that_was_checked() {
        let dir = Scratch::new("swap");
        let path = dir.0.join("app");
        std::fs::write(&path, b"checked").unwrap();
        let r = open_regular(&path, u64::MAX).unwrap();
        // Swapped for a FIFO after the open: the descriptor's path still
        // names the file that was checked.
        std::fs::remove_file(&path).unwrap();
        mkfifo(&path);
        assert_eq!(std::fs::read(fd_path(&r.file)).unwrap(), b"checked");
        assert!(open_regular(&path, u64::MAX).is_err());
    }
}
