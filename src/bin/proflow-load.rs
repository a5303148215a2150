//! `proflow-load`: pushes profiles at a receiver for a fixed time and reports
//! throughput, status codes, latency and (with `--watch-pid`) the peak RSS of
//! the collector. Three protocols:
//! - `pprof` (default): a typical gzip pprof to a `pprof_push` receiver over
//!   keep-alive HTTP/1.1 connections;
//! - `otlp-http`: an OTLP profiles request (`--services` resources, two
//!   profiles each, one shared dictionary; gzip unless `--compression none`)
//!   to `POST /v1development/profiles` over keep-alive HTTP/1.1;
//! - `otlp-grpc`: the same request to `ProfilesService/Export` over HTTP/2
//!   (one connection per `--connections`, one request in flight on each).
//!
//! The request is built and compressed once; the tool only sends bytes.
//!
//! Examples:
//! `proflow-load --target 127.0.0.1:4040 --connections 4 --duration 10s --watch-pid $(pidof proflow)`
//! `proflow-load --protocol otlp-grpc --target 127.0.0.1:4317 --services 4`

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use proflow_config::Duration as ConfigDuration;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Protocol {
    Pprof,
    OtlpHttp,
    OtlpGrpc,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Compression {
    Gzip,
    None,
}

const OTLP_GRPC_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";

#[derive(Parser, Debug)]
#[command(
    name = "proflow-load",
    about = "Push profiles at a receiver (pprof_push or OTLP) and report throughput."
)]
struct Args {
    /// What to send: pprof (to pprof_push), otlp-http or otlp-grpc.
    #[arg(long, value_enum, default_value = "pprof")]
    protocol: Protocol,
    /// host:port of the receiver.
    #[arg(long, default_value = "127.0.0.1:4040")]
    target: String,
    /// Request path and query (HTTP protocols). Default: the pprof_push
    /// ingest path, or /v1development/profiles for otlp-http.
    #[arg(long)]
    path: Option<String>,
    /// OTLP: resources (services) per request; each brings two profiles
    /// (samples/count and cpu/nanoseconds), all sharing one dictionary.
    #[arg(long, default_value_t = 1)]
    services: usize,
    /// Distinct functions in the generated profiles.
    #[arg(long, default_value_t = proflow_model::testdata::TYPICAL_FUNCTIONS)]
    functions: usize,
    /// OTLP: compress the request (pprof bodies are always gzip, as clients send them).
    #[arg(long, value_enum, default_value = "gzip")]
    compression: Compression,
    /// Concurrent keep-alive connections.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// How long to push (bounded; the tool always stops by itself).
    #[arg(long, default_value = "10s")]
    duration: ConfigDuration,
    /// Samples in the generated profile (the default makes a ~4 KB gzip CPU profile).
    #[arg(long, default_value_t = proflow_model::testdata::TYPICAL_SAMPLES)]
    samples: usize,
    /// Process whose peak RSS to report (read from /proc/PID/status).
    #[arg(long)]
    watch_pid: Option<u32>,
    /// Offered load in requests per second across all connections (0: as
    /// fast as answers come). Lets two systems be compared at the same load
    /// rather than each at its own saturation.
    #[arg(long, default_value_t = 0.0)]
    rate: f64,
    /// pprof: spread the requests over this many series (a `series` label
    /// of 0..N, taken in turn), as a fleet of senders does.
    #[arg(long, default_value_t = 1)]
    series: usize,
    /// pprof with --series: draw each profile's stacks anew (the same
    /// functions, other stacks), so no two profiles share a stack.
    #[arg(long)]
    distinct_stacks: bool,
    /// A header to send with every request (`Name: value`; HTTP protocols;
    /// repeatable), e.g. `X-Scope-OrgID: team-a` for a tenant.
    #[arg(long = "header", value_name = "NAME: VALUE")]
    headers: Vec<String>,
}

