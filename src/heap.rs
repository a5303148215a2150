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
//! Other C libraries (musl) and allocators keep their own policies: these
//! do nothing there.

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
