//! One compiled rule and what each action does to the labels, with Go's
//! per-character case mapping and `hashmod`'s MD5.

use super::*;

/// One compiled rule.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub(crate) source_labels: Vec<String>,
    pub(crate) separator: String,
    pub(crate) op: Op,
}

#[derive(Debug, Clone)]
pub(crate) enum Op {
    Replace(Box<Replace>),
    Keep(Pattern),
    Drop(Pattern),
    KeepEqual(String),
    DropEqual(String),
    HashMod { target: String, modulus: u64 },
    LabelMap { pattern: Pattern, name: Template },
    LabelDrop(Pattern),
    LabelKeep(Pattern),
    Lowercase(String),
    Uppercase(String),
}

#[derive(Debug, Clone)]
pub(crate) struct Replace {
    pub(crate) pattern: Pattern,
    pub(crate) target: Target,
    pub(crate) replacement: Template,
    /// A template refers to a capture group: captures must be computed.
    pub(crate) need_groups: bool,
    /// The result depends on the source value (otherwise the rule just sets a constant).
    pub(crate) need_value: bool,
}

/// A `replace` rule's `target_label`.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// Without `$`: a label name, checked when compiled.
    Fixed(String),
    /// With `$` references: checked after each expansion, as Prometheus does.
    Template(Template),
}

impl Rule {
    /// Validates `c` like Prometheus and compiles it; on error returns every
    /// problem, with paths relative to the rule (`regex`, `source_labels.1`).
    pub(crate) fn compile(c: &RelabelConfig) -> Result<Rule, Vec<FieldError>> {
        let mut problems = Vec::new();

        check_source_labels(c, &mut problems);
        let pattern = match Pattern::compile(&c.regex) {
            Ok(p) => Some(p),
            Err(message) => {
                problems.push(FieldError::new("regex", message));
                None
            }
        };
        check_modulus(c, &mut problems);
        check_target_label(c, &mut problems);
        check_replacement(c, &mut problems);
        check_equal_unused_fields(c, &mut problems);
        check_label_filter_unused_fields(c, &mut problems);

        let pattern = match pattern {
            Some(p) if problems.is_empty() => p,
            _ => return Err(problems),
        };
        Ok(Rule {
            source_labels: c.source_labels.clone(),
            separator: c.separator.clone(),
            op: build_op(c, pattern),
        })
    }

    // ------------------------------------------------------------- applying

    /// The source label values joined by the separator; borrowed (no
    /// allocation) for zero or one source label, the common cases.
    pub(crate) fn source_value<'a>(&self, labels: &'a Labels) -> Cow<'a, str> {
        match self.source_labels.as_slice() {
            [] => Cow::Borrowed(""),
            [one] => Cow::Borrowed(labels.get(one).unwrap_or("")),
            many => {
                let mut joined = String::new();
                for (i, name) in many.iter().enumerate() {
                    if i > 0 {
                        joined.push_str(&self.separator);
                    }
                    joined.push_str(labels.get(name).unwrap_or(""));
                }
                Cow::Owned(joined)
            }
        }
    }

    /// Runs the rule; false when the series must be dropped.
    pub(crate) fn apply(&self, labels: &mut Labels) -> bool {
        match &self.op {
            Op::Keep(p) => p.is_match(&self.source_value(labels)),
            Op::Drop(p) => !p.is_match(&self.source_value(labels)),
            Op::KeepEqual(target) => labels.get(target).unwrap_or("") == self.source_value(labels),
            Op::DropEqual(target) => labels.get(target).unwrap_or("") != self.source_value(labels),
            Op::Replace(r) => {
                self.replace(r, labels);
                true
            }
            Op::Lowercase(target) => {
                let source = self.source_value(labels);
                let value = go_to_lower(&source);
                if differs(labels, target, &value) {
                    let value = value.into_owned();
                    labels.set(target.as_str(), value);
                }
                true
            }
            Op::Uppercase(target) => {
                let source = self.source_value(labels);
                let value = go_to_upper(&source);
                if differs(labels, target, &value) {
                    let value = value.into_owned();
                    labels.set(target.as_str(), value);
                }
                true
            }
            Op::HashMod { target, modulus } => {
                let bucket = hash_mod(&self.source_value(labels), *modulus).to_string();
                if differs(labels, target, &bucket) {
                    labels.set(target.as_str(), bucket);
                }
                true
            }
            Op::LabelMap { pattern, name } => {
                label_map(pattern, name, labels);
                true
            }
            Op::LabelDrop(p) => {
                labels.retain(|l| !p.is_match(&l.name));
                true
            }
            Op::LabelKeep(p) => {
                labels.retain(|l| p.is_match(&l.name));
                true
            }
        }
    }

    pub(crate) fn replace(&self, r: &Replace, labels: &mut Labels) {
        let source = if r.need_value {
            self.source_value(labels)
        } else {
            Cow::Borrowed("")
        };
        let Some(groups) = r.pattern.run(&source, r.need_groups) else {
            return;
        };
        let target = match &r.target {
            Target::Fixed(t) => Cow::Borrowed(t.as_str()),
            Target::Template(template) => {
                let t = template.expand(&groups);
                // Prometheus skips the rule when the expanded name is invalid.
                if !is_valid_label_name(&t) {
                    return;
                }
                t
            }
        };
        let value = r.replacement.expand(&groups);
        if differs(labels, &target, &value) {
            // An empty value removes the label, as Prometheus does.
            let (target, value) = (target.into_owned(), value.into_owned());
            labels.set(target, value);
        }
    }
}

