//! Replacement templates (`$1`, `${name}`), expanded like Go's
//! `Regexp.Expand`, and the check of target-label templates.

use super::*;

/// A reference after `$` in a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupRef<'a> {
    Number(usize),
    Name(&'a str),
}

/// A `replacement` or `target_label` template, parsed once against its regex.
#[derive(Debug, Clone, Default)]
pub(crate) struct Template {
    pub(crate) parts: Vec<Part>,
}

#[derive(Debug, Clone)]
pub(crate) enum Part {
    Literal(String),
    Group(usize),
}

impl Template {
    /// Parses `template` as Go's `Regexp.Expand` reads it: `$$` is `$`; `$name`
    /// takes the longest run of letters, digits and `_`; `${name}` needs the
    /// closing brace; a name of ASCII digits without a leading zero is a group
    /// number, anything else a group name; a malformed reference is kept as
    /// literal text; a reference to no group expands to nothing.
    pub(crate) fn compile(template: &str, pattern: &Pattern) -> Template {
        let mut parts = Vec::new();
        let mut literal = String::new();
        let mut rest = template;
        while let Some(dollar) = rest.find('$') {
            literal.push_str(&rest[..dollar]);
            rest = &rest[dollar + 1..];
            if let Some(after) = rest.strip_prefix('$') {
                literal.push('$');
                rest = after;
                continue;
            }
            let Some((reference, after)) = parse_reference(rest) else {
                literal.push('$');
                continue;
            };
            rest = after;
            if let Some(index) = pattern.group_index(reference) {
                if !literal.is_empty() {
                    parts.push(Part::Literal(std::mem::take(&mut literal)));
                }
                parts.push(Part::Group(index));
            }
        }
        literal.push_str(rest);
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Template { parts }
    }

    /// The text when the template refers to no group.
    pub(crate) fn literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Literal(s)] => Some(s),
            _ => None,
        }
    }

    pub(crate) fn uses_groups(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Group(_)))
    }

    /// The expanded text; borrowed (no allocation) when the template is literal.
    pub(crate) fn expand(&self, groups: &Groups<'_>) -> Cow<'_, str> {
        if let Some(s) = self.literal() {
            return Cow::Borrowed(s);
        }
        let mut out = String::new();
        for part in &self.parts {
            match part {
                Part::Literal(s) => out.push_str(s),
                Part::Group(i) => out.push_str(groups.get(*i).unwrap_or("")),
            }
        }
        Cow::Owned(out)
    }
}

/// Reads the reference after a `$` (Go's rules, see [`Template::compile`]);
/// returns it and the text after it, or `None` when malformed.
pub(crate) fn parse_reference(text: &str) -> Option<(GroupRef<'_>, &str)> {
    let (braced, body) = match text.strip_prefix('{') {
        Some(b) => (true, b),
        None => (false, text),
    };
    // Go accepts Unicode letters and digits (`unicode.IsLetter`/`IsDigit`);
    // `is_alphanumeric` is the nearest std test.
    let end = body
        .char_indices()
        .find(|&(_, c)| !(c == '_' || c.is_alphanumeric()))
        .map_or(body.len(), |(i, _)| i);
    if end == 0 {
        return None;
    }
    let name = &body[..end];
    let rest = if braced {
        body[end..].strip_prefix('}')?
    } else {
        &body[end..]
    };
    Some((group_ref(name), rest))
}

pub(crate) fn group_ref(name: &str) -> GroupRef<'_> {
    // Go stops at 1e8 and rejects leading zeros; such names then fall back to a
    // (never matching) group name lookup.
    let numeric = name.bytes().all(|b| b.is_ascii_digit())
        && !(name.len() > 1 && name.starts_with('0'))
        && name.len() <= 9;
    match name.parse::<usize>() {
        Ok(n) if numeric => GroupRef::Number(n),
        _ => GroupRef::Name(name),
    }
}

/// True when `template` is a valid label name once its `$` references are
/// expanded, as Prometheus checks it (legacy names): it starts with a letter,
/// `_` or a reference, then has only word characters and references, where a
/// reference is `$` followed by `{word}` or `word` (ASCII word characters).
pub(crate) fn is_valid_label_template(template: &str) -> bool {
    let bytes = template.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    // Returns the index after the reference starting at `at` (a `$`).
    let reference = |at: usize| -> Option<usize> {
        let mut i = at + 1;
        let braced = bytes.get(i) == Some(&b'{');
        if braced {
            i += 1;
        }
        let start = i;
        while bytes.get(i).is_some_and(|&b| word(b)) {
            i += 1;
        }
        if i == start {
            return None;
        }
        if braced {
            if bytes.get(i) != Some(&b'}') {
                return None;
            }
            i += 1;
        }
        Some(i)
    };
    let mut i = match bytes.first() {
        Some(b'$') => match reference(0) {
            Some(next) => next,
            None => return false,
        },
        Some(&b) if b.is_ascii_alphabetic() || b == b'_' => 1,
        _ => return false,
    };
    while let Some(&b) = bytes.get(i) {
        if b == b'$' {
            match reference(i) {
                Some(next) => i = next,
                None => return false,
            }
        } else if word(b) {
            i += 1;
        } else {
            return false;
        }
    }
    true
}
