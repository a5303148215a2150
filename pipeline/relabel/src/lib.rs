//! Prometheus relabelling (`relabel_config`) on series [`Labels`]: the config
//! ([`RelabelConfig`]), its validation ([`validate_configs`]) and the compiled
//! rule list ([`Relabeler`]) that rewrites labels or drops the series.
//!
//! The semantics follow Prometheus's `model/relabel` with legacy label-name
//! validation (`[a-zA-Z_][a-zA-Z0-9_]*` for every label a rule writes; source
//! labels may have any non-empty name):
//! regexes are fully anchored (`^(?s:<regex>)$`, so `.` also matches a newline),
//! replacement templates expand like Go's `Regexp.Expand`, `lowercase` and
//! `uppercase` use Go's per-character (simple) case mapping, `hashmod` takes the
//! last 8 bytes of the MD5 digest as a big-endian integer. Two differences remain,
//! both from the regex engines: Rust's `\d`, `\w`, `\s` and `\b` are
//! Unicode-aware where Go's are ASCII-only, and `\Q...\E` is not supported.
//!
//! This crate knows nothing about components: the `relabel` processor and the
//! scrape receiver both build a [`Relabeler`] from their own configs. It depends
//! only on `proflow-model` (labels) and `proflow-config` (validation).

use std::borrow::Cow;
use std::fmt;

use md5::{Digest, Md5};
use regex::{Captures, Regex};
use serde::{Deserialize, Deserializer};

use proflow_config::{BuildError, FieldError};
use proflow_model::model::{Labels, is_valid_label_name};

/// The default `separator`.
pub const DEFAULT_SEPARATOR: &str = ";";
/// The default `regex`: matches every value and captures all of it as `$1`.
pub const DEFAULT_REGEX: &str = "(.*)";
/// The default `replacement`.
pub const DEFAULT_REPLACEMENT: &str = "$1";

/// What a relabel rule does. Names are read case-insensitively, as Prometheus does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RelabelAction {
    /// Matches `regex` against the joined source values; on a match writes the
    /// expanded `replacement` to the expanded `target_label` (an empty result
    /// removes the label).
    #[default]
    Replace,
    /// Drops the series unless `regex` matches the joined source values.
    Keep,
    /// Drops the series when `regex` matches the joined source values.
    Drop,
    /// Drops the series unless the joined source values equal `target_label`'s value.
    KeepEqual,
    /// Drops the series when the joined source values equal `target_label`'s value.
    DropEqual,
    /// Sets `target_label` to the MD5 of the joined source values modulo `modulus`.
    HashMod,
    /// Copies every label whose name matches `regex` to the name given by the
    /// expanded `replacement`.
    LabelMap,
    /// Removes every label whose name matches `regex`.
    LabelDrop,
    /// Removes every label whose name does not match `regex`.
    LabelKeep,
    /// Sets `target_label` to the joined source values in lower case.
    Lowercase,
    /// Sets `target_label` to the joined source values in upper case.
    Uppercase,
}

impl RelabelAction {
    /// Every action, in the order Prometheus documents them.
    pub const ALL: [RelabelAction; 11] = [
        RelabelAction::Replace,
        RelabelAction::Keep,
        RelabelAction::Drop,
        RelabelAction::KeepEqual,
        RelabelAction::DropEqual,
        RelabelAction::HashMod,
        RelabelAction::LabelMap,
        RelabelAction::LabelDrop,
        RelabelAction::LabelKeep,
        RelabelAction::Lowercase,
        RelabelAction::Uppercase,
    ];

    /// The name as written in config.
    pub fn as_str(self) -> &'static str {
        match self {
            RelabelAction::Replace => "replace",
            RelabelAction::Keep => "keep",
            RelabelAction::Drop => "drop",
            RelabelAction::KeepEqual => "keepequal",
            RelabelAction::DropEqual => "dropequal",
            RelabelAction::HashMod => "hashmod",
            RelabelAction::LabelMap => "labelmap",
            RelabelAction::LabelDrop => "labeldrop",
            RelabelAction::LabelKeep => "labelkeep",
            RelabelAction::Lowercase => "lowercase",
            RelabelAction::Uppercase => "uppercase",
        }
    }

    /// Parses an action name, ignoring case (`Replace` and `REPLACE` are `replace`).
    pub fn from_name(name: &str) -> Option<RelabelAction> {
        // Unicode lower-casing, like Prometheus's `strings.ToLower`; config-time only.
        let lower = name.to_lowercase();
        RelabelAction::ALL.into_iter().find(|a| a.as_str() == lower)
    }
}

impl fmt::Display for RelabelAction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for RelabelAction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = String::deserialize(d)?;
        if name.is_empty() {
            return Err(serde::de::Error::custom(format!(
                "relabel action cannot be empty; use one of: {}",
                action_names()
            )));
        }
        RelabelAction::from_name(&name).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "unknown relabel action {name:?}; use one of: {}",
                action_names()
            ))
        })
    }
}

fn action_names() -> String {
    RelabelAction::ALL
        .iter()
        .map(|a| a.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// One Prometheus `relabel_config` rule. Missing fields take Prometheus's
/// defaults; a field written as null (`regex:` with nothing after it) is empty,
/// as in Prometheus.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RelabelConfig {
    /// Labels whose values are joined with `separator` (in this order) to form
    /// the value the rule works on; a missing label counts as the empty string.
    /// Any non-empty name is accepted (Prometheus's UTF-8 rule), so a label such
    /// as `service.name` can be read and copied to a valid name.
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    pub source_labels: Vec<String>,
    /// Put between the source values when joining them. Default `;`.
    #[serde(
        default = "default_separator",
        deserialize_with = "proflow_config::null_as_default"
    )]
    pub separator: String,
    /// Regular expression (RE2/Rust syntax) matched against the joined value, or
    /// against each label name for `labelmap`, `labeldrop` and `labelkeep`.
    /// Always fully anchored. Default `(.*)`.
    #[serde(
        default = "default_regex",
        deserialize_with = "proflow_config::null_as_default"
    )]
    pub regex: String,
    /// Divisor for `hashmod`; required and greater than 0 for that action.
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    pub modulus: u64,
    /// The label the rule writes (`replace`, `hashmod`, `lowercase`,
    /// `uppercase`) or compares with (`keepequal`, `dropequal`). For `replace` it
    /// may use capture references such as `$1` or `${name}`.
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    pub target_label: String,
    /// Template for the value written by `replace`, or for the new label name by
    /// `labelmap`: `$1`, `${1}`, `$name`, `${name}` refer to capture groups and
    /// `$$` is a literal `$`. Default `$1`.
    #[serde(
        default = "default_replacement",
        deserialize_with = "proflow_config::null_as_default"
    )]
    pub replacement: String,
    /// What the rule does: replace, keep, drop, keepequal, dropequal, hashmod,
    /// labelmap, labeldrop, labelkeep, lowercase or uppercase. Default `replace`.
    #[serde(default)]
    pub action: RelabelAction,
}

