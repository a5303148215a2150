//! The top-level config document: component sections keyed by [`ComponentId`],
//! each component's body kept as a located [`Node`] for its own typed parse, and
//! the `service` section.

use std::fmt;
use std::net::SocketAddr;

use serde::Deserialize;

use crate::de::{Located, from_node};
use crate::env::expand_env;
use crate::error::{Error, Errors};
use crate::node::{Node, NodeValue};
use crate::values::Duration;

/// `type` or `type/name`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ComponentId {
    pub kind: String,
    pub name: Option<String>,
}

impl ComponentId {
    pub fn parse(s: &str) -> Result<Self, String> {
        let (kind, name) = match s.split_once('/') {
            Some((k, n)) => (k, Some(n)),
            None => (s, None),
        };
        let valid_type = !kind.is_empty()
            && kind.starts_with(|c: char| c.is_ascii_lowercase())
            && kind
                .bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_');
        if !valid_type {
            return Err(format!(
                "invalid component id {s:?}: the type must be lowercase letters, digits and `_`, as in `pprof_push` or `relabel/team`"
            ));
        }
        if let Some(n) = name
            && (n.is_empty() || n.contains('/') || n.chars().any(char::is_whitespace))
        {
            return Err(format!(
                "invalid component id {s:?}: the name after `/` must be non-empty without spaces or `/`"
            ));
        }
        Ok(ComponentId {
            kind: kind.to_owned(),
            name: name.map(str::to_owned),
        })
    }
}

impl fmt::Display for ComponentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.name {
            Some(n) => write!(f, "{}/{}", self.kind, n),
            None => f.write_str(&self.kind),
        }
    }
}

/// A pipeline id: `profiles` or `profiles/<name>`.
pub type PipelineId = ComponentId;

/// `service.telemetry`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Address of the `/metrics`, `/healthz` and `/readyz` server; `none` disables it.
    #[serde(default = "default_telemetry_address")]
    pub address: Located<String>,
    /// `trace`, `debug`, `info`, `warn` or `error` (or a tracing filter such as `proflow=debug`).
    #[serde(default = "default_log_level")]
    pub log_level: String,
    /// `text` or `json`.
    #[serde(default)]
    pub log_format: LogFormat,
    /// TLS for the telemetry address: `{cert_file, key_file, client_ca_file,
    /// min_version}`.
    #[serde(default)]
    pub tls: Option<crate::ServerTlsSettings>,
    /// Serve `POST /-/reload` (reload the config, as SIGHUP does). Off by
    /// default: whoever reaches the address could make the collector reload.
    #[serde(default)]
    pub reload_endpoint: bool,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

fn default_telemetry_address() -> Located<String> {
    Located {
        value: "127.0.0.1:8888".into(),
        line: 0,
        column: 0,
        path: "service.telemetry.address".into(),
    }
}

fn default_log_level() -> String {
    "info".into()
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            address: default_telemetry_address(),
            log_level: default_log_level(),
            log_format: LogFormat::Text,
            tls: None,
            reload_endpoint: false,
        }
    }
}

impl TelemetryConfig {
    /// The parsed telemetry address, `None` when disabled.
    pub fn socket_addr(&self) -> Result<Option<SocketAddr>, Error> {
        if self.address.value == "none" || self.address.value.is_empty() {
            return Ok(None);
        }
        // `localhost:PORT` as the receivers accept it; other names are not looked up.
        let text = match self.address.value.strip_prefix("localhost:") {
            Some(port) => format!("127.0.0.1:{port}"),
            None => self.address.value.clone(),
        };
        text.parse().map(Some).map_err(|_| {
            Error::new(
                &self.address.path,
                self.address.line,
                self.address.column,
                format!(
                    "invalid address {:?}: write host:port such as 127.0.0.1:8888, or `none`",
                    self.address.value
                ),
            )
        })
    }
}

/// One pipeline: receivers feed processors in order, then every exporter.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    /// Receiver ids feeding this pipeline (at least one).
    pub receivers: Vec<Located<String>>,
    /// Processor ids, run in this order.
    #[serde(default)]
    pub processors: Vec<Located<String>>,
    /// Exporter ids, each fed every profile that leaves the processors (at
    /// least one for a profiles pipeline; none for a traces pipeline).
    #[serde(default)]
    pub exporters: Vec<Located<String>>,
}

/// `service.limits`: bounds on what the collector holds at once.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Most bytes of request bodies being read and data decompressed from
    /// them, summed over every receiver and request. A request that would go
    /// past it waits briefly, then is refused (429 / `RESOURCE_EXHAUSTED`).
    /// Requests over 1 MiB may use three quarters of it, so small pushes are
    /// still served while large uploads crowd in.
    pub max_in_flight_bytes: crate::ByteSize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_in_flight_bytes: crate::ByteSize::mib(256),
        }
    }
}

