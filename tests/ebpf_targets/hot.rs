//! A target for tests/ebpf.rs: the same 2:1 split as hot.c, as a Rust
//! release binary without frame pointers. Usage: hot SECONDS (0: until
//! killed); prints "ready PID", then "rounds N" at the end.

use std::hint::black_box;
use std::io::Write;
use std::time::{Duration, Instant};

const N: u64 = 50_000;

#[inline(never)]
fn proflow_rust_spin(n: u64) -> u64 {
    let mut acc = 0u64;
    for i in 0..n {
        acc = black_box(acc.wrapping_add(i));
    }
    acc
}

#[inline(never)]
fn proflow_rust_hot_two(k: u64) -> u64 {
    black_box(proflow_rust_spin(2 * k * N)) ^ 1
}

#[inline(never)]
fn proflow_rust_hot_one(k: u64) -> u64 {
    black_box(proflow_rust_spin(k * N)) ^ 2
}

fn main() {
    let seconds: u64 = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    println!("ready {}", std::process::id());
    std::io::stdout().flush().unwrap();
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut rounds = 0u64;
    let mut sink = 0u64;
    // Random round lengths (as hot.c): no locking onto the sampling rate.
    let mut x = 88_172_645_463_325_252u64;
    loop {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let k = 1 + (x & 7);
        sink ^= proflow_rust_hot_two(k);
        sink ^= proflow_rust_hot_one(k);
        rounds += 1;
        if seconds > 0 && rounds % 16 == 0 && Instant::now() >= end {
            break;
        }
    }
    black_box(sink);
    println!("rounds {rounds}");
}
