//! The `otlp` receiver's config: its `protocols` (each embedding the
//! listener settings every receiver that listens shares), their checks, and
//! the build.

use proflow_config::ByteSize;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Receiver, ReceiverConfig, Resource, Validate,
};
use proflow_model::otlp::AttributeLabels;
use proflow_net::server::body::body_size_problems;
use proflow_net::server::{
    HttpListenerSettings, ListenerSettings, TenantLimiter, TenantLimitsSettings,
};
use serde::{Deserialize, Deserializer};
use std::sync::Arc;

use super::serve::OtlpReceiver;
use super::{grpc, http};

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
    /// The listener's keys, written beside this block's own: `endpoint`
    /// (default `0.0.0.0:4317`), `read_timeout` (for a request's message;
    /// a slower one gets `DEADLINE_EXCEEDED`), `max_connections`,
    /// `idle_timeout`, `max_concurrent_streams`, `tls` and `auth` (see
    /// [`ListenerSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub listener: ListenerSettings,
    /// Largest request message accepted, in MiB, once decompressed (gRPC's
    /// limit; the collector's name and unit); a larger one gets
    /// `RESOURCE_EXHAUSTED`.
    pub max_recv_msg_size_mib: u64,
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
            listener: ListenerSettings::default(),
            max_recv_msg_size_mib: 4,
        }
    }
}

/// The `protocols.http` block.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// The listener's keys, written beside this block's own: `endpoint`
    /// (default `0.0.0.0:4318`), `read_header_timeout`, `read_timeout`,
    /// `max_connections`, `idle_timeout`, `max_concurrent_streams`, `tls`
    /// and `auth` (see [`HttpListenerSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub listener: HttpListenerSettings,
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
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listener: HttpListenerSettings::default(),
            max_request_body_size: ByteSize::mib(4),
            max_decompressed_size: ByteSize::mib(16),
            max_decoded_size: ByteSize::mib(64),
        }
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
            problems.extend(g.listener.problems("protocols.grpc", DEFAULT_GRPC_ENDPOINT));
            if g.max_recv_msg_size_mib == 0 || g.max_recv_msg_size_mib >= 4096 {
                problems.push(FieldError::new(
                    "protocols.grpc.max_recv_msg_size_mib",
                    "must be from 1 to 4095 (MiB; a gRPC message cannot reach 4GiB); the default is 4",
                ));
            }
        }
        if let Some(h) = http {
            problems.extend(h.listener.problems("protocols.http", DEFAULT_HTTP_ENDPOINT));
            problems.extend(body_size_problems(
                "protocols.http",
                h.max_request_body_size,
                h.max_decompressed_size,
                ("4MiB", "16MiB"),
            ));
            if h.max_decoded_size.bytes() == 0 {
                problems.push(FieldError::new(
                    "protocols.http.max_decoded_size",
                    "must be more than 0, such as 64MiB",
                ));
            }
        }
        if let (Some(g), Some(h)) = (grpc, http)
            && let (Ok(a), Ok(b)) = (
                g.listener.socket_addr(DEFAULT_GRPC_ENDPOINT),
                h.listener.listener.socket_addr(DEFAULT_HTTP_ENDPOINT),
            )
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
        let refused = |e: String| BuildError::new(format!("receiver `{}`: {e}", ctx.id));
        let grpc = match &self.protocols.grpc {
            Some(g) => Some(grpc::Settings {
                endpoint: g
                    .listener
                    .socket_addr(DEFAULT_GRPC_ENDPOINT)
                    .map_err(refused)?,
                max_message: g.max_message_bytes(),
                listener: g.listener.clone(),
            }),
            None => None,
        };
        let http = match &self.protocols.http {
            Some(h) => Some(http::Settings {
                endpoint: h
                    .listener
                    .listener
                    .socket_addr(DEFAULT_HTTP_ENDPOINT)
                    .map_err(refused)?,
                max_request_body: h.max_request_body_size.as_usize(),
                max_decompressed: h.max_decompressed_size.as_usize(),
                max_decoded: h.max_decoded_size.as_usize(),
                listener: h.listener.clone(),
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
        let grpc =
            (self.protocols.grpc.as_ref()).and_then(|g| g.listener.claimed(DEFAULT_GRPC_ENDPOINT));
        let http = (self.protocols.http.as_ref())
            .and_then(|h| h.listener.listener.claimed(DEFAULT_HTTP_ENDPOINT));
        grpc.into_iter()
            .chain(http)
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