/// `service`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ServiceConfig {
    /// Logs and the `/metrics`, `/healthz`, `/readyz` server.
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Pipelines by id (`profiles` or `profiles/<name>`), in file order.
    pub pipelines: Vec<(Located<String>, PipelineConfig)>,
    /// How long to drain exporter queues on SIGTERM/SIGINT.
    pub shutdown_timeout: Duration,
    /// Memory bounds.
    pub limits: LimitsConfig,
    /// Remote management over OpAMP (off when absent).
    pub opamp: Option<crate::opamp::OpampSettings>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawService {
    /// See [`ServiceConfig::telemetry`].
    #[serde(default)]
    telemetry: TelemetryConfig,
    /// Read separately (kept as a located node); present here so it is a known field.
    #[serde(default, rename = "pipelines")]
    _pipelines: serde::de::IgnoredAny,
    #[serde(default = "default_shutdown")]
    shutdown_timeout: Duration,
    /// See [`ServiceConfig::limits`].
    #[serde(default)]
    limits: LimitsConfig,
    /// See [`ServiceConfig::opamp`].
    #[serde(default)]
    opamp: Option<crate::opamp::OpampSettings>,
}

fn default_shutdown() -> Duration {
    Duration::from_secs(10)
}

/// A component section entry: id, where it is, and its body.
#[derive(Debug, Clone)]
pub struct ComponentEntry {
    pub id: ComponentId,
    /// YAML path of the body, such as `receivers.pprof_push`.
    pub path: String,
    pub line: usize,
    pub column: usize,
    pub body: Node,
}

/// A whole config file, with env variables expanded and component bodies untyped.
#[derive(Debug, Clone)]
pub struct Document {
    pub receivers: Vec<ComponentEntry>,
    pub processors: Vec<ComponentEntry>,
    pub exporters: Vec<ComponentEntry>,
    pub service: ServiceConfig,
}

const SECTIONS: &[&str] = &["receivers", "processors", "exporters", "service"];

impl Document {
    /// Parses config text, expanding `${env:...}` from the process environment.
    pub fn parse(text: &str) -> Result<Document, Errors> {
        Self::parse_with_env(text, &|k| std::env::var(k).ok())
    }

