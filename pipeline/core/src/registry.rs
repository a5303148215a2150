//! The table of component types: for each type name, its kind, stability and
//! how to read its config. Component crates export `factories()`; the binary
//! joins them into one [`Registry`].

use std::fmt;
use std::sync::Arc;

use proflow_config::{Error, Node, from_node};
use serde::de::DeserializeOwned;

use crate::component::{ExporterConfig, ProcessorConfig, ReceiverConfig};
use proflow_config::{FieldError, Validate};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    Receiver,
    Processor,
    Exporter,
}

impl Kind {
    /// The config section name (`receivers`, ...).
    pub fn section(self) -> &'static str {
        match self {
            Kind::Receiver => "receivers",
            Kind::Processor => "processors",
            Kind::Exporter => "exporters",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Receiver => "receiver",
            Kind::Processor => "processor",
            Kind::Exporter => "exporter",
        })
    }
}

/// How far a component is from being finished, as the OpenTelemetry Collector says it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stability {
    Development,
    Alpha,
    Beta,
    Stable,
}

impl fmt::Display for Stability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stability::Development => "development",
            Stability::Alpha => "alpha",
            Stability::Beta => "beta",
            Stability::Stable => "stable",
        })
    }
}

/// A typed, validated component config of any kind.
#[derive(Debug, Clone)]
pub enum AnyConfig {
    Receiver(Arc<dyn ReceiverConfig>),
    Processor(Arc<dyn ProcessorConfig>),
    Exporter(Arc<dyn ExporterConfig>),
}

type ParseFn = fn(&Node, &str) -> Result<AnyConfig, Vec<Error>>;

/// One component type.
#[derive(Clone)]
pub struct Factory {
    pub kind: Kind,
    pub type_name: &'static str,
    pub stability: Stability,
    pub description: &'static str,
    parse: ParseFn,
}

impl fmt::Debug for Factory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Factory({} {})", self.kind, self.type_name)
    }
}

/// Reads `C` from `node` and runs its `validate()`, locating each problem.
fn parse_validated<C: DeserializeOwned + Validate>(
    node: &Node,
    path: &str,
    shared_checks: impl Fn(&C) -> Vec<FieldError>,
) -> Result<C, Vec<Error>> {
    let config: C = from_node(node, path).map_err(|e| vec![e])?;
    let mut problems = config.validate();
    problems.extend(shared_checks(&config));
    if problems.is_empty() {
        return Ok(config);
    }
    Err(problems
        .into_iter()
        .map(|p| {
            let at = node.lookup(&p.path);
            let full = if p.path.is_empty() {
                path.to_owned()
            } else {
                format!("{path}.{}", p.path)
            };
            Error::new(full, at.line, at.column, p.message)
        })
        .collect())
}

fn parse_receiver<C: ReceiverConfig + DeserializeOwned + 'static>(
    node: &Node,
    path: &str,
) -> Result<AnyConfig, Vec<Error>> {
    parse_validated::<C>(node, path, |_| Vec::new()).map(|c| AnyConfig::Receiver(Arc::new(c)))
}

fn parse_processor<C: ProcessorConfig + DeserializeOwned + 'static>(
    node: &Node,
    path: &str,
) -> Result<AnyConfig, Vec<Error>> {
    parse_validated::<C>(node, path, |_| Vec::new()).map(|c| AnyConfig::Processor(Arc::new(c)))
}

fn parse_exporter<C: ExporterConfig + DeserializeOwned + 'static>(
    node: &Node,
    path: &str,
) -> Result<AnyConfig, Vec<Error>> {
    // Every exporter's `sending_queue` and `retry_on_failure` are checked here,
    // so no exporter can forget to.
    parse_validated::<C>(node, path, |c| c.sending().problems())
        .map(|c| AnyConfig::Exporter(Arc::new(c)))
}

impl Factory {
    pub fn receiver<C: ReceiverConfig + DeserializeOwned + 'static>(
        type_name: &'static str,
        stability: Stability,
        description: &'static str,
    ) -> Self {
        Factory {
            kind: Kind::Receiver,
            type_name,
            stability,
            description,
            parse: parse_receiver::<C>,
        }
    }

    pub fn processor<C: ProcessorConfig + DeserializeOwned + 'static>(
        type_name: &'static str,
        stability: Stability,
        description: &'static str,
    ) -> Self {
        Factory {
            kind: Kind::Processor,
            type_name,
            stability,
            description,
            parse: parse_processor::<C>,
        }
    }

    pub fn exporter<C: ExporterConfig + DeserializeOwned + 'static>(
        type_name: &'static str,
        stability: Stability,
        description: &'static str,
    ) -> Self {
        Factory {
            kind: Kind::Exporter,
            type_name,
            stability,
            description,
            parse: parse_exporter::<C>,
        }
    }

    /// Reads and validates a component body; `path` is its YAML path.
    pub fn parse(&self, body: &Node, path: &str) -> Result<AnyConfig, Vec<Error>> {
        (self.parse)(body, path)
    }
}

/// All known component types.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    factories: Vec<Factory>,
}

impl Registry {
    pub fn new(factories: impl IntoIterator<Item = Factory>) -> Self {
        let mut factories: Vec<Factory> = factories.into_iter().collect();
        factories.sort_by_key(|f| (f.kind, f.type_name));
        Registry { factories }
    }

    pub fn get(&self, kind: Kind, type_name: &str) -> Option<&Factory> {
        self.factories
            .iter()
            .find(|f| f.kind == kind && f.type_name == type_name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Factory> {
        self.factories.iter()
    }

    /// Type names of one kind, for "unknown type" errors.
    pub fn names(&self, kind: Kind) -> Vec<&'static str> {
        self.factories
            .iter()
            .filter(|f| f.kind == kind)
            .map(|f| f.type_name)
            .collect()
    }
}
