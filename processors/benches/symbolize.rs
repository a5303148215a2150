//! The `symbolize` processor's cost on a realistic native profile: 3,000
//! unnamed locations across ten mappings of real ELF files on this machine
//! (system libraries and this benchmark's own binary), 2,000 samples of 8
//! to 16 frames. `warm`: the caches hold every address (decode, name,
//! encode); `cold_per_build_id`: a fresh symbolizer naming 300 addresses of
//! one library (opening it, reading its symbols and DWARF). Prints peak RSS
//! after the warm runs.
//! Run: `cargo bench -p proflow-processors --bench symbolize`

use std::hint::black_box;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use proflow_model::pprof;
use proflow_processors::symbolize::config::HostSource;
use proflow_processors::symbolize::profile;
use proflow_processors::symbolize::sources::Sources;
use proflow_symbolize::elf::ElfInfo;
use proflow_symbolize::{Limits, Symbols};

/// Shared libraries a Debian machine has; the first nine found are used,
/// with this binary as the tenth.
const LIBRARIES: &[&str] = &[
    "libc.so.6",
    "libm.so.6",
    "libstdc++.so.6",
    "libz.so.1",
    "libssl.so.3",
    "libcrypto.so.3",
    "libgcc_s.so.1",
    "libsqlite3.so.0",
    "libcurl.so.4",
    "libxml2.so.2",
    "libzstd.so.1",
    "liblzma.so.5",
    "libexpat.so.1",
];

fn files() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = LIBRARIES
        .iter()
        .map(|l| Path::new("/usr/lib/x86_64-linux-gnu").join(l))
        .filter(|p| ElfInfo::read(p).is_some_and(|i| i.build_id.is_some()))
        .take(9)
        .collect();
    out.push(std::env::current_exe().unwrap());
    assert!(out.len() >= 8, "too few libraries here: {out:?}");
    out
}

/// A small deterministic generator (xorshift), so every run names the same
/// addresses.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// A profile whose mappings map `files`' executable segments as a process
/// would, with `locations` addresses spread over them.
fn native_profile(files: &[PathBuf], locations: usize, samples: usize) -> pprof::Profile {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut p = pprof::Profile {
        string_table: vec![String::new(), "cpu".into(), "nanoseconds".into()],
        sample_type: vec![pprof::ValueType { r#type: 1, unit: 2 }],
        ..Default::default()
    };
    let mut segments = Vec::new();
    for (i, f) in files.iter().enumerate() {
        let info = ElfInfo::read(f).unwrap();
        let seg = *info.loads.iter().find(|l| l.executable).unwrap();
        let base = 0x7f00_0000_0000 + (i as u64) * 0x1000_0000;
        let start = base + (seg.vaddr & !0xfff);
        p.string_table.push(f.to_string_lossy().into_owned());
        let filename = p.string_table.len() as i64 - 1;
        p.string_table
            .push(info.build_id.clone().unwrap_or_default());
        let build_id = p.string_table.len() as i64 - 1;
        p.mapping.push(pprof::Mapping {
            id: i as u64 + 1,
            memory_start: start,
            memory_limit: start + seg.file_size,
            file_offset: seg.offset & !0xfff,
            filename,
            build_id,
            ..Default::default()
        });
        segments.push((start + (seg.vaddr & 0xfff), seg.file_size));
    }
    for id in 1..=locations as u64 {
        let m = (rng.next() % segments.len() as u64) as usize;
        let (start, size) = segments[m];
        p.location.push(pprof::Location {
            id,
            mapping_id: m as u64 + 1,
            address: start + rng.next() % size,
            ..Default::default()
        });
    }
    for _ in 0..samples {
        let depth = 8 + rng.next() % 9;
        p.sample.push(pprof::Sample {
            location_id: (0..depth)
                .map(|_| 1 + rng.next() % locations as u64)
                .collect(),
            value: vec![10_000_000],
            label: vec![],
        });
    }
    p
}

fn limits() -> Limits {
    Limits {
        max_entries: 100_000,
        max_open: 32,
        max_debug_info: 16 << 20,
    }
}

fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn symbolize(c: &mut Criterion) {
    let files = files();
    let p = native_profile(&files, 3_000, 2_000);
    let bytes: Bytes = pprof::encode(&p);
    let mut group = c.benchmark_group("symbolize");
    group.throughput(Throughput::Elements(1));

    let mut sources = Sources::new(HostSource::Every, vec![], HostSource::Every);
    let mut symbols = Symbols::new(limits(), Some(vec![]));
    let mut named = p.clone();
    let (changed, counts) = profile::symbolize(&mut named, None, &mut sources, &mut symbols);
    assert!(changed, "some addresses named");
    eprintln!(
        "symbolize bench: {} mappings, {} locations ({} bytes as pprof, {} named), frames by result {counts:?}",
        p.mapping.len(),
        p.location.len(),
        bytes.len(),
        pprof::encode(&named).len()
    );
    // What the processor adds beyond naming: the decode and the encode.
    group.bench_function("decode_encode_only_3000_locations", |b| {
        b.iter(|| {
            let decoded = pprof::decode(&bytes, 64 << 20).unwrap();
            black_box(pprof::encode(black_box(&decoded)))
        })
    });
    group.bench_function("warm_3000_locations_10_mappings", |b| {
        b.iter(|| {
            let mut decoded = pprof::decode(&bytes, 64 << 20).unwrap();
            profile::symbolize(black_box(&mut decoded), None, &mut sources, &mut symbols);
            black_box(pprof::encode(&decoded))
        })
    });
    eprintln!(
        "symbolize bench: peak RSS after the warm runs {} KiB",
        peak_rss_kib()
    );

    // One library's 300 addresses with nothing cached: the cost a new build
    // id adds once.
    let libc = native_profile(&files[..1], 300, 10);
    group.bench_function("cold_per_build_id_300_locations", |b| {
        b.iter_batched(
            || {
                (
                    libc.clone(),
                    Sources::new(HostSource::Every, vec![], HostSource::Every),
                    Symbols::new(limits(), Some(vec![])),
                )
            },
            |(mut p, mut sources, mut symbols)| {
                black_box(profile::symbolize(&mut p, None, &mut sources, &mut symbols))
            },
            BatchSize::PerIteration,
        )
    });
    group.finish();
}

criterion_group!(benches, symbolize);
criterion_main!(benches);
