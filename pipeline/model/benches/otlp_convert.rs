//! pprof ↔ OTLP conversion on the typical CPU profile (two sample types).
//! Run: `cargo bench -p proflow-model --bench otlp_convert`

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use proflow_model::otlp::{DictionaryBuilder, Lost, otlp_to_pprof, pprof_to_otlp};
use proflow_model::testdata::{TYPICAL_FUNCTIONS, TYPICAL_SAMPLES, cpu_profile};
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

/// One request out of the profiles of received requests (the `otlp`
/// exporter's work): profiles sharing one dictionary are written by
/// reference; profiles of several requests are re-indexed into one.
fn request(c: &mut Criterion) {
    use proflow_model::model::Labels;
    use proflow_model::otlp::{OtlpProfiles, RequestBuilder, SharedDictionary};
    use proflow_model::testdata::otlp_request;
    use std::sync::Arc;
    // The load tool's large request: 4 services, 8 profiles, ~61 KB.
    let received = |n: usize| -> Vec<OtlpProfiles> {
        (0..n)
            .flat_map(|_| {
                let mut r = otlp_request(4, 140, 700);
                let dict = Arc::new(SharedDictionary::from_decoded(
                    r.dictionary.take().unwrap_or_default(),
                ));
                r.resource_profiles
                    .into_iter()
                    .flat_map(|rp| rp.scope_profiles)
                    .flat_map(|sp| sp.profiles)
                    .map(|p| OtlpProfiles::new(dict.clone(), None, vec![p.into()], 0))
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let labels = Labels::from_pairs([("service_name", "load")]);
    let one = received(1);
    let four = received(4);
    let mut g = c.benchmark_group("otlp_request");
    g.throughput(Throughput::Elements(one.len() as u64));
    g.bench_function("one_request_shared_dictionary_8_profiles", |b| {
        b.iter(|| {
            let mut rb = RequestBuilder::new();
            for o in &one {
                rb.push(&labels, o);
            }
            rb.build().map(|r| r.encode().len())
        })
    });
    g.throughput(Throughput::Elements(four.len() as u64));
    g.bench_function("four_requests_merged_32_profiles", |b| {
        b.iter(|| {
            let mut rb = RequestBuilder::new();
            for o in &four {
                rb.push(&labels, o);
            }
            rb.build().map(|r| r.encode().len())
        })
    });
    g.finish();
}

criterion_group!(benches, convert, request);
criterion_main!(benches);
