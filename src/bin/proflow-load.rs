//! `proflow-load`: pushes a typical gzip pprof to a receiver over keep-alive
//! HTTP/1.1 connections for a fixed time and reports throughput, status codes,
//! latency and (with `--watch-pid`) the peak RSS of the collector.
//!
//! Example: `proflow-load --target 127.0.0.1:4040 --connections 4 --duration 10s --watch-pid $(pidof proflow)`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use proflow_config::Duration as ConfigDuration;

#[derive(Parser, Debug)]
#[command(
    name = "proflow-load",
    about = "Push profiles at a pprof_push receiver and report throughput."
)]
struct Args {
    /// host:port of the receiver.
    #[arg(long, default_value = "127.0.0.1:4040")]
    target: String,
    /// Request path and query.
    #[arg(
        long,
        default_value = "/ingest?name=load.app%7Benv%3Dbench%7D&format=pprof&spyName=load"
    )]
    path: String,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// How long to push (bounded; the tool always stops by itself).
    #[arg(long, default_value = "10s")]
    duration: ConfigDuration,
    /// Samples in the generated profile (the default makes a ~4 KB gzip CPU profile).
    #[arg(long, default_value_t = proflow_pipeline::testdata::TYPICAL_SAMPLES)]
    samples: usize,
    /// Process whose peak RSS to report (read from /proc/PID/status).
    #[arg(long)]
    watch_pid: Option<u32>,
}

#[derive(Default)]
struct Stats {
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    latencies_us: Vec<u64>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let duration = args.duration.get().min(Duration::from_secs(600));
    let body = proflow_pipeline::testdata::cpu_profile_gzip(
        args.samples,
        proflow_pipeline::testdata::TYPICAL_FUNCTIONS,
    );
    let request = Arc::new({
        let mut r = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
            args.path,
            args.target,
            body.len()
        )
        .into_bytes();
        r.extend_from_slice(&body);
        r
    });
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Mutex::new(Stats::default()));
    let peak_rss = Arc::new(Mutex::new((0u64, 0u64))); // (before, peak) in KiB
    if let Some(pid) = args.watch_pid {
        peak_rss.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.0 = rss_kib(pid).unwrap_or(0);
    }
    let started = Instant::now();
    let mut threads = Vec::new();
    for _ in 0..args.connections.max(1) {
        let (target, request, stop, stats) = (
            args.target.clone(),
            request.clone(),
            stop.clone(),
            stats.clone(),
        );
        threads.push(std::thread::spawn(move || {
            worker(&target, &request, &stop, &stats)
        }));
    }
    while started.elapsed() < duration {
        std::thread::sleep(Duration::from_millis(100));
        if let Some(pid) = args.watch_pid
            && let Some(rss) = rss_kib(pid)
            && let Ok(mut p) = peak_rss.lock()
        {
            p.1 = p.1.max(rss);
        }
    }
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        let _ = t.join();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let mut s = stats.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let total: u64 = s.statuses.values().sum();
    let ok = s.statuses.get(&200).copied().unwrap_or(0);
    s.latencies_us.sort_unstable();
    let pct = |p: f64| {
        s.latencies_us
            .get(
                ((s.latencies_us.len() as f64 * p) as usize)
                    .min(s.latencies_us.len().saturating_sub(1)),
            )
            .copied()
            .unwrap_or(0)
    };
    println!("profile size: {} bytes gzip", body.len());
    println!(
        "requests: {total} in {elapsed:.1}s = {:.0} req/s; 200 OK: {ok} = {:.0} profiles/s",
        total as f64 / elapsed,
        ok as f64 / elapsed
    );
    println!(
        "statuses: {:?}; connection errors: {}",
        s.statuses, s.errors
    );
    println!(
        "latency: p50 {} µs, p99 {} µs, max {} µs",
        pct(0.5),
        pct(0.99),
        s.latencies_us.last().copied().unwrap_or(0)
    );
    if let Some(pid) = args.watch_pid {
        let p = peak_rss.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
        println!(
            "collector RSS: {} KiB before, {} KiB peak, {} KiB after",
            p.0,
            p.1,
            rss_kib(pid).unwrap_or(0)
        );
    }
    Ok(())
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn worker(target: &str, request: &[u8], stop: &AtomicBool, stats: &Mutex<Stats>) {
    let mut local = Stats::default();
    while !stop.load(Ordering::Relaxed) {
        let Ok(stream) = TcpStream::connect(target) else {
            local.errors += 1;
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        let _ = stream.set_nodelay(true);
        let _ = stream.set_read_timeout(Some(Duration::from_secs(10)));
        let Ok(read_half) = stream.try_clone() else {
            continue;
        };
        let mut reader = BufReader::new(read_half);
        let mut writer = stream;
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            match round_trip(&mut writer, &mut reader, request) {
                Ok((status, keep_alive)) => {
                    local.latencies_us.push(t.elapsed().as_micros() as u64);
                    *local.statuses.entry(status).or_default() += 1;
                    if !keep_alive {
                        break;
                    }
                }
                Err(_) => {
                    local.errors += 1;
                    break;
                }
            }
        }
    }
    if let Ok(mut s) = stats.lock() {
        for (k, v) in local.statuses {
            *s.statuses.entry(k).or_default() += v;
        }
        s.errors += local.errors;
        s.latencies_us.extend(local.latencies_us);
    }
}

/// Sends one request and reads one response; returns (status, keep-alive).
fn round_trip(
    w: &mut TcpStream,
    r: &mut BufReader<TcpStream>,
    request: &[u8],
) -> std::io::Result<(u16, bool)> {
    w.write_all(request)?;
    let mut line = String::new();
    r.read_line(&mut line)?;
    let status: u16 = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("bad status line"))?;
    let mut length = 0usize;
    let mut keep_alive = true;
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Err(std::io::Error::other("connection closed"));
        }
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':') {
            if k.eq_ignore_ascii_case("content-length") {
                length = v
                    .trim()
                    .parse()
                    .map_err(|_| std::io::Error::other("bad content-length"))?;
            } else if k.eq_ignore_ascii_case("connection") && v.trim().eq_ignore_ascii_case("close")
            {
                keep_alive = false;
            }
        }
    }
    // Responses are small JSON bodies; cap what we read to stay bounded.
    let mut body = vec![0u8; length.min(1 << 20)];
    r.read_exact(&mut body)?;
    Ok((status, keep_alive))
}
