//! The `otlp` receiver: OTLP profiles (proto 1.10, `v1development`) over
//! gRPC and HTTP, configured like the OpenTelemetry Collector's `otlp`
//! receiver, so an OpenTelemetry SDK, the eBPF profiler or a collector's
//! `otlp_grpc`/`otlp_http` exporter can point at proflow unchanged.
//!
//! Endpoints:
//! - gRPC `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export`
//!   (cleartext HTTP/2, gzip accepted), on `protocols.grpc.endpoint`;
//! - HTTP `POST /v1development/profiles`, protobuf (`application/x-protobuf`,
//!   `application/protobuf`) or OTLP JSON (`application/json`), plain or
//!   `Content-Encoding: gzip`, on `protocols.http.endpoint`.
//!
//! Each (resource, scope, profile) of a request becomes one
//! [`Envelope`](proflow_model::model::Envelope) whose payload is the
//! profile as it arrived, sharing the request's one dictionary (`Arc`) with
//! every other profile of the request. A request whose dictionary is broken
//! is refused whole (the usual cause is a sender on another OTLP profiles
//! version); a broken profile is refused alone and reported in the
//! response's `partial_success`, the others of its request go on.
//!
//! Module map: `export` (the handler both protocols share: decode under the
//! memory budget, check, build the batch, hand it to the pipeline), `estimate`
//! (what a protobuf request will take once decoded, read from the wire before
//! decoding), `grpc` and `http` (one listener each), `serve` (the accept loop
//! both use), `status` (`google.rpc.Status` and `RetryInfo`), `error`.

mod error;
mod export;
mod grpc;
mod http;
mod serve;
mod status;

use std::net::SocketAddr;

use proflow_config::{ByteSize, Duration};
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Receiver, ReceiverConfig, Resource, Validate,
};
use proflow_model::otlp::AttributeLabels;
use proflow_net::server::{
    AuthSettings, ServerTlsFiles, ServerTlsSettings, TenantLimiter, TenantLimitsSettings,
};
use serde::{Deserialize, Deserializer};
use std::sync::Arc;

use crate::endpoint::parse_endpoint;

pub use error::OtlpError;
pub use serve::LocalAddrs;
pub use serve::OtlpReceiver;

/// The collector's default gRPC endpoint.
const DEFAULT_GRPC_ENDPOINT: &str = "0.0.0.0:4317";
/// The collector's default HTTP endpoint.
const DEFAULT_HTTP_ENDPOINT: &str = "0.0.0.0:4318";

/// Config of an `otlp` receiver.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OtlpConfig {
    /// The protocols to serve; at least one. A protocol that is not listed is
    /// not served; one listed with nothing under it (`grpc:`) is served with
    /// its defaults, as in the OpenTelemetry Collector.
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    pub protocols: Protocols,
    /// Which resource and scope attributes become series labels (see
    /// [`AttributeLabels`]): `include` (only these keys, all when empty) and
    /// `exclude`. `service.name` always becomes `service_name`.
    #[serde(default, deserialize_with = "proflow_config::null_as_default")]
    pub resource_to_labels: AttributeLabels,
    /// Per-tenant limits of both protocols, with Pyroscope's names (as
    /// `pprof_push`'s, but for its profile limits, refused here); a
    /// tenant past its rate gets 429 (gRPC `RESOURCE_EXHAUSTED`) with the
    /// time to retry.
    pub limits: Option<TenantLimitsSettings>,
}

/// The `protocols` block.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Protocols {
    /// OTLP/gRPC; served when present.
    #[serde(default, deserialize_with = "present_as_default")]
    pub grpc: Option<GrpcConfig>,
    /// OTLP/HTTP; served when present.
    #[serde(default, deserialize_with = "present_as_default")]
    pub http: Option<HttpConfig>,
}

/// A protocol key that is present is served, even with nothing under it.
fn present_as_default<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(|v| Some(v.unwrap_or_default()))
}

