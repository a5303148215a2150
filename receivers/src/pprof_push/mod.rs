//! The `pprof_push` receiver: accepts profiles the way Grafana Pyroscope does, so
//! Pyroscope clients (pyroscope-go, @pyroscope/nodejs, pyroscope-rs and the
//! agents built on it) can point at proflow unchanged.
//!
//! Endpoints:
//! - `POST /ingest` and `POST /pyroscope/ingest`: the original Pyroscope API.
//!   Query `name=app{k=v,...}`, `from`/`until`, `sampleRate`, `spyName`,
//!   `units`, `aggregationType`, `format`. Bodies: raw pprof (plain or gzip),
//!   `multipart/form-data` with a `profile` part (pyroscope-go, newer nodejs),
//!   folded text (`format=folded`, the default) and `format=lines`.
//! - `POST /push.v1.PusherService/Push`: Connect unary, binary
//!   (`application/proto`) or JSON (`application/json`), optionally gzipped.
//!
//! Each pprof profile becomes one [`Envelope`](proflow_model::model::Envelope)
//! whose payload keeps the bytes as they arrived; only the metadata is scanned.
//! All profiles of one request go to the pipeline as one batch, and the client
//! hears success only once the pipeline took it.
//!
//! Module map: `server` (listener, routes, responses), `ingest` and `push`
//! (one per API), `name`, `timestamp`, `folded`, `multipart`, `labels` and
//! `profile_type` (the parsers and Pyroscope's labelling rules), `budget` (the
//! per-request decompression budget), `error`.

mod budget;
mod error;
mod folded;
mod ingest;
mod jfr;
mod labels;
mod multipart;
mod name;
mod profile_limits;
mod profile_type;
mod push;
mod server;
mod speedscope;
mod timestamp;
mod tree;

use proflow_config::{ByteSize, Duration};
use proflow_core::component::{
    BuildContext, BuildError, FieldError, Receiver, ReceiverConfig, Resource, Validate,
};
use proflow_net::server::{
    AuthSettings, ServerTlsFiles, ServerTlsSettings, TenantLimiter, TenantLimitsSettings,
};
use serde::Deserialize;
use std::sync::Arc;

pub use error::IngestError;
pub use server::{LocalAddr, PprofPushReceiver};

/// The Pyroscope default port.
const DEFAULT_ENDPOINT: &str = "0.0.0.0:4040";

/// Config of a `pprof_push` receiver.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PprofPushConfig {
    /// Address to listen on, as `ip:port` (`localhost` is accepted as a host).
    /// Defaults to `0.0.0.0:4040`, Pyroscope's port. Port 0 picks a free port.
    pub endpoint: String,
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
    /// How long a client may take to send a request's headers (the
    /// OpenTelemetry Collector's name); a slower one is disconnected.
    pub read_header_timeout: Duration,
    /// How long a client may take to send a request's body; a slower one
    /// gets 408, so slow clients cannot hold memory for long.
    pub read_timeout: Duration,
    /// Most connections served at once. When all are taken, a new client
    /// makes the connection idle the longest close; while every one is in a
    /// request, new ones wait in the kernel's listen backlog.
    pub max_connections: usize,
    /// How long a connection may stay open without a request in flight
    /// (between requests, kept alive); then it is closed. Its first request
    /// is due within `read_header_timeout`.
    pub idle_timeout: Duration,
    /// Most requests in flight at once on one HTTP/2 connection.
    pub max_concurrent_streams: u32,
    /// TLS: `{cert_file, key_file, client_ca_file, min_version}`; the files
    /// are read again when they change.
    pub tls: Option<ServerTlsSettings>,
    /// Credentials every request must carry: `{bearer_tokens_file,
    /// basic_auth: {htpasswd_file}}`; otherwise 401, the body unread.
    pub auth: Option<AuthSettings>,
    /// Per-tenant limits with Pyroscope's names and meanings (rate, label,
    /// profile and series limits, and `overrides: {<tenant>: {...}}`; see
    /// the receiver's README); a tenant past its rate gets 429 with
    /// `Retry-After`.
    pub limits: Option<TenantLimitsSettings>,
}

