//! Folded text (`foo;bar;baz 100` per line, Brendan Gregg's collapsed stacks)
//! and the `lines` format (one stack per line, each occurrence counting 1),
//! converted to a pprof profile the way Pyroscope converts them.
//!
//! Grouped lines split at the last space; a line without one is skipped and a
//! count that is not a whole number refuses the request (as in Pyroscope).
//! Frames are separated by `;`, root first. Identical stacks are merged.
//! As in Pyroscope, an empty frame (`a;;b`, `;b`) is a frame with an empty
//! name, and one `;` at the end of a stack ends it (`a;` is `a`); a stack
//! with no text at all (` 5`) has no frame to go to and is counted as lost.
//!
//! Everything the conversion holds beside the body (the distinct stacks, the
//! profile's strings, functions, locations and samples) is charged as it
//! grows ([`Charge`]), and the distinct stacks and frames are capped
//! ([`TextLimits`]), so a body of millions of distinct frames is refused
//! before it takes memory nobody granted.

use std::borrow::Cow;
use std::collections::HashMap;
use std::mem::size_of;

use proflow_model::lost::LostSamples;
use proflow_model::memory::OverBudget;
use proflow_model::pprof::{Profile, ProfileBuilder, Sample};

use super::profile_type::FoldedType;

/// Which text format the body is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TextFormat {
    /// `stack count` per line (`format=folded`, or no format).
    Folded,
    /// `stack` per line; each line counts one sample (`format=lines`).
    Lines,
    /// A binary tree of frames (`format=tree`), read by `tree.rs`.
    Tree,
    /// A binary trie of stack pieces (`format=trie`), read by `tree.rs`.
    Trie,
}

/// Caps on what one text body may convert to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TextLimits {
    /// Most distinct stacks (`max_text_stacks`).
    pub max_stacks: usize,
    /// Most distinct frame names (`max_text_frames`).
    pub max_frames: usize,
}

/// `max_text_stacks` by default.
pub(crate) const DEFAULT_MAX_STACKS: usize = 100_000;
/// `max_text_frames` by default.
pub(crate) const DEFAULT_MAX_FRAMES: usize = 100_000;

impl Default for TextLimits {
    fn default() -> Self {
        TextLimits {
            max_stacks: DEFAULT_MAX_STACKS,
            max_frames: DEFAULT_MAX_FRAMES,
        }
    }
}

/// Grows the request's memory grant by the bytes given, before the
/// conversion allocates them; an error (the budget has no room) stops it.
pub(crate) type Charge<'c> = dyn FnMut(usize) -> Result<(), OverBudget> + 'c;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FoldedError {
    #[error(
        "line {line}: {count:?} is not a sample count; folded lines are `frame;frame;frame <whole number>`"
    )]
    BadCount { line: usize, count: String },
    #[error(
        "the body has more than {limit} distinct stacks (max_text_stacks); send fewer distinct stacks per request or raise max_text_stacks"
    )]
    TooManyStacks { limit: usize },
    #[error(
        "the body has more than {limit} distinct frames (max_text_frames); send fewer distinct frames per request or raise max_text_frames"
    )]
    TooManyFrames { limit: usize },
    /// The memory budget had no room for the conversion.
    #[error("{0}")]
    Memory(OverBudget),
    /// A binary `tree` or `trie` body that cannot be read.
    #[error("{0}")]
    Malformed(String),
}

/// What one distinct stack costs while parsing, beside any text it owns:
/// its entry in the list and in the index, each with its share of spare
/// capacity (both double as they grow).
const STACK_ENTRY: usize = 2 * (size_of::<(Cow<str>, i64)>() + size_of::<(Cow<str>, usize)>() + 8);
/// What one distinct frame costs in the profile beside its name (held
/// twice: the string table and the builder's index): a function, a
/// location with its line, and two index entries, spare capacity included.
const FRAME_ENTRY: usize = 2
    * (size_of::<proflow_model::pprof::Function>()
        + size_of::<proflow_model::pprof::Location>()
        + size_of::<proflow_model::pprof::Line>()
        + size_of::<(String, i64)>()
        + size_of::<(i64, u64)>()
        + 16);
