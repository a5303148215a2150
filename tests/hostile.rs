//! Hostile clients against the real binary, every default but a 64 MiB
//! in-flight budget and 5 s read timeouts: each attack an unauthenticated
//! client can make on the listeners, eight at a time, all at once, while a
//! small client pushes a typical profile every 25 ms.
//!
//! - folded text of a million distinct frames, gzipped (four million used
//!   to take 1.38 GB of the builder's tables, uncounted);
//! - gzip bombs, to `/ingest` and as an OTLP/HTTP body, and one whose
//!   trailer understates it (a second member), inflated step by step;
//! - OTLP JSON of empty samples (decodes to ~50 bytes a byte);
//! - requests that promise a 1 MiB body and send nothing, over HTTP/1 and
//!   over h2c (a hundred streams a connection);
//! - OTLP gRPC streams that send all of a 3 MiB message but its last byte;
//! - a thousand connections that send nothing, or a header byte a second,
//!   each opened again as soon as the collector closes it.
//!
//! Asserted: every small push, each on a connection of its own, gets 200;
//! the collector's peak resident memory (`VmHWM`) stays under the budget +
//! the queue's `max_bytes` + 64 MiB; it stays up; every request an attacker
//! made is answered (no connection cut instead) and every refusal counted
//! under its reason.
//!
//! `work` (tests/hostile_cases/work.rs): bodies whose work grows faster
//! than their bytes (a shared OTLP dictionary, nested speedscope opens, a
//! trie of empty nodes), each bounded in time or charged to the budget.
//! `secrets` (tests/hostile_cases/secrets.rs): a password in a URL or a
//! token in scrape `params` shows nowhere proflow writes.

mod common;
#[path = "hostile_cases/secrets.rs"]
mod secrets;
#[path = "hostile_cases/work.rs"]
mod work;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Proflow, cpu_profile, gzip, ingest_query, metric_sum, wait_served_more};

const BUDGET: u64 = 64 << 20;
const QUEUE_MAX_BYTES: u64 = 16 << 20;
/// What connections buffer before a handler reads it (at most 64 KiB each
/// on HTTP/1, docs/memory.md; a thousand idle and trickling ones and the
/// promised bodies' take about 20 MiB) and the allocator's slack.
const MARGIN: u64 = 64 << 20;
/// Each attack runs this many times at once.
const EACH: usize = 8;

/// What an attacker saw of one request: the receiver and the reason its
/// refusal must be counted under, or `None` (accepted, or no request).
type Seen = Option<(&'static str, &'static str)>;

/// The reason `proflow_receiver_refused_requests_total` counts an HTTP
/// status under.
fn http_reason(status: u16) -> Option<&'static str> {
    match status {
        200 => None,
        400 => Some("bad_request"),
        408 => Some("timeout"),
        413 => Some("too_large"),
        429 => Some("memory_limit"),
        other => panic!("an attacker got HTTP {other}: every refusal is 400, 408, 413 or 429"),
    }
}

/// Sends `head` and `body` on a fresh connection and reads the status;
/// a connection that breaks instead of answering fails the test.
fn raw_request(addr: SocketAddr, head: &str, body: &[u8]) -> u16 {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .expect("set a read timeout");
    stream.write_all(head.as_bytes()).expect("send the head");
    // A refusal may come before the whole body is sent; the status is read
    // whatever happened to the rest.
    let _ = stream.write_all(body);
    status_of(&mut BufReader::new(stream))
        .unwrap_or_else(|| panic!("no answer, a broken connection, to {head:?}"))
}

fn status_of(reader: &mut impl BufRead) -> Option<u16> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn post_head(addr: SocketAddr, path: &str, extra: &str, len: usize) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Content-Length: {len}\r\nConnection: close\r\n\r\n"
    )
}

