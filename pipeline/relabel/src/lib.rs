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

mod config;
mod pattern;
mod rule;
mod template;
#[cfg(test)]
mod tests;

pub use config::*;
use pattern::*;
use rule::*;
use template::*;

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
