//! The `pprof_push` receiver's config: its keys (the listener's are shared
//! with every receiver that listens), their checks, and the build.

use proflow_config::ByteSize;
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Receiver, ReceiverConfig, Resource, Validate,
};
use proflow_net::server::body::body_size_problems;
use proflow_net::server::{HttpListenerSettings, TenantLimiter, TenantLimitsSettings};
use serde::Deserialize;
use std::sync::Arc;

use super::folded;
use super::server::{self, PprofPushReceiver};

/// The Pyroscope default port.
const DEFAULT_ENDPOINT: &str = "0.0.0.0:4040";

/// Config of a `pprof_push` receiver.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PprofPushConfig {
    /// The listener's keys, written beside this receiver's own: `endpoint`
    /// (default `0.0.0.0:4040`, Pyroscope's port), `read_header_timeout`,
    /// `read_timeout`, `max_connections`, `idle_timeout`,
    /// `max_concurrent_streams`, `tls` and `auth` (see
    /// [`HttpListenerSettings`]).
    #[serde(rename = "__proflow_embedded", default)]
    pub listener: HttpListenerSettings,
    /// Largest request body accepted as it arrives on the wire (before any
    /// decompression); larger requests get 413.
    pub max_request_body_size: ByteSize,
    /// Largest total one request may reach once decompressed: a gzipped body
    /// and every gzipped profile in it share this one budget, and a request
    /// that would grow past it is refused with 413 before more memory is used.
    pub max_decompressed_size: ByteSize,
    /// Most distinct stacks a folded or lines body may hold; a body with
    /// more gets 413.
    pub max_text_stacks: usize,
    /// Most distinct frame names a folded or lines body may hold; a body
    /// with more gets 413.
    pub max_text_frames: usize,
    /// Per-tenant limits with Pyroscope's names and meanings (rate, label,
    /// profile and series limits, and `overrides: {<tenant>: {...}}`; see
    /// the receiver's README); a tenant past its rate gets 429 with
    /// `Retry-After`.
    pub limits: Option<TenantLimitsSettings>,
}

impl Default for PprofPushConfig {
    fn default() -> Self {
        PprofPushConfig {
            listener: HttpListenerSettings::default(),
            max_request_body_size: ByteSize::mib(16),
            max_decompressed_size: ByteSize::mib(64),
            max_text_stacks: folded::DEFAULT_MAX_STACKS,
            max_text_frames: folded::DEFAULT_MAX_FRAMES,
            limits: None,
        }
    }
}

impl Validate for PprofPushConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = self.listener.problems("", DEFAULT_ENDPOINT);
        problems.extend(body_size_problems(
            "",
            self.max_request_body_size,
            self.max_decompressed_size,
            ("16MiB", "64MiB"),
        ));
        for (name, value) in [
            ("max_text_stacks", self.max_text_stacks),
            ("max_text_frames", self.max_text_frames),
        ] {
            if value == 0 {
                problems.push(FieldError::new(name, "must be at least 1, such as 100000"));
            }
        }
        if let Some(limits) = &self.limits {
            problems.extend(limits.problems("limits"));
        }
        problems
    }
}

impl PprofPushConfig {
    /// Builds the concrete receiver. [`ReceiverConfig::build`] boxes this; tests
    /// and embedders keep the concrete type to learn the bound address through
    /// [`PprofPushReceiver::local_addr`].
    pub fn build_receiver(&self, ctx: &BuildContext) -> Result<PprofPushReceiver, BuildError> {
        let endpoint = self
            .listener
            .listener
            .socket_addr(DEFAULT_ENDPOINT)
            .map_err(|e| BuildError::new(format!("receiver `{}`: {e}", ctx.id)))?;
        Ok(PprofPushReceiver::new(
            endpoint,
            self.listener.clone(),
            server::Limits {
                max_request_body: self.max_request_body_size.as_usize(),
                max_decompressed: self.max_decompressed_size.as_usize(),
                text: folded::TextLimits {
                    max_stacks: self.max_text_stacks,
                    max_frames: self.max_text_frames,
                },
                read_timeout: self.listener.listener.read_timeout.get(),
            },
            self.limits
                .clone()
                .filter(TenantLimitsSettings::limits_anything)
                .map(|l| Arc::new(TenantLimiter::new(l))),
        ))
    }
}

