//! How the binary keeps glibc's allocator from holding memory it no longer
//! uses. glibc gives each thread that contends for the heap an arena of its
//! own (up to eight per core), and freed memory stays in its arena until
//! the top of that arena is free. A long-running collector frees in bursts
//! (an interval's profiles, a closed file's DWARF, a pushed batch), so its
//! RSS creeps up towards its peak and stays there.
//!
//! - [`limit_arenas`]: at most one arena per core (tokio runs one worker
//!   per core; blocking threads share), unless the operator set
//!   `MALLOC_ARENA_MAX` or `GLIBC_TUNABLES=glibc.malloc.arena_max=N`.
//! - [`trim_every`]: every period, free pages inside the arenas are given
//!   back to the kernel (`malloc_trim`, on a blocking thread; 40 µs to
//!   1.2 ms for the `ebpf` receiver's 43 MiB heap, logged at debug as
//!   `heap trimmed`).
//!
//! - [`release_clean_file_pages`]: with each trim, and once when the
//!   pipelines have started, the pages of read-only private file mappings
//!   (this binary's code and constants, shared libraries) that were never
//!   written are unmapped from the page tables (`MADV_DONTNEED`). They stay
//!   in the kernel's page cache; the code that still runs maps its pages
//!   again at its next call (a minor fault, no read). RSS counts mapped file
//!   pages, and of the 22 MB of code in this binary about 10 MB was mapped
//!   by start-up, config and TLS set-up that a running collector never calls
//!   again; mapped pages are also the last the kernel reclaims.
//!
//! Other C libraries (musl) and allocators keep their own policies: the
//! first two do nothing there.

use std::time::Duration;

/// At most one glibc arena per core, unless the environment sets the
/// number. Called before the runtime starts its threads.
pub fn limit_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let set_by_operator = std::env::var_os("MALLOC_ARENA_MAX").is_some()
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.arena_max"));
        if set_by_operator {
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cores = i32::try_from(cores).unwrap_or(i32::MAX);
        // SAFETY: mallopt only sets a tunable; no thread allocates yet.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, cores);
        }
    }
}

/// Gives free heap pages back to the kernel every `period`, until the
/// process ends.
pub async fn trim_every(period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        // Off the async workers: it walks every arena.
        let _ = tokio::task::spawn_blocking(trim).await;
    }
}

fn trim() {
    release_clean_file_pages();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let started = std::time::Instant::now();
        // SAFETY: malloc_trim only releases free memory; any thread may call it.
        let released = unsafe { libc::malloc_trim(0) };
        let took = started.elapsed();
        // Its counters walk every arena: read only when they are logged.
        if !tracing::enabled!(tracing::Level::DEBUG) {
            return;
        }
        // SAFETY: mallinfo2 only reads the allocator's counters.
        let info = unsafe { libc::mallinfo2() };
        tracing::debug!(
            took_us = took.as_micros() as u64,
            released = released != 0,
            in_use = info.uordblks,
            free = info.fordblks,
            mapped = info.hblkhd,
            "heap trimmed"
        );
    }
}

/// Unmaps the pages of every read-only private file mapping that holds no
/// page of its own (`Anonymous: 0 kB` in `/proc/self/smaps`); returns how
/// many mappings were released. A mapping written before it was made
/// read-only (relocated constants) holds such pages, which exist nowhere
/// else, and is left alone, as are writable, shared and anonymous mappings.
pub fn release_clean_file_pages() -> usize {
    #[cfg(target_os = "linux")]
    {
        let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
            return 0;
        };
        let mut released = 0;
        for (start, len) in clean_private_file_mappings(&smaps) {
            // SAFETY: a read-only private mapping of a file in which no page
            // was ever copied on write: every page is the file's own, so
            // dropping the page-table entries changes no byte a reader sees
            // (the next access maps the file's page again). The range is one
            // whole mapping, page aligned, from the kernel.
            if unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) } == 0 {
                released += 1;
            }
        }
        released
    }
    #[cfg(not(target_os = "linux"))]
    0
}

/// The mappings of a `/proc/self/smaps` text that [`release_clean_file_pages`]
/// may release: `r--p` or `r-xp`, a file (inode not 0, a path), and
/// `Anonymous: 0 kB`.
fn clean_private_file_mappings(smaps: &str) -> Vec<(usize, usize)> {
    let mut found = Vec::new();
    let mut candidate: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(kib) = line.strip_prefix("Anonymous:") {
            if let Some(range) = candidate.take()
                && kib.trim() == "0 kB"
            {
                found.push(range);
            }
            continue;
        }
        // A mapping's header line: "start-end perms offset dev inode path".
        let mut fields = line.split_ascii_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (
            usize::from_str_radix(start, 16),
            usize::from_str_radix(end, 16),
        ) else {
            continue;
        };
        let (_offset, _dev, inode, path) =
            (fields.next(), fields.next(), fields.next(), fields.next());
        candidate = ((perms == "r--p" || perms == "r-xp")
            && inode.is_some_and(|i| i != "0")
            && path.is_some_and(|p| p.starts_with('/'))
            && end > start)
            .then_some((start, end - start));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_clean_read_only_private_file_mappings_qualify() {
        let smaps = "\
55d000000000-55d000100000 r--p 00000000 fe:00 99 /usr/bin/proflow
Rss:                1024 kB
Anonymous:             0 kB
55d000100000-55d000300000 r-xp 00100000 fe:00 99 /usr/bin/proflow
Rss:                2048 kB
Anonymous:             0 kB
55d000300000-55d000400000 r--p 00300000 fe:00 99 /usr/bin/proflow
Anonymous:           512 kB
55d000400000-55d000401000 rw-p 00400000 fe:00 99 /usr/bin/proflow
Anonymous:             4 kB
7f0000000000-7f0000001000 r--s 00000000 fe:00 12 /var/lib/shared
Anonymous:             0 kB
7f1000000000-7f1000021000 r--p 00000000 00:00 0
Anonymous:             0 kB
7f2000000000-7f2000001000 r-xp 00000000 00:00 0 [vdso]
Anonymous:             0 kB
";
        assert_eq!(
            clean_private_file_mappings(smaps),
            vec![(0x55d0_0000_0000, 0x10_0000), (0x55d0_0010_0000, 0x20_0000)],
            "the code and the constants of the binary; not its relocated constants, its data, \
             shared, anonymous or kernel mappings"
        );
    }

    /// Releasing this test binary's clean mappings lowers its mapped file
    /// pages, and it runs on: the pages come back as its code is called.
    #[test]
    fn the_process_runs_on_after_its_clean_pages_are_released() {
        let rss_file_kib = || -> u64 {
            let status = std::fs::read_to_string("/proc/self/status").unwrap();
            let line = status.lines().find(|l| l.starts_with("RssFile:")).unwrap();
            line.split_ascii_whitespace()
                .nth(1)
                .unwrap()
                .parse()
                .unwrap()
        };
        let before = rss_file_kib();
        assert!(
            release_clean_file_pages() >= 1,
            "this test's own code is one"
        );
        let after = rss_file_kib();
        assert!(after < before, "RssFile {before} kB -> {after} kB");
        // Code and constants called again read as before.
        let text: String = (0..1000)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect();
        assert_eq!(text.matches("abc").count(), 39);
    }
}
