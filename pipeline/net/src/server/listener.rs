//! The settings every receiver that listens takes, declared once:
//! [`ListenerSettings`] (gRPC and HTTP alike) and [`HttpListenerSettings`]
//! (adds HTTP/1's header timeout). A receiver embeds one of them in its
//! config (`#[serde(rename = "__proflow_embedded", default)]`, see
//! [`proflow_config::EMBEDDED`]), so users write these keys beside the
//! receiver's own, as they always have: `endpoint`, `read_timeout`,
//! `max_connections`, `idle_timeout`, `max_concurrent_streams`, `tls`,
//! `auth` and, for HTTP, `read_header_timeout`. Each receiver names its own
//! default endpoint (Pyroscope's 4040, the collector's 4317 and 4318).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use proflow_config::{Duration, FieldError};
use serde::Deserialize;

use super::tls::{ServerTls, ServerTlsFiles, ServerTlsSettings};
use super::{AuthSettings, DEFAULT_IDLE_TIMEOUT, DEFAULT_MAX_CONCURRENT_STREAMS, Listen};

/// Parses `ip:port`, also accepting `localhost:port`. Host names are not
/// resolved: resolution at validation time would make configs depend on DNS.
pub fn parse_endpoint(endpoint: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = endpoint.parse::<SocketAddr>() {
        return Ok(addr);
    }
    if let Some(port) = endpoint.strip_prefix("localhost:")
        && let Ok(port) = port.parse::<u16>()
    {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    Err(format!(
        "invalid endpoint {endpoint:?}: write an IP address and port such as 0.0.0.0:4040, 127.0.0.1:4040 or [::]:4040"
    ))
}

/// The listener settings of every receiver that listens.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenerSettings {
    /// Address to listen on, as `ip:port` (`localhost` is accepted as a
    /// host); when not set, the receiver's default. Port 0 picks a free port.
    pub endpoint: Option<String>,
    /// How long a client may take to send a request's body (gRPC: its
    /// message); a slower one gets 408 (`DEADLINE_EXCEEDED`), so slow
    /// clients cannot hold memory for long.
    pub read_timeout: Duration,
    /// Most connections served at once. When all are taken, a new client
    /// makes the connection idle the longest close; while every one is in a
    /// request, new ones wait in the kernel's listen backlog.
    pub max_connections: usize,
    /// How long a connection may stay open without a request in flight;
    /// then it is closed (clients reconnect by themselves).
    pub idle_timeout: Duration,
    /// Most requests in flight at once on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// TLS: `{cert_file, key_file, client_ca_file, min_version}`; the files
    /// are read again when they change.
    pub tls: Option<ServerTlsSettings>,
    /// Credentials every request must carry: `{bearer_tokens_file,
    /// basic_auth: {htpasswd_file}}`; otherwise 401 (`UNAUTHENTICATED`),
    /// the body unread.
    pub auth: Option<AuthSettings>,
}

impl Default for ListenerSettings {
    fn default() -> Self {
        ListenerSettings {
            endpoint: None,
            read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            idle_timeout: Duration(DEFAULT_IDLE_TIMEOUT),
            max_concurrent_streams: DEFAULT_MAX_CONCURRENT_STREAMS,
            tls: None,
            auth: None,
        }
    }
}

/// `prefix.field`, or `field` at a component's top.
fn under(prefix: &str, field: &str) -> String {
    if prefix.is_empty() {
        field.to_owned()
    } else {
        format!("{prefix}.{field}")
    }
}

/// A timeout of 0 would let a client that stops sending hold its
/// connection and memory forever.
pub fn positive_timeout(problems: &mut Vec<FieldError>, path: String, value: Duration) {
    if value.is_zero() {
        problems.push(FieldError::new(
            path,
            "must be more than 0, such as 10s: without it a client that stops sending holds its connection and memory forever",
        ));
    }
}

impl ListenerSettings {
    /// The defaults, listening on `endpoint` (for tests and embedders).
    pub fn on(endpoint: impl Into<String>) -> Self {
        ListenerSettings {
            endpoint: Some(endpoint.into()),
            ..ListenerSettings::default()
        }
    }

    /// The endpoint written, or `default` (the receiver's).
    pub fn endpoint_or<'a>(&'a self, default: &'a str) -> &'a str {
        self.endpoint.as_deref().unwrap_or(default)
    }

    /// The address to bind: the endpoint written, or `default`.
    pub fn socket_addr(&self, default: &str) -> Result<SocketAddr, String> {
        parse_endpoint(self.endpoint_or(default))
    }

    /// The address this listener claims for itself, if any: port 0 asks
    /// the OS for a fresh port, so it can never collide with another
    /// component (and two such receivers, common in tests, are fine).
    pub fn claimed(&self, default: &str) -> Option<SocketAddr> {
        self.socket_addr(default).ok().filter(|a| a.port() != 0)
    }