/// Folded text, gzipped, of one line of `frames` distinct frames.
fn folded_bomb(frames: usize) -> Vec<u8> {
    let mut line = String::with_capacity(frames * 9);
    for i in 0..frames {
        if i > 0 {
            line.push(';');
        }
        line.push_str(&format!("f{i}"));
    }
    line.push_str(" 1\n");
    gzip(line.as_bytes())
}

/// An OTLP JSON request whose one profile has `n` empty samples.
fn empty_samples_json(n: usize) -> Vec<u8> {
    let samples = vec!["{}"; n].join(",");
    format!(
        r#"{{"resourceProfiles":[{{"scopeProfiles":[{{"profiles":[{{"samples":[{samples}]}}]}}]}}],"dictionary":{{"stringTable":[""]}}}}"#
    )
    .into_bytes()
}

/// `streams` HTTP/2 requests on one cleartext connection to `path`, each
/// promising `len` bytes and sending nothing; their statuses.
fn h2c_promises(addr: SocketAddr, path: &'static str, streams: usize, len: usize) -> Vec<u16> {
    runtime().block_on(async move {
        let Ok(tcp) = tokio::net::TcpStream::connect(addr).await else {
            return Vec::new();
        };
        let Ok((client, connection)) = h2::client::handshake(tcp).await else {
            return Vec::new();
        };
        tokio::spawn(connection);
        let mut responses = Vec::new();
        for _ in 0..streams {
            let Ok(mut ready) = client.clone().ready().await else {
                break;
            };
            let request = http::Request::post(format!("http://{addr}{path}"))
                .header("content-length", len)
                .body(())
                .unwrap();
            if let Ok((response, body)) = ready.send_request(request, false) {
                // Kept open and empty until the server answers.
                responses.push((response, body));
            }
        }
        let mut statuses = Vec::new();
        for (response, _body) in responses {
            if let Ok(r) = response.await {
                statuses.push(r.status().as_u16());
            }
        }
        statuses
    })
}

