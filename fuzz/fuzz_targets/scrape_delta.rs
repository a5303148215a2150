//! Deltas of cumulative profiles (the `scrape` receiver's allocs, heap,
//! mutex and block): two pprof profiles (cut by a 2-byte length; the second
//! is the first again when it does not decode) scraped in turn a, b, b, a.
//! The states stay within their store's limit and give it all back; a
//! delta never adds samples; a profile scraped twice over has nothing new
//! (every cumulative value of the second delta zero), and one without a
//! cumulative type passes as it was.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use proflow_fuzz::LIMIT;
use proflow_pipeline::pprof::{self, Profile};
use proflow_receivers::scrape::delta::{CUMULATIVE_TYPES, DeltaOutcome, DeltaState, DeltaStore};

fuzz_target!(|data: &[u8]| {
    let Some((first, second)) = proflow_fuzz::two_parts(data) else {
        return;
    };
    let decode = |b: &[u8]| pprof::decode(&Bytes::copy_from_slice(b), LIMIT).ok();
    let Some(a) = decode(first) else {
        return;
    };
    let b = decode(second).unwrap_or_else(|| a.clone());
    // A small store, so refusals for want of memory are reached too.
    let store = DeltaStore::new(4 << 10);
    {
        let mut state = DeltaState::new(store.clone());
        let mut last = None;
        for (i, p) in [a.clone(), b.clone(), b.clone(), a].into_iter().enumerate() {
            let samples = p.sample.len();
            let cumulative = cumulative(&p);
            let before = p.clone();
            let outcome = state.next(p);
            assert!(
                store.used_bytes() <= store.limit_bytes(),
                "the store went past its limit"
            );
            if let DeltaOutcome::Delta(d) = &outcome {
                assert!(
                    d.sample.len() <= samples,
                    "a delta with more samples than its scrape"
                );
                if cumulative.is_empty() {
                    assert!(
                        *d == before,
                        "a profile without cumulative types was changed"
                    );
                }
            }
            if i == 2 && !cumulative.is_empty() && last != Some(false) {
                let DeltaOutcome::Delta(d) = &outcome else {
                    panic!("the same scrape twice made {outcome:?}, not a delta");
                };
                for s in &d.sample {
                    for &c in &cumulative {
                        assert_eq!(
                            s.value.get(c).copied().unwrap_or(0),
                            0,
                            "a change where there was none"
                        );
                    }
                }
            }
            last = Some(!matches!(outcome, DeltaOutcome::StateFull));
        }
    }
    assert_eq!(store.used_bytes(), 0, "a dropped state kept its bytes");
    assert_eq!(store.series(), 0, "a dropped state is still counted");
});

/// The indices of a profile's cumulative sample types.
fn cumulative(p: &Profile) -> Vec<usize> {
    p.sample_type
        .iter()
        .enumerate()
        .filter(|(_, t)| CUMULATIVE_TYPES.contains(&p.string(t.r#type)))
        .map(|(i, _)| i)
        .collect()
}
