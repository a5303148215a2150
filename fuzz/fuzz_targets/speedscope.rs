//! Speedscope bodies of `/ingest?format=speedscope` (the first byte picks
//! the client's `sampleRate`: 0 is the default 100, else the byte): what
//! the conversion keeps and what it counts as lost add up to what the
//! file holds. The file is read again here as plain JSON, value by value:
//! every weight (sampled) or interval between events with a frame open
//! (evented) that is above 0 is either in the stacks, rounded as the unit
//! says, or one lost sample (`empty_stack`, `rounded_to_zero`).
#![no_main]
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

/// What one value of `unit` is multiplied by before it is rounded (the
/// rule in `speedscope.rs`'s docs), or `None` for a unit the parser refuses.
fn multiplier(unit: &str, sample_rate: u32) -> Option<f64> {
    let nanos = match unit {
        "none" => 1e7,
        "nanoseconds" => return Some(1.0),
        "microseconds" => 1e3,
        "milliseconds" => 1e6,
        "seconds" => 1e9,
        "bytes" => return Some(1.0),
        _ => return None,
    };
    Some(if sample_rate == 100 { nanos } else { 100.0 })
}

/// Whether the frames named `names` make no stack: their `;`-joined stack
/// is empty (no frame, or one with an empty name). Empty names among
/// others are frames, as in folded text (`a;;b`).
fn no_stack(names: &[&str]) -> bool {
    names.join(";").is_empty()
}

/// Tallies one value: into `kept` when it rounds to 1 or more and has a
/// frame, else one lost sample.
fn tally(value: f64, empty: bool, mult: f64, kept: &mut f64, lost: &mut u64, capped: &mut bool) {
    if value.is_nan() || value <= 0.0 {
        return;
    }
    if empty {
        *lost += 1;
        return;
    }
    let scaled = (value * mult).round();
    if scaled < 1.0 {
        *lost += 1;
    } else if scaled >= i64::MAX as f64 / 4.0 {
        *capped = true;
    } else {
        *kept += scaled;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let sample_rate = if first == 0 { 100 } else { u32::from(first) };
    let Ok((profiles, lost)) =
        proflow_receivers::pprof_push::fuzzing::speedscope(body, sample_rate)
    else {
        return;
    };
    // The parser took it. Read as a whole document it may still fail: the
    // parser skips the fields it does not read without checking their
    // escapes (an unpaired surrogate), a full read does not.
    let Ok(doc) = serde_json::from_slice::<Value>(body) else {
        return;
    };
    let names: Vec<&str> = doc["shared"]["frames"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|f| f["name"].as_str().unwrap_or_default())
        .collect();
    let name = |i: &Value| names[i.as_f64().unwrap_or(0.0).trunc() as usize];
    let profiles_in = doc["profiles"].as_array().cloned().unwrap_or_default();
    // Profiles of the same name, type, unit and start are merged, their
    // events run on from one into the next: tallied apart here, they would
    // differ. Only files without such twins are checked.
    let key = |p: &Value| {
        (
            p["name"].to_string(),
            p["type"].to_string(),
            p["unit"].to_string(),
            p["startValue"].as_f64().unwrap_or(0.0).to_bits(),
        )
    };
    let keys: std::collections::BTreeSet<_> = profiles_in.iter().map(key).collect();
    if keys.len() != profiles_in.len() {
        return;
    }
    let (mut kept, mut lost_here, mut capped) = (0f64, 0u64, false);
    for p in &profiles_in {
        let unit = p["unit"].as_str().unwrap_or_default();
        let mult = multiplier(unit, sample_rate).expect("a unit the parser took");
        match p["type"].as_str() {
            Some("sampled") => {
                let samples = p["samples"].as_array().cloned().unwrap_or_default();
                let weights = p["weights"].as_array().cloned().unwrap_or_default();
                for (s, w) in samples.iter().zip(&weights) {
                    let frames: Vec<&str> = s.as_array().into_iter().flatten().map(name).collect();
                    let w = w.as_f64().unwrap_or(0.0);
                    tally(
                        w,
                        no_stack(&frames),
                        mult,
                        &mut kept,
                        &mut lost_here,
                        &mut capped,
                    );
                }
            }
            _ => {
                // Evented: the time between two events belongs to the frames
                // open (none open: outside the profile, no sample).
                let mut open: Vec<&str> = Vec::new();
                let mut last = p["startValue"].as_f64().unwrap_or(0.0);
                for e in p["events"].as_array().into_iter().flatten() {
                    let at = e["at"].as_f64().unwrap_or(0.0);
                    if at > last && !open.is_empty() {
                        let empty = no_stack(&open);
                        tally(
                            at - last,
                            empty,
                            mult,
                            &mut kept,
                            &mut lost_here,
                            &mut capped,
                        );
                    }
                    if e["type"].as_str() == Some("O") {
                        open.push(name(&e["frame"]));
                    } else {
                        open.pop();
                    }
                    last = at;
                }
            }
        }
    }
    let out: f64 = profiles
        .iter()
        .flat_map(|(_, stacks)| stacks)
        .map(|(_, v)| *v as f64)
        .sum();
    if !capped && lost.samples("value_capped") == 0 {
        // Sums of whole numbers below 2^53 are exact in f64; above, allow
        // the rounding of the sum.
        let slack = (kept.abs() * 1e-12).max(0.5);
        assert!(
            (out - kept).abs() <= slack,
            "kept {out}, the file holds {kept} (lost {lost:?})"
        );
    }
    assert_eq!(
        lost.samples("empty_stack") + lost.samples("rounded_to_zero"),
        lost_here,
        "values lost unseen, or counted twice: {lost:?}"
    );
    for (_, stacks) in &profiles {
        for (stack, v) in stacks {
            assert!(*v > 0, "a stack of no value: {stack}");
        }
    }
});
