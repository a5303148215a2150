//! Folded (`a;b;c 12`) and `lines` text bodies: the first byte picks the
//! format (bit 0) and a sample rate (the rest); the profile made of the text
//! has a sample per distinct stack, no negative value, and survives its own
//! encoding. Nothing is lost unseen: the values in the profile are the
//! counts of the lines that carry one (tallied here, line by line), and the
//! lines that cannot be carried are the samples counted as lost.
#![no_main]
use libfuzzer_sys::fuzz_target;

/// What the body's lines hold, tallied independently of the parser: the
/// sum of the counts that have a frame to go to, and the lines with a value
/// but nowhere to put it (no count, or no frame).
fn tally(body: &[u8], lines: bool) -> (u128, u64) {
    let (mut total, mut lost) = (0u128, 0u64);
    for raw in body.split(|&b| b == b'\n') {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = String::from_utf8_lossy(raw);
        let (stack, count) = if lines {
            if line.is_empty() {
                continue;
            }
            (&line[..], 1u128)
        } else {
            let Some((stack, count)) = line.rsplit_once(' ') else {
                lost += u64::from(line.chars().any(|c| !c.is_ascii_whitespace()));
                continue;
            };
            // Parsed as the parser does (a sign allowed, `-0` is 0).
            let count = count
                .parse::<i64>()
                .expect("a body with a bad count is refused");
            (
                stack,
                u128::try_from(count).expect("a negative count is refused"),
            )
        };
        if count == 0 {
            continue;
        }
        if stack.is_empty() {
            lost += 1;
        } else {
            total += count;
        }
    }
    (total, lost)
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, body)) = data.split_first() else {
        return;
    };
    let lines = first & 1 == 1;
    let sample_rate = u32::from(first >> 1) * 10;
    let Ok((profile, lost)) =
        proflow_receivers::pprof_push::fuzzing::folded(body, lines, sample_rate)
    else {
        assert!(!lines, "lines bodies have no counts to refuse");
        return;
    };
    assert_eq!(profile.sample_type.len(), 1);
    let lines_in_body = body.split(|&b| b == b'\n').count();
    assert!(
        profile.sample.len() <= lines_in_body,
        "more stacks than lines"
    );
    for s in &profile.sample {
        assert_eq!(s.value.len(), 1);
        assert!(s.value[0] >= 0, "a negative sample value");
    }
    // Sampled: each count is worth the period.
    let scale = 1_000_000_000u32
        .checked_div(sample_rate)
        .map_or(1, u128::from);
    let (total, lost_lines) = tally(body, lines);
    let out: u128 = profile.sample.iter().map(|s| s.value[0] as u128).sum();
    if lost.samples("value_capped") == 0 {
        assert_eq!(
            out,
            total * scale,
            "the profile's values are not the lines' counts"
        );
    } else {
        assert!(out < total * scale, "capped, yet nothing is missing");
    }
    assert_eq!(
        lost.samples("no_count") + lost.samples("empty_stack"),
        lost_lines,
        "lines lost unseen (or counted twice): {lost:?}"
    );
    proflow_fuzz::check_pprof_roundtrip(&profile);
});