// ------------------------------------------------------------- compiling

/// Reports each empty name in `source_labels`.
fn check_source_labels(c: &RelabelConfig, problems: &mut Vec<FieldError>) {
    for (i, name) in c.source_labels.iter().enumerate() {
        if name.is_empty() {
            problems.push(FieldError::new(
                format!("source_labels.{i}"),
                "a source label name cannot be empty",
            ));
        }
    }
}

/// Reports a `hashmod` rule whose `modulus` is 0.
fn check_modulus(c: &RelabelConfig, problems: &mut Vec<FieldError>) {
    if c.action == RelabelAction::HashMod && c.modulus == 0 {
        problems.push(FieldError::new(
            "modulus",
            "the hashmod action needs `modulus` greater than 0",
        ));
    }
}

/// Reports a missing or invalid `target_label` for the actions that write one.
fn check_target_label(c: &RelabelConfig, problems: &mut Vec<FieldError>) {
    use RelabelAction as A;
    let action = c.action;
    let needs_target = matches!(
        action,
        A::Replace | A::HashMod | A::Lowercase | A::Uppercase | A::KeepEqual | A::DropEqual
    );
    if needs_target && c.target_label.is_empty() {
        problems.push(FieldError::new(
            "target_label",
            format!("the {action} action needs `target_label`"),
        ));
    } else if action == A::Replace {
        let valid = if c.target_label.contains('$') {
            is_valid_label_template(&c.target_label)
        } else {
            is_valid_label_name(&c.target_label)
        };
        if !valid {
            problems.push(FieldError::new(
                "target_label",
                format!(
                    "{:?} is not a valid target_label for the replace action: use a label \
                     name ([a-zA-Z_][a-zA-Z0-9_]*), optionally with `$1` or `${{name}}` \
                     references",
                    c.target_label
                ),
            ));
        }
    } else if needs_target && !is_valid_label_name(&c.target_label) {
        problems.push(FieldError::new(
            "target_label",
            format!(
                "{:?} is not a valid target_label for the {action} action: use a label \
                 name ([a-zA-Z_][a-zA-Z0-9_]*) without `$` references",
                c.target_label
            ),
        ));
    }
}