/// When each connection sends its requests: every `interval` from the start
/// (the schedule, not the last answer, sets the next send, so a slow answer
/// does not lower the offered load), or back to back.
#[derive(Clone, Copy)]
struct Pace {
    start: Instant,
    interval: Option<Duration>,
}

impl Pace {
    fn new(rate: f64, connections: usize) -> Pace {
        let interval = (rate > 0.0 && rate.is_finite())
            .then(|| Duration::from_secs_f64(connections.max(1) as f64 / rate));
        Pace {
            start: Instant::now(),
            interval,
        }
    }

    /// When the `n`th request of a connection is due (None: now).
    fn due(&self, n: u32) -> Option<Instant> {
        self.interval.map(|i| self.start + i * n)
    }
}

#[derive(Default)]
struct Stats {
    statuses: BTreeMap<u16, u64>,
    errors: u64,
    latencies_us: Vec<u64>,
    /// With --series: the CPU total (cpu/nanoseconds) of the profiles
    /// answered 200.
    accepted_cpu: i64,
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    // Writing to a Vec cannot fail.
    let _ = e.write_all(bytes);
    e.finish().unwrap_or_default()
}

/// Builds the request once, pushes it for `--duration`, then reports.
fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let duration = args.duration.get().min(Duration::from_secs(600));
    // (body, plain size, profiles per request)
    let (body, plain, per_request) = request_body(&args);
    if args.protocol == Protocol::OtlpGrpc {
        anyhow::ensure!(
            args.headers.is_empty(),
            "--header is for the HTTP protocols (pprof, otlp-http)"
        );
        return grpc_main(&args, duration, body, plain, per_request);
    }
    let requests = Arc::new(http_requests(&args, &body)?);
    let stats = Arc::new(Mutex::new(Stats::default()));
    let peak_rss = Arc::new(Mutex::new((0u64, 0u64))); // (before, peak) in KiB
    if let Some(pid) = args.watch_pid {
        peak_rss.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.0 = rss_kib(pid).unwrap_or(0);
    }
    let elapsed = push_http(&args, duration, &requests, &stats, &peak_rss);
    let s = stats.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    report(
        &args,
        elapsed,
        &s,
        200,
        body.len(),
        plain,
        per_request,
        &peak_rss,
    )
}

/// The request body to send, its size before compression (0 for pprof)
/// and how many profiles it holds.
fn request_body(args: &Args) -> (Vec<u8>, usize, u64) {
    let gz = args.compression == Compression::Gzip;
    match args.protocol {
        Protocol::Pprof => {
            // Stamped now: backends refuse profiles from outside their window.
            let mut p = proflow_model::testdata::cpu_profile(args.samples, args.functions);
            p.time_nanos = proflow_model::model::now_unix_nanos();
            let body = proflow_model::pprof::gzip(&proflow_model::pprof::encode(&p));
            (body.to_vec(), 0, 1)
        }
        Protocol::OtlpHttp | Protocol::OtlpGrpc => {
            let r =
                proflow_model::testdata::otlp_request(args.services, args.samples, args.functions);
            let profiles: usize = r
                .resource_profiles
                .iter()
                .flat_map(|r| &r.scope_profiles)
                .map(|s| s.profiles.len())
                .sum();
            let plain = prost::Message::encode_to_vec(&r);
            let body = if gz { gzip(&plain) } else { plain.clone() };
            (body, plain.len(), profiles as u64)
        }
    }
}

/// The `--header` values as request header lines (each ending in CRLF).
fn extra_headers(headers: &[String]) -> anyhow::Result<String> {
    let mut extra = String::new();
    for h in headers {
        let Some((name, value)) = h.split_once(':') else {
            anyhow::bail!("--header {h:?}: write it as `Name: value`");
        };
        if name.trim().is_empty() || h.contains(['\r', '\n']) {
            anyhow::bail!("--header {h:?}: a header name, a colon and a value on one line");
        }
        extra.push_str(&format!("{}: {}\r\n", name.trim(), value.trim()));
    }
    Ok(extra)
}

