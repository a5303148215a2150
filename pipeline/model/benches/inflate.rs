//! gzip inflation of what senders push: today's `inflate`, one call of
//! libdeflate into a buffer of the trailer's stated size, against the stream
//! it replaced (zlib-rs in 32 KiB steps copied out, its state made per
//! request) and against one call of zlib-rs into the same buffer (its state
//! kept, the CRC-32 checked after), on the typical ~4 KB profile and on a
//! large one (~1 MB plain).
//! Run: `cargo bench -p proflow-model --bench inflate`

use std::hint::black_box;
use std::io::Read;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_model::inflate::inflate;
use proflow_model::memory::MemoryBudget;
use proflow_model::testdata::{cpu_profile_gzip, typical_cpu_profile_gzip};

/// The path before the one-call inflate: a stream read in 32 KiB steps,
/// each copied into an output sized from the trailer.
fn stream(gz: &[u8], step: &mut [u8]) -> usize {
    let n = gz.len();
    let stated = u32::from_le_bytes(gz[n - 4..].try_into().unwrap()) as usize;
    let mut out = Vec::with_capacity(stated);
    let mut d = flate2::bufread::MultiGzDecoder::new(gz);
    loop {
        match d.read(step).unwrap() {
            0 => break,
            k => out.extend_from_slice(&step[..k]),
        }
    }
    out.len()
}

/// One call of zlib-rs into a buffer of the stated size, its raw-deflate
/// state kept, then the trailer checked (a gzip header without optional
/// fields, as the profiles here have).
fn one_call_zlib_rs(gz: &[u8], raw: &mut flate2::Decompress) -> usize {
    let n = gz.len();
    let stated = u32::from_le_bytes(gz[n - 4..].try_into().unwrap()) as usize;
    let mut out = Vec::with_capacity(stated);
    raw.reset(false);
    let status = raw
        .decompress_vec(&gz[10..], &mut out, flate2::FlushDecompress::Finish)
        .unwrap();
    assert_eq!(status, flate2::Status::StreamEnd);
    let crc = u32::from_le_bytes(gz[n - 8..n - 4].try_into().unwrap());
    assert_eq!(crc32fast::hash(&out), crc);
    out.len()
}

fn gunzip(c: &mut Criterion) {
    let budget = MemoryBudget::new(1 << 30);
    for (name, gz) in [
        ("typical", typical_cpu_profile_gzip()),
        ("large", cpu_profile_gzip(20_000, 5_000)),
    ] {
        let n = gz.len();
        let stated = u32::from_le_bytes(gz[n - 4..].try_into().unwrap()) as usize;
        eprintln!("{name}: {n} bytes gzip, {stated} plain");
        let mut g = c.benchmark_group(format!("gunzip_{name}"));
        g.throughput(Throughput::Bytes(stated as u64));
        let mut step = vec![0u8; 32 << 10];
        g.bench_function("stream_zlib_rs", |b| {
            b.iter(|| stream(black_box(&gz), &mut step))
        });
        let mut raw = flate2::Decompress::new(false);
        g.bench_function("one_call_zlib_rs", |b| {
            b.iter(|| one_call_zlib_rs(black_box(&gz), &mut raw))
        });
        g.bench_function("inflate_libdeflate", |b| {
            b.iter(|| inflate(black_box(&gz), 64 << 20, &mut budget.grant()).map(|v| v.len()))
        });
        g.finish();
    }
}

criterion_group!(benches, gunzip);
criterion_main!(benches);