/// Reports a `replacement` the action forbids or cannot use as a label name.
fn check_replacement(c: &RelabelConfig, problems: &mut Vec<FieldError>) {
    use RelabelAction as A;
    let action = c.action;
    match action {
        A::Lowercase | A::Uppercase | A::KeepEqual | A::DropEqual
            if c.replacement != DEFAULT_REPLACEMENT =>
        {
            problems.push(FieldError::new(
                "replacement",
                format!("`replacement` cannot be set for the {action} action; remove it"),
            ));
        }
        A::LabelMap if !is_valid_label_template(&c.replacement) => {
            problems.push(FieldError::new(
                "replacement",
                format!(
                    "{:?} is not a valid replacement for the labelmap action: it must make \
                     a label name ([a-zA-Z_][a-zA-Z0-9_]*), optionally with `$1` or \
                     `${{name}}` references",
                    c.replacement
                ),
            ));
        }
        _ => {}
    }
}

/// Reports fields set on a `keepequal`/`dropequal` rule, which ignores them.
fn check_equal_unused_fields(c: &RelabelConfig, problems: &mut Vec<FieldError>) {
    let action = c.action;
    if !matches!(action, RelabelAction::KeepEqual | RelabelAction::DropEqual) {
        return;
    }
    let only = format!("the {action} action uses only `source_labels` and `target_label`; remove");
    if c.regex != DEFAULT_REGEX {
        problems.push(FieldError::new("regex", format!("{only} `regex`")));
    }
    if c.modulus != 0 {
        problems.push(FieldError::new("modulus", format!("{only} `modulus`")));
    }
    if c.separator != DEFAULT_SEPARATOR {
        problems.push(FieldError::new("separator", format!("{only} `separator`")));
    }
}

/// Reports fields set on a `labeldrop`/`labelkeep` rule, which ignores them.
fn check_label_filter_unused_fields(c: &RelabelConfig, problems: &mut Vec<FieldError>) {
    let action = c.action;
    if !matches!(action, RelabelAction::LabelDrop | RelabelAction::LabelKeep) {
        return;
    }
    let only =
        format!("the {action} action uses only `regex` (matched against label names); remove");
    if !c.source_labels.is_empty() {
        problems.push(FieldError::new(
            "source_labels",
            format!("{only} `source_labels`"),
        ));
    }
    if !c.target_label.is_empty() {
        problems.push(FieldError::new(
            "target_label",
            format!("{only} `target_label`"),
        ));
    }
    if c.modulus != 0 {
        problems.push(FieldError::new("modulus", format!("{only} `modulus`")));
    }
    if c.separator != DEFAULT_SEPARATOR {
        problems.push(FieldError::new("separator", format!("{only} `separator`")));
    }
    if c.replacement != DEFAULT_REPLACEMENT {
        problems.push(FieldError::new(
            "replacement",
            format!("{only} `replacement`"),
        ));
    }
}

/// Builds the operation of an already validated rule around its compiled `pattern`.
fn build_op(c: &RelabelConfig, pattern: Pattern) -> Op {
    use RelabelAction as A;
    let target = c.target_label.clone();
    match c.action {
        A::Replace => build_replace(c, pattern, target),
        A::Keep => Op::Keep(pattern),
        A::Drop => Op::Drop(pattern),
        A::KeepEqual => Op::KeepEqual(target),
        A::DropEqual => Op::DropEqual(target),
        A::HashMod => Op::HashMod {
            target,
            modulus: c.modulus,
        },
        A::LabelMap => {
            let name = Template::compile(&c.replacement, &pattern);
            Op::LabelMap { pattern, name }
        }
        A::LabelDrop => Op::LabelDrop(pattern),
        A::LabelKeep => Op::LabelKeep(pattern),
        A::Lowercase => Op::Lowercase(target),
        A::Uppercase => Op::Uppercase(target),
    }
}