impl ReceiverConfig for PprofPushConfig {
    fn resources(&self) -> Vec<Resource> {
        let claimed = self.listener.listener.claimed(DEFAULT_ENDPOINT);
        claimed.into_iter().map(Resource::TcpListen).collect()
    }

    fn max_request_memory(&self) -> usize {
        self.max_request_body_size
            .as_usize()
            .saturating_add(self.max_decompressed_size.as_usize())
    }

    fn build(&self, ctx: &BuildContext) -> Result<Box<dyn Receiver>, BuildError> {
        Ok(Box::new(self.build_receiver(ctx)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_config::{Duration, Node};
    use proflow_core::registry::Kind;

    /// Reads a config body the way the binary does (through the registered
    /// factory, so validation runs), then returns the typed config.
    fn parse(yaml: &str) -> Result<PprofPushConfig, Vec<String>> {
        let factory = crate::factories()
            .into_iter()
            .find(|f| f.kind == Kind::Receiver && f.type_name == "pprof_push")
            .expect("factory is registered");
        let node = Node::parse(yaml).map_err(|e| vec![e.to_string()])?;
        factory
            .parse(&node, "receivers.pprof_push")
            .map_err(|errors| {
                errors
                    .into_iter()
                    .map(|e| e.to_string())
                    .collect::<Vec<_>>()
            })?;
        proflow_config::from_node(&node, "receivers.pprof_push").map_err(|e| vec![e.to_string()])
    }

    #[test]
    fn defaults_match_pyroscope() {
        let c = parse("{}").unwrap();
        assert_eq!(c, PprofPushConfig::default());
        assert_eq!(c.listener.listener.endpoint, None);
        assert_eq!(c.max_request_body_size, ByteSize::mib(16));
        assert_eq!(c.max_decompressed_size, ByteSize::mib(64));
        assert_eq!(c.listener.read_header_timeout, Duration::from_secs(10));
        assert_eq!(c.listener.listener.read_timeout, Duration::from_secs(30));
        assert_eq!(c.listener.listener.max_connections, 1024);
        assert_eq!(c.max_request_memory(), 80 << 20);
        assert_eq!(
            c.resources(),
            vec![Resource::TcpListen("0.0.0.0:4040".parse().unwrap())]
        );
    }

    #[test]
    fn fields_are_read_and_unknown_fields_refused() {
        let c = parse(
            "endpoint: localhost:5050\nmax_request_body_size: 1MiB\nmax_decompressed_size: 2MiB\n",
        )
        .unwrap();
        assert_eq!(
            c.listener
                .listener
                .socket_addr(DEFAULT_ENDPOINT)
                .unwrap()
                .to_string(),
            "127.0.0.1:5050"
        );
        assert_eq!(c.max_request_body_size, ByteSize::mib(1));
        let errors = parse("endpoint: 0.0.0.0:4040\nmax_body: 1MiB\n").unwrap_err();
        assert!(errors.iter().any(|e| e.contains("max_body")), "{errors:?}");
    }

    #[test]
    fn validation_reports_every_problem() {
        let errors =
            parse("endpoint: example.com:80\nmax_request_body_size: 0\nmax_decompressed_size: 0\n")
                .unwrap_err();
        assert_eq!(errors.len(), 3, "{errors:?}");
        assert!(errors[0].contains("endpoint"), "{errors:?}");
        let errors =
            parse("max_request_body_size: 32MiB\nmax_decompressed_size: 16MiB\n").unwrap_err();
        assert!(errors[0].contains("max_decompressed_size"), "{errors:?}");
    }

    #[test]
    fn port_zero_claims_nothing() {
        let c = PprofPushConfig {
            listener: HttpListenerSettings::on("127.0.0.1:0"),
            ..PprofPushConfig::default()
        };
        assert!(c.validate().is_empty());
        assert!(c.resources().is_empty());
    }
}
