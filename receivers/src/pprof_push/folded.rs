//! Folded text (`foo;bar;baz 100` per line, Brendan Gregg's collapsed stacks)
//! and the `lines` format (one stack per line, each occurrence counting 1),
//! converted to a pprof profile the way Pyroscope converts them.
//!
//! Grouped lines split at the last space; a line without one is skipped and a
//! count that is not a whole number refuses the request (as in Pyroscope).
//! Frames are separated by `;`, root first. Identical stacks are merged.

use std::collections::HashMap;

use proflow_pipeline::pprof::{Profile, ProfileBuilder};

use super::profile_type::FoldedType;

/// Which text format the body is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextFormat {
    /// `stack count` per line (`format=folded`, or no format).
    Folded,
    /// `stack` per line; each line counts one sample (`format=lines`).
    Lines,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FoldedError {
    #[error(
        "line {line}: {count:?} is not a sample count; folded lines are `frame;frame;frame <whole number>`"
    )]
    BadCount { line: usize, count: String },
}

/// Stacks with their summed counts, in first-seen order.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Stacks {
    pub stacks: Vec<(String, i64)>,
}

impl Stacks {
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

/// Reads the stacks of a text body. Invalid UTF-8 is replaced, not refused:
/// frame names are only displayed.
pub(crate) fn parse_stacks(body: &[u8], format: TextFormat) -> Result<Stacks, FoldedError> {
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut stacks: Vec<(String, i64)> = Vec::new();
    for (i, raw) in body.split(|&b| b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = String::from_utf8_lossy(raw);
        let (stack, count) = match format {
            TextFormat::Lines => (line.as_ref(), 1i64),
            TextFormat::Folded => {
                let Some((stack, count)) = line.rsplit_once(' ') else {
                    continue;
                };
                let count = count
                    .parse::<i64>()
                    .ok()
                    .filter(|c| *c >= 0)
                    .ok_or_else(|| FoldedError::BadCount {
                        line: i + 1,
                        count: count.chars().take(40).collect(),
                    })?;
                (stack, count)
            }
        };
        if count == 0 || stack.split(';').all(str::is_empty) {
            continue;
        }
        match index.get(stack) {
            Some(&at) => stacks[at].1 = stacks[at].1.saturating_add(count),
            None => {
                index.insert(stack.to_owned(), stacks.len());
                stacks.push((stack.to_owned(), count));
            }
        }
    }
    Ok(Stacks { stacks })
}

/// The period and sample type a converted profile gets: sampled types (CPU,
/// wall) with a sample rate become nanoseconds, each sample worth 1s / rate,
/// with a `cpu`/`nanoseconds` period type (Pyroscope uses `cpu` for wall too).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Conversion {
    pub sample_type: (String, String),
    pub period: Option<((String, String), i64)>,
    /// What each counted sample is worth.
    pub scale: i64,
}

pub(crate) fn conversion(ty: FoldedType, sample_rate: u32) -> Conversion {
    if ty.is_sampled() && sample_rate > 0 {
        let period = 1_000_000_000 / i64::from(sample_rate);
        let kind = if ty.profile_name == "wall" {
            "wall"
        } else {
            "cpu"
        };
        Conversion {
            sample_type: (kind.to_owned(), "nanoseconds".to_owned()),
            period: Some((("cpu".to_owned(), "nanoseconds".to_owned()), period)),
            scale: period,
        }
    } else {
        Conversion {
            sample_type: (ty.sample_type.to_owned(), ty.unit.to_owned()),
            period: None,
            scale: 1,
        }
    }
}

/// Builds the pprof profile of parsed stacks.
pub(crate) fn to_profile(
    stacks: &Stacks,
    conv: &Conversion,
    time_nanos: i64,
    duration_nanos: i64,
) -> Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type(&conv.sample_type.0, &conv.sample_type.1);
    if let Some(((ty, unit), period)) = &conv.period {
        b.period(ty, unit, *period);
    }
    b.time(time_nanos, duration_nanos);
    for (stack, count) in &stacks.stacks {
        let frames = stack.split(';').filter(|f| !f.is_empty());
        b.sample_root_first(frames, vec![count.saturating_mul(conv.scale)]);
    }
    b.build()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof_push::profile_type::folded_type;
    use proflow_pipeline::pprof::stacks_root_first;

    #[test]
    fn folded_lines_merge_and_skip() {
        let body = b"main;work;hot 30\r\nmain;idle 10\nno-count-line\n\nmain;work;hot 2\nzero 0\n";
        let s = parse_stacks(body, TextFormat::Folded).unwrap();
        assert_eq!(
            s.stacks,
            vec![
                ("main;work;hot".to_string(), 32),
                ("main;idle".to_string(), 10)
            ]
        );
    }

    #[test]
    fn frames_may_contain_spaces() {
        let s = parse_stacks(b"a b;c d 7", TextFormat::Folded).unwrap();
        assert_eq!(s.stacks, vec![("a b;c d".to_string(), 7)]);
    }

    #[test]
    fn bad_counts_are_refused() {
        for body in [
            &b"a;b x"[..],
            b"a;b -1",
            b"a;b 1.5",
            b"a 99999999999999999999",
        ] {
            assert!(
                matches!(
                    parse_stacks(body, TextFormat::Folded),
                    Err(FoldedError::BadCount { line: 1, .. })
                ),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn lines_count_occurrences() {
        let s = parse_stacks(b"a;b\na;c\na;b\n\n", TextFormat::Lines).unwrap();
        assert_eq!(
            s.stacks,
            vec![("a;b".to_string(), 2), ("a;c".to_string(), 1)]
        );
    }

    #[test]
    fn cpu_with_sample_rate_becomes_nanoseconds() {
        let conv = conversion(folded_type("cpu").unwrap(), 100);
        assert_eq!(conv.sample_type, ("cpu".into(), "nanoseconds".into()));
        assert_eq!(
            conv.period,
            Some((("cpu".into(), "nanoseconds".into()), 10_000_000))
        );
        let s = parse_stacks(b"main;work 3\nmain 1", TextFormat::Folded).unwrap();
        let p = to_profile(&s, &conv, 5, 10);
        assert_eq!(p.time_nanos, 5);
        assert_eq!(p.duration_nanos, 10);
        let got: Vec<(Vec<&str>, i64)> = stacks_root_first(&p)
            .map(|(frames, sample)| (frames, sample.value[0]))
            .collect();
        assert_eq!(
            got,
            vec![
                (vec!["main", "work"], 30_000_000),
                (vec!["main"], 10_000_000)
            ]
        );
        // Without a rate the values stay counts of samples.
        let conv = conversion(folded_type("cpu").unwrap(), 0);
        assert_eq!(conv.sample_type, ("samples".into(), "count".into()));
        assert_eq!(conv.period, None);
        // Memory is never scaled.
        let conv = conversion(folded_type("alloc_space").unwrap(), 100);
        assert_eq!(conv.sample_type, ("alloc_space".into(), "bytes".into()));
        assert_eq!(conv.scale, 1);
        let wall = conversion(folded_type("wall").unwrap(), 50);
        assert_eq!(wall.sample_type.0, "wall");
        assert_eq!(wall.scale, 20_000_000);
    }

    proptest::proptest! {
        #[test]
        fn never_panics(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            for format in [TextFormat::Folded, TextFormat::Lines] {
                if let Ok(stacks) = parse_stacks(&body, format) {
                    let conv = conversion(folded_type("cpu").unwrap(), 100);
                    let _ = to_profile(&stacks, &conv, 0, 0);
                }
            }
        }
    }
}
