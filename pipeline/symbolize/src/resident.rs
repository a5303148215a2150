//! File pages this process has mapped to read symbols, handed back to the
//! page cache.
//!
//! blazesym maps every file it reads (an ELF file's symbol table, its DWARF
//! in place), and the `ebpf` receiver maps unwind sections. Each page a
//! lookup touches stays in this process's page tables, so it counts in its
//! RSS until the file is closed, though it is the kernel's page cache: on a
//! node that starts processes all the time, the libraries every process maps
//! (libc, a Python built with DWARF) stay open and their touched pages add up
//! to tens of MiB of RSS. [`release_file_pages`] unmaps those pages from
//! the page tables (`MADV_DONTNEED`) without closing anything: the bytes
//! stay in the page cache, where the kernel may reclaim them, and the next
//! lookup that needs a page maps it again (a minor fault, no read).
//!
//! Only read-only shared mappings of files are released (`r--s` in
//! `/proc/self/maps`): for those the call cannot change what a reader sees,
//! since the pages come back from the same file. Private mappings (this
//! binary's code and data, whose relocated pages exist nowhere else), shared
//! memory (`/memfd:`, `/SYSV`, tmpfs is not told apart) and devices are
//! left alone.

use std::io::{BufRead, BufReader};

/// Releases the pages of every read-only shared file mapping of this
/// process; returns how many mappings were released. Safe to call from any
/// thread at any time (see the module docs); costs a read of
/// `/proc/self/maps` and one `madvise` per mapping.
pub fn release_file_pages() -> usize {
    let Ok(maps) = std::fs::File::open("/proc/self/maps") else {
        return 0;
    };
    let mut released = 0;
    for line in BufReader::new(maps).lines() {
        let Ok(line) = line else { break };
        let Some((start, len)) = releasable(&line) else {
            continue;
        };
        // SAFETY: a read-only shared mapping of a file: MADV_DONTNEED drops
        // this process's page-table entries only, and the next access maps
        // the same file's page again, so no reader sees other bytes. The
        // range is one whole mapping, page aligned, from the kernel.
        if unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) } == 0 {
            released += 1;
        }
    }
    released
}

/// The start and length of a `/proc/self/maps` line's mapping when it is a
/// read-only shared mapping of a file.
fn releasable(line: &str) -> Option<(usize, usize)> {
    let mut fields = line.split_ascii_whitespace();
    let range = fields.next()?;
    let perms = fields.next()?;
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    let path = fields.next()?;
    if perms != "r--s" || inode == "0" || !path.starts_with('/') {
        return None;
    }
    if ["/memfd:", "/SYSV", "/dev/", "/dmabuf"]
        .iter()
        .any(|p| path.starts_with(p))
    {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    Some((start, end.checked_sub(start).filter(|&l| l > 0)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn only_read_only_shared_file_mappings_are_released() {
        let yes =
            "7f0000000000-7f0000a00000 r--s 00000000 fe:00 1234 /usr/lib/libpython3.11.so.1.0";
        assert_eq!(releasable(yes), Some((0x7f00_0000_0000, 0xa0_0000)));
        for no in [
            // this binary's code and relocated data
            "55d000000000-55d000100000 r-xp 00000000 fe:00 99 /usr/bin/proflow",
            "55d000100000-55d000200000 r--p 00100000 fe:00 99 /usr/bin/proflow",
            // the BPF ring buffer, shared memory, devices, anonymous memory
            "7f1000000000-7f1000200000 r--s 00000000 00:0e 77 anon_inode:bpf-map",
            "7f2000000000-7f2000001000 r--s 00000000 00:01 5 /memfd:x (deleted)",
            "7f3000000000-7f3000001000 r--s 00000000 00:05 6 /dev/zero",
            "7f4000000000-7f4000001000 rw-s 00000000 fe:00 7 /var/lib/data",
            "7f5000000000-7f5000021000 rw-p 00000000 00:00 0",
            "7f6000000000-7f6000021000 r--s 00000000 00:00 0 [vvar]",
            "not a line",
        ] {
            assert_eq!(releasable(no), None, "{no}");
        }
    }

    /// A file mapped and read, released, reads the same bytes again, and
    /// its pages are no longer resident in this process.
    #[test]
    fn released_pages_read_back_the_same_bytes() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        // SAFETY: a private temporary file nobody else changes.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                data.len(),
                libc::PROT_READ,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&f),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED);
        // SAFETY: the mapping is data.len() bytes long and readable.
        let view = unsafe { std::slice::from_raw_parts(map as *const u8, data.len()) };
        assert_eq!(view, &data[..]);
        let rss = || {
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let start = format!("{:x}-", map as usize);
            smaps
                .split('\n')
                .skip_while(|l| !l.starts_with(&start))
                .find_map(|l| l.strip_prefix("Rss:"))
                .map(|v| {
                    v.trim()
                        .trim_end_matches("kB")
                        .trim()
                        .parse::<u64>()
                        .unwrap()
                })
                .expect("the mapping is in smaps")
        };
        assert_eq!(rss(), 1024, "the mapping was read whole: 1 MiB resident");
        assert!(release_file_pages() >= 1, "the test's own mapping is one");
        assert_eq!(rss(), 0, "no page of the released mapping is resident");
        assert_eq!(view, &data[..], "the same bytes are read again");
        // SAFETY: unmapping the mapping made above, not used after.
        unsafe { libc::munmap(map, data.len()) };
    }
}
