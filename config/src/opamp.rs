//! `service.opamp`: how proflow reaches an OpAMP server (the OpenTelemetry
//! agent management protocol), in the shape of the OpenTelemetry
//! Collector's `opamp` extension: `server.ws` (WebSocket: the server pushes
//! a new config at once) or `server.http` (plain HTTP, polled), each with
//! `endpoint`, `headers` and `tls` as the exporters take them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Deserialize;

use crate::tls::ClientTlsSettings;
use crate::values::Duration;

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OpampSettings {
    /// The server and how to reach it: `ws: {...}` or `http: {...}`.
    pub server: OpampServer,
    /// A directory proflow keeps across restarts: the instance uid it is
    /// known by, and the last remote config it applied (it starts with that
    /// config when the server cannot be reached).
    pub storage: PathBuf,
    /// Take configs the server sends (validated as `proflow validate` does,
    /// applied as SIGHUP applies a file). Off by default: whoever controls
    /// the server then controls where profiles go.
    #[serde(default)]
    pub accepts_remote_config: bool,
}

/// One of the two transports.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OpampServer {
    /// WebSocket: `ws://` or `wss://`; one connection, kept open.
    #[serde(default)]
    pub ws: Option<OpampConnection>,
    /// Plain HTTP: `http://` or `https://`; a POST every `polling_interval`.
    #[serde(default)]
    pub http: Option<OpampConnection>,
}

#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OpampConnection {
    /// The server's OpAMP URL, such as `ws://opamp:4320/v1/opamp`.
    pub endpoint: String,
    /// Headers sent with every request (an `Authorization` header, say).
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
    /// TLS for `wss://` and `https://`: `{ca_file, cert_file, key_file,
    /// insecure_skip_verify}`.
    #[serde(default)]
    pub tls: ClientTlsSettings,
    /// Plain HTTP only: how often proflow asks the server (default 30s).
    #[serde(default)]
    pub polling_interval: Option<Duration>,
}

/// Which transport, and its settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpampTransport {
    WebSocket,
    Http,
}

impl OpampSettings {
    /// The transport and its settings (after [`OpampSettings::problems`]
    /// found none, exactly one is set).
    pub fn connection(&self) -> Option<(OpampTransport, &OpampConnection)> {
        match (&self.server.ws, &self.server.http) {
            (Some(ws), None) => Some((OpampTransport::WebSocket, ws)),
            (None, Some(http)) => Some((OpampTransport::Http, http)),
            _ => None,
        }
    }

    /// Every problem, each a message for `service.opamp`.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let (transport, connection) = match self.connection() {
            Some(c) => c,
            None => {
                problems.push("service.opamp.server: set exactly one of `ws: {endpoint: ws://...}` (WebSocket) and `http: {endpoint: http://...}` (plain HTTP)".to_owned());
                return problems;
            }
        };
        let (key, schemes): (&str, &[&str]) = match transport {
            OpampTransport::WebSocket => ("ws", &["ws://", "wss://"]),
            OpampTransport::Http => ("http", &["http://", "https://"]),
        };
        if !schemes.iter().any(|s| connection.endpoint.starts_with(s)) {
            problems.push(format!(
                "service.opamp.server.{key}.endpoint `{}`: start it with {}",
                connection.endpoint,
                schemes.join(" or ")
            ));
        }
        if transport == OpampTransport::WebSocket && connection.polling_interval.is_some() {
            problems.push("service.opamp.server.ws.polling_interval: only the http transport polls; a WebSocket stays open".to_owned());
        }
        if connection
            .polling_interval
            .is_some_and(|d| d.get() < std::time::Duration::from_secs(1))
        {
            problems.push(format!(
                "service.opamp.server.{key}.polling_interval: at least 1s"
            ));
        }
        for problem in connection
            .tls
            .problems(&format!("service.opamp.server.{key}.tls"))
        {
            problems.push(format!("{}: {}", problem.path, problem.message));
        }
        if self.storage.as_os_str().is_empty() {
            problems.push("service.opamp.storage: name a directory proflow keeps across restarts (e.g. /var/lib/proflow/opamp)".to_owned());
        }
        problems
    }
}

#[cfg(test)]
mod tests {
    use crate::Document;

    fn problems(opamp: &str) -> String {
        let text = format!(
            "receivers:\n  pprof_push: {{}}\nexporters:\n  file: {{directory: /tmp}}\nservice:\n  opamp:\n{opamp}  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [file]}}\n"
        );
        match Document::parse_with_env(&text, &|_| None) {
            Ok(d) => {
                assert!(d.service.opamp.is_some());
                String::new()
            }
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn each_transport_takes_its_own_schemes_and_exactly_one_is_set() {
        let ok = "    server: {ws: {endpoint: \"wss://opamp:4320/v1/opamp\", headers: {Authorization: x}}}\n    storage: /var/lib/proflow/opamp\n";
        assert_eq!(problems(ok), "");
        let http = "    server: {http: {endpoint: \"http://opamp:4320/v1/opamp\", polling_interval: 15s}}\n    storage: /s\n    accepts_remote_config: true\n";
        assert_eq!(problems(http), "");
        let both = "    server: {ws: {endpoint: \"ws://a\"}, http: {endpoint: \"http://a\"}}\n    storage: /s\n";
        assert!(
            problems(both).contains("set exactly one of"),
            "{}",
            problems(both)
        );
        let scheme = "    server: {ws: {endpoint: \"http://a/v1/opamp\", polling_interval: 5s}}\n    storage: /s\n";
        let p = problems(scheme);
        assert!(p.contains("start it with ws:// or wss://"), "{p}");
        assert!(p.contains("only the http transport polls"), "{p}");
        let unknown = "    server: {ws: {endpoint: \"ws://a\", colour: blue}}\n    storage: /s\n";
        assert!(
            problems(unknown).contains("colour"),
            "{}",
            problems(unknown)
        );
        let no_storage = "    server: {ws: {endpoint: \"ws://a\"}}\n";
        assert!(
            problems(no_storage).contains("storage"),
            "{}",
            problems(no_storage)
        );
    }
}