impl Default for PprofPushConfig {
    fn default() -> Self {
        PprofPushConfig {
            endpoint: DEFAULT_ENDPOINT.to_owned(),
            max_request_body_size: ByteSize::mib(16),
            max_decompressed_size: ByteSize::mib(64),
            max_text_stacks: folded::DEFAULT_MAX_STACKS,
            max_text_frames: folded::DEFAULT_MAX_FRAMES,
            read_header_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(30),
            max_connections: 1024,
            idle_timeout: Duration::from_secs(60),
            max_concurrent_streams: 100,
            tls: None,
            auth: None,
            limits: None,
        }
    }
}

pub(crate) use crate::endpoint::parse_endpoint;

impl Validate for PprofPushConfig {
    fn validate(&self) -> Vec<FieldError> {
        let mut problems = Vec::new();
        if let Err(message) = parse_endpoint(&self.endpoint) {
            problems.push(FieldError::new("endpoint", message));
        }
        if self.max_request_body_size.bytes() == 0 {
            problems.push(FieldError::new(
                "max_request_body_size",
                "must be more than 0, such as 16MiB",
            ));
        }
        if self.max_decompressed_size.bytes() == 0 {
            problems.push(FieldError::new(
                "max_decompressed_size",
                "must be more than 0, such as 64MiB",
            ));
        } else if self.max_decompressed_size < self.max_request_body_size {
            // An uncompressed profile that fits the request limit would
            // otherwise still be refused as too large once "decompressed".
            problems.push(FieldError::new(
                "max_decompressed_size",
                format!(
                    "must be at least max_request_body_size ({}); raise it or lower max_request_body_size",
                    self.max_request_body_size
                ),
            ));
        }
        for (name, value) in [
            ("read_header_timeout", self.read_header_timeout),
            ("read_timeout", self.read_timeout),
            ("idle_timeout", self.idle_timeout),
        ] {
            if value.is_zero() {
                problems.push(FieldError::new(
                    name,
                    "must be more than 0, such as 10s: without it a client that stops sending holds its connection and memory forever",
                ));
            }
        }
        for (name, value) in [
            ("max_text_stacks", self.max_text_stacks),
            ("max_text_frames", self.max_text_frames),
        ] {
            if value == 0 {
                problems.push(FieldError::new(name, "must be at least 1, such as 100000"));
            }
        }
        if self.max_concurrent_streams == 0 {
            problems.push(FieldError::new(
                "max_concurrent_streams",
                "must be at least 1, such as 100",
            ));
        }
        if self.max_connections == 0 {
            problems.push(FieldError::new(
                "max_connections",
                "must be at least 1, such as 1024",
            ));
        }
        if let Some(tls) = &self.tls {
            problems.extend(tls.problems("tls"));
        }
        if let Some(auth) = &self.auth {
            problems.extend(auth.problems("auth"));
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
        let endpoint = parse_endpoint(&self.endpoint)
            .map_err(|e| BuildError::new(format!("receiver `{}`: {e}", ctx.id)))?;
        Ok(PprofPushReceiver::new(
            endpoint,
            server::Limits {
                max_request_body: self.max_request_body_size.as_usize(),
                max_decompressed: self.max_decompressed_size.as_usize(),
                text: folded::TextLimits {
                    max_stacks: self.max_text_stacks,
                    max_frames: self.max_text_frames,
                },
                read_header_timeout: self.read_header_timeout.get(),
                read_timeout: self.read_timeout.get(),
                max_connections: self.max_connections,
                idle_timeout: self.idle_timeout.get(),
                max_concurrent_streams: self.max_concurrent_streams,
            },
            self.tls.clone(),
            self.auth.clone(),
            self.limits
                .clone()
                .filter(TenantLimitsSettings::limits_anything)
                .map(|l| Arc::new(TenantLimiter::new(l))),
        ))
    }
}

impl ReceiverConfig for PprofPushConfig {
    fn resources(&self) -> Vec<Resource> {
        match parse_endpoint(&self.endpoint) {
            // Port 0 asks the OS for a fresh port, so it can never collide with
            // another component; claiming it would make two such receivers
            // (common in tests) fail validation for nothing.
            Ok(addr) if addr.port() != 0 => vec![Resource::TcpListen(addr)],
            _ => Vec::new(),
        }
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
    use proflow_config::Node;
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
        assert_eq!(c.endpoint, "0.0.0.0:4040");
        assert_eq!(c.max_request_body_size, ByteSize::mib(16));
        assert_eq!(c.max_decompressed_size, ByteSize::mib(64));
        assert_eq!(c.read_header_timeout, Duration::from_secs(10));
        assert_eq!(c.read_timeout, Duration::from_secs(30));
        assert_eq!(c.max_connections, 1024);
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
            parse_endpoint(&c.endpoint).unwrap().to_string(),
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
            endpoint: "127.0.0.1:0".into(),
            ..PprofPushConfig::default()
        };
        assert!(c.validate().is_empty());
        assert!(c.resources().is_empty());
    }
}

