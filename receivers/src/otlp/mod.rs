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
//! Module map: `config` (the receiver's config, its checks and its build),
//! `export` (the handler both protocols share: decode under the
//! memory budget, check, build the batch, hand it to the pipeline), `estimate`
//! (what a protobuf request will take once decoded, read from the wire before
//! decoding), `grpc` and `http` (one listener each), `serve` (the accept loop
//! both use), `status` (`google.rpc.Status` and `RetryInfo`), `error`.

mod config;
mod error;
mod export;
mod grpc;
mod http;
mod serve;
mod status;

pub use config::{GrpcConfig, HttpConfig, OtlpConfig, Protocols};
pub use error::OtlpError;
pub use serve::LocalAddrs;
pub use serve::OtlpReceiver;

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