/// What one sample costs beside its location ids.
const SAMPLE_ENTRY: usize = 2 * size_of::<Sample>() + size_of::<i64>();

/// Stacks with their summed counts, in first-seen order; borrowed from the
/// body where it is valid UTF-8. `lost`: the samples the body had that
/// none of the stacks carries.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Stacks<'a> {
    pub stacks: Vec<(Cow<'a, str>, i64)>,
    pub lost: LostSamples,
}

impl Stacks<'_> {
    pub fn is_empty(&self) -> bool {
        self.stacks.is_empty()
    }
}

/// Stacks summed as they are made (by the binary and JSON formats, which
/// build each `;`-joined stack themselves), within `max_text_stacks`, every
/// copy charged before it is made.
pub(crate) struct StackSums {
    index: HashMap<String, usize>,
    stacks: Vec<(Cow<'static, str>, i64)>,
    limits: TextLimits,
    /// Samples added that no stack carries.
    pub lost: LostSamples,
}

impl StackSums {
    pub fn new(limits: TextLimits) -> Self {
        StackSums {
            index: HashMap::new(),
            stacks: Vec::new(),
            limits,
            lost: LostSamples::default(),
        }
    }

    /// Adds `value` to the stack `frames` (`;`-joined, root first); a
    /// value of 0 or less adds nothing, and one on a stack of no frames is
    /// lost.
    pub fn add(
        &mut self,
        stack: &str,
        value: i64,
        charge: &mut Charge<'_>,
    ) -> Result<(), FoldedError> {
        if value <= 0 {
            return Ok(());
        }
        if stack.is_empty() {
            self.lost.add("empty_stack", 1);
            return Ok(());
        }
        if let Some(&at) = self.index.get(stack) {
            self.stacks[at].1 = sum(self.stacks[at].1, value, &mut self.lost);
            return Ok(());
        }
        if self.stacks.len() >= self.limits.max_stacks {
            return Err(FoldedError::TooManyStacks {
                limit: self.limits.max_stacks,
            });
        }
        charge(STACK_ENTRY + 2 * stack.len()).map_err(FoldedError::Memory)?;
        self.index.insert(stack.to_owned(), self.stacks.len());
        self.stacks.push((Cow::Owned(stack.to_owned()), value));
        Ok(())
    }

    pub fn into_stacks(self) -> Stacks<'static> {
        Stacks {
            stacks: self.stacks,
            lost: self.lost,
        }
    }
}

/// `a + b`, the largest `i64` when that does not fit (counted as
/// `value_capped`).
fn sum(a: i64, b: i64, lost: &mut LostSamples) -> i64 {
    a.checked_add(b).unwrap_or_else(|| {
        lost.add("value_capped", 1);
        i64::MAX
    })
}

/// `stack count` split at the last space, borrowing what `line` borrows.
fn split_count(line: Cow<'_, str>) -> Option<(Cow<'_, str>, Cow<'_, str>)> {
    match line {
        Cow::Borrowed(l) => l
            .rsplit_once(' ')
            .map(|(s, c)| (Cow::Borrowed(s), Cow::Borrowed(c))),
        Cow::Owned(l) => l
            .rsplit_once(' ')
            .map(|(s, c)| (Cow::Owned(s.to_owned()), Cow::Owned(c.to_owned()))),
    }
}

