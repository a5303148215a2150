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
    use proflow_model::otlp::{OtlpProfiles, ProfileData, RequestBuilder, SharedDictionary};
    use proflow_model::testdata::otlp_request;
    use prost::Message;
    use std::sync::Arc;
    // The load tool's requests: large (4 services, 8 profiles, ~61 KB) and
    // small (1 service, 2 profiles, ~4 KB). Each request's profiles share
    // its dictionary; `raw`: held as the bytes that arrived (what a receiver
    // keeps), else decoded (what JSON or a conversion makes).
    let received = |n: usize, shape: (usize, usize, usize), raw: bool| -> Vec<OtlpProfiles> {
        (0..n)
            .flat_map(|_| {
                let mut r = otlp_request(shape.0, shape.1, shape.2);
                let d = r.dictionary.take().unwrap_or_default();
                let dict = Arc::new(if raw {
                    let entries = d.string_table.len() + d.location_table.len();
                    SharedDictionary::from_raw_entries(d.encode_to_vec().into(), entries)
                } else {
                    SharedDictionary::from_decoded(d)
                });
                r.resource_profiles
                    .into_iter()
                    .flat_map(|rp| rp.scope_profiles)
                    .flat_map(|sp| sp.profiles)
                    .map(|p| {
                        let p = if raw {
                            ProfileData::from_raw(p.encode_to_vec().into())
                        } else {
                            p.into()
                        };
                        OtlpProfiles::new(dict.clone(), None, vec![p], 0)
                    })
                    .collect::<Vec<_>>()
            })
            .collect()
    };
    let labels = Labels::from_pairs([("service_name", "load")]);
    const LARGE: (usize, usize, usize) = (4, 140, 700);
    const SMALL: (usize, usize, usize) = (1, 25, 50);
    let build = |items: &[OtlpProfiles]| {
        let mut rb = RequestBuilder::new();
        for o in items {
            rb.push(&labels, o);
        }
        rb.build().map(|r| r.encode().len())
    };
    let mut g = c.benchmark_group("otlp_request");
    for (name, items) in [
        (
            "one_request_shared_dictionary_8_profiles",
            received(1, LARGE, false),
        ),
        (
            "four_requests_merged_32_profiles",
            received(4, LARGE, false),
        ),
        (
            "four_requests_merged_on_the_wire_32_profiles",
            received(4, LARGE, true),
        ),
        (
            "32_small_requests_merged_64_profiles",
            received(32, SMALL, false),
        ),
        (
            "32_small_requests_merged_on_the_wire_64_profiles",
            received(32, SMALL, true),
        ),
    ] {
        g.throughput(Throughput::Elements(items.len() as u64));
        g.bench_function(name, |b| b.iter(|| build(black_box(&items))));
    }
    g.finish();
}

criterion_group!(benches, convert, request);
criterion_main!(benches);