/// Builds a `replace` operation: compiles the target and replacement
/// templates and works out whether applying needs the value and the groups.
fn build_replace(c: &RelabelConfig, pattern: Pattern, target: String) -> Op {
    let target = if c.target_label.contains('$') {
        Target::Template(Template::compile(&c.target_label, &pattern))
    } else {
        Target::Fixed(target)
    };
    let replacement = Template::compile(&c.replacement, &pattern);
    let need_groups =
        replacement.uses_groups() || matches!(&target, Target::Template(t) if t.uses_groups());
    let need_value = need_groups || !matches!(pattern, Pattern::Everything);
    Op::Replace(Box::new(Replace {
        pattern,
        target,
        replacement,
        need_groups,
        need_value,
    }))
}

/// `labelmap`: copies each label whose name matches to the expanded name.
/// Names are taken from the labels as they were before the rule (later copies
/// win on a clash, in label-name order).
pub(crate) fn label_map(pattern: &Pattern, name: &Template, labels: &mut Labels) {
    let need_groups = name.uses_groups();
    let mut copies: Vec<(String, String)> = Vec::new();
    for label in labels.iter() {
        if let Some(groups) = pattern.run(&label.name, need_groups) {
            copies.push((name.expand(&groups).into_owned(), label.value.clone()));
        }
    }
    for (n, v) in copies {
        labels.set(n, v);
    }
}

/// True when setting `name` to `value` would change `labels` (an absent label
/// reads as empty). Checking first saves the name and value allocations
/// `Labels::set` needs when a rule finds the label already as it wants it.
pub(crate) fn differs(labels: &Labels, name: &str, value: &str) -> bool {
    labels.get(name).unwrap_or("") != value
}

/// Prometheus's hashmod: MD5 of `value`, last 8 bytes read big-endian, modulo.
pub(crate) fn hash_mod(value: &str, modulus: u64) -> u64 {
    let digest = Md5::digest(value.as_bytes());
    let tail = digest[8..]
        .iter()
        .fold(0u64, |acc, &b| (acc << 8) | u64::from(b));
    // `modulus` is validated non-zero; `checked_rem` keeps a hand-built rule from panicking.
    tail.checked_rem(modulus).unwrap_or(0)
}

/// Go's `strings.ToLower`: each character mapped on its own by the simple
/// (one-to-one) Unicode mapping. Rust's `to_lowercase` uses the full mapping,
/// which differs for the few characters that lower-case to several.
/// Borrows `s` when nothing changes.
pub(crate) fn go_to_lower(s: &str) -> Cow<'_, str> {
    if s.is_ascii() {
        if !s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Cow::Borrowed(s);
        }
        return Cow::Owned(s.to_ascii_lowercase());
    }
    Cow::Owned(s.chars().map(simple_lower).collect())
}

/// Go's `strings.ToUpper`, see [`go_to_lower`].
pub(crate) fn go_to_upper(s: &str) -> Cow<'_, str> {
    if s.is_ascii() {
        if !s.bytes().any(|b| b.is_ascii_lowercase()) {
            return Cow::Borrowed(s);
        }
        return Cow::Owned(s.to_ascii_uppercase());
    }
    Cow::Owned(s.chars().map(simple_upper).collect())
}

pub(crate) fn simple_lower(c: char) -> char {
    let mut full = c.to_lowercase();
    match (full.next(), full.next()) {
        (Some(one), None) => one,
        // U+0130 is the only character whose full lowercase has two characters;
        // its simple mapping is `i`.
        _ if c == '\u{130}' => 'i',
        _ => c,
    }
}

pub(crate) fn simple_upper(c: char) -> char {
    let mut full = c.to_uppercase();
    match (full.next(), full.next()) {
        (Some(one), None) => one,
        // Characters with a multi-character full uppercase have no simple
        // uppercase, except Greek vowels with ypogegrammeni, whose simple
        // uppercase is the titlecase letter with prosgegrammeni.
        _ => match u32::from(c) {
            0x1F80..=0x1F87 | 0x1F90..=0x1F97 | 0x1FA0..=0x1FA7 => {
                char::from_u32(u32::from(c) + 8).unwrap_or(c)
            }
            0x1FB3 => '\u{1FBC}',
            0x1FC3 => '\u{1FCC}',
            0x1FF3 => '\u{1FFC}',
            _ => c,
        },
    }
}