/// Reads the stacks of a folded or lines body (the binary formats are
/// `tree`'s; `ingest::parse_text` takes any). Invalid UTF-8 is replaced,
/// not refused: frame names are only displayed.
pub(crate) fn parse_stacks<'a>(
    body: &'a [u8],
    format: TextFormat,
    limits: TextLimits,
    charge: &mut Charge<'_>,
) -> Result<Stacks<'a>, FoldedError> {
    let mut index: HashMap<Cow<'a, str>, usize> = HashMap::new();
    let mut stacks: Vec<(Cow<'a, str>, i64)> = Vec::new();
    let mut lost = LostSamples::default();
    for (i, raw) in body.split(|&b| b == b'\n').enumerate() {
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if std::str::from_utf8(raw).is_err() {
            // Made valid, it is copied (each bad byte may become the 3-byte
            // replacement character), then split into copies again: both
            // granted before they are made.
            charge(6 * raw.len()).map_err(FoldedError::Memory)?;
        }
        let line = String::from_utf8_lossy(raw);
        let (stack, count) = match format {
            TextFormat::Lines | TextFormat::Tree | TextFormat::Trie => (line, 1i64),
            TextFormat::Folded => {
                let Some((stack, count)) = split_count(line) else {
                    // A line of text with no count (Pyroscope skips it too).
                    if raw.iter().any(|b| !b.is_ascii_whitespace()) {
                        lost.add("no_count", 1);
                    }
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
        if count == 0 {
            continue;
        }
        if stack.is_empty() {
            // A blank line of `lines` is no sample.
            if format == TextFormat::Folded {
                lost.add("empty_stack", 1);
            }
            continue;
        }
        match index.get(stack.as_ref()) {
            Some(&at) => stacks[at].1 = sum(stacks[at].1, count, &mut lost),
            None => {
                if stacks.len() >= limits.max_stacks {
                    return Err(FoldedError::TooManyStacks {
                        limit: limits.max_stacks,
                    });
                }
                let owned = match &stack {
                    Cow::Owned(s) => 2 * s.len(),
                    Cow::Borrowed(_) => 0,
                };
                charge(STACK_ENTRY + owned).map_err(FoldedError::Memory)?;
                index.insert(stack.clone(), stacks.len());
                stacks.push((stack, count));
            }
        }
    }
    Ok(Stacks { stacks, lost })
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

/// Builds the pprof profile of parsed stacks, charging every distinct
/// frame and every sample before it is added.
pub(crate) fn to_profile(
    stacks: &Stacks<'_>,
    conv: &Conversion,
    time_nanos: i64,
    duration_nanos: i64,
    limits: TextLimits,
    charge: &mut Charge<'_>,
    lost: &mut LostSamples,
) -> Result<Profile, FoldedError> {
    let mut b = ProfileBuilder::new();
    b.sample_type(&conv.sample_type.0, &conv.sample_type.1);
    if let Some(((ty, unit), period)) = &conv.period {
        b.period(ty, unit, *period);
    }
    b.time(time_nanos, duration_nanos);
    for (stack, count) in &stacks.stacks {
        let mut depth = 0;
        for frame in frames(stack) {
            depth += 1;
            if !b.has_frame(frame) {
                if b.frames() >= limits.max_frames {
                    return Err(FoldedError::TooManyFrames {
                        limit: limits.max_frames,
                    });
                }
                // Its entries and two copies of its name.
                charge(FRAME_ENTRY + 2 * frame.len()).map_err(FoldedError::Memory)?;
                b.frame(frame);
            }
        }
        charge(SAMPLE_ENTRY + depth * size_of::<u64>()).map_err(FoldedError::Memory)?;
        let frames = frames(stack);
        let value = count.checked_mul(conv.scale).unwrap_or_else(|| {
            lost.add("value_capped", 1);
            i64::MAX
        });
        b.sample_root_first(frames, vec![value]);
    }
    Ok(b.build())
}

/// The frames of a non-empty stack, root first: split at `;`, one `;` at
/// the end ending the stack (Pyroscope's rule: `a;;b` is `a`, ``, `b`;
/// `a;` is `a`; `;` is one frame with an empty name).
fn frames(stack: &str) -> std::str::Split<'_, char> {
    stack.strip_suffix(';').unwrap_or(stack).split(';')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof_push::profile_type::folded_type;
    use proflow_model::pprof::stacks_root_first;

    fn free(_: usize) -> Result<(), OverBudget> {
        Ok(())
    }

    fn parse_stacks(body: &[u8], format: TextFormat) -> Result<Stacks<'_>, FoldedError> {
        super::parse_stacks(body, format, TextLimits::default(), &mut free)
    }

    fn to_profile(stacks: &Stacks<'_>, conv: &Conversion, time: i64, duration: i64) -> Profile {
        super::to_profile(
            stacks,
            conv,
            time,
            duration,
            TextLimits::default(),
            &mut free,
            &mut LostSamples::default(),
        )
        .unwrap()
    }

    #[test]
    fn folded_lines_merge_and_skip() {
        let body = b"main;work;hot 30\r\nmain;idle 10\nno-count-line\n\nmain;work;hot 2\nzero 0\n";
        let s = parse_stacks(body, TextFormat::Folded).unwrap();
        assert_eq!(
            s.stacks,
            vec![("main;work;hot".into(), 32), ("main;idle".into(), 10)]
        );
        // The line without a count is lost and counted; blank lines and
        // counts of 0 are no samples.
        assert_eq!(s.lost.iter().collect::<Vec<_>>(), vec![("no_count", 1)]);
    }

    #[test]
    fn empty_frames_are_kept_and_one_trailing_separator_ends_a_stack() {
        // What the real Pyroscope stores for the same lines.
        let body = b"a;;b 5\nc; 3\n;d 2\nx;y;; 1\n; 4\n";
        let s = parse_stacks(body, TextFormat::Folded).unwrap();
        let conv = conversion(folded_type("cpu").unwrap(), 0);
        let p = to_profile(&s, &conv, 0, 0);
        let mut got: Vec<(Vec<&str>, i64)> = stacks_root_first(&p)
            .map(|(frames, sample)| (frames, sample.value[0]))
            .collect();
        got.sort();
        let want: Vec<(Vec<&str>, i64)> = vec![
            (vec![""], 4),
            (vec!["", "d"], 2),
            (vec!["a", "", "b"], 5),
            (vec!["c"], 3),
            (vec!["x", "y", ""], 1),
        ];
        assert_eq!(got, want);
        assert!(s.lost.is_empty(), "{:?}", s.lost);
    }

    #[test]
    fn what_the_stacks_cannot_carry_is_counted() {
        let body = b" 5\n;; 3\nmain 9223372036854775807\nmain 1\nmain;x 2\n";
        let s = parse_stacks(body, TextFormat::Folded).unwrap();
        assert_eq!(
            s.stacks,
            vec![
                (";;".into(), 3),
                ("main".into(), i64::MAX),
                ("main;x".into(), 2)
            ]
        );
        assert_eq!(
            s.lost.iter().collect::<Vec<_>>(),
            vec![("empty_stack", 1), ("value_capped", 1)]
        );
        let s = parse_stacks(b"a\n\n;;\n", TextFormat::Lines).unwrap();
        assert_eq!(s.stacks, vec![("a".into(), 1), (";;".into(), 1)]);
        assert!(s.lost.is_empty(), "{:?}", s.lost);
        // A count that fits but does not once it is scaled.
        let conv = conversion(folded_type("cpu").unwrap(), 100);
        let s = parse_stacks(b"a 9223372036854775807\nb 1\n", TextFormat::Folded).unwrap();
        let mut lost = LostSamples::default();
        let p = super::to_profile(&s, &conv, 0, 0, TextLimits::default(), &mut free, &mut lost)
            .unwrap();
        assert_eq!(p.sample.len(), 2);
        assert_eq!(lost.iter().collect::<Vec<_>>(), vec![("value_capped", 1)]);
    }

    #[test]
    fn frames_may_contain_spaces() {
        let s = parse_stacks(b"a b;c d 7", TextFormat::Folded).unwrap();
        assert_eq!(s.stacks, vec![("a b;c d".into(), 7)]);
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
        assert_eq!(s.stacks, vec![("a;b".into(), 2), ("a;c".into(), 1)]);
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

    #[test]
    fn distinct_stacks_and_frames_are_capped() {
        let limits = TextLimits {
            max_stacks: 3,
            max_frames: 4,
        };
        let body = b"a;b 1\na;c 1\na;b 5\na;d 1\n";
        let s = super::parse_stacks(body, TextFormat::Folded, limits, &mut free).unwrap();
        assert_eq!(
            s.stacks.len(),
            3,
            "a repeated stack is merged, not counted twice"
        );
        let err = super::parse_stacks(b"a 1\nb 1\nc 1\nd 1", TextFormat::Folded, limits, &mut free)
            .unwrap_err();
        assert_eq!(err, FoldedError::TooManyStacks { limit: 3 });
        assert!(err.to_string().contains("max_text_stacks"), "{err}");
        // One line of five distinct frames: past max_text_frames.
        let s = super::parse_stacks(b"f0;f1;f2;f3;f4 1", TextFormat::Folded, limits, &mut free)
            .unwrap();
        let conv = conversion(folded_type("cpu").unwrap(), 100);
        let err = super::to_profile(
            &s,
            &conv,
            0,
            0,
            limits,
            &mut free,
            &mut LostSamples::default(),
        )
        .unwrap_err();
        assert_eq!(err, FoldedError::TooManyFrames { limit: 4 });
        assert!(err.to_string().contains("max_text_frames"), "{err}");
        // Repeated frames are one frame each.
        let s =
            super::parse_stacks(b"a;a;a;a;a;a;b 1", TextFormat::Folded, limits, &mut free).unwrap();
        let p = super::to_profile(
            &s,
            &conv,
            0,
            0,
            limits,
            &mut free,
            &mut LostSamples::default(),
        )
        .unwrap();
        assert_eq!(p.function.len(), 2);
    }

    #[test]
    fn invalid_utf8_is_charged_before_it_is_made_valid() {
        // Every 0xFF becomes a 3-byte replacement character.
        let mut body = vec![0xffu8; 10_000];
        body.extend_from_slice(b" 1\n");
        let charged = std::cell::Cell::new(0usize);
        let mut count = |n: usize| -> Result<(), OverBudget> {
            charged.set(charged.get() + n);
            Ok(())
        };
        let s = super::parse_stacks(&body, TextFormat::Folded, TextLimits::default(), &mut count)
            .unwrap();
        let made: usize = s.stacks.iter().map(|(st, _)| st.len()).sum();
        assert_eq!(made, 30_000);
        assert!(charged.get() >= 2 * made, "{} for {made}", charged.get());
        // Refused before the copy when the budget cannot take it.
        let no_room = OverBudget {
            limit: 1,
            wanted: 1,
            never: false,
            tenant: None,
        };
        let mut none = |_: usize| -> Result<(), OverBudget> { Err(no_room.clone()) };
        let err = super::parse_stacks(&body, TextFormat::Folded, TextLimits::default(), &mut none)
            .unwrap_err();
        assert_eq!(err, FoldedError::Memory(no_room.clone()));
    }

    #[test]
    fn the_conversion_charges_what_it_grows_and_stops_when_refused() {
        let body: String = (0..2000)
            .map(|i| format!("main;frame_{i:05};leaf_{i} 1\n"))
            .collect();
        let charged = std::cell::Cell::new(0usize);
        let mut count = |n: usize| -> Result<(), OverBudget> {
            charged.set(charged.get() + n);
            Ok(())
        };
        let s = super::parse_stacks(
            body.as_bytes(),
            TextFormat::Folded,
            TextLimits::default(),
            &mut count,
        )
        .unwrap();
        let parsed = charged.get();
        assert!(parsed >= 2000 * STACK_ENTRY, "{parsed}");
        let conv = conversion(folded_type("cpu").unwrap(), 100);
        let p = super::to_profile(
            &s,
            &conv,
            0,
            0,
            TextLimits::default(),
            &mut count,
            &mut LostSamples::default(),
        )
        .unwrap();
        let built = charged.get() - parsed;
        // Every frame's name twice, and its entries; every sample.
        let names: usize = p.string_table.iter().map(String::len).sum();
        assert!(
            built >= 2 * names + 4001 * FRAME_ENTRY,
            "{built} for {names} bytes of names"
        );
        let encoded = proflow_model::pprof::encode(&p).len();
        assert!(
            built > encoded,
            "charged {built}, the profile encodes to {encoded}"
        );
        // A budget that runs out stops the conversion with its message.
        let mut left = 10_000usize;
        let no_room = OverBudget {
            limit: 10_000,
            wanted: 1,
            never: false,
            tenant: None,
        };
        let mut tight = |n: usize| -> Result<(), OverBudget> {
            left = left.checked_sub(n).ok_or(no_room.clone())?;
            Ok(())
        };
        let err = super::to_profile(
            &s,
            &conv,
            0,
            0,
            TextLimits::default(),
            &mut tight,
            &mut LostSamples::default(),
        )
        .unwrap_err();
        assert_eq!(err, FoldedError::Memory(no_room.clone()));
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