/// The `protocols.grpc` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GrpcConfig {
    /// Address to listen on, as `ip:port` (`localhost` is accepted as a
    /// host). Defaults to `0.0.0.0:4317`. Port 0 picks a free port.
    pub endpoint: String,
    /// Largest request message accepted, in MiB, once decompressed (gRPC's
    /// limit; the collector's name and unit); a larger one gets
    /// `RESOURCE_EXHAUSTED`.
    pub max_recv_msg_size_mib: u64,
    /// How long a client may take to send a request's message; a slower
    /// one gets `DEADLINE_EXCEEDED`.
    pub read_timeout: Duration,
    /// Most connections served at once. When all are taken, a new client
    /// makes the connection idle the longest close; while every one is in a
    /// request, new ones wait in the kernel's listen backlog.
    pub max_connections: usize,
    /// How long a connection may stay open without a request in flight;
    /// then it is closed (gRPC clients reconnect by themselves).
    pub idle_timeout: Duration,
    /// Most requests in flight at once on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// TLS: `{cert_file, key_file, client_ca_file, min_version}`.
    pub tls: Option<ServerTlsSettings>,
    /// Credentials every request must carry: `{bearer_tokens_file,
    /// basic_auth: {htpasswd_file}}`; otherwise `UNAUTHENTICATED`.
    pub auth: Option<AuthSettings>,
}

impl GrpcConfig {
    /// `max_recv_msg_size_mib` in bytes.
    fn max_message_bytes(&self) -> usize {
        usize::try_from(self.max_recv_msg_size_mib.min(4095) << 20).unwrap_or(usize::MAX)
    }
}

impl Default for GrpcConfig {
    fn default() -> Self {
        GrpcConfig {
            endpoint: DEFAULT_GRPC_ENDPOINT.to_owned(),
            max_recv_msg_size_mib: 4,
            read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
            max_concurrent_streams: 100,
            tls: None,
            auth: None,
        }
    }
}

/// The `protocols.http` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Address to listen on, as `ip:port` (`localhost` is accepted as a
    /// host). Defaults to `0.0.0.0:4318`. Port 0 picks a free port.
    pub endpoint: String,
    /// Largest request body accepted as it arrives on the wire (before any
    /// decompression); larger requests get 413.
    pub max_request_body_size: ByteSize,
    /// Largest size a gzip body may reach once decompressed; larger gets 413
    /// before more memory is used.
    pub max_decompressed_size: ByteSize,
    /// Largest memory one request's profiles may take once decoded, as
    /// estimated before decoding (protobuf: from the message; JSON: 16 times
    /// its size, what reading JSON may take); a larger one gets 413.
    pub max_decoded_size: ByteSize,
    /// How long a client may take to send a request's headers; a slower one
    /// is disconnected.
    pub read_header_timeout: Duration,
    /// How long a client may take to send a request's body; a slower one
    /// gets 408.
    pub read_timeout: Duration,
    /// Most connections served at once. When all are taken, a new client
    /// makes the connection idle the longest close; while every one is in a
    /// request, new ones wait in the kernel's listen backlog.
    pub max_connections: usize,
    /// How long a connection may stay open without a request in flight;
    /// then it is closed (gRPC clients reconnect by themselves).
    pub idle_timeout: Duration,
    /// Most requests in flight at once on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// TLS: `{cert_file, key_file, client_ca_file, min_version}`.
    pub tls: Option<ServerTlsSettings>,
    /// Credentials every request must carry: `{bearer_tokens_file,
    /// basic_auth: {htpasswd_file}}`; otherwise 401, the body unread.
    pub auth: Option<AuthSettings>,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            endpoint: DEFAULT_HTTP_ENDPOINT.to_owned(),
            max_request_body_size: ByteSize::mib(4),
            max_decompressed_size: ByteSize::mib(16),
            max_decoded_size: ByteSize::mib(64),
            read_header_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
            max_concurrent_streams: 100,
            tls: None,
            auth: None,
        }
    }
}

fn positive_size(problems: &mut Vec<FieldError>, path: String, value: ByteSize, example: &str) {
    if value.bytes() == 0 {
        problems.push(FieldError::new(
            path,
            format!("must be more than 0, such as {example}"),
        ));
    }
}

fn positive_duration(problems: &mut Vec<FieldError>, path: String, value: Duration) {
    if value.is_zero() {
        problems.push(FieldError::new(
            path,
            "must be more than 0, such as 10s: without it a client that stops sending holds its connection and memory forever",
        ));
    }
}