impl Default for RelabelConfig {
    fn default() -> Self {
        RelabelConfig {
            source_labels: Vec::new(),
            separator: default_separator(),
            regex: default_regex(),
            modulus: 0,
            target_label: String::new(),
            replacement: default_replacement(),
            action: RelabelAction::Replace,
        }
    }
}

fn default_separator() -> String {
    DEFAULT_SEPARATOR.to_owned()
}

fn default_regex() -> String {
    DEFAULT_REGEX.to_owned()
}

fn default_replacement() -> String {
    DEFAULT_REPLACEMENT.to_owned()
}

/// Checks `configs` the way Prometheus does and returns every problem. Paths are
/// relative to the list: `3.regex` is the `regex` of the fourth rule.
pub fn validate_configs(configs: &[RelabelConfig]) -> Vec<FieldError> {
    let mut problems = Vec::new();
    for (i, config) in configs.iter().enumerate() {
        if let Err(rule_problems) = Rule::compile(config) {
            problems.extend(prefixed(i, rule_problems));
        }
    }
    problems
}

fn prefixed(index: usize, problems: Vec<FieldError>) -> impl Iterator<Item = FieldError> {
    problems.into_iter().map(move |p| FieldError {
        path: if p.path.is_empty() {
            index.to_string()
        } else {
            format!("{index}.{}", p.path)
        },
        message: p.message,
    })
}

/// Why relabel rules could not be compiled: every problem, located like
/// [`validate_configs`] locates them.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid relabel_configs: {}", describe(.problems))]
pub struct RelabelError {
    /// Every problem found, paths relative to the rule list (`3.regex`).
    pub problems: Vec<FieldError>,
}

fn describe(problems: &[FieldError]) -> String {
    problems
        .iter()
        .map(|p| format!("{}: {}", p.path, p.message))
        .collect::<Vec<_>>()
        .join("; ")
}

impl From<RelabelError> for BuildError {
    fn from(e: RelabelError) -> Self {
        BuildError::new(e.to_string())
    }
}

/// Compiled relabel rules, applied in order. Regexes and templates are compiled
/// once here; [`Relabeler::apply`] only matches and expands.
#[derive(Debug, Clone, Default)]
pub struct Relabeler {
    rules: Vec<Rule>,
}

impl Relabeler {
    /// Compiles `configs`, reporting every problem [`validate_configs`] would.
    pub fn new(configs: &[RelabelConfig]) -> Result<Relabeler, RelabelError> {
        let mut rules = Vec::with_capacity(configs.len());
        let mut problems = Vec::new();
        for (i, config) in configs.iter().enumerate() {
            match Rule::compile(config) {
                Ok(rule) => rules.push(rule),
                Err(p) => problems.extend(prefixed(i, p)),
            }
        }
        if problems.is_empty() {
            Ok(Relabeler { rules })
        } else {
            Err(RelabelError { problems })
        }
    }

    /// Number of rules.
    pub fn len(&self) -> usize {
        self.rules.len()
    }

    /// True when there are no rules (every series is kept unchanged).
    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Runs the rules on `labels` in order. Returns false when a rule drops the
    /// series; `labels` is then left part-way and should be discarded.
    pub fn apply(&self, labels: &mut Labels) -> bool {
        self.rules.iter().all(|rule| rule.apply(labels))
    }
}

// ------------------------------------------------------------------ compiling

/// A regex as Prometheus anchors it, with the default `(.*)` special-cased:
/// it matches every string and its groups 0 and 1 are the whole string, so no
/// regex needs to run.
#[derive(Debug, Clone)]
enum Pattern {
    Everything,
    Regex(Regex),
}

impl Pattern {
    fn compile(regex: &str) -> Result<Pattern, String> {
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

    fn is_match(&self, haystack: &str) -> bool {
        match self {
            Pattern::Everything => true,
            Pattern::Regex(re) => re.is_match(haystack),
        }
    }

    /// Matches `haystack`; `None` when it does not match. Capture positions are
    /// computed only when `need_groups` (a plain match test is much cheaper).
    fn run<'h>(&self, haystack: &'h str, need_groups: bool) -> Option<Groups<'h>> {
        match self {
            Pattern::Everything => Some(Groups::Whole(haystack)),
            Pattern::Regex(re) if need_groups => re.captures(haystack).map(Groups::Captured),
            Pattern::Regex(re) => re.is_match(haystack).then_some(Groups::Unused),
        }
    }

    /// The group index a template reference names, or `None` when it names no
    /// group (Go's `Expand` then writes nothing).
    fn group_index(&self, reference: GroupRef<'_>) -> Option<usize> {
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
fn regex_error_summary(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix("error: "))
        .map(str::to_owned)
        .unwrap_or(text)
}

/// The capture groups of one match.
enum Groups<'h> {
    /// Only whether it matched is known (no template uses a group).
    Unused,
    /// The default regex: groups 0 and 1 are the whole haystack.
    Whole(&'h str),
    Captured(Captures<'h>),
}

impl<'h> Groups<'h> {
    fn get(&self, index: usize) -> Option<&'h str> {
        match self {
            Groups::Unused => None,
            Groups::Whole(s) => (index < 2).then_some(*s),
            Groups::Captured(c) => c.get(index).map(|m| m.as_str()),
        }
    }
}

/// A reference after `$` in a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GroupRef<'a> {
    Number(usize),
    Name(&'a str),
}

