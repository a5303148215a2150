//! What every component config answers to: [`Validate`] reports every
//! problem as a [`FieldError`] (a dotted path relative to the component's
//! body and what to do), and [`joined_problems`] makes them one message
//! ([`no_problems`]: one error);
//! a config that passed but could not be built says so as a [`BuildError`].

/// A problem found by [`Validate::validate`]: `path` is relative to the
/// component's body, dotted, sequence items by index (`relabel_configs.1.regex`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub path: String,
    pub message: String,
}

impl FieldError {
    pub fn new(path: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            path: path.into(),
            message: message.into(),
        }
    }
}

/// Config problems as one build error message: `path: message; …`.
pub fn joined_problems(problems: &[FieldError]) -> String {
    problems
        .iter()
        .map(|p| format!("{}: {}", p.path, p.message))
        .collect::<Vec<_>>()
        .join("; ")
}

/// `Ok` when there is no problem, else every problem in one [`BuildError`]
/// (`path: message; …`): what a component's `build` says of a config that
/// did not pass its checks.
pub fn no_problems(problems: Vec<FieldError>) -> Result<(), BuildError> {
    if problems.is_empty() {
        Ok(())
    } else {
        Err(BuildError(joined_problems(&problems)))
    }
}

/// Checks a config and reports every problem, not just the first.
pub trait Validate {
    fn validate(&self) -> Vec<FieldError>;
}

/// Why a component could not be built or started.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BuildError(pub String);

impl BuildError {
    pub fn new(msg: impl Into<String>) -> Self {
        BuildError(msg.into())
    }
}
