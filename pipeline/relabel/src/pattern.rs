//! Regexes as Prometheus anchors them, and their capture groups.

use super::*;

/// A regex as Prometheus anchors it, with the default `(.*)` special-cased:
/// it matches every string and its groups 0 and 1 are the whole string, so no
/// regex needs to run.
#[derive(Debug, Clone)]
pub(crate) enum Pattern {
    Everything,
    Regex(Regex),
}

impl Pattern {
    pub(crate) fn compile(regex: &str) -> Result<Pattern, String> {
        if regex == DEFAULT_REGEX {
            return Ok(Pattern::Everything);
        }
        // `(?s:` as Prometheus wraps it: `.` matches newlines too.
        match Regex::new(&format!("^(?s:{regex})$")) {
            Ok(re) => Ok(Pattern::Regex(re)),
            Err(e) => {
                // Report the error against the pattern as the user wrote it, so
                // positions and the echoed pattern are theirs, not the wrapper's.
                let shown = match Regex::new(regex) {
                    Err(raw) => raw,
                    Ok(_) => e,
                };
                Err(format!(
                    "invalid regex {regex:?}: {}",
                    regex_error_summary(&shown)
                ))
            }
        }
    }

    pub(crate) fn is_match(&self, haystack: &str) -> bool {
        match self {
            Pattern::Everything => true,
            Pattern::Regex(re) => re.is_match(haystack),
        }
    }

    /// Matches `haystack`; `None` when it does not match. Capture positions are
    /// computed only when `need_groups` (a plain match test is much cheaper).
    pub(crate) fn run<'h>(&self, haystack: &'h str, need_groups: bool) -> Option<Groups<'h>> {
        match self {
            Pattern::Everything => Some(Groups::Whole(haystack)),
            Pattern::Regex(re) if need_groups => re.captures(haystack).map(Groups::Captured),
            Pattern::Regex(re) => re.is_match(haystack).then_some(Groups::Unused),
        }
    }

    /// The group index a template reference names, or `None` when it names no
    /// group (Go's `Expand` then writes nothing).
    pub(crate) fn group_index(&self, reference: GroupRef<'_>) -> Option<usize> {
        let groups = match self {
            // `^(?s:(.*))$`: group 0 and group 1, no names.
            Pattern::Everything => 2,
            Pattern::Regex(re) => re.captures_len(),
        };
        match reference {
            GroupRef::Number(n) => (n < groups).then_some(n),
            GroupRef::Name(name) => match self {
                Pattern::Everything => None,
                Pattern::Regex(re) => re.capture_names().position(|n| n == Some(name)),
            },
        }
    }
}

/// The regex crate's parse errors span several lines (pattern, caret, message);
/// a config error wants the message alone.
pub(crate) fn regex_error_summary(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map(str::to_owned)
        .unwrap_or(text)
}

/// The capture groups of one match.
pub(crate) enum Groups<'h> {
    /// Only whether it matched is known (no template uses a group).
    Unused,
    /// The default regex: groups 0 and 1 are the whole haystack.
    Whole(&'h str),
    Captured(Captures<'h>),
}

impl<'h> Groups<'h> {
    pub(crate) fn get(&self, index: usize) -> Option<&'h str> {
        match self {
            Groups::Unused => None,
            Groups::Whole(s) => (index < 2).then_some(*s),
            Groups::Captured(c) => c.get(index).map(|m| m.as_str()),
        }
    }
}