/// Entry points for the fuzz targets in `fuzz/`: every decoder of untrusted
/// bytes, run the way a request runs them. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::Bytes;

    use futures_util::FutureExt;
    use proflow_model::model::Envelope;
    use proflow_model::pprof::Profile;

    use super::budget::DecompressBudget;
    use super::folded::{self, TextFormat};
    use super::ingest::{self, BodyKind};
    use super::jfr;
    use super::multipart::{self, PartLimit};
    use super::profile_type::folded_type;
    use super::push::{self, Codec};

    /// An `/ingest` request: query string and body (multipart is [`multipart`]).
    /// `Err` is the refusal's message.
    pub fn ingest(query: &str, body: &[u8]) -> Result<Vec<Envelope>, String> {
        let uri = format!("/ingest?{query}")
            .parse::<axum::http::Uri>()
            .map_err(|e| e.to_string())?;
        let params =
            ingest::parse_params(&uri, 1_700_000_000_000_000_000).map_err(|e| e.to_string())?;
        let body = Bytes::copy_from_slice(body);
        let mut budget = DecompressBudget::new(1 << 20);
        match ingest::body_kind(&params.format, None).map_err(|e| e.to_string())? {
            BodyKind::Pprof | BodyKind::Multipart => {
                ingest::pprof_batch(&params, body, None, &mut budget)
            }
            BodyKind::Text(format) => ingest::text_batch(
                &params,
                format,
                body,
                Default::default(),
                &mut budget,
                &mut Default::default(),
            ),
            BodyKind::Jfr { .. } => {
                jfr::jfr_batch(&params, body, None, &mut budget, &mut Default::default())
            }
            BodyKind::Speedscope => ingest::speedscope_batch(
                &params,
                body,
                Default::default(),
                &mut budget,
                &mut Default::default(),
            ),
        }
        .map_err(|r| r.error.to_string())
    }

    /// A JFR upload as `/ingest?format=jfr` converts it: the recording and
    /// the agent's labels (empty: none), plain or gzip, within a request's
    /// budget (1 MiB to decompress, 4 MiB of memory). `Err` is the
    /// refusal's message.
    pub fn jfr(recording: &[u8], labels: &[u8]) -> Result<Vec<Envelope>, String> {
        let params = ingest::parse_params(
            &"/ingest?name=fuzz&format=jfr".parse().expect("a valid uri"),
            1_700_000_000_000_000_000,
        )
        .map_err(|e| e.to_string())?;
        let mut budget = DecompressBudget::new(1 << 20);
        let labels = (!labels.is_empty()).then(|| Bytes::copy_from_slice(labels));
        super::jfr::jfr_batch(
            &params,
            Bytes::copy_from_slice(recording),
            labels,
            &mut budget,
            &mut Default::default(),
        )
        .map_err(|r| r.error.to_string())
    }

    /// A speedscope body read as `/ingest?format=speedscope&sampleRate=..`
    /// reads it: per profile its sample rate and its stacks (`;`-joined,
    /// root first) with their values, and what was counted as lost.
    #[allow(clippy::type_complexity)]
    pub fn speedscope(
        body: &[u8],
        sample_rate: u32,
    ) -> Result<
        (
            Vec<(u32, Vec<(String, i64)>)>,
            proflow_model::lost::LostSamples,
        ),
        String,
    > {
        let mut free = |_: usize| -> Result<(), proflow_model::memory::OverBudget> { Ok(()) };
        let profiles =
            super::speedscope::parse(body, sample_rate, folded::TextLimits::default(), &mut free)
                .map_err(|e| e.to_string())?;
        let mut lost = proflow_model::lost::LostSamples::default();
        let out = profiles
            .into_iter()
            .map(|p| {
                lost.merge(&p.stacks.lost);
                let stacks = p
                    .stacks
                    .stacks
                    .into_iter()
                    .map(|(k, v)| (k.into_owned(), v))
                    .collect();
                (p.sample_rate, stacks)
            })
            .collect();
        Ok((out, lost))
    }

    /// A folded (`lines`: lines) text body as a CPU profile sampled at
    /// `sample_rate`, converted as `/ingest` converts it: the stacks read,
    /// the profile made of them, and the samples counted as lost. Every
    /// stack read counts more than zero.
    pub fn folded(
        body: &[u8],
        lines: bool,
        sample_rate: u32,
    ) -> Result<(Profile, proflow_model::lost::LostSamples), String> {
        let format = if lines {
            TextFormat::Lines
        } else {
            TextFormat::Folded
        };
        // What the conversion charges, checked against what it made.
        let charged = std::cell::Cell::new(0usize);
        let mut charge = |n: usize| -> Result<(), proflow_model::memory::OverBudget> {
            charged.set(charged.get() + n);
            Ok(())
        };
        let limits = folded::TextLimits::default();
        let stacks =
            ingest::parse_text(body, format, limits, &mut charge).map_err(|e| e.to_string())?;
        assert!(
            stacks.stacks.iter().all(|(_, count)| *count > 0),
            "a stack read with no samples"
        );
        let ty = folded_type("cpu").ok_or("no cpu type")?;
        let conv = folded::conversion(ty, sample_rate);
        let mut lost = stacks.lost.clone();
        let profile = folded::to_profile(&stacks, &conv, 1, 1, limits, &mut charge, &mut lost)
            .map_err(|e| e.to_string())?;
        // Every frame's name is held twice (the string table and the
        // builder's index); the sample and period type names are not
        // charged (a few constant words).
        let names: usize = profile
            .function
            .iter()
            .map(|f| profile.string(f.name).len())
            .sum();
        assert!(
            charged.get() >= 2 * names,
            "the conversion charged {} bytes for {names} bytes of frame names",
            charged.get()
        );
        Ok((profile, lost))
    }

    /// A `multipart/form-data` body read as `/ingest` reads it, each part at
    /// most `part_limit` bytes: the `profile` and `sample_type_config` parts.
    /// The body is all in memory, so reading never waits.
    pub fn multipart(
        content_type: &str,
        body: &[u8],
        part_limit: usize,
    ) -> Result<(Option<Bytes>, Option<Bytes>), String> {
        let read = multipart::read_form(
            content_type,
            Bytes::copy_from_slice(body),
            PartLimit::RequestBody(part_limit),
        );
        let form = read
            .now_or_never()
            .expect("reading a body in memory waited")
            .map_err(|e| e.to_string())?;
        Ok((form.profile, form.sample_type_config))
    }

    /// A Connect Push body, binary protobuf or JSON. `Err` is the refusal's message.
    pub fn push(json: bool, body: &[u8]) -> Result<Vec<Envelope>, String> {
        let codec = if json { Codec::Json } else { Codec::Proto };
        let request =
            push::decode_request(codec, Bytes::copy_from_slice(body)).map_err(|e| e.to_string())?;
        let mut budget = DecompressBudget::new(1 << 20);
        push::to_batch(request, &mut budget, 1_700_000_000_000_000_000)
            .map_err(|r| r.error.to_string())
    }
}
