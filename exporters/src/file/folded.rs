//! Folded stacks (`root;caller;leaf value`, one line per distinct stack), the
//! text format flame-graph tools read. One text per sample type: a header line
//! would break those tools, so the file exporter writes one file per type.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use proflow_model::pprof::{Profile, stacks_root_first};

/// The folded text of one sample type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FoldedText {
    pub sample_type: String,
    pub unit: String,
    pub text: String,
}

/// One [`FoldedText`] per sample type of `profile`, in sample-type order.
/// Identical stacks are summed and written once, sorted, so the output is
/// deterministic; stacks summing to zero and samples without frames are left out
/// (folded text cannot express either).
pub(crate) fn render(profile: &Profile) -> Vec<FoldedText> {
    let types = profile.sample_type.len();
    let mut sums: Vec<BTreeMap<String, i64>> = vec![BTreeMap::new(); types];
    for (frames, sample) in stacks_root_first(profile) {
        if frames.is_empty() {
            continue;
        }
        let mut stack = String::new();
        for (i, frame) in frames.iter().enumerate() {
            if i > 0 {
                stack.push(';');
            }
            push_frame(&mut stack, frame);
        }
        for (i, per_type) in sums.iter_mut().enumerate() {
            let value = sample.value.get(i).copied().unwrap_or(0);
            if value != 0 {
                let sum = per_type.entry(stack.clone()).or_insert(0);
                *sum = sum.saturating_add(value);
            }
        }
    }
    profile
        .sample_type
        .iter()
        .zip(sums)
        .map(|(vt, stacks)| {
            let mut text = String::new();
            for (stack, value) in stacks.into_iter().filter(|(_, v)| *v != 0) {
                // Writing to a String cannot fail.
                let _ = writeln!(text, "{stack} {value}");
            }
            FoldedText {
                sample_type: profile.string(vt.r#type).to_owned(),
                unit: profile.string(vt.unit).to_owned(),
                text,
            }
        })
        .collect()
}

/// Appends a frame name, replacing the characters that would change the line's
/// structure: `;` separates frames and a line break ends the line.
fn push_frame(out: &mut String, frame: &str) {
    for c in frame.chars() {
        out.push(match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_model::pprof::ProfileBuilder;

    #[test]
    fn sums_identical_stacks_per_type_root_first() {
        let mut b = ProfileBuilder::new();
        b.sample_type("samples", "count")
            .sample_type("cpu", "nanoseconds");
        b.sample_root_first(["main", "work", "hot"], vec![3, 30]);
        b.sample_root_first(["main", "idle"], vec![1, 0]);
        b.sample_root_first(["main", "work", "hot"], vec![2, 20]);
        b.sample_root_first(["odd;name", "line\nbreak"], vec![1, 1]);
        b.sample_root_first(Vec::<&str>::new(), vec![9, 9]);
        let out = render(&b.build());
        assert_eq!(out.len(), 2);
        assert_eq!(
            (out[0].sample_type.as_str(), out[0].unit.as_str()),
            ("samples", "count")
        );
        assert_eq!(
            out[0].text,
            "main;idle 1\nmain;work;hot 5\nodd:name;line break 1\n"
        );
        assert_eq!(out[1].sample_type, "cpu");
        assert_eq!(out[1].text, "main;work;hot 50\nodd:name;line break 1\n");
    }
}
