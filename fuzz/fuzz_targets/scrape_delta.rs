//! Deltas of cumulative profiles (the `scrape` receiver's allocs, heap,
//! mutex and block), computed on the wire: two byte strings (cut by a
//! 2-byte length) scraped in turn a, b, b, a, as they are, whether they
//! are pprof or not. Nothing panics; the states stay within their store's
//! limit and give it all back; the delta of a scrape that decodes decodes
//! too, counts its samples right, never has more than its scrape and keeps
//! its tables and never has a negative cumulative value; a first scrape's
//! instant values come with every cumulative value zero; a profile without
//! a cumulative type is left to pass as it was; and a profile scraped twice
//! over has nothing new (every cumulative value of the second delta zero).
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_model::pprof::{self, Profile};
use proflow_receivers::scrape::delta::{CUMULATIVE_TYPES, DeltaOutcome, DeltaState, DeltaStore};
use prost::Message;

fuzz_target!(|data: &[u8]| {
    let Some((first, second)) = proflow_fuzz::two_parts(data) else {
        return;
    };
    // A small store, so refusals for want of memory are reached too.
    let store = DeltaStore::new(4 << 10);
    {
        let mut state = DeltaState::new(store.clone());
        // Whether the previous scrape left a state to compare with.
        let mut primed = false;
        for (i, plain) in [first, second, second, first].into_iter().enumerate() {
            let scraped = Profile::decode(plain).ok();
            // What the receiver grants: the decoded-size budget.
            let outcome = state.next(plain, pprof::decoded_budget(plain.len()));
            assert!(
                store.used_bytes() <= store.limit_bytes(),
                "the store went past its limit"
            );
            // What the delta did not rewrite passes as it came, so only a
            // scrape that decodes makes a delta that must.
            // A first scrape (or one after a restart) emits its instant
            // values alone: every cumulative one 0.
            let (made, instant) = match &outcome {
                Ok(DeltaOutcome::Delta(d)) => (Some(d), false),
                Ok(DeltaOutcome::Primed(Some(d)) | DeltaOutcome::Reset(Some(d))) => (Some(d), true),
                _ => (None, false),
            };
            if let (Some(d), Some(scraped)) = (made, &scraped) {
                let delta = Profile::decode(&d.bytes[..]).expect("a delta that does not decode");
                let columns = cumulative(&delta);
                for s in &delta.sample {
                    for &c in &columns {
                        let v = s.value.get(c).copied().unwrap_or(0);
                        assert!(v >= 0, "a negative delta");
                        assert!(!instant || v == 0, "a cumulative value in a first scrape");
                    }
                }
                assert_eq!(delta.sample.len(), d.samples, "samples miscounted");
                {
                    assert!(
                        delta.sample.len() <= scraped.sample.len(),
                        "a delta with more samples than its scrape"
                    );
                    assert_eq!(delta.string_table, scraped.string_table);
                    assert_eq!(delta.location, scraped.location);
                }
                if i == 2 && primed {
                    let cumulative = cumulative(&delta);
                    for s in &delta.sample {
                        for &c in &cumulative {
                            assert_eq!(
                                s.value.get(c).copied().unwrap_or(0),
                                0,
                                "a change where there was none"
                            );
                        }
                    }
                }
            }
            if let (Ok(DeltaOutcome::Unchanged), Some(scraped)) = (&outcome, &scraped) {
                assert!(
                    cumulative(scraped).is_empty(),
                    "a cumulative profile left unchanged"
                );
            }
            if i == 2 && primed {
                assert!(
                    matches!(
                        outcome,
                        Ok(DeltaOutcome::Delta(_) | DeltaOutcome::Unchanged)
                    ),
                    "the same scrape twice made {outcome:?}, not a delta"
                );
            }
            primed = matches!(
                outcome,
                Ok(DeltaOutcome::Primed(_) | DeltaOutcome::Reset(_) | DeltaOutcome::Delta(_))
            );
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