/// What the HTTP connections send: `body` under its request head, or with
/// `--series` a profile stamped per request on each series' path.
fn http_requests(args: &Args, body: &[u8]) -> anyhow::Result<Requests> {
    let gz = args.compression == Compression::Gzip;
    let (path, content_type, encoding) = match args.protocol {
        Protocol::Pprof => (
            args.path.clone().unwrap_or_else(|| {
                "/ingest?name=load.app%7Benv%3Dbench%7D&format=pprof&spyName=load".to_owned()
            }),
            "application/octet-stream",
            "",
        ),
        _ => (
            args.path
                .clone()
                .unwrap_or_else(|| "/v1development/profiles".to_owned()),
            "application/x-protobuf",
            if gz { "Content-Encoding: gzip\r\n" } else { "" },
        ),
    };
    let extra = extra_headers(&args.headers)?;
    anyhow::ensure!(
        args.series >= 1
            && (args.series == 1 || args.protocol == Protocol::Pprof && args.path.is_none())
            && (!args.distinct_stacks || args.series > 1),
        "--series is at least 1, and more than 1 only for pprof on the default path; --distinct-stacks needs --series above 1"
    );
    let target = args.target.clone();
    let head = move |path: &str, len: usize| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: {target}\r\nContent-Type: {content_type}\r\n{encoding}{extra}Content-Length: {len}\r\n\r\n"
        )
    };
    Ok(if args.series == 1 {
        let mut r = head(&path, body.len()).into_bytes();
        r.extend_from_slice(body);
        Requests::Fixed(r)
    } else {
        // One path per series, taken in turn; each profile stamped as it is
        // sent, since a backend keeps one profile per series and instant.
        let paths = (0..args.series)
            .map(|k| {
                format!(
                    "/ingest?name=load.app%7Benv%3Dbench%2Cseries%3D{k}%7D&format=pprof&spyName=load"
                )
            })
            .collect();
        Requests::Stamped {
            distinct: args.distinct_stacks,
            samples: args.samples,
            functions: args.functions,
            paths,
            profile: Box::new(proflow_model::testdata::cpu_profile(
                args.samples,
                args.functions,
            )),
            head: Box::new(head),
        }
    })
}

