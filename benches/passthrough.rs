//! push → relabel → nop: one keep-alive HTTP connection posting a typical
//! ~4 KB gzip pprof to `/ingest`, through a relabel processor, into the nop
//! exporter. Measures the whole receive path (HTTP parse, gzip scan, relabel,
//! queue admission) per profile on the collector side.
//! Run: `cargo bench --bench passthrough`

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_config::Document;
use proflow_core::registry::Registry;
use proflow_core::telemetry::Telemetry;
use proflow_core::topology;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

fn post(w: &mut TcpStream, r: &mut BufReader<TcpStream>, request: &[u8]) -> u16 {
    w.write_all(request).expect("write");
    let mut line = String::new();
    r.read_line(&mut line).expect("status line");
    let status = line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let mut len = 0usize;
    loop {
        line.clear();
        r.read_line(&mut line).expect("header");
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        if let Some((k, v)) = l.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            len = v.trim().parse().expect("length");
        }
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).expect("body");
    status
}

fn passthrough(c: &mut Criterion) {
    let port = free_port();
    let yaml = format!(
        "receivers:\n  pprof_push:\n    endpoint: 127.0.0.1:{port}\nprocessors:\n  relabel:\n    relabel_configs:\n      - {{action: replace, target_label: team, replacement: core}}\n      - {{action: drop, source_labels: [env], regex: debug}}\nexporters:\n  nop:\n    sending_queue: {{queue_size: 100000, max_bytes: 1GiB}}\nservice:\n  telemetry: {{address: none}}\n  pipelines:\n    profiles: {{receivers: [pprof_push], processors: [relabel], exporters: [nop]}}\n"
    );
    let registry = Registry::new(
        proflow_receivers::factories()
            .into_iter()
            .chain(proflow_processors::factories())
            .chain(proflow_exporters::factories()),
    );
    let plan = topology::plan(&Document::parse(&yaml).expect("config parses"), &registry)
        .expect("config is valid");
    // One worker thread: the goal is stated per core.
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    let running = rt
        .block_on(plan.start(Arc::new(Telemetry::new())))
        .expect("collector starts");

    let body = proflow_model::testdata::typical_cpu_profile_gzip();
    let mut request = format!(
        "POST /ingest?name=bench.app%7Benv%3Dprod%7D&format=pprof&spyName=bench HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/octet-stream\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(&body);
    let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_nodelay(true).expect("nodelay");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reader = BufReader::new(stream.try_clone().expect("clone"));
    let mut writer = stream;
    assert_eq!(
        post(&mut writer, &mut reader, &request),
        200,
        "the receiver accepts the benchmark profile"
    );

    let mut g = c.benchmark_group("passthrough");
    g.throughput(Throughput::Elements(1));
    g.bench_function(format!("ingest_pprof_{}B_relabel_nop", body.len()), |b| {
        b.iter(|| post(&mut writer, &mut reader, &request))
    });
    g.finish();
    drop(writer);
    rt.block_on(running.shutdown());
}

criterion_group!(benches, passthrough);
criterion_main!(benches);