/// A `replacement` or `target_label` template, parsed once against its regex.
#[derive(Debug, Clone, Default)]
struct Template {
    parts: Vec<Part>,
}

#[derive(Debug, Clone)]
enum Part {
    Literal(String),
    Group(usize),
}

impl Template {
    /// Parses `template` as Go's `Regexp.Expand` reads it: `$$` is `$`; `$name`
    /// takes the longest run of letters, digits and `_`; `${name}` needs the
    /// closing brace; a name of ASCII digits without a leading zero is a group
    /// number, anything else a group name; a malformed reference is kept as
    /// literal text; a reference to no group expands to nothing.
    fn compile(template: &str, pattern: &Pattern) -> Template {
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
    fn literal(&self) -> Option<&str> {
        match self.parts.as_slice() {
            [] => Some(""),
            [Part::Literal(s)] => Some(s),
            _ => None,
        }
    }

    fn uses_groups(&self) -> bool {
        self.parts.iter().any(|p| matches!(p, Part::Group(_)))
    }

    /// The expanded text; borrowed (no allocation) when the template is literal.
    fn expand(&self, groups: &Groups<'_>) -> Cow<'_, str> {
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
fn parse_reference(text: &str) -> Option<(GroupRef<'_>, &str)> {
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

fn group_ref(name: &str) -> GroupRef<'_> {
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
fn is_valid_label_template(template: &str) -> bool {
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

/// One compiled rule.
#[derive(Debug, Clone)]
struct Rule {
    source_labels: Vec<String>,
    separator: String,
    op: Op,
}

#[derive(Debug, Clone)]
enum Op {
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
struct Replace {
    pattern: Pattern,
    target: Target,
    replacement: Template,
    /// A template refers to a capture group: captures must be computed.
    need_groups: bool,
    /// The result depends on the source value (otherwise the rule just sets a constant).
    need_value: bool,
}

/// A `replace` rule's `target_label`.
#[derive(Debug, Clone)]
enum Target {
    /// Without `$`: a label name, checked when compiled.
    Fixed(String),
    /// With `$` references: checked after each expansion, as Prometheus does.
    Template(Template),
}

impl Rule {
    /// Validates `c` like Prometheus and compiles it; on error returns every
    /// problem, with paths relative to the rule (`regex`, `source_labels.1`).
    fn compile(c: &RelabelConfig) -> Result<Rule, Vec<FieldError>> {
        use RelabelAction as A;
        let mut problems = Vec::new();
        let action = c.action;

        for (i, name) in c.source_labels.iter().enumerate() {
            if name.is_empty() {
                problems.push(FieldError::new(
                    format!("source_labels.{i}"),
                    "a source label name cannot be empty",
                ));
            }
        }

        let pattern = match Pattern::compile(&c.regex) {
            Ok(p) => Some(p),
            Err(message) => {
                problems.push(FieldError::new("regex", message));
                None
            }
        };

        if action == A::HashMod && c.modulus == 0 {
            problems.push(FieldError::new(
                "modulus",
                "the hashmod action needs `modulus` greater than 0",
            ));
        }

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

        if matches!(action, A::KeepEqual | A::DropEqual) {
            let only =
                format!("the {action} action uses only `source_labels` and `target_label`; remove");
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

        if matches!(action, A::LabelDrop | A::LabelKeep) {
            let only = format!(
                "the {action} action uses only `regex` (matched against label names); remove"
            );
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

        let pattern = match pattern {
            Some(p) if problems.is_empty() => p,
            _ => return Err(problems),
        };
        let target = c.target_label.clone();
        let op = match action {
            A::Replace => {
                let target = if c.target_label.contains('$') {
                    Target::Template(Template::compile(&c.target_label, &pattern))
                } else {
                    Target::Fixed(target)
                };
                let replacement = Template::compile(&c.replacement, &pattern);
                let need_groups = replacement.uses_groups()
                    || matches!(&target, Target::Template(t) if t.uses_groups());
                let need_value = need_groups || !matches!(pattern, Pattern::Everything);
                Op::Replace(Box::new(Replace {
                    pattern,
                    target,
                    replacement,
                    need_groups,
                    need_value,
                }))
            }
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
        };
        Ok(Rule {
            source_labels: c.source_labels.clone(),
            separator: c.separator.clone(),
            op,
        })
    }

    // ------------------------------------------------------------- applying

    /// The source label values joined by the separator; borrowed (no
    /// allocation) for zero or one source label, the common cases.
    fn source_value<'a>(&self, labels: &'a Labels) -> Cow<'a, str> {
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
    fn apply(&self, labels: &mut Labels) -> bool {
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

    fn replace(&self, r: &Replace, labels: &mut Labels) {
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

/// `labelmap`: copies each label whose name matches to the expanded name.
/// Names are taken from the labels as they were before the rule (later copies
/// win on a clash, in label-name order).
fn label_map(pattern: &Pattern, name: &Template, labels: &mut Labels) {
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
fn differs(labels: &Labels, name: &str, value: &str) -> bool {
    labels.get(name).unwrap_or("") != value
}

/// Prometheus's hashmod: MD5 of `value`, last 8 bytes read big-endian, modulo.
fn hash_mod(value: &str, modulus: u64) -> u64 {
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
fn go_to_lower(s: &str) -> Cow<'_, str> {
    if s.is_ascii() {
        if !s.bytes().any(|b| b.is_ascii_uppercase()) {
            return Cow::Borrowed(s);
        }
        return Cow::Owned(s.to_ascii_lowercase());
    }
    Cow::Owned(s.chars().map(simple_lower).collect())
}

/// Go's `strings.ToUpper`, see [`go_to_lower`].
fn go_to_upper(s: &str) -> Cow<'_, str> {
    if s.is_ascii() {
        if !s.bytes().any(|b| b.is_ascii_lowercase()) {
            return Cow::Borrowed(s);
        }
        return Cow::Owned(s.to_ascii_uppercase());
    }
    Cow::Owned(s.chars().map(simple_upper).collect())
}

fn simple_lower(c: char) -> char {
    let mut full = c.to_lowercase();
    match (full.next(), full.next()) {
        (Some(one), None) => one,
        // U+0130 is the only character whose full lowercase has two characters;
        // its simple mapping is `i`.
        _ if c == '\u{130}' => 'i',
        _ => c,
    }
}

fn simple_upper(c: char) -> char {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_config::{Node, from_node};
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        Labels::from_pairs(pairs.iter().copied())
    }

    /// Reads a YAML list of rules through the config loader, as users write them.
    fn configs(yaml: &str) -> Vec<RelabelConfig> {
        let node = Node::parse(yaml).unwrap_or_else(|e| panic!("bad test YAML {yaml}: {e}"));
        from_node(&node, "relabel_configs").unwrap_or_else(|e| panic!("{yaml}: {e}"))
    }

    fn relabel(yaml: &str, input: &[(&str, &str)]) -> Option<Labels> {
        let relabeler = Relabeler::new(&configs(yaml)).unwrap_or_else(|e| panic!("{yaml}: {e}"));
        let mut l = labels(input);
        relabeler.apply(&mut l).then_some(l)
    }

    fn paths(yaml: &str) -> Vec<String> {
        validate_configs(&configs(yaml))
            .into_iter()
            .map(|p| p.path)
            .collect()
    }

    struct Case {
        name: &'static str,
        rules: &'static str,
        input: &'static [(&'static str, &'static str)],
        /// `None`: the series is dropped.
        output: Option<&'static [(&'static str, &'static str)]>,
    }

    const KEPT_AS_IS: Option<&[(&str, &str)]> = Some(&[("env", "debug"), ("job", "api")]);

    #[test]
    fn actions_and_defaults() {
        let cases = [
            Case {
                name: "replace with every default copies the source label",
                rules: "[{source_labels: [job], target_label: service}]",
                input: &[("job", "api")],
                output: Some(&[("job", "api"), ("service", "api")]),
            },
            Case {
                name: "constant replace needs no source",
                rules: "[{target_label: team, replacement: core}]",
                input: &[("job", "api")],
                output: Some(&[("job", "api"), ("team", "core")]),
            },
            Case {
                name: "replace overwrites an existing label",
                rules: "[{target_label: job, replacement: web}]",
                input: &[("job", "api")],
                output: Some(&[("job", "web")]),
            },
            Case {
                name: "replace with groups, braced and bare",
                rules: r#"[{source_labels: [pod], regex: "svc-(.*)-([0-9]+)", target_label: app, replacement: "x_${1}_$2"}]"#,
                input: &[("pod", "svc-cart-17")],
                output: Some(&[("app", "x_cart_17"), ("pod", "svc-cart-17")]),
            },
            Case {
                name: "replace does nothing when the regex does not match",
                rules: r#"[{source_labels: [pod], regex: "svc-(.*)", target_label: app}]"#,
                input: &[("pod", "db-1")],
                output: Some(&[("pod", "db-1")]),
            },
            Case {
                name: "the regex is anchored at both ends for replace",
                rules: r#"[{source_labels: [env], regex: "bug", target_label: x, replacement: y}]"#,
                input: &[("env", "debug")],
                output: Some(&[("env", "debug")]),
            },
            Case {
                name: "an empty result removes the target (missing source is empty)",
                rules: "[{source_labels: [absent], target_label: job}]",
                input: &[("job", "api")],
                output: Some(&[]),
            },
            Case {
                name: "an empty replacement removes the target",
                rules: r#"[{target_label: job, replacement: ""}]"#,
                input: &[("job", "api"), ("z", "1")],
                output: Some(&[("z", "1")]),
            },
            Case {
                name: "a null replacement is empty, as in Prometheus",
                rules: "[{target_label: job, replacement: }]",
                input: &[("job", "api")],
                output: Some(&[]),
            },
            Case {
                name: "named groups, bare and braced",
                rules: r#"[{source_labels: [addr], regex: "(?P<host>[^:]+):(?P<port>\\d+)", target_label: host, replacement: "$host"},
                          {source_labels: [addr], regex: "(?P<host>[^:]+):(?P<port>\\d+)", target_label: port, replacement: "p${port}"}]"#,
                input: &[("addr", "db.local:5432")],
                output: Some(&[
                    ("addr", "db.local:5432"),
                    ("host", "db.local"),
                    ("port", "p5432"),
                ]),
            },
            Case {
                name: "a target template picks the label name from the value",
                rules: r#"[{source_labels: [tag], regex: "([a-z]+)=(.*)", target_label: "tag_${1}", replacement: "$2"}]"#,
                input: &[("tag", "zone=eu-1")],
                output: Some(&[("tag", "zone=eu-1"), ("tag_zone", "eu-1")]),
            },
            Case {
                name: "an expanded target that is not a label name skips the rule",
                rules: r#"[{source_labels: [tag], regex: "(.*)=(.*)", target_label: "$1", replacement: "$2"}]"#,
                input: &[("tag", "9lives=x")],
                output: Some(&[("tag", "9lives=x")]),
            },
            Case {
                name: "an expanded target that is empty skips the rule",
                rules: r#"[{source_labels: [tag], target_label: "${7}", replacement: "v"}]"#,
                input: &[("tag", "a")],
                output: Some(&[("tag", "a")]),
            },
            Case {
                name: "multiple sources join with the default separator",
                rules: "[{source_labels: [a, b], target_label: ab}]",
                input: &[("a", "1"), ("b", "2")],
                output: Some(&[("a", "1"), ("ab", "1;2"), ("b", "2")]),
            },
            Case {
                name: "a custom separator, and missing sources are empty strings",
                rules: "[{source_labels: [a, missing, b], separator: /, target_label: ab}]",
                input: &[("a", "1"), ("b", "2")],
                output: Some(&[("a", "1"), ("ab", "1//2"), ("b", "2")]),
            },
            Case {
                name: "an empty separator",
                rules: r#"[{source_labels: [a, b], separator: "", target_label: ab}]"#,
                input: &[("a", "1"), ("b", "2")],
                output: Some(&[("a", "1"), ("ab", "12"), ("b", "2")]),
            },
            Case {
                name: "$$ is a literal dollar",
                rules: r#"[{target_label: price, replacement: "$$1"}]"#,
                input: &[],
                output: Some(&[("price", "$1")]),
            },
            Case {
                name: "dot matches a newline (Prometheus wraps in (?s:...))",
                rules: r#"[{action: keep, source_labels: [m], regex: "a.b"}]"#,
                input: &[("m", "a\nb")],
                output: Some(&[("m", "a\nb")]),
            },
            Case {
                name: "drop matching: regex `de` must not match `debug`",
                rules: "[{action: drop, source_labels: [env], regex: de}]",
                input: &[("env", "debug"), ("job", "api")],
                output: KEPT_AS_IS,
            },
            Case {
                name: "drop on a full match",
                rules: "[{action: drop, source_labels: [env], regex: de.*}]",
                input: &[("env", "debug"), ("job", "api")],
                output: None,
            },
            Case {
                name: "drop with the default regex drops everything",
                rules: "[{action: drop}]",
                input: &[("job", "api")],
                output: None,
            },
            Case {
                name: "keep on a match",
                rules: "[{action: keep, source_labels: [env], regex: debug|prod}]",
                input: &[("env", "debug"), ("job", "api")],
                output: KEPT_AS_IS,
            },
            Case {
                name: "keep drops a non-match, anchored",
                rules: "[{action: keep, source_labels: [env], regex: bug}]",
                input: &[("env", "debug"), ("job", "api")],
                output: None,
            },
            Case {
                name: "keep drops when the source label is missing and the regex needs text",
                rules: "[{action: keep, source_labels: [zone], regex: .+}]",
                input: &[("job", "api")],
                output: None,
            },
            Case {
                name: "keep joins sources with the separator",
                rules: r#"[{action: keep, source_labels: [env, job], regex: "debug;api"}]"#,
                input: &[("env", "debug"), ("job", "api")],
                output: KEPT_AS_IS,
            },
            Case {
                name: "rules after a drop do not run",
                rules: "[{action: drop, source_labels: [env], regex: debug}, {target_label: x, replacement: y}]",
                input: &[("env", "debug")],
                output: None,
            },
            Case {
                name: "keepequal keeps equal values",
                rules: "[{action: keepequal, source_labels: [a], target_label: b}]",
                input: &[("a", "1"), ("b", "1")],
                output: Some(&[("a", "1"), ("b", "1")]),
            },
            Case {
                name: "keepequal drops different values",
                rules: "[{action: keepequal, source_labels: [a], target_label: b}]",
                input: &[("a", "1"), ("b", "2")],
                output: None,
            },
            Case {
                name: "keepequal: two missing labels are equal (both empty)",
                rules: "[{action: keepequal, source_labels: [x], target_label: y}]",
                input: &[("a", "1")],
                output: Some(&[("a", "1")]),
            },
            Case {
                name: "keepequal compares the joined sources",
                rules: "[{action: keepequal, source_labels: [a, b], target_label: c}]",
                input: &[("a", "1"), ("b", "2"), ("c", "1;2")],
                output: Some(&[("a", "1"), ("b", "2"), ("c", "1;2")]),
            },
            Case {
                name: "dropequal drops equal values",
                rules: "[{action: dropequal, source_labels: [a], target_label: b}]",
                input: &[("a", "1"), ("b", "1")],
                output: None,
            },
            Case {
                name: "dropequal keeps different values",
                rules: "[{action: dropequal, source_labels: [a], target_label: b}]",
                input: &[("a", "1"), ("b", "2")],
                output: Some(&[("a", "1"), ("b", "2")]),
            },
            // Expected buckets computed independently with Python's hashlib:
            // int.from_bytes(md5(v).digest()[8:], "big") % m
            Case {
                name: "hashmod of one source",
                rules: "[{action: hashmod, source_labels: [a], modulus: 1000, target_label: shard}]",
                input: &[("a", "foo")],
                output: Some(&[("a", "foo"), ("shard", "696")]),
            },
            Case {
                name: "hashmod of joined sources",
                rules: "[{action: hashmod, source_labels: [a, b], modulus: 7, target_label: shard}]",
                input: &[("a", "foo"), ("b", "bar")],
                output: Some(&[("a", "foo"), ("b", "bar"), ("shard", "6")]),
            },
            Case {
                name: "hashmod of a missing source hashes the empty string",
                rules: "[{action: hashmod, source_labels: [a], modulus: 1000, target_label: shard}]",
                input: &[],
                output: Some(&[("shard", "958")]),
            },
            Case {
                name: "hashmod reads a modulus given as a string",
                rules: r#"[{action: hashmod, source_labels: [addr], modulus: "1000", target_label: shard}]"#,
                input: &[("addr", "127.0.0.1:9090")],
                output: Some(&[("addr", "127.0.0.1:9090"), ("shard", "318")]),
            },
            Case {
                name: "labelmap with the default replacement $1",
                rules: "[{action: labelmap, regex: __meta_(.+)}]",
                input: &[
                    ("__meta_pod", "p1"),
                    ("__meta_ns", "default"),
                    ("job", "api"),
                ],
                output: Some(&[
                    ("__meta_ns", "default"),
                    ("__meta_pod", "p1"),
                    ("job", "api"),
                    ("ns", "default"),
                    ("pod", "p1"),
                ]),
            },
            Case {
                name: "labelmap with a template, anchored on names",
                rules: r#"[{action: labelmap, regex: "k_(.+)", replacement: "kube_${1}"}]"#,
                input: &[("k_pod", "p1"), ("xk_ns", "n")],
                output: Some(&[("k_pod", "p1"), ("kube_pod", "p1"), ("xk_ns", "n")]),
            },
            Case {
                name: "labelmap overwrites an existing label",
                rules: "[{action: labelmap, regex: tmp_(.+)}]",
                input: &[("job", "old"), ("tmp_job", "new")],
                output: Some(&[("job", "new"), ("tmp_job", "new")]),
            },
            Case {
                name: "labeldrop removes matching names, anchored",
                rules: "[{action: labeldrop, regex: tmp_.*|pid}]",
                input: &[("job", "api"), ("pid", "1"), ("pidx", "2"), ("tmp_a", "x")],
                output: Some(&[("job", "api"), ("pidx", "2")]),
            },
            Case {
                name: "labelkeep keeps only matching names",
                rules: "[{action: labelkeep, regex: __name__|service_name}]",
                input: &[("__name__", "cpu"), ("job", "api"), ("service_name", "svc")],
                output: Some(&[("__name__", "cpu"), ("service_name", "svc")]),
            },
            Case {
                name: "lowercase",
                rules: "[{action: lowercase, source_labels: [a, b], target_label: low}]",
                input: &[("a", "MiXeD"), ("b", "ÄÖ")],
                output: Some(&[("a", "MiXeD"), ("b", "ÄÖ"), ("low", "mixed;äö")]),
            },
            Case {
                name: "uppercase",
                rules: "[{action: uppercase, source_labels: [a], target_label: a}]",
                input: &[("a", "eu-west-1")],
                output: Some(&[("a", "EU-WEST-1")]),
            },
            Case {
                name: "lowercase of an empty value removes the target",
                rules: "[{action: lowercase, source_labels: [missing], target_label: a}]",
                input: &[("a", "x")],
                output: Some(&[]),
            },
            Case {
                name: "action names ignore case",
                rules: "[{action: LabelDrop, regex: a}, {action: REPLACE, target_label: b, replacement: c}]",
                input: &[("a", "1")],
                output: Some(&[("b", "c")]),
            },
            Case {
                name: "rules run in order, each seeing the previous result",
                rules: r#"[{target_label: a, replacement: x}, {source_labels: [a], target_label: b, replacement: "${1}y"}, {action: keep, source_labels: [b], regex: xy}]"#,
                input: &[],
                output: Some(&[("a", "x"), ("b", "xy")]),
            },
        ];
        for case in cases {
            let got = relabel(case.rules, case.input);
            let want = case.output.map(labels);
            assert_eq!(got, want, "{}", case.name);
        }
    }

    #[test]
    fn no_rules_keep_everything() {
        let r = Relabeler::new(&[]).unwrap();
        assert!(r.is_empty());
        let mut l = labels(&[("a", "1")]);
        assert!(r.apply(&mut l));
        assert_eq!(l, labels(&[("a", "1")]));
    }

    #[test]
    fn defaults_match_prometheus() {
        let parsed = configs("[{}]");
        assert_eq!(parsed, vec![RelabelConfig::default()]);
        let c = &parsed[0];
        assert_eq!(c.action, RelabelAction::Replace);
        assert_eq!(c.separator, ";");
        assert_eq!(c.regex, "(.*)");
        assert_eq!(c.replacement, "$1");
        assert_eq!(c.modulus, 0);
        assert!(c.source_labels.is_empty() && c.target_label.is_empty());
    }

    #[test]
    fn null_fields_read_as_empty() {
        let c = &configs("[{separator: , regex: , replacement: , source_labels: , modulus: }]")[0];
        assert_eq!(
            (
                c.separator.as_str(),
                c.regex.as_str(),
                c.replacement.as_str()
            ),
            ("", "", "")
        );
        assert!(c.source_labels.is_empty());
        // An empty regex matches only the empty string.
        let r = relabel(r#"[{action: keep, source_labels: [a], regex: }]"#, &[]);
        assert!(r.is_some());
        assert!(
            relabel(
                r#"[{action: keep, source_labels: [a], regex: ""}]"#,
                &[("a", "x")]
            )
            .is_none()
        );
    }

    #[test]
    fn scalars_fill_string_fields() {
        let c =
            &configs("[{source_labels: [a], regex: 200, target_label: ok, replacement: true}]")[0];
        assert_eq!((c.regex.as_str(), c.replacement.as_str()), ("200", "true"));
    }

    #[test]
    fn bad_field_values_fail_to_read() {
        for (yaml, needle) in [
            ("[{action: rename}]", "unknown relabel action \"rename\""),
            ("[{action: ''}]", "cannot be empty"),
            ("[{action: }]", "expected a string"),
            ("[{regexp: a}]", "regexp"),
            ("[{action: hashmod, modulus: -1}]", "non-negative"),
            ("[{source_labels: a}]", "list"),
        ] {
            let node = Node::parse(yaml).unwrap();
            let err = from_node::<Vec<RelabelConfig>>(&node, "relabel_configs")
                .expect_err(yaml)
                .to_string();
            assert!(err.contains(needle), "{yaml}: {err}");
        }
    }

    #[test]
    fn action_names_round_trip() {
        for a in RelabelAction::ALL {
            assert_eq!(RelabelAction::from_name(a.as_str()), Some(a));
            assert_eq!(
                RelabelAction::from_name(&a.as_str().to_uppercase()),
                Some(a)
            );
        }
        // Go's strings.ToLower maps the Kelvin sign to `k`, so Prometheus takes this too.
        assert_eq!(
            RelabelAction::from_name("\u{212A}eep"),
            Some(RelabelAction::Keep)
        );
        assert_eq!(RelabelAction::from_name("keep "), None);
    }

    #[test]
    fn validation_errors() {
        let cases: &[(&str, &str, &[&str])] = &[
            (
                "hashmod without modulus",
                "{action: hashmod, source_labels: [a], target_label: s}",
                &["0.modulus"],
            ),
            (
                "hashmod with modulus 0",
                "{action: hashmod, modulus: 0, target_label: s}",
                &["0.modulus"],
            ),
            (
                "hashmod without target",
                "{action: hashmod, modulus: 2}",
                &["0.target_label"],
            ),
            (
                "hashmod with a templated target",
                "{action: hashmod, modulus: 2, target_label: $1}",
                &["0.target_label"],
            ),
            (
                "replace without target",
                "{source_labels: [a]}",
                &["0.target_label"],
            ),
            (
                "replace with an invalid target",
                "{target_label: foo-bar}",
                &["0.target_label"],
            ),
            (
                "replace with a target starting with a digit",
                "{target_label: 1abc}",
                &["0.target_label"],
            ),
            (
                "replace with a malformed reference",
                "{target_label: 'a${'}",
                &["0.target_label"],
            ),
            (
                "replace with an invalid templated target",
                "{target_label: 'a.${1}'}",
                &["0.target_label"],
            ),
            (
                "lowercase without target",
                "{action: lowercase, source_labels: [a]}",
                &["0.target_label"],
            ),
            (
                "uppercase without target",
                "{action: uppercase, source_labels: [a]}",
                &["0.target_label"],
            ),
            (
                "lowercase with a templated target",
                "{action: lowercase, target_label: '${1}'}",
                &["0.target_label"],
            ),
            (
                "uppercase with a replacement",
                "{action: uppercase, target_label: a, replacement: x}",
                &["0.replacement"],
            ),
            (
                "keepequal without target",
                "{action: keepequal, source_labels: [a]}",
                &["0.target_label"],
            ),
            (
                "dropequal without target",
                "{action: dropequal, source_labels: [a]}",
                &["0.target_label"],
            ),
            (
                "keepequal with an invalid target",
                "{action: keepequal, source_labels: [a], target_label: a-b}",
                &["0.target_label"],
            ),
            (
                "keepequal with a regex",
                "{action: keepequal, source_labels: [a], target_label: b, regex: x}",
                &["0.regex"],
            ),
            (
                "dropequal with a separator",
                "{action: dropequal, source_labels: [a], target_label: b, separator: ','}",
                &["0.separator"],
            ),
            (
                "dropequal with a modulus",
                "{action: dropequal, source_labels: [a], target_label: b, modulus: 3}",
                &["0.modulus"],
            ),
            (
                "keepequal with a replacement",
                "{action: keepequal, source_labels: [a], target_label: b, replacement: x}",
                &["0.replacement"],
            ),
            (
                "labeldrop with sources",
                "{action: labeldrop, regex: a, source_labels: [a]}",
                &["0.source_labels"],
            ),
            (
                "labelkeep with a target",
                "{action: labelkeep, regex: a, target_label: b}",
                &["0.target_label"],
            ),
            (
                "labelkeep with a replacement",
                "{action: labelkeep, regex: a, replacement: b}",
                &["0.replacement"],
            ),
            (
                "labeldrop with a separator and modulus",
                "{action: labeldrop, regex: a, separator: x, modulus: 1}",
                &["0.modulus", "0.separator"],
            ),
            (
                "labelmap with an invalid replacement",
                "{action: labelmap, regex: '(.*)', replacement: 'a-$1'}",
                &["0.replacement"],
            ),
            (
                "labelmap with an empty replacement",
                "{action: labelmap, regex: '(.*)', replacement: ''}",
                &["0.replacement"],
            ),
            (
                "invalid regex",
                "{action: keep, regex: '(unclosed'}",
                &["0.regex"],
            ),
            (
                "invalid regex repetition",
                "{action: drop, regex: '*'}",
                &["0.regex"],
            ),
            (
                "empty source label name",
                "{action: keep, source_labels: [a, '']}",
                &["0.source_labels.1"],
            ),
            (
                "every problem of a rule is reported",
                "{action: keepequal, source_labels: [''], regex: '(', separator: x}",
                &[
                    "0.source_labels.0",
                    "0.regex",
                    "0.target_label",
                    "0.regex",
                    "0.separator",
                ],
            ),
        ];
        for (name, rule, want) in cases {
            let got = paths(&format!("[{rule}]"));
            assert_eq!(got, *want, "{name}");
        }
    }

    #[test]
    fn valid_configs_have_no_problems() {
        let rules = r#"[
            {target_label: "${1}_x"},
            {source_labels: [a], regex: "(?P<k>[a-z]+)", target_label: "$k", replacement: "$k"},
            {action: labelmap, regex: "__meta_(.+)", replacement: "m_${1}"},
            {action: keepequal, source_labels: [a], target_label: b, replacement: "$1", separator: ";", regex: "(.*)"},
            {action: labeldrop, regex: "tmp_.*"},
            {action: hashmod, source_labels: [a], modulus: 4, target_label: __tmp_hash}
        ]"#;
        assert_eq!(validate_configs(&configs(rules)), vec![]);
    }

    #[test]
    fn problem_paths_index_the_list() {
        let rules = "[{target_label: ok}, {target_label: ok}, {action: hashmod, target_label: s}]";
        let problems = validate_configs(&configs(rules));
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].path, "2.modulus");
        assert!(problems[0].message.contains("modulus"), "{problems:?}");

        let err = Relabeler::new(&configs(rules)).expect_err("invalid");
        assert_eq!(err.problems, problems);
        let build: BuildError = err.into();
        assert!(build.to_string().contains("2.modulus"), "{build}");
    }

    #[test]
    fn regex_errors_name_the_user_pattern() {
        let problems = validate_configs(&configs("[{action: keep, regex: 'a(b'}]"));
        let message = &problems[0].message;
        assert!(message.starts_with("invalid regex \"a(b\": "), "{message}");
        assert!(!message.contains('\n'), "{message}");
        assert!(!message.contains("(?s:"), "{message}");
    }

    #[test]
    fn label_templates_as_prometheus_checks_them() {
        for (template, valid) in [
            ("job", true),
            ("_", true),
            ("a$1", true),
            ("$1", true),
            ("${1}", true),
            ("${name}_suffix", true),
            ("x_${a}${b}_$c9", true),
            ("$a-b", false),
            ("9a", false),
            ("$", false),
            ("$$", false),
            ("${", false),
            ("${}", false),
            ("${a", false),
            ("a$", false),
            ("a.b$1", false),
            ("", false),
            ("é$1", false),
        ] {
            assert_eq!(is_valid_label_template(template), valid, "{template:?}");
        }
    }

    /// Expected values produced by Go's `regexp.ExpandString` (Go 1.26) on the
    /// same pattern and input.
    #[test]
    fn templates_expand_like_go() {
        let pattern = Pattern::compile("(?P<first>[a-z]+)-(?P<second>[0-9]+)(x)?").unwrap();
        let input = "abc-42";
        let Pattern::Regex(re) = &pattern else {
            panic!("not a regex")
        };
        let caps = Groups::Captured(re.captures(input).unwrap());
        for (template, want) in [
            ("$1", "abc"),
            ("${1}", "abc"),
            ("$1x", ""),
            ("${1}x", "abcx"),
            ("$01", ""),
            ("$$", "$"),
            ("$", "$"),
            ("a$", "a$"),
            ("${", "${"),
            ("${1", "${1"),
            ("${}", "${}"),
            ("$first", "abc"),
            ("${first}", "abc"),
            ("$first_", ""),
            ("$first.", "abc."),
            ("${second}${first}", "42abc"),
            ("$3", ""),
            ("$9", ""),
            ("$0", "abc-42"),
            ("$2$1", "42abc"),
            ("$-", "$-"),
            ("$100000000", ""),
            ("$1é", ""),
            ("$é", ""),
            ("${first}é", "abcé"),
            ("$$1", "$1"),
            ("$$$1", "$abc"),
            ("x${2}y", "x42y"),
        ] {
            let t = Template::compile(template, &pattern);
            assert_eq!(t.expand(&caps), want, "{template:?}");
        }
    }

    #[test]
    fn default_regex_shortcut_expands_like_the_regex() {
        let shortcut = Pattern::compile(DEFAULT_REGEX).unwrap();
        assert!(matches!(shortcut, Pattern::Everything));
        let real = Pattern::Regex(Regex::new("^(?s:(.*))$").unwrap());
        for input in ["", "abc", "a\nb"] {
            for template in ["$0", "$1", "${1}x", "$2", "$name", "a$$"] {
                let want = Template::compile(template, &real)
                    .expand(&real.run(input, true).unwrap())
                    .into_owned();
                let got = Template::compile(template, &shortcut)
                    .expand(&shortcut.run(input, true).unwrap())
                    .into_owned();
                assert_eq!(got, want, "{template:?} on {input:?}");
            }
        }
    }

    /// Expected values from Go's `strings.ToLower`/`ToUpper` (simple case mapping).
    #[test]
    fn case_mapping_matches_go() {
        let input = "İSTANBUL Σ ß ᾳ ǅ ﬁ ᾀ";
        assert_eq!(go_to_lower(input), "istanbul σ ß ᾳ ǆ ﬁ ᾀ");
        assert_eq!(go_to_upper(input), "İSTANBUL Σ ß ᾼ Ǆ ﬁ ᾈ");
        assert_eq!(go_to_lower("ÀB"), "àb");
        assert_eq!(go_to_upper("àb"), "ÀB");
        // Rust's `to_lowercase` would give a final sigma here; Go does not.
        assert_eq!(go_to_lower("ΟΔΟΣ"), "οδοσ");
    }

    #[test]
    fn hashmod_matches_independent_md5() {
        // int.from_bytes(hashlib.md5(v).digest()[8:], "big"), from Python.
        assert_eq!(hash_mod("", u64::MAX), 16825458760271544958);
        assert_eq!(hash_mod("foo", u64::MAX), 17145033699835028696);
        assert_eq!(hash_mod("foo;bar", u64::MAX), 15973639978189266750);
        assert_eq!(hash_mod("foo", 1000), 696);
        assert_eq!(hash_mod("foo", 0), 0, "a zero modulus never panics");
    }

    #[test]
    fn source_values_borrow_for_one_label() {
        let rule = Rule::compile(&RelabelConfig {
            source_labels: vec!["a".into()],
            action: RelabelAction::Keep,
            ..RelabelConfig::default()
        })
        .unwrap();
        let l = labels(&[("a", "x")]);
        assert!(matches!(rule.source_value(&l), Cow::Borrowed("x")));
    }

    fn arb_labels() -> impl Strategy<Value = Vec<(String, String)>> {
        let name = prop::sample::select(vec!["a", "b", "job", "__name__", "tmp_x", "Zz", "9"]);
        let value = prop::sample::select(vec![
            "", "x", "foo", "Bar", "a;b", "İß", "debug", "1", "a\nb",
        ]);
        prop::collection::vec((name, value), 0..8).prop_map(|v| {
            v.into_iter()
                .map(|(n, v)| (n.to_owned(), v.to_owned()))
                .collect()
        })
    }

    fn arb_config() -> impl Strategy<Value = RelabelConfig> {
        let action = prop::sample::select(RelabelAction::ALL.to_vec());
        let sources = prop::collection::vec(
            prop::sample::select(vec!["a", "b", "job", "missing", "__name__"]),
            0..3,
        );
        let separator = prop::sample::select(vec![";", "", "/"]);
        let regex = prop::sample::select(vec![
            "(.*)",
            "",
            "f(.*)",
            "(?P<n>[a-z]+)",
            ".*o.*",
            "a|b",
            "__(.*)",
            "(.)(.)",
            "(.*);(.*)",
            "tmp_.*",
        ]);
        let modulus = 0u64..4;
        let target = prop::sample::select(vec!["x", "a", "${1}", "${n}_z", "t$2", "", "job"]);
        let replacement = prop::sample::select(vec!["$1", "", "${n}", "v$2", "$$", "x", "${9}"]);
        (
            action,
            sources,
            separator,
            regex,
            modulus,
            target,
            replacement,
        )
            .prop_map(
                |(action, sources, separator, regex, modulus, target, replacement)| RelabelConfig {
                    source_labels: sources.into_iter().map(str::to_owned).collect(),
                    separator: separator.to_owned(),
                    regex: regex.to_owned(),
                    modulus,
                    target_label: target.to_owned(),
                    replacement: replacement.to_owned(),
                    action,
                },
            )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(1000))]

        #[test]
        fn apply_never_panics_and_keeps_labels_sorted_unique(
            input in arb_labels(),
            rules in prop::collection::vec(arb_config(), 1..5),
        ) {
            // Validation and compilation agree on what is valid.
            prop_assert_eq!(validate_configs(&rules).is_empty(), Relabeler::new(&rules).is_ok());
            // Keep the valid rules so that most cases exercise apply().
            let rules: Vec<RelabelConfig> = rules
                .into_iter()
                .filter(|r| validate_configs(std::slice::from_ref(r)).is_empty())
                .collect();
            let relabeler = Relabeler::new(&rules);
            prop_assert!(relabeler.is_ok(), "{:?}", relabeler.err());
            let Ok(relabeler) = relabeler else { return Ok(()) };
            let mut l = Labels::from_pairs(input);
            if relabeler.apply(&mut l) {
                let names: Vec<&str> = l.iter().map(|l| l.name.as_str()).collect();
                prop_assert!(names.windows(2).all(|w| w[0] < w[1]), "{:?}", names);
                prop_assert!(l.iter().all(|l| !l.value.is_empty()));
            }
        }
    }
}
