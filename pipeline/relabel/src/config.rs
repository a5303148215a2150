//! The rule config as Prometheus writes it (`relabel_config`): actions,
//! defaults, and [`validate_configs`], which reports every problem.

use super::*;

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

pub(crate) fn action_names() -> String {
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

pub(crate) fn default_separator() -> String {
    DEFAULT_SEPARATOR.to_owned()
}

pub(crate) fn default_regex() -> String {
    DEFAULT_REGEX.to_owned()
}

pub(crate) fn default_replacement() -> String {
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

pub(crate) fn prefixed(
    index: usize,
    problems: Vec<FieldError>,
) -> impl Iterator<Item = FieldError> {
    problems.into_iter().map(move |p| FieldError {
        path: if p.path.is_empty() {
            index.to_string()
        } else {
            format!("{index}.{}", p.path)
        },
        message: p.message,
    })
}
