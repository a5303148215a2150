//! The profile limits of a tenant (`max_profile_size_bytes`,
//! `max_profile_stacktrace_samples`, `max_profile_stacktrace_depth`,
//! `max_profile_stacktrace_sample_labels`): what they look at in a profile
//! ([`ProfileShape`]) and the check in Pyroscope's order and words.

use super::LimitRefused;

/// What the profile limits look at, read from a profile by its receiver.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileShape {
    /// Its uncompressed protobuf, bytes.
    pub size: usize,
    pub samples: usize,
    /// Most location ids of one sample.
    pub deepest_stack: usize,
    pub most_sample_labels: usize,
}

/// How a profile came, for the words of a size refusal: Pyroscope's differ
/// by path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProfileSource {
    /// A pprof body of `/ingest`.
    IngestPprof,
    /// A profile of `/push.v1.PusherService/Push`.
    Push,
    /// A profile the receiver made from another format (folded text, JFR…).
    Converted,
}

/// One tenant's profile limits (0: no limit), taken from the settings when
/// a request arrives, so a request is checked against one set of limits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProfileLimits {
    pub tenant: String,
    pub max_size: usize,
    pub max_samples: usize,
    pub max_depth: usize,
    pub max_sample_labels: usize,
}

impl ProfileLimits {
    /// Whether any of them limits.
    pub fn any(&self) -> bool {
        self.max_size > 0
            || self.max_samples > 0
            || self.max_depth > 0
            || self.max_sample_labels > 0
    }

    /// Checks a profile (its `shape`, its series `labels`) in Pyroscope's
    /// order: size, samples, then each sample's depth and labels. `Ok(Some(depth))`:
    /// its stacks deeper than `depth` are to be truncated (the root side kept).
    pub fn check<'a>(
        &self,
        shape: &ProfileShape,
        source: ProfileSource,
        labels: impl Iterator<Item = (&'a str, &'a str)> + Clone,
    ) -> Result<Option<usize>, LimitRefused> {
        let tenant = &self.tenant;
        let refuse = |reason: &'static str, words: String| LimitRefused {
            reason,
            message: format!("{words} (tenant {tenant:?})"),
            tenant: tenant.clone(),
            exhausted: false,
        };
        if self.max_size > 0 && shape.size > self.max_size {
            let words = match source {
                ProfileSource::IngestPprof => format!(
                    "decompressed size exceeds maximum allowed size of {} bytes",
                    self.max_size
                ),
                ProfileSource::Push => format!(
                    "uncompressed profile payload size exceeds limit of {}",
                    si_bytes(self.max_size)
                ),
                ProfileSource::Converted => format!(
                    "the profile with labels '{}' exceeds the size limit (max_profile_size_byte, actual: {}, limit: {})",
                    shown_labels(labels),
                    shape.size,
                    self.max_size
                ),
            };
            return Err(refuse("profile_size_limit", words));
        }
        if self.max_samples > 0 && shape.samples > self.max_samples {
            return Err(refuse(
                "samples_limit",
                format!(
                    "the profile with labels '{}' exceeds the samples count limit (max_profile_stacktrace_samples, actual: {}, limit: {})",
                    shown_labels(labels),
                    shape.samples,
                    self.max_samples
                ),
            ));
        }
        if self.max_sample_labels > 0 && shape.most_sample_labels > self.max_sample_labels {
            return Err(refuse(
                "sample_labels_limit",
                format!(
                    "the profile with labels '{}' exceeds the sample labels limit (max_profile_stacktrace_sample_labels, actual: {}, limit: {})",
                    shown_labels(labels),
                    shape.most_sample_labels,
                    self.max_sample_labels
                ),
            ));
        }
        Ok((self.max_depth > 0 && shape.deepest_stack > self.max_depth).then_some(self.max_depth))
    }
}

/// A series' labels as Pyroscope shows them in a refusal
/// (`{name="value", ...}`), at most 512 bytes of them.
pub(super) fn shown_labels<'a>(labels: impl Iterator<Item = (&'a str, &'a str)>) -> String {
    let pairs: Vec<String> = labels.map(|(n, v)| format!("{n}=\"{v}\"")).collect();
    // Bounded: a refusal does not echo a megabyte of labels.
    let mut text = format!("{{{}}}", pairs.join(", "));
    if text.len() > 512 {
        let mut cut = 512;
        while !text.is_char_boundary(cut) {
            cut -= 1;
        }
        text.truncate(cut);
        text.push_str("...");
    }
    text
}

/// Bytes in SI units as Pyroscope writes them in refusals (go-humanize's
/// `Bytes`: `4.2 MB`, `15 kB`, `7 B`).
pub(super) fn si_bytes(n: usize) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if n < 10 {
        return format!("{n} B");
    }
    let mut e = 0;
    let mut scaled = n as f64;
    while scaled >= 1000.0 && e + 1 < UNITS.len() {
        scaled /= 1000.0;
        e += 1;
    }
    let value = (scaled * 10.0 + 0.5).floor() / 10.0;
    if value < 10.0 {
        format!("{value:.1} {}", UNITS[e])
    } else {
        format!("{value:.0} {}", UNITS[e])
    }
}
