//! Configuration errors: each names the component, the YAML path and the line.

use std::fmt;

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// The component id (`receivers::pprof_push`), if the problem is inside one.
    pub component: Option<String>,
    /// The YAML path, such as `receivers.pprof_push.endpoint`.
    pub path: String,
    /// 1-based line; 0 when unknown.
    pub line: usize,
    /// 1-based column; 0 when unknown.
    pub column: usize,
    pub message: String,
}

impl Error {
    pub fn new(
        path: impl Into<String>,
        line: usize,
        column: usize,
        message: impl Into<String>,
    ) -> Self {
        Error {
            component: None,
            path: path.into(),
            line,
            column,
            message: message.into(),
        }
    }

    pub fn in_component(mut self, id: impl Into<String>) -> Self {
        self.component = Some(id.into());
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line > 0 {
            write!(f, "line {}:{}: ", self.line, self.column)?;
        }
        if let Some(c) = &self.component {
            write!(f, "{c}: ")?;
        }
        if !self.path.is_empty() {
            write!(f, "at `{}`: ", self.path)?;
        }
        f.write_str(&self.message)
    }
}

/// Every problem found, in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq, thiserror::Error)]
pub struct Errors(pub Vec<Error>);

impl Errors {
    pub fn push(&mut self, e: Error) {
        self.0.push(e);
    }

    pub fn extend(&mut self, other: Errors) {
        self.0.extend(other.0);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn iter(&self) -> std::slice::Iter<'_, Error> {
        self.0.iter()
    }

    pub fn sorted(mut self) -> Self {
        self.0.sort_by_key(|e| (e.line, e.column));
        self
    }

    /// Ok(()) when empty, else Err(self).
    pub fn into_result(self) -> Result<(), Errors> {
        if self.0.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for Errors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl From<Error> for Errors {
    fn from(e: Error) -> Self {
        Errors(vec![e])
    }
}