impl Validate for OtlpConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        let Protocols { grpc, http } = &self.protocols;
        if grpc.is_none() && http.is_none() {
            problems.push(FieldError::new(
                "protocols",
                "must list at least one protocol: grpc, http or both (such as `protocols: {grpc: , http: }` for the defaults)",
            ));
        }
        if let Some(g) = grpc {
            let p = |f: &str| format!("protocols.grpc.{f}");
            if let Err(message) = parse_endpoint(&g.endpoint) {
                problems.push(FieldError::new(p("endpoint"), message));
            }
            if g.max_recv_msg_size_mib == 0 || g.max_recv_msg_size_mib >= 4096 {
                problems.push(FieldError::new(
                    p("max_recv_msg_size_mib"),
                    "must be from 1 to 4095 (MiB; a gRPC message cannot reach 4GiB); the default is 4",
                ));
            }
            positive_duration(&mut problems, p("read_timeout"), g.read_timeout);
            if g.max_connections == 0 {
                problems.push(FieldError::new(
                    p("max_connections"),
                    "must be at least 1, such as 1024",
                ));
            }
            positive_duration(&mut problems, p("idle_timeout"), g.idle_timeout);
            if g.max_concurrent_streams == 0 {
                problems.push(FieldError::new(
                    p("max_concurrent_streams"),
                    "must be at least 1, such as 100",
                ));
            }
            if let Some(tls) = &g.tls {
                problems.extend(tls.problems(&p("tls")));
            }
            if let Some(auth) = &g.auth {
                problems.extend(auth.problems(&p("auth")));
            }
        }
        if let Some(h) = http {
            let p = |f: &str| format!("protocols.http.{f}");
            if let Err(message) = parse_endpoint(&h.endpoint) {
                problems.push(FieldError::new(p("endpoint"), message));
            }
            positive_size(
                &mut problems,
                p("max_request_body_size"),
                h.max_request_body_size,
                "4MiB",
            );
            positive_size(
                &mut problems,
                p("max_decoded_size"),
                h.max_decoded_size,
                "64MiB",
            );
            if h.max_decompressed_size.bytes() == 0 {
                positive_size(
                    &mut problems,
                    p("max_decompressed_size"),
                    h.max_decompressed_size,
                    "16MiB",
                );
            } else if h.max_decompressed_size < h.max_request_body_size {
                problems.push(FieldError::new(
                    p("max_decompressed_size"),
                    format!(
                        "must be at least max_request_body_size ({}); raise it or lower max_request_body_size",
                        h.max_request_body_size
                    ),
                ));
            }
            positive_duration(
                &mut problems,
                p("read_header_timeout"),
                h.read_header_timeout,
            );
            positive_duration(&mut problems, p("read_timeout"), h.read_timeout);
            if h.max_connections == 0 {
                problems.push(FieldError::new(
                    p("max_connections"),
                    "must be at least 1, such as 1024",
                ));
            }
            positive_duration(&mut problems, p("idle_timeout"), h.idle_timeout);
            if h.max_concurrent_streams == 0 {
                problems.push(FieldError::new(
                    p("max_concurrent_streams"),
                    "must be at least 1, such as 100",
                ));
            }
            if let Some(tls) = &h.tls {
                problems.extend(tls.problems(&p("tls")));
            }
            if let Some(auth) = &h.auth {
                problems.extend(auth.problems(&p("auth")));
            }
        }
        if let (Some(g), Some(h)) = (grpc, http)
            && let (Ok(a), Ok(b)) = (parse_endpoint(&g.endpoint), parse_endpoint(&h.endpoint))
            && a == b
            && a.port() != 0
        {
            problems.push(FieldError::new(
                "protocols.http.endpoint",
                format!("is {a}, the same as protocols.grpc.endpoint; give each protocol its own port (the defaults are 4317 for grpc and 4318 for http)"),
            ));
        }
        if let Some(limits) = &self.limits {
            problems.extend(limits.problems("limits"));
            if limits.limits_profiles() {
                problems.push(FieldError::new(
                    "limits",
                    "max_profile_size_bytes, max_profile_stacktrace_samples, max_profile_stacktrace_depth and max_profile_stacktrace_sample_labels are applied by the pprof_push receiver only; remove them here",
                ));
            }
        }
        problems
    }
}

