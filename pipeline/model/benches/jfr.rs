//! JFR → pprof on two 10 s uploads of the Pyroscope Java agent (itimer CPU,
//! allocations, locks, dynamic labels) recorded from
//! `tests/peers/apps/java/App.java`: the first of a freshly started JVM
//! (class loading and compilation make it the richest in distinct stacks)
//! and the next one (a service at work). The whole conversion `/ingest?format=jfr`
//! makes of one upload: gunzip, the labels' protobuf, and the recording to
//! one pprof profile per event kind, encoded (what an exporter sends).
//! Before the timing it prints the upload's sizes and the most memory one
//! conversion held, counted by the allocator.
//! Run: `cargo bench -p proflow-model --bench jfr`

use std::alloc::{GlobalAlloc, Layout, System};
use std::hint::black_box;
use std::io::Read;
use std::sync::atomic::{AtomicUsize, Ordering};

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_model::jfr::{Meter, convert, labels::LabelsSnapshot};
use proflow_model::pprof;
use prost::Message;

/// Counts the bytes allocated now and the most ever, since the last reset.
struct Counting;

static NOW: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
        PEAK.fetch_max(now, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            let now = NOW.fetch_add(new_size - layout.size(), Ordering::Relaxed) + new_size
                - layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        } else {
            NOW.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// (name, gzipped JFR, labels)
const UPLOADS: [(&str, &[u8], &[u8]); 2] = [
    (
        "first_upload",
        include_bytes!("data/agent-first-10s.jfr.gz"),
        include_bytes!("data/agent-first-10s.labels"),
    ),
    (
        "steady_upload",
        include_bytes!("data/agent-10s.jfr.gz"),
        include_bytes!("data/agent-10s.labels"),
    ),
];

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(gz)
        .read_to_end(&mut out)
        .expect("the bench recording is gzip");
    out
}

/// One upload as `/ingest` converts it: the profiles and what the meter took.
fn convert_upload(jfr_gz: &[u8], labels: &[u8]) -> (convert::Recording, usize) {
    let jfr = gunzip(jfr_gz);
    let labels = LabelsSnapshot::decode(labels).expect("labels");
    let mut meter = Meter::unbounded();
    let recording = convert::to_pprof(&jfr, Some(&labels), 100, 0, 10_000_000_000, &mut meter)
        .expect("the bench recording converts");
    (recording, meter.peak())
}

fn jfr(c: &mut Criterion) {
    let mut g = c.benchmark_group("jfr");
    g.throughput(Throughput::Elements(1));
    for (name, jfr_gz, labels) in UPLOADS {
        let plain = gunzip(jfr_gz);
        let before = NOW.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let (recording, metered) = convert_upload(jfr_gz, labels);
        let peak = PEAK.load(Ordering::Relaxed) - before;
        let encoded: usize = recording.profiles.iter().map(|p| p.pprof.len()).sum();
        for p in &recording.profiles {
            pprof::decode(&bytes::Bytes::from(p.pprof.clone()), 64 << 20)
                .expect("each profile decodes");
        }
        eprintln!(
            "{name}: {} bytes of JFR ({} gzip), {} bytes of labels; {} profiles, {encoded} bytes of pprof",
            plain.len(),
            jfr_gz.len(),
            labels.len(),
            recording.profiles.len(),
        );
        eprintln!(
            "{name}: one conversion held at most {peak} bytes ({:.2}x the JFR) with the gunzipped JFR, the meter took {metered} ({:.2}x)",
            peak as f64 / plain.len() as f64,
            metered as f64 / plain.len() as f64
        );
        drop(recording);
        g.bench_function(name, |b| {
            b.iter(|| {
                convert_upload(black_box(jfr_gz), black_box(labels))
                    .0
                    .profiles
                    .len()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, jfr);
criterion_main!(benches);