    pub fn parse_with_env(
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Document, Errors> {
        let mut root = Node::parse(text).map_err(Errors::from)?;
        let mut errors = Errors::default();

        let mut env_errors = Vec::new();
        root.try_map_strings(&mut |s| expand_env(s, env), &mut env_errors);
        for (line, column, msg) in env_errors {
            errors.push(Error::new("", line, column, msg));
        }

        let entries = match &root.value {
            NodeValue::Map(m) => m.clone(),
            _ => {
                errors.push(Error::new(
                    "",
                    root.line,
                    root.column,
                    "the config must be a map with receivers, processors, exporters and service",
                ));
                return Err(errors);
            }
        };
        let mut sections: [Option<Node>; 4] = [None, None, None, None];
        for (k, v) in entries {
            let key = k.scalar_text().unwrap_or_default();
            match SECTIONS.iter().position(|s| *s == key) {
                Some(i) => sections[i] = Some(v),
                None => errors.push(Error::new(
                    key.clone(),
                    k.line,
                    k.column,
                    format!(
                        "unknown top-level key `{key}`; expected one of: {}",
                        SECTIONS.join(", ")
                    ),
                )),
            }
        }
        let [receivers, processors, exporters, service] = sections;
        let receivers = component_section("receivers", receivers, &mut errors);
        let processors = component_section("processors", processors, &mut errors);
        let exporters = component_section("exporters", exporters, &mut errors);

        let service = match service {
            None => {
                errors.push(Error::new(
                    "service",
                    0,
                    0,
                    "missing `service` section: it lists the pipelines to run",
                ));
                None
            }
            Some(node) => parse_service(&node, &mut errors),
        };
        match service {
            Some(service) if errors.is_empty() => Ok(Document {
                receivers,
                processors,
                exporters,
                service,
            }),
            _ => Err(errors.sorted()),
        }
    }
}

fn component_section(name: &str, node: Option<Node>, errors: &mut Errors) -> Vec<ComponentEntry> {
    let Some(node) = node else { return Vec::new() };
    let entries = match node.value {
        NodeValue::Map(m) => m,
        NodeValue::Null => return Vec::new(),
        _ => {
            errors.push(Error::new(
                name,
                node.line,
                node.column,
                format!("`{name}` must be a map of component id to settings"),
            ));
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (k, v) in entries {
        let key = k.scalar_text().unwrap_or_default();
        let path = format!("{name}.{key}");
        match ComponentId::parse(&key) {
            Ok(id) => out.push(ComponentEntry {
                id,
                path,
                line: k.line,
                column: k.column,
                body: v,
            }),
            Err(msg) => errors.push(Error::new(path, k.line, k.column, msg)),
        }
    }
    out
}

fn parse_service(node: &Node, errors: &mut Errors) -> Option<ServiceConfig> {
    let raw: RawService = match from_node(node, "service") {
        Ok(r) => r,
        Err(e) => {
            errors.push(e);
            return None;
        }
    };
    if let Err(e) = raw.telemetry.socket_addr() {
        errors.push(e);
    }
    if let Some(opamp) = &raw.opamp {
        let at = node.get("opamp").unwrap_or(node);
        for problem in opamp.problems() {
            errors.push(Error::new("service.opamp", at.line, at.column, problem));
        }
    }
    let mut pipelines = Vec::new();
    let missing = Node::new(NodeValue::Null, node.line, node.column);
    let pipelines_node = node.get("pipelines").unwrap_or(&missing);
    match &pipelines_node.value {
        NodeValue::Map(m) if !m.is_empty() => {
            for (k, v) in m {
                let key = k.scalar_text().unwrap_or_default();
                let path = format!("service.pipelines.{key}");
                match ComponentId::parse(&key) {
                    Ok(id) if id.kind == "profiles" || id.kind == "traces" => {}
                    _ => errors.push(Error::new(
                        path.clone(),
                        k.line,
                        k.column,
                        format!("invalid pipeline id `{key}`: write `profiles` or `profiles/<name>` (or `traces`, `traces/<name>` for spans that feed trace_link)"),
                    )),
                }
                match from_node::<PipelineConfig>(v, &path) {
                    Ok(p) => pipelines.push((
                        Located {
                            value: key,
                            line: k.line,
                            column: k.column,
                            path,
                        },
                        p,
                    )),
                    Err(e) => errors.push(e),
                }
            }
        }
        _ => errors.push(Error::new(
            "service.pipelines",
            pipelines_node.line,
            pipelines_node.column,
            "`service.pipelines` must name at least one pipeline, such as `profiles: {receivers: [...], exporters: [...]}`",
        )),
    }
    Some(ServiceConfig {
        telemetry: raw.telemetry,
        pipelines,
        shutdown_timeout: raw.shutdown_timeout,
        limits: raw.limits,
        opamp: raw.opamp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
receivers:
  pprof_push:
    endpoint: 0.0.0.0:${env:PORT:-4040}
processors:
  relabel/team:
    relabel_configs:
      - {action: replace, target_label: team, replacement: core}
exporters:
  file:
    directory: ./profiles
service:
  telemetry:
    address: 127.0.0.1:8888
  pipelines:
    profiles:
      receivers: [pprof_push]
      processors: [relabel/team]
      exporters: [file]
"#;

    #[test]
    fn parses_the_issue_example() {
        let d = Document::parse_with_env(GOOD, &|_| None).unwrap();
        assert_eq!(d.receivers[0].id.to_string(), "pprof_push");
        assert_eq!(
            d.receivers[0].body.get("endpoint").unwrap().as_str(),
            Some("0.0.0.0:4040")
        );
        assert_eq!(
            d.processors[0].id,
            ComponentId::parse("relabel/team").unwrap()
        );
        assert_eq!(d.service.pipelines[0].1.exporters[0].value, "file");
        assert_eq!(d.service.pipelines[0].1.exporters[0].line, 19);
        assert_eq!(d.service.shutdown_timeout, Duration::from_secs(10));
        assert_eq!(
            d.service.telemetry.socket_addr().unwrap(),
            Some("127.0.0.1:8888".parse().unwrap())
        );
    }

    #[test]
    fn reports_every_problem_at_once() {
        let text = "receivers:\n  Bad Id: {}\nextensions: {}\nservice:\n  pipelines:\n    metrics:\n      receivers: [x]\n      exporters: [y]\n  telemetry:\n    address: nowhere\n    colour: blue\n";
        let errs = Document::parse_with_env(text, &|_| None).unwrap_err();
        let text = errs.to_string();
        assert!(text.contains("invalid component id \"Bad Id\""), "{text}");
        assert!(
            text.contains("unknown top-level key `extensions`"),
            "{text}"
        );
        assert!(text.contains("unknown field `colour`"), "{text}");
        assert!(errs.len() >= 3, "{text}");
    }

    #[test]
    fn unset_env_is_an_error_with_line() {
        let errs = Document::parse_with_env("receivers:\n  pprof_push:\n    endpoint: ${env:NOPE}\nservice:\n  pipelines:\n    profiles: {receivers: [pprof_push], exporters: [nop]}\n", &|_| None).unwrap_err();
        assert_eq!(errs.0[0].line, 3, "{errs}");
        assert!(errs.0[0].message.contains("NOPE is not set"));
    }
}
