//! The `aggregate` processor's per-profile cost on a typical CPU push (the
//! ~4 KB gzip profile the load tool sends): decoding it, and merging it
//! into an open window; and what a window costs to close (encode and
//! gzip). Run: `cargo bench -p proflow-processors --bench aggregate`

use std::hint::black_box;
use std::sync::Arc;

use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use proflow_core::component::{BuildContext, ProcessorConfig};
use proflow_core::telemetry::Telemetry;
use proflow_model::memory::MemoryBudget;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload, ValueType};
use proflow_model::pprof::{self, Merger, ProfileParts};
use proflow_model::testdata;
use proflow_processors::aggregate::AggregateProcessorConfig;

fn envelope(series: usize, seed: u64) -> Envelope {
    let p =
        testdata::cpu_profile_seeded(testdata::TYPICAL_SAMPLES, testdata::TYPICAL_FUNCTIONS, seed);
    Envelope {
        labels: Labels::from_pairs([
            ("__name__", "process_cpu".to_owned()),
            ("service_name", format!("svc-{series}")),
        ]),
        start_unix_nanos: 0,
        end_unix_nanos: 0,
        sample_types: vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds"),
        ],
        period_type: Some(ValueType::new("cpu", "nanoseconds")),
        period: 10_000_000,
        payload: Payload::from_bytes(pprof::gzip(&pprof::encode(&p)), 64 << 20),
    }
}

fn aggregate(c: &mut Criterion) {
    let mut g = c.benchmark_group("aggregate");
    g.throughput(Throughput::Elements(1));
    let gz = pprof::gzip(&pprof::encode(&testdata::cpu_profile(
        testdata::TYPICAL_SAMPLES,
        testdata::TYPICAL_FUNCTIONS,
    )));
    g.bench_function("decode_typical", |b| {
        b.iter(|| pprof::decode(black_box(&gz), 64 << 20).unwrap())
    });
    // Merging into a window that holds the same series' earlier profiles
    // (other stacks over the same functions).
    let first =
        testdata::cpu_profile_seeded(testdata::TYPICAL_SAMPLES, testdata::TYPICAL_FUNCTIONS, 1);
    let next =
        testdata::cpu_profile_seeded(testdata::TYPICAL_SAMPLES, testdata::TYPICAL_FUNCTIONS, 2);
    g.bench_function("merge_typical", |b| {
        b.iter_batched_ref(
            || Merger::new(&ProfileParts::of(&first)).unwrap(),
            |m| m.add(black_box(&ProfileParts::of(&next))).unwrap(),
            BatchSize::SmallInput,
        )
    });
    // The same off the profile's plain bytes, as the processor reads a
    // pushed pprof profile (no decoding).
    let next_plain = pprof::encode(&next);
    g.bench_function("merge_typical_off_the_wire", |b| {
        b.iter_batched_ref(
            || Merger::new(&ProfileParts::of(&first)).unwrap(),
            |m| {
                m.add(&ProfileParts::read(black_box(&next_plain)).unwrap())
                    .unwrap()
            },
            BatchSize::SmallInput,
        )
    });
    let mut window = Merger::new(&ProfileParts::of(&first)).unwrap();
    for seed in 2..15 {
        let p = testdata::cpu_profile_seeded(
            testdata::TYPICAL_SAMPLES,
            testdata::TYPICAL_FUNCTIONS,
            seed,
        );
        window.add(&ProfileParts::of(&p)).unwrap();
    }
    let merged = window.finish();
    g.bench_function("close_window_of_15", |b| {
        b.iter(|| pprof::gzip(&pprof::encode(black_box(&merged))))
    });
    // The processor as the pipeline calls it: one push of a typical
    // profile into one of 100 open windows.
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a runtime");
    let processor = AggregateProcessorConfig::default()
        .build(&BuildContext {
            id: "aggregate".to_owned(),
            telemetry: Arc::new(Telemetry::new()),
            memory: MemoryBudget::new(256 << 20),
        })
        .expect("builds");
    let meta = BatchMeta::default();
    let mut n = 0u64;
    g.bench_function("process_typical_push", |b| {
        b.iter_batched(
            || {
                n += 1;
                vec![envelope((n % 100) as usize, n % 7)]
            },
            |batch| rt.block_on(processor.process(batch, &meta)),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, aggregate);
criterion_main!(benches);
