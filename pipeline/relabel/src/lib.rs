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
mod tests;