    /// Every problem, each under `prefix` (empty at a component's top).
    pub fn problems(&self, prefix: &str, default_endpoint: &str) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if let Err(message) = self.socket_addr(default_endpoint) {
            problems.push(FieldError::new(under(prefix, "endpoint"), message));
        }
        positive_timeout(
            &mut problems,
            under(prefix, "read_timeout"),
            self.read_timeout,
        );
        if self.max_connections == 0 {
            problems.push(FieldError::new(
                under(prefix, "max_connections"),
                "must be at least 1, such as 1024",
            ));
        }
        positive_timeout(
            &mut problems,
            under(prefix, "idle_timeout"),
            self.idle_timeout,
        );
        if self.max_concurrent_streams == 0 {
            problems.push(FieldError::new(
                under(prefix, "max_concurrent_streams"),
                "must be at least 1, such as 100",
            ));
        }
        if let Some(tls) = &self.tls {
            problems.extend(tls.problems(&under(prefix, "tls")));
        }
        if let Some(auth) = &self.auth {
            problems.extend(auth.problems(&under(prefix, "auth")));
        }
        problems
    }

    /// How the accept loop serves these settings' connections: HTTP/2 only
    /// (gRPC), no HTTP/1 header timeout.
    pub fn listen_grpc(&self, tls: Option<Arc<ServerTls>>) -> Listen {
        Listen {
            http2_only: true,
            idle_timeout: self.idle_timeout.get(),
            max_concurrent_streams: self.max_concurrent_streams,
            ..Listen::new(self.max_connections, tls)
        }
    }
}

/// The listener settings of a receiver that serves HTTP/1 and HTTP/2.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpListenerSettings {
    /// What every listener takes.
    #[serde(rename = "__proflow_embedded", default)]
    pub listener: ListenerSettings,
    /// How long a client may take to send a request's headers (the
    /// OpenTelemetry Collector's name); a slower one is disconnected.
    pub read_header_timeout: Duration,
}

impl Default for HttpListenerSettings {
    fn default() -> Self {
        HttpListenerSettings {
            listener: ListenerSettings::default(),
            read_header_timeout: Duration::from_secs(10),
        }
    }
}

impl HttpListenerSettings {
    /// The defaults, listening on `endpoint` (for tests and embedders).
    pub fn on(endpoint: impl Into<String>) -> Self {
        HttpListenerSettings {
            listener: ListenerSettings::on(endpoint),
            ..HttpListenerSettings::default()
        }
    }

    /// Every problem, each under `prefix` (empty at a component's top).
    pub fn problems(&self, prefix: &str, default_endpoint: &str) -> Vec<FieldError> {
        let mut problems = self.listener.problems(prefix, default_endpoint);
        positive_timeout(
            &mut problems,
            under(prefix, "read_header_timeout"),
            self.read_header_timeout,
        );
        problems
    }

    /// How the accept loop serves these settings' connections.
    pub fn listen(&self, tls: Option<Arc<ServerTls>>) -> Listen {
        Listen {
            read_header_timeout: Some(self.read_header_timeout.get()),
            idle_timeout: self.listener.idle_timeout.get(),
            max_concurrent_streams: self.listener.max_concurrent_streams,
            ..Listen::new(self.listener.max_connections, tls)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_config::{Node, from_node};

    /// A receiver's config as receivers write it: its own key beside the
    /// embedded listener's.
    #[derive(Debug, Deserialize, PartialEq, Default)]
    #[serde(deny_unknown_fields, default)]
    struct Receiver {
        #[serde(rename = "__proflow_embedded", default)]
        listener: HttpListenerSettings,
        max_things: u32,
    }

    fn parse(yaml: &str) -> Result<Receiver, proflow_config::Error> {
        from_node(&Node::parse(yaml).unwrap(), "receivers.r")
    }

    #[test]
    fn listener_keys_sit_beside_the_receivers_own() {
        let r = parse(
            "endpoint: localhost:0\nmax_things: 3\nread_header_timeout: 2s\nmax_connections: '7'\n",
        )
        .unwrap();
        assert_eq!(r.max_things, 3);
        assert_eq!(r.listener.read_header_timeout, Duration::from_secs(2));
        assert_eq!(r.listener.listener.max_connections, 7);
        assert_eq!(
            r.listener.listener.socket_addr("0.0.0.0:1").unwrap(),
            "127.0.0.1:0".parse().unwrap()
        );
        assert_eq!(r.listener.listener.claimed("0.0.0.0:1"), None);
        assert_eq!(parse("{}").unwrap(), Receiver::default());
        let defaults = ListenerSettings::default();
        assert_eq!(
            defaults.claimed("0.0.0.0:4040"),
            Some("0.0.0.0:4040".parse().unwrap())
        );
    }

    #[test]
    fn an_unknown_key_names_every_key_it_could_have_been() {
        let e = parse("endpoint: 127.0.0.1:0\nmax_conections: 3\n").unwrap_err();
        assert_eq!((e.path.as_str(), e.line), ("receivers.r.max_conections", 2));
        for key in [
            "max_connections",
            "max_things",
            "read_header_timeout",
            "tls",
        ] {
            assert!(e.message.contains(key), "{key} missing from {e}");
        }
    }

    #[test]
    fn every_problem_is_reported_under_its_path() {
        let r = parse(
            "endpoint: example.com:80\nread_timeout: 0s\nmax_connections: 0\nidle_timeout: 0s\nmax_concurrent_streams: 0\nread_header_timeout: 0s\n",
        )
        .unwrap();
        let paths: Vec<String> = r
            .listener
            .problems("protocols.http", "0.0.0.0:4318")
            .into_iter()
            .map(|p| p.path)
            .collect();
        assert_eq!(
            paths,
            [
                "protocols.http.endpoint",
                "protocols.http.read_timeout",
                "protocols.http.max_connections",
                "protocols.http.idle_timeout",
                "protocols.http.max_concurrent_streams",
                "protocols.http.read_header_timeout",
            ]
        );
        assert!(
            parse("{}")
                .unwrap()
                .listener
                .problems("", "0.0.0.0:4040")
                .is_empty()
        );
    }
}
