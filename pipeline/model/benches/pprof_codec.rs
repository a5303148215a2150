//! pprof decode, encode and metadata scan on a typical ~4 KB gzip CPU profile.
//! Run: `cargo bench -p proflow-model --bench pprof_codec`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_model::pprof;
use proflow_model::testdata::{
    TYPICAL_FUNCTIONS, TYPICAL_SAMPLES, cpu_profile, typical_cpu_profile_gzip,
};
use std::hint::black_box;

fn codec(c: &mut Criterion) {
    let profile = cpu_profile(TYPICAL_SAMPLES, TYPICAL_FUNCTIONS);
    let gz = typical_cpu_profile_gzip();
    let plain = pprof::encode(&profile);
    eprintln!(
        "typical profile: {} bytes gzip, {} bytes plain",
        gz.len(),
        plain.len()
    );

    let mut g = c.benchmark_group("pprof");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode_gzip", |b| {
        b.iter(|| pprof::decode(black_box(&gz), 64 << 20).map(|p| p.sample.len()))
    });
    g.bench_function("decode_plain", |b| {
        b.iter(|| pprof::decode(black_box(&plain), 64 << 20).map(|p| p.sample.len()))
    });
    g.bench_function("encode_plain", |b| {
        b.iter(|| pprof::encode(black_box(&profile)).len())
    });
    g.bench_function("encode_gzip", |b| {
        b.iter(|| pprof::gzip(&pprof::encode(black_box(&profile))).len())
    });
    g.bench_function("scan_metadata_gzip", |b| {
        b.iter(|| pprof::scan_metadata(black_box(&gz), 64 << 20).map(|m| m.sample_count))
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