impl OtlpConfig {
    /// Builds the concrete receiver. [`ReceiverConfig::build`] boxes this;
    /// tests and embedders keep the concrete type to learn the bound
    /// addresses through [`OtlpReceiver::local_addrs`].
    pub fn build_receiver(&self, ctx: &BuildContext) -> Result<OtlpReceiver, BuildError> {
        let endpoint = |e: &str| -> Result<SocketAddr, BuildError> {
            parse_endpoint(e).map_err(|e| BuildError::new(format!("receiver `{}`: {e}", ctx.id)))
        };
        let grpc = match &self.protocols.grpc {
            Some(g) => Some(grpc::Settings {
                endpoint: endpoint(&g.endpoint)?,
                max_message: g.max_message_bytes(),
                read_timeout: g.read_timeout.get(),
                max_connections: g.max_connections,
                idle_timeout: g.idle_timeout.get(),
                max_concurrent_streams: g.max_concurrent_streams,
                tls: g.tls.clone(),
                auth: g.auth.clone(),
            }),
            None => None,
        };
        let http = match &self.protocols.http {
            Some(h) => Some(http::Settings {
                endpoint: endpoint(&h.endpoint)?,
                max_request_body: h.max_request_body_size.as_usize(),
                max_decompressed: h.max_decompressed_size.as_usize(),
                max_decoded: h.max_decoded_size.as_usize(),
                read_header_timeout: h.read_header_timeout.get(),
                read_timeout: h.read_timeout.get(),
                max_connections: h.max_connections,
                idle_timeout: h.idle_timeout.get(),
                max_concurrent_streams: h.max_concurrent_streams,
                tls: h.tls.clone(),
                auth: h.auth.clone(),
            }),
            None => None,
        };
        Ok(OtlpReceiver::new(
            grpc,
            http,
            self.resource_to_labels.clone(),
            self.limits
                .clone()
                .filter(TenantLimitsSettings::limits_anything)
                .map(|l| Arc::new(TenantLimiter::new(l))),
        ))
    }
}

impl ReceiverConfig for OtlpConfig {
    fn resources(&self) -> Vec<Resource> {
        // Port 0 asks the OS for a fresh port and can never collide.
        let grpc = self.protocols.grpc.as_ref().map(|g| g.endpoint.as_str());
        let http = self.protocols.http.as_ref().map(|h| h.endpoint.as_str());
        grpc.into_iter()
            .chain(http)
            .filter_map(|e| parse_endpoint(e).ok())
            .filter(|a| a.port() != 0)
            .map(Resource::TcpListen)
            .collect()
    }

    /// OTLP traces feed the span index of a `traces` pipeline's processors.
    fn accepts_spans(&self) -> bool {
        true
    }

    fn max_request_memory(&self) -> usize {
        // gRPC: tonic holds the message as it arrived and decompressed
        // (protobuf is checked on the wire, never decoded). HTTP: the body,
        // what it decompresses to, and for JSON the decoded profiles.
        let grpc = self
            .protocols
            .grpc
            .as_ref()
            .map_or(0, |g| g.max_message_bytes().saturating_mul(2));
        let http = self.protocols.http.as_ref().map_or(0, |h| {
            h.max_request_body_size
                .as_usize()
                .saturating_add(h.max_decompressed_size.as_usize())
                .saturating_add(h.max_decoded_size.as_usize())
        });
        grpc.max(http)
    }

    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Receiver>, BuildError> {
        Ok(Box::new(self.build_receiver(ctx)?))
    }
}