/// One OTLP gRPC stream that sends a `len`-byte message but its last byte,
/// then waits; the `grpc-status` it ends with.
fn grpc_stall(addr: SocketAddr, len: usize) -> Option<u32> {
    runtime().block_on(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
        let (client, connection) = h2::client::handshake(tcp).await.ok()?;
        tokio::spawn(connection);
        let mut client = client.ready().await.ok()?;
        let request = http::Request::post(format!(
            "http://{addr}/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(())
        .unwrap();
        let (response, mut body) = client.send_request(request, false).ok()?;
        let mut message = vec![0u8; 5];
        message[1..5].copy_from_slice(&u32::try_from(len).ok()?.to_be_bytes());
        message.extend(std::iter::repeat_n(0x0a, len - 1));
        // The collector may answer before the message is all sent (a
        // deadline passed, or no memory for it) and end the stream: the
        // sending stops there, and the answer is read all the same.
        'send: for chunk in message.chunks(16 << 10) {
            body.reserve_capacity(chunk.len());
            while body.capacity() < chunk.len() {
                match std::future::poll_fn(|cx| body.poll_capacity(cx)).await {
                    Some(Ok(_)) => {}
                    _ => break 'send,
                }
            }
            if body.send_data(Bytes::copy_from_slice(chunk), false).is_err() {
                break;
            }
        }
        let response = response.await.ok()?;
        let status = |h: &http::HeaderMap| {
            h.get("grpc-status")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.parse::<u32>().ok())
        };
        if let Some(s) = status(response.headers()) {
            return Some(s);
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            chunk.ok()?;
        }
        body.trailers().await.ok()?.as_ref().and_then(status)
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// The collector's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb << 10)
}

#[test]
fn hostile_clients_stay_inside_the_budget_and_never_starve_a_small_push() {
    let (mut grpc_port, mut http_port) = (0, 0);
    let proflow = Proflow::start(|ports, _| {
        grpc_port = common::free_port();
        http_port = common::free_port();
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n    read_timeout: 5s\n    max_decompressed_size: 32MiB\n  otlp:\n    protocols:\n      grpc:\n        endpoint: 127.0.0.1:{grpc_port}\n        read_timeout: 5s\n      http:\n        endpoint: 127.0.0.1:{http_port}\n        read_timeout: 5s\n        max_decoded_size: 24MiB\nexporters:\n  nop:\n    sending_queue: {{max_bytes: 16MiB}}\nservice:\n  limits:\n    max_in_flight_bytes: 64MiB\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push, otlp], exporters: [nop]}}\n",
            ports.receiver, ports.telemetry
        )
    });
    let push = proflow.ports.receiver;
    let grpc = SocketAddr::from(([127, 0, 0, 1], grpc_port));
    let otlp_http = SocketAddr::from(([127, 0, 0, 1], http_port));
    let idle_rss = peak_rss(proflow.pid());

    // Built once, sent by every attacker of its kind.
    let folded = Arc::new(folded_bomb(1_000_000));
    let zip_bomb = Arc::new(gzip(&vec![0u8; 60 << 20]));
    let hidden_bomb = Arc::new({
        let mut two = (*zip_bomb).clone();
        two.extend(gzip(b"x"));
        two
    });
    let json = Arc::new(empty_samples_json(300_000));
    eprintln!(
        "bodies: folded {} KiB gzip, bomb {} KiB, JSON {} KiB",
        folded.len() >> 10,
        zip_bomb.len() >> 10,
        json.len() >> 10
    );

    // The small client: a typical push every 25 ms until the attacks end.
    let done = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let small = thread::spawn({
        let (done, served, url) = (
            done.clone(),
            served.clone(),
            proflow.receiver_url(&ingest_query("small.app", Some("pprof"))),
        );
        move || {
            let body = gzip(&cpu_profile());
            let mut statuses = Vec::new();
            let mut slowest = Duration::ZERO;
            while !done.load(Ordering::SeqCst) {
                // A new client, so a new connection: it must get a slot
                // among the attackers' every time.
                let http = common::http_client();
                let started = Instant::now();
                let status = http
                    .post(&url)
                    .body(body.clone())
                    .send()
                    .map_or(0, |r| r.status().as_u16());
                slowest = slowest.max(started.elapsed());
                statuses.push(status);
                served.fetch_add(1, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(25));
            }
            (statuses, slowest)
        }
    });

    let mut attackers: Vec<thread::JoinHandle<Vec<Seen>>> = Vec::new();
    // A thousand connections that hold a slot without a request: half send
    // nothing, half a header byte a second. One the collector closed is
    // opened again at once, so the thousand stay for the whole storm.
    // They connect first, so that the busy connections the attacks bring
    // after them can only get a slot by the collector closing idle ones.
    let stop_idle = Arc::new(AtomicBool::new(false));
    let (idle_ready, idle_connected) = std::sync::mpsc::channel();
    let idle = thread::spawn({
        let stop = stop_idle.clone();
        move || {
            let connect = || {
                let c = TcpStream::connect(push).ok()?;
                c.set_nonblocking(true).ok()?;
                Some(c)
            };
            let mut conns: Vec<Option<TcpStream>> = (0..1000).map(|_| connect()).collect();
            let _ = idle_ready.send(conns.iter().flatten().count());
            let head = b"POST /ingest?name=slow HTTP/1.1\r\n";
            let (mut at, mut closed) = (0, 0);
            loop {
                // One last look after the storm, so a connection closed in
                // its last second is counted too.
                let last = stop.load(Ordering::SeqCst);
                for (i, slot) in conns.iter_mut().enumerate() {
                    let gone = slot.as_mut().is_none_or(|c| {
                        let mut byte = [0u8; 1];
                        // An end, or a reset (a close with bytes unread).
                        let ended = match c.peek(&mut byte) {
                            Ok(n) => n == 0,
                            Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                        };
                        let trickled = i < 500
                            || c.write_all(&head[at % head.len()..at % head.len() + 1])
                                .is_ok();
                        ended || !trickled
                    });
                    if gone {
                        closed += 1;
                        *slot = connect();
                    }
                }
                if last {
                    break;
                }
                at += 1;
                thread::sleep(Duration::from_secs(1));
            }
            closed
        }
    });
    let connected = idle_connected
        .recv()
        .expect("the idle connections are opened");
    assert_eq!(connected, 1000, "the thousand idle clients connect");
    for _ in 0..EACH {
        attackers.push(thread::spawn({
            let folded = folded.clone();
            move || {
                let head = post_head(
                    push,
                    "/ingest?name=bomb.cpu&format=folded",
                    "Content-Encoding: gzip\r\n",
                    folded.len(),
                );
                let status = raw_request(push, &head, &folded);
                vec![http_reason(status).map(|r| ("pprof_push", r))]
            }
        }));
        attackers.push(thread::spawn({
            let (bomb, hidden) = (zip_bomb.clone(), hidden_bomb.clone());
            move || {
                let head = post_head(
                    push,
                    &ingest_query("zip.app", Some("pprof")),
                    "Content-Encoding: gzip\r\n",
                    bomb.len(),
                );
                let push_bomb =
                    http_reason(raw_request(push, &head, &bomb)).map(|r| ("pprof_push", r));
                let head = post_head(
                    otlp_http,
                    "/v1development/profiles",
                    "Content-Type: application/x-protobuf\r\nContent-Encoding: gzip\r\n",
                    bomb.len(),
                );
                let otlp_bomb =
                    http_reason(raw_request(otlp_http, &head, &bomb)).map(|r| ("otlp", r));
                // A bomb whose trailer understates it (a second member):
                // inflated step by step until it passes the limit.
                let head = post_head(
                    push,
                    &ingest_query("zip.app", Some("pprof")),
                    "Content-Encoding: gzip\r\n",
                    hidden.len(),
                );
                let hidden_bomb =
                    http_reason(raw_request(push, &head, &hidden)).map(|r| ("pprof_push", r));
                vec![push_bomb, otlp_bomb, hidden_bomb]
            }
        }));
        attackers.push(thread::spawn({
            let json = json.clone();
            move || {
                let head = post_head(
                    otlp_http,
                    "/v1development/profiles",
                    "Content-Type: application/json\r\n",
                    json.len(),
                );
                vec![http_reason(raw_request(otlp_http, &head, &json)).map(|r| ("otlp", r))]
            }
        }));
        // Forty HTTP/1 requests promising 1 MiB and sending nothing.
        attackers.push(thread::spawn(move || {
            let conns: Vec<TcpStream> = (0..40)
                .filter_map(|_| {
                    let mut c = TcpStream::connect(push).ok()?;
                    let head = post_head(
                        push,
                        &ingest_query("promise.app", Some("pprof")),
                        "",
                        1 << 20,
                    );
                    c.write_all(head.as_bytes()).ok()?;
                    c.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
                    Some(c)
                })
                .collect();
            conns
                .into_iter()
                .map(|c| {
                    status_of(&mut BufReader::new(c))
                        .expect("a promised body that never came is answered, not cut off")
                })
                .map(|s| http_reason(s).map(|r| ("pprof_push", r)))
                .collect()
        }));
        // A hundred h2c streams promising 1 MiB and sending nothing.
        attackers.push(thread::spawn(move || {
            h2c_promises(push, "/ingest?name=h2c.app&format=pprof", 100, 1 << 20)
                .into_iter()
                .map(|s| http_reason(s).map(|r| ("pprof_push", r)))
                .collect()
        }));
        // A gRPC stream that stalls one byte short of its 3 MiB message.
        attackers.push(thread::spawn(move || {
            let reason = match grpc_stall(grpc, 3 << 20) {
                Some(4) => Some(("otlp", "timeout")),
                Some(8) => Some(("otlp", "memory_limit")),
                other => panic!("a stalled gRPC stream ended with {other:?}, not DEADLINE_EXCEEDED or RESOURCE_EXHAUSTED"),
            };
            vec![reason]
        }));
    }
    let mut seen: Vec<Seen> = Vec::new();
    for a in attackers {
        seen.extend(a.join().expect("an attacker thread panicked"));
    }
    stop_idle.store(true, Ordering::SeqCst);
    let idle_closed = idle.join().unwrap();
    // The small client goes on after the storm: five more pushes.
    wait_served_more(&served, 5);
    done.store(true, Ordering::SeqCst);
    let (small_statuses, slowest) = small.join().unwrap();
    let peak = peak_rss(proflow.pid());
    let metrics = proflow.metrics();

    let mut counted_by_client: BTreeMap<(&str, &str), usize> = BTreeMap::new();
    for (receiver, reason) in seen.iter().flatten() {
        *counted_by_client.entry((receiver, reason)).or_default() += 1;
    }
    let report = format!(
        "{} requests by attackers, refusals {counted_by_client:?}; 1000 idle or trickling connections, {idle_closed} of them closed by the collector and opened again; small pushes {} (slowest {slowest:?}); RSS peak {} MiB (idle {} MiB)",
        seen.len(),
        small_statuses.len(),
        peak >> 20,
        idle_rss >> 20
    );
    eprintln!("hostile: {report}");
    assert!(
        small_statuses.len() >= 40 && small_statuses.iter().all(|&s| s == 200),
        "every small push gets 200 through every attack: {small_statuses:?}\n{report}"
    );
    // The collector's own baseline (the idle binary) is apart from the
    // bound, as docs/memory.md states it.
    assert!(
        peak.saturating_sub(idle_rss) < BUDGET + QUEUE_MAX_BYTES + MARGIN,
        "peak RSS {} MiB, less the idle {} MiB, must stay under the budget (64) + the queue (16) + 64 MiB: {report}",
        peak >> 20,
        idle_rss >> 20
    );
    // The thousand, connected first, and the 320 promised bodies after them
    // take more than the 1,024 connections pprof_push serves: the promised
    // bodies and the small pushes got theirs only because the collector
    // closed idle ones for them.
    assert!(
        idle_closed > 0,
        "the collector closed idle connections for new clients: {report}"
    );
    for reason in ["too_large", "timeout", "memory_limit"] {
        assert!(
            counted_by_client.keys().any(|(_, r)| *r == reason),
            "the attacks met {reason}: {report}"
        );
    }
    for ((receiver, reason), n) in &counted_by_client {
        let counted = metric_sum(
            &metrics,
            "proflow_receiver_refused_requests_total",
            &[("receiver", receiver), ("reason", reason)],
        );
        assert_eq!(
            counted, *n as f64,
            "{receiver}'s {reason} refusals are counted as the attackers saw them: {report}\n{metrics}"
        );
    }
    assert_eq!(
        metric_sum(&metrics, "proflow_memory_in_flight_bytes", &[]),
        0.0,
        "every grant was given back"
    );
    // Still up, still serving.
    let reply = proflow.post(
        &ingest_query("after.app", Some("pprof")),
        &[],
        gzip(&cpu_profile()),
    );
    assert_eq!(reply.status, 200, "{}", reply.text());
}

/// A client that comes long after the listener's last accept (longer than
/// a first request may take) is served: a connection's clock starts when
/// it is accepted, not when room was taken for it.
#[test]
fn a_client_long_after_the_last_one_is_served() {
    let proflow = Proflow::start(|ports, _| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n    read_header_timeout: 1s\nexporters:\n  nop: {{}}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [nop]}}\n",
            ports.receiver, ports.telemetry
        )
    });
    let url = proflow.receiver_url(&ingest_query("later.app", Some("pprof")));
    for _ in 0..2 {
        // A fresh client each time: a new connection.
        let status = common::http_client()
            .post(&url)
            .body(gzip(&cpu_profile()))
            .send()
            .map(|r| r.status().as_u16());
        assert!(matches!(status, Ok(200)), "{status:?}");
        thread::sleep(Duration::from_millis(2500));
    }
}
