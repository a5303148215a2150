//! pprof ↔ OTLP conversion on the typical CPU profile (two sample types).
//! Run: `cargo bench -p proflow-pipeline --bench otlp_convert`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_pipeline::otlp::{DictionaryBuilder, Lost, otlp_to_pprof, pprof_to_otlp};
use proflow_pipeline::testdata::{TYPICAL_FUNCTIONS, TYPICAL_SAMPLES, cpu_profile};
use std::hint::black_box;

fn convert(c: &mut Criterion) {
    let profile = cpu_profile(TYPICAL_SAMPLES, TYPICAL_FUNCTIONS);
    let mut dict = DictionaryBuilder::new();
    let otlp = pprof_to_otlp(&profile, &mut dict, &mut Lost::default()).expect("converts");
    let dict = dict.finish();

    let mut g = c.benchmark_group("otlp");
    g.throughput(Throughput::Elements(1));
    g.bench_function("pprof_to_otlp_typical", |b| {
        b.iter(|| {
            let mut dict = DictionaryBuilder::new();
            let out = pprof_to_otlp(black_box(&profile), &mut dict, &mut Lost::default());
            (out.map(|p| p.len()), dict.finish().string_table.len())
        })
    });
    g.bench_function("otlp_to_pprof_typical", |b| {
        b.iter(|| {
            otlp_to_pprof(black_box(&dict), black_box(&otlp), &mut Lost::default()).map(|p| p.len())
        })
    });
    g.finish();
}

criterion_group!(benches, convert);
criterion_main!(benches);