/// Sends `requests` on `--connections` keep-alive connections for
/// `duration`, noting the watched process's peak RSS; returns the seconds
/// it took.
fn push_http(
    args: &Args,
    duration: Duration,
    requests: &Arc<Requests>,
    stats: &Arc<Mutex<Stats>>,
    peak_rss: &Mutex<(u64, u64)>,
) -> f64 {
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let pace = Pace::new(args.rate, args.connections);
    let mut threads = Vec::new();
    let connections = args.connections.max(1);
    for c in 0..connections {
        let (target, requests, stop, stats) = (
            args.target.clone(),
            requests.clone(),
            stop.clone(),
            stats.clone(),
        );
        threads.push(std::thread::spawn(move || {
            worker(&target, &requests, (c, connections), pace, &stop, &stats)
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
    started.elapsed().as_secs_f64()
}

/// Prints what a run did; `ok_status` is the status that means accepted.
#[allow(clippy::too_many_arguments)]
fn report(
    args: &Args,
    elapsed: f64,
    s: &Stats,
    ok_status: u16,
    body: usize,
    plain: usize,
    per_request: u64,
    peak_rss: &Mutex<(u64, u64)>,
) -> anyhow::Result<()> {
    let mut s = Stats {
        statuses: s.statuses.clone(),
        errors: s.errors,
        latencies_us: s.latencies_us.clone(),
        accepted_cpu: s.accepted_cpu,
    };
    let total: u64 = s.statuses.values().sum();
    let ok = s.statuses.get(&ok_status).copied().unwrap_or(0);
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
    match args.protocol {
        Protocol::Pprof => {
            println!("profile size: {body} bytes gzip");
            // What each accepted profile adds to a backend's totals.
            let p = proflow_model::testdata::cpu_profile(args.samples, args.functions);
            let totals: Vec<String> = p
                .sample_type
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    let sum: i64 = p.sample.iter().map(|s| s.value[i]).sum();
                    format!("{}/{}={sum}", p.string(t.r#type), p.string(t.unit))
                })
                .collect();
            println!("profile totals: {}", totals.join(", "));
            if args.series > 1 {
                println!(
                    "accepted cpu/nanoseconds: {} (every profile answered 200)",
                    s.accepted_cpu
                );
            }
        }
        _ => println!(
            "request: {per_request} profiles, {plain} bytes protobuf, {body} bytes on the wire ({:?})",
            args.compression
        ),
    }
    let ok_name = if args.protocol == Protocol::OtlpGrpc {
        "grpc-status 0"
    } else {
        "200 OK"
    };
    println!(
        "requests: {total} in {elapsed:.1}s = {:.0} req/s; {ok_name}: {ok} = {:.0} profiles/s",
        total as f64 / elapsed,
        (ok * per_request) as f64 / elapsed
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
        let p = *p;
        println!(
            "collector RSS: {} KiB before, {} KiB peak, {} KiB after",
            p.0,
            p.1,
            rss_kib(pid).unwrap_or(0)
        );
    }
    Ok(())
}

/// OTLP over gRPC: `--connections` HTTP/2 connections, one request in
/// flight on each, the length-prefixed message built once.
fn grpc_main(
    args: &Args,
    duration: Duration,
    body: Vec<u8>,
    plain: usize,
    per_request: u64,
) -> anyhow::Result<()> {
    let gz = args.compression == Compression::Gzip;
    let mut frame = Vec::with_capacity(body.len() + 5);
    frame.push(u8::from(gz));
    frame.extend_from_slice(&u32::try_from(body.len())?.to_be_bytes());
    frame.extend_from_slice(&body);
    let frame = bytes::Bytes::from(frame);
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Mutex::new(Stats::default()));
    let peak_rss = Arc::new(Mutex::new((0u64, 0u64)));
    if let Some(pid) = args.watch_pid {
        peak_rss.lock().map_err(|_| anyhow::anyhow!("poisoned"))?.0 = rss_kib(pid).unwrap_or(0);
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let started = Instant::now();
    let pace = Pace::new(args.rate, args.connections);
    let mut tasks = Vec::new();
    for _ in 0..args.connections.max(1) {
        let (target, frame, stop, stats) = (
            args.target.clone(),
            frame.clone(),
            stop.clone(),
            stats.clone(),
        );
        tasks.push(
            rt.spawn(async move { grpc_worker(&target, frame, gz, pace, &stop, &stats).await }),
        );
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
    rt.block_on(async {
        for t in tasks {
            let _ = t.await;
        }
    });
    let elapsed = started.elapsed().as_secs_f64();
    let s = stats.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    // gRPC statuses are reported as themselves; 0 is OK.
    report(
        args,
        elapsed,
        &s,
        0,
        body.len(),
        plain,
        per_request,
        &peak_rss,
    )
}

async fn grpc_worker(
    target: &str,
    frame: bytes::Bytes,
    gz: bool,
    pace: Pace,
    stop: &AtomicBool,
    stats: &Mutex<Stats>,
) {
    let mut local = Stats::default();
    let mut sent = 0u32;
    while !stop.load(Ordering::Relaxed) {
        let conn = async {
            let tcp = tokio::net::TcpStream::connect(target).await?;
            tcp.set_nodelay(true)?;
            let (client, connection) = h2::client::handshake(tcp)
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(connection);
            Ok::<_, std::io::Error>(client)
        };
        let Ok(mut client) = conn.await else {
            local.errors += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            if let Some(due) = pace.due(sent) {
                tokio::time::sleep_until(due.into()).await;
            }
            sent = sent.saturating_add(1);
            let t = Instant::now();
            match grpc_call(&mut client, target, frame.clone(), gz).await {
                Ok(status) => {
                    local.latencies_us.push(t.elapsed().as_micros() as u64);
                    *local.statuses.entry(status).or_default() += 1;
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

/// One unary call; returns the grpc-status (from trailers, or from the
/// headers of a trailers-only response).
async fn grpc_call(
    client: &mut h2::client::SendRequest<bytes::Bytes>,
    target: &str,
    frame: bytes::Bytes,
    gz: bool,
) -> Result<u16, Box<dyn std::error::Error + Send + Sync>> {
    let mut request = http::Request::post(format!("http://{target}{OTLP_GRPC_PATH}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if gz {
        request = request.header("grpc-encoding", "gzip");
    }
    let request = request.body(())?;
    let ready = client.clone().ready().await?;
    *client = ready;
    let (response, mut send) = client.send_request(request, false)?;
    send.reserve_capacity(frame.len());
    send.send_data(frame, true)?;
    let response = response.await?;
    let status_of = |h: &http::HeaderMap| {
        h.get("grpc-status")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u16>().ok())
    };
    if let Some(s) = status_of(response.headers()) {
        return Ok(s);
    }
    let mut body = response.into_body();
    while let Some(chunk) = body.data().await {
        let chunk = chunk?;
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let trailers = body.trailers().await?.unwrap_or_default();
    Ok(status_of(&trailers).unwrap_or(2))
}

fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The request head for a path and a body length.
type RequestHead = dyn Fn(&str, usize) -> String + Send + Sync;

/// What the connections send.
enum Requests {
    /// One request, again and again.
    Fixed(Vec<u8>),
    /// A request per series path, taken in turn, its profile stamped with
    /// the time it is sent.
    Stamped {
        /// Each profile's stacks drawn anew (`samples` over `functions`).
        distinct: bool,
        samples: usize,
        functions: usize,
        paths: Vec<String>,
        profile: Box<proflow_model::pprof::Profile>,
        head: Box<RequestHead>,
    },
}

impl Requests {
    /// The `i`th request of the run, with its profile's CPU total
    /// (`cpu/nanoseconds`; 0 when it is not such a profile).
    fn get(&self, i: usize) -> (std::borrow::Cow<'_, [u8]>, i64) {
        match self {
            Requests::Fixed(r) => (std::borrow::Cow::Borrowed(r), 0),
            Requests::Stamped {
                distinct,
                samples,
                functions,
                paths,
                profile,
                head,
            } => {
                let mut p = if *distinct {
                    proflow_model::testdata::cpu_profile_of_stacks(
                        *samples,
                        *functions,
                        0x9e37_79b9_7f4a_7c15 ^ i as u64,
                    )
                } else {
                    (**profile).clone()
                };
                p.time_nanos = proflow_model::model::now_unix_nanos();
                let body = proflow_model::pprof::gzip(&proflow_model::pprof::encode(&p));
                let mut r = head(&paths[i % paths.len()], body.len()).into_bytes();
                r.extend_from_slice(&body);
                // The second sample type is cpu/nanoseconds.
                let cpu = p.sample.iter().filter_map(|s| s.value.get(1)).sum();
                (std::borrow::Cow::Owned(r), cpu)
            }
        }
    }
}

/// One connection's sender: request `n` of connection `c` (of `of`) is the
/// run's request `n * of + c`, so together they take the series in turn.
fn worker(
    target: &str,
    requests: &Requests,
    (c, of): (usize, usize),
    pace: Pace,
    stop: &AtomicBool,
    stats: &Mutex<Stats>,
) {
    let mut local = Stats::default();
    let mut sent = 0u32;
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
            if let Some(due) = pace.due(sent) {
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
            }
            let (request, cpu) = requests.get(sent as usize * of + c);
            sent = sent.saturating_add(1);
            let t = Instant::now();
            match round_trip(&mut writer, &mut reader, &request) {
                Ok((status, keep_alive)) => {
                    local.latencies_us.push(t.elapsed().as_micros() as u64);
                    *local.statuses.entry(status).or_default() += 1;
                    if status == 200 {
                        local.accepted_cpu += cpu;
                    }
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
        s.accepted_cpu += local.accepted_cpu;
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
