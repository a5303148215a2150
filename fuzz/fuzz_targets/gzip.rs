//! gzip streams through the inflation every receiver uses
//! (`inflate::inflate`, under a memory grant) and the codec's
//! (`pprof::gunzip_into`), against flate2's stream reader: both give the
//! reader's bytes, or an error the reader gives too (or a limit it passes).
#![no_main]
use std::io::Read;

use libfuzzer_sys::fuzz_target;
use proflow_model::inflate::{InflateError, inflate};
use proflow_model::memory::MemoryBudget;
use proflow_model::pprof::{self, DecodeError};

const LIMIT: usize = 1 << 20;

fuzz_target!(|data: &[u8]| {
    let mut reference = Vec::new();
    let read = flate2::bufread::MultiGzDecoder::new(data)
        .take(LIMIT as u64 + 1)
        .read_to_end(&mut reference);
    // The reader's verdict: its bytes within the limit, past the limit, or
    // refused before reaching it.
    let past_limit = read.is_ok() && reference.len() > LIMIT;
    let budget = MemoryBudget::new(64 << 20);
    let mut grant = budget.grant();
    match inflate(data, LIMIT, &mut grant) {
        Ok(out) => {
            assert!(
                read.is_ok() && !past_limit,
                "inflated what the reader refuses"
            );
            assert_eq!(out, reference);
            assert!(grant.held() >= out.capacity());
        }
        Err(InflateError::TooLarge { .. }) => assert!(past_limit, "too large, the reader says not"),
        Err(InflateError::Corrupt(e)) => {
            assert!(
                read.is_err() || past_limit,
                "corrupt ({e}), the reader read it"
            )
        }
        Err(InflateError::OverBudget(e)) => panic!("a 1 MiB limit in a 64 MiB budget: {e}"),
    }
    drop(grant);
    assert_eq!(budget.in_flight(), 0, "nothing stays granted");
    let mut out = Vec::new();
    match pprof::gunzip_into(data, LIMIT, &mut out) {
        Ok(()) => {
            assert!(
                read.is_ok() && !past_limit,
                "gunzipped what the reader refuses"
            );
            assert_eq!(out, reference);
        }
        Err(DecodeError::TooLarge { .. }) => assert!(past_limit),
        Err(e) => assert!(
            read.is_err() || past_limit,
            "refused ({e}), the reader read it"
        ),
    }
});
