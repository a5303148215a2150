//! The trace_link processor's cost per profile, and its span index's
//! memory. Run: `cargo bench -p proflow-processors --bench trace_link`
//!
//! The profile is the typical 4 KB gzip CPU push (60 samples over 100
//! functions, `proflow_model::testdata`) with 50 of its samples labelled
//! by otel-profiling-go's convention (`span_id`, `span_name`; 10 spans, no
//! trace id), as a Go service instrumented with Pyroscope sends it.
//! `index_bytes_per_span` prints the index's memory per span at 100k spans.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_core::component::Processor;
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload};
use proflow_model::pprof::{self, Label};
use proflow_model::spans::Span;
use proflow_model::testdata;
use proflow_processors::trace_link::telemetry::TraceLinkTelemetry;
use proflow_processors::trace_link::{SpanIndex, TraceLinkProcessor, TraceLinkProcessorConfig};

const SPANS: u64 = 10;
const LABELLED: usize = 50;

fn span_id(i: u64) -> [u8; 8] {
    (0x00f0_67aa_0ba9_0200 + i).to_be_bytes()
}

fn span(i: u64) -> Span {
    let mut trace_id = [0x4b; 16];
    trace_id[8..].copy_from_slice(&i.to_be_bytes());
    Span {
        trace_id,
        span_id: span_id(i),
        parent_span_id: [0; 8],
        name: format!("GET /route/{}", i % 7),
        service: Arc::from("checkout"),
        start_unix_nanos: 1,
        end_unix_nanos: 2,
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The typical profile, `LABELLED` samples labelled with one of `SPANS` spans.
fn labelled_profile() -> bytes::Bytes {
    let mut p = testdata::cpu_profile(testdata::TYPICAL_SAMPLES, testdata::TYPICAL_FUNCTIONS);
    let mut intern = |s: String| {
        p.string_table.push(s);
        p.string_table.len() as i64 - 1
    };
    let key = intern("span_id".into());
    let name_key = intern("span_name".into());
    let ids: Vec<i64> = (0..SPANS).map(|i| intern(hex(&span_id(i)))).collect();
    let names: Vec<i64> = (0..SPANS)
        .map(|i| intern(format!("GET /route/{}", i % 7)))
        .collect();
    for (n, s) in p.sample.iter_mut().take(LABELLED).enumerate() {
        let i = n % SPANS as usize;
        s.label.push(Label {
            key,
            str: ids[i],
            ..Label::default()
        });
        s.label.push(Label {
            key: name_key,
            str: names[i],
            ..Label::default()
        });
    }
    pprof::gzip(&pprof::encode(&p))
}

/// How the profile reaches the processor.
#[derive(Clone, Copy)]
enum Input {
    /// Gzipped, as from `scrape` or `kafka`: the processor inflates it.
    Gzip,
    /// Gzipped, with the plain bytes the `pprof_push` receiver inflated to
    /// check it (what that receiver hands the pipeline).
    GzipFromPush,
    /// Sent uncompressed.
    Plain,
}

fn envelope(bytes: bytes::Bytes) -> Envelope {
    Envelope {
        labels: Labels::from_pairs([("service_name", "checkout")]),
        start_unix_nanos: 0,
        end_unix_nanos: 0,
        sample_types: Vec::new(),
        period_type: None,
        period: 0,
        payload: Payload::from_bytes(bytes, pprof::DEFAULT_MAX_DECOMPRESSED),
    }
}

fn processor(yaml: &str, make_otlp: bool, feed: bool) -> TraceLinkProcessor {
    let config: TraceLinkProcessorConfig = serde_saphyr::from_str(yaml).expect("bench config");
    let telemetry = Arc::new(Telemetry::new());
    let p = TraceLinkProcessor::new(
        &config,
        make_otlp,
        None,
        TraceLinkTelemetry::new(&telemetry, "bench"),
    );
    if feed {
        let spans: Vec<Span> = (0..SPANS).map(span).collect();
        p.span_consumer().expect("an index").consume_spans(&spans);
    }
    p
}

fn per_profile(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    let bytes = labelled_profile();
    eprintln!(
        "profile: {} bytes gzip, {LABELLED} of {} samples span-labelled",
        bytes.len(),
        testdata::TYPICAL_SAMPLES
    );
    let unlabelled = testdata::typical_cpu_profile_gzip();
    let mut g = c.benchmark_group("trace_link");
    g.throughput(Throughput::Elements(1));
    use Input::{Gzip, GzipFromPush, Plain};
    let cases = [
        (
            "no_span_labels_pass_through",
            "output: [otlp_links, labels]\n",
            false,
            false,
            Gzip,
        ),
        (
            "no_span_labels_pass_through_from_pprof_push",
            "output: [otlp_links, labels]\n",
            false,
            false,
            GzipFromPush,
        ),
        (
            "labels_without_index",
            "output: [labels]\n",
            false,
            false,
            Gzip,
        ),
        (
            "labels_with_index",
            "output: [labels]\nspan_index: {wait: 0s}\n",
            false,
            true,
            Gzip,
        ),
        (
            "labels_with_index_from_pprof_push",
            "output: [labels]\nspan_index: {wait: 0s}\n",
            false,
            true,
            GzipFromPush,
        ),
        (
            "labels_with_index_uncompressed_input",
            "output: [labels]\nspan_index: {wait: 0s}\n",
            false,
            true,
            Plain,
        ),
        (
            "labels_and_trace_id_label_with_index",
            "output: [labels, trace_id_label]\nspan_index: {wait: 0s}\n",
            false,
            true,
            Gzip,
        ),
        (
            "labels_and_trace_id_label_with_index_from_pprof_push",
            "output: [labels, trace_id_label]\nspan_index: {wait: 0s}\n",
            false,
            true,
            GzipFromPush,
        ),
        (
            "labels_and_trace_id_label_with_index_uncompressed_input",
            "output: [labels, trace_id_label]\nspan_index: {wait: 0s}\n",
            false,
            true,
            Plain,
        ),
        (
            "labels_and_otlp_links_with_index_to_otlp",
            "output: [otlp_links, labels]\nspan_index: {wait: 0s}\n",
            true,
            true,
            Gzip,
        ),
        (
            "labels_and_otlp_links_with_index_to_otlp_from_pprof_push",
            "output: [otlp_links, labels]\nspan_index: {wait: 0s}\n",
            true,
            true,
            GzipFromPush,
        ),
        (
            "otlp_links_with_index_to_otlp",
            "output: [otlp_links]\nspan_index: {wait: 0s}\n",
            true,
            true,
            Gzip,
        ),
    ];
    for (name, yaml, make_otlp, feed, input) in cases {
        let p = processor(yaml, make_otlp, feed);
        let gzipped = if name.starts_with("no_span_labels") {
            &unlabelled
        } else {
            &bytes
        };
        let inflated =
            pprof::decompress(gzipped, pprof::DEFAULT_MAX_DECOMPRESSED).expect("gunzips");
        let mut e = envelope(match input {
            Gzip | GzipFromPush => gzipped.clone(),
            Plain => inflated.clone(),
        });
        if let GzipFromPush = input {
            e.payload = e.payload.with_plain(inflated);
            assert!(e.payload.has_plain());
        }
        let meta = BatchMeta::default();
        g.bench_function(name, |b| {
            b.iter(|| black_box(rt.block_on(p.process(vec![e.clone()], &meta))))
        });
    }
    // What reading any gzipped profile costs before anything is looked at.
    g.bench_function("gunzip_alone", |b| {
        b.iter(|| {
            black_box(pprof::decompress(&bytes, pprof::DEFAULT_MAX_DECOMPRESSED).expect("gunzips"))
        })
    });
    // The conversion the pipeline makes for an OTLP exporter without the
    // processor, for comparison with the `_to_otlp` cases.
    let e = envelope(bytes.clone());
    g.bench_function("pipeline_conversion_to_otlp_alone", |b| {
        b.iter(|| {
            black_box(
                e.payload
                    .with_form(proflow_model::model::Format::Otlp, &mut Default::default())
                    .expect("converts"),
            )
        })
    });
    g.finish();
}

fn index(c: &mut Criterion) {
    let n = 100_000u64;
    let index = SpanIndex::new(Duration::from_secs(300), 1_000_000, None);
    let spans: Vec<Span> = (0..n).map(span).collect();
    for chunk in spans.chunks(512) {
        index.insert(chunk);
    }
    let (len, bytes) = index.size();
    eprintln!(
        "index_bytes_per_span: {len} spans, {bytes} bytes, {:.1} bytes a span (max_spans 1000000)",
        bytes as f64 / len as f64
    );
    let full = SpanIndex::new(Duration::from_secs(300), 100_000, None);
    for chunk in spans.chunks(512) {
        full.insert(chunk);
    }
    let (len, bytes) = full.size();
    eprintln!(
        "index_bytes_per_span: {len} spans, {bytes} bytes, {:.1} bytes a span (max_spans 100000, full)",
        bytes as f64 / len as f64
    );
    let mut g = c.benchmark_group("span_index");
    let batch: Vec<Span> = (n..n + 512).map(span).collect();
    g.throughput(Throughput::Elements(batch.len() as u64));
    g.bench_function("insert_512_spans", |b| {
        b.iter(|| full.insert(black_box(&batch)))
    });
    let ids: Vec<[u8; 8]> = (n - 50..n).map(span_id).collect();
    g.throughput(Throughput::Elements(ids.len() as u64));
    g.bench_function("lookup_50_spans", |b| {
        b.iter(|| {
            let mut found = 0;
            full.lookup_all(black_box(&ids), |_, _| found += 1);
            found
        })
    });
    g.finish();
}

criterion_group!(benches, per_profile, index);
criterion_main!(benches);
