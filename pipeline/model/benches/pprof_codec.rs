//! pprof decode, encode and metadata scan on a typical ~4 KB gzip CPU profile,
//! and the scan per byte beside a bare walk of the same bytes.
//! Run: `cargo bench -p proflow-model --bench pprof_codec`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_model::testdata::{
    TYPICAL_FUNCTIONS, TYPICAL_SAMPLES, cpu_profile, typical_cpu_profile_gzip,
};
use proflow_model::{pprof, wire};
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

    // The scan of the plain bytes against the least any check of them does:
    // one walk of the top-level fields and of each sample's fields.
    let mut g = c.benchmark_group("scan_per_byte");
    g.throughput(Throughput::Bytes(plain.len() as u64));
    g.bench_function("scan_metadata_plain", |b| {
        b.iter(|| pprof::scan_metadata(black_box(&plain), 64 << 20).map(|m| m.sample_count))
    });
    g.bench_function("bare_walk", |b| {
        b.iter(|| {
            let mut n = 0usize;
            for field in wire::fields(black_box(&plain)) {
                let Ok((tag, value)) = field else { break };
                n += 1;
                if let (2, wire::Value::Bytes(sample)) = (tag, value) {
                    n += wire::fields(sample).count();
                }
            }
            n
        })
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