/// Entry points for the fuzz targets in `fuzz/`: a request body, run the
/// way both protocols run it. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::Bytes;
    use proflow_model::memory::MemoryBudget;
    use proflow_model::otlp::{AttributeLabels, Split};

    use super::export::{self, Encoding};

    /// Most bytes a gzip body may inflate to here.
    pub const MAX_INFLATED: usize = 1 << 20;

    /// A profiles request body: inflated first when `gzip` (as OTLP/HTTP's
    /// `Content-Encoding: gzip`), then split into envelopes as the handler
    /// does. `Err` is the refusal's message.
    pub fn export(body: &[u8], json: bool, gzip: bool) -> Result<Split, String> {
        let body = if gzip {
            let budget = MemoryBudget::new(4 * MAX_INFLATED);
            let mut grant = budget.grant();
            let inflated = super::http::inflate(body, MAX_INFLATED, &mut grant);
            // What the output holds is granted, and never more than the limit.
            assert!(budget.in_flight() <= 4 * MAX_INFLATED);
            match &inflated {
                Ok(out) => {
                    assert!(out.len() <= MAX_INFLATED, "inflated past the limit");
                    assert!(grant.held() >= out.capacity(), "an ungranted allocation");
                }
                Err(_) => assert_eq!(grant.held(), 0, "a refusal kept its grant"),
            }
            drop(grant);
            assert_eq!(budget.in_flight(), 0, "a grant was not given back");
            Bytes::from(inflated.map_err(|e| e.to_string())?)
        } else {
            Bytes::copy_from_slice(body)
        };
        let encoding = if json {
            Encoding::Json
        } else {
            Encoding::Protobuf
        };
        export::split(&body, encoding, &AttributeLabels::default()).map_err(|r| r.error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_config::Node;
    use proflow_core::registry::Kind;

    fn parse(yaml: &str) -> Result<OtlpConfig, Vec<String>> {
        let factory = crate::factories()
            .into_iter()
            .find(|f| f.kind == Kind::Receiver && f.type_name == "otlp")
            .expect("factory is registered");
        let node = Node::parse(yaml).map_err(|e| vec![e.to_string()])?;
        factory.parse(&node, "receivers.otlp").map_err(|errors| {
            errors
                .into_iter()
                .map(|e| e.to_string())
                .collect::<Vec<_>>()
        })?;
        proflow_config::from_node(&node, "receivers.otlp").map_err(|e| vec![e.to_string()])
    }

    #[test]
    fn a_listed_protocol_without_settings_gets_the_collector_defaults() {
        let c = parse("protocols:\n  grpc:\n  http:\n").unwrap();
        assert_eq!(c.protocols.grpc, Some(GrpcConfig::default()));
        assert_eq!(c.protocols.http, Some(HttpConfig::default()));
        assert_eq!(
            c.resources(),
            vec![
                Resource::TcpListen("0.0.0.0:4317".parse().unwrap()),
                Resource::TcpListen("0.0.0.0:4318".parse().unwrap()),
            ]
        );
        // The worst request: HTTP's 4 MiB body, 16 MiB decompressed, 64 MiB decoded.
        assert_eq!(c.max_request_memory(), (4 + 16 + 64) << 20);
        let c = parse("protocols: {grpc: {}}").unwrap();
        assert_eq!(c.protocols.http, None, "an unlisted protocol is off");
        assert_eq!(c.max_request_memory(), (4 + 4) << 20);
    }

    #[test]
    fn fields_are_read_and_unknown_fields_refused() {
        let c = parse(
            "protocols:\n  grpc: {endpoint: 127.0.0.1:5317, max_recv_msg_size_mib: 1}\n  http: {endpoint: localhost:5318, max_request_body_size: 2MiB}\nresource_to_labels: {include: [host.name], exclude: [process.pid]}\n",
        )
        .unwrap();
        let g = c.protocols.grpc.as_ref().unwrap();
        assert_eq!(g.max_message_bytes(), 1 << 20);
        assert_eq!(
            c.protocols.http.as_ref().unwrap().max_request_body_size,
            ByteSize::mib(2)
        );
        assert_eq!(c.resource_to_labels.include, vec!["host.name".to_owned()]);
        assert_eq!(c.resource_to_labels.exclude, vec!["process.pid".to_owned()]);
        let errors = parse("protocols: {grpc: {max_recv_msg_size: 4MiB}}").unwrap_err();
        assert!(
            errors.iter().any(|e| e.contains("max_recv_msg_size")),
            "{errors:?}"
        );
        let errors = parse("protocols: {thrift: {}}").unwrap_err();
        assert!(errors.iter().any(|e| e.contains("thrift")), "{errors:?}");
    }

    #[test]
    fn validation_reports_every_problem() {
        let errors = parse("protocols: {}").unwrap_err();
        assert!(errors[0].contains("at least one protocol"), "{errors:?}");
        let errors = parse(
            "protocols:\n  grpc: {endpoint: example.com:1, max_recv_msg_size_mib: 0}\n  http: {max_request_body_size: 8MiB, max_decompressed_size: 4MiB, read_timeout: 0}\n",
        )
        .unwrap_err();
        assert_eq!(errors.len(), 4, "{errors:?}");
        let errors = parse(
            "protocols:\n  grpc: {endpoint: 127.0.0.1:7000}\n  http: {endpoint: 127.0.0.1:7000}\n",
        )
        .unwrap_err();
        assert!(errors[0].contains("its own port"), "{errors:?}");
    }

    #[test]
    fn port_zero_claims_nothing() {
        let c = parse("protocols: {grpc: {endpoint: 127.0.0.1:0}, http: {endpoint: 127.0.0.1:0}}")
            .unwrap();
        assert!(c.validate().is_empty());
        assert!(c.resources().is_empty());
    }
}
