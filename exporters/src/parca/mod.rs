//! The `parca` exporter: sends profiles to a Parca server with gRPC
//! `parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw`, the call
//! Parca's own scraper uses.
//!
//! - This file: the config, its validation, and [`ParcaExporter::export`].
//! - [`wire`]: the few request messages, written here from their field
//!   numbers, and how one export batch becomes one request ([`wire::build_request`]).
//!
//! The pprof bytes travel as they arrived (gzipped or not: Parca takes
//! both), never decoded or re-encoded; only the small request around them is
//! encoded. One export is one request; envelopes with the same label set
//! become one series with several samples.
//!
//! Labels (Parca's rules): `__name__` names the profile and is required: the
//! envelope's own, else one derived from the sample types
//! ([`wire::profile_name`]). Every other label starting with `__` is dropped,
//! `__delta__` too: Parca decides delta-ness from the pprof's
//! `duration_nanos`, not from a label. `external_labels` are added where the
//! profile does not have the label already (as Prometheus external labels).
//!
//! Failures follow the `otlp` exporter's gRPC classification
//! ([`crate::client::status`]): UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED, ...
//! and RESOURCE_EXHAUSTED with a `RetryInfo` are retried by the queue; all
//! else is permanent. INVALID_ARGUMENT (Parca refusing a profile) is logged
//! once per distinct message.

mod config;
#[cfg(test)]
mod tests;
pub(crate) mod wire;

pub use config::ParcaExporterConfig;

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration as StdDuration;

use async_trait::async_trait;
use bytes::Bytes;
use http::Uri;
use http::header::HeaderMap;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use proflow_core::component::{ExportError, Exporter};
use proflow_model::model::ExportBatch;
use prost::Message;

use crate::client::{self, Connector, status};

/// The gRPC method.
pub const WRITE_RAW_PATH: &str = "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw";

/// Distinct refusal messages remembered for log-once.
const MAX_REMEMBERED_MESSAGES: usize = 256;

/// The running `parca` exporter.
#[derive(Debug)]
pub struct ParcaExporter {
    id: String,
    client: Client<Connector, Full<Bytes>>,
    /// Origin + [`WRITE_RAW_PATH`].
    url: Uri,
    /// The peer as logs and errors show it.
    shown: String,
    /// Configured headers and the bearer token.
    headers: HeaderMap,
    timeout: StdDuration,
    normalized: bool,
    /// Sorted by name.
    external_labels: Vec<(String, String)>,
    /// INVALID_ARGUMENT messages already logged.
    logged: Mutex<HashSet<String>>,
}

impl ParcaExporter {
    /// Sends one encoded `WriteRawRequest`.
    pub(crate) async fn send(&self, message: Bytes) -> Result<(), ExportError> {
        let call = client::unary(
            &self.client,
            &self.url,
            self.headers.clone(),
            message,
            false,
            self.timeout,
        );
        match tokio::time::timeout(self.timeout, call).await {
            Ok(Ok(_answer)) => Ok(()),
            Ok(Err(s)) => {
                if s.code() == tonic::Code::InvalidArgument {
                    self.log_refusal(s.message());
                }
                Err(status::grpc_error(
                    &s,
                    &format!("Parca WriteRaw to {}", self.shown),
                ))
            }
            Err(_) => Err(ExportError::retryable(
                "timeout",
                format!(
                    "Parca WriteRaw to {} got no answer within {:?} (`timeout`)",
                    self.shown, self.timeout
                ),
            )),
        }
    }

    /// Logs a refusal once per distinct message (a bad profile is usually
    /// sent again and again by the same client).
    fn log_refusal(&self, message: &str) {
        let first_time = {
            let mut logged = self.logged.lock().unwrap_or_else(PoisonError::into_inner);
            logged.len() < MAX_REMEMBERED_MESSAGES && logged.insert(message.to_owned())
        };
        if first_time {
            tracing::warn!(
                exporter = %self.id,
                peer = %self.shown,
                error = %message,
                "Parca refused profiles as invalid; they were dropped (this message is logged once)"
            );
        } else {
            tracing::debug!(exporter = %self.id, error = %message, "Parca refused profiles as invalid");
        }
    }
}

#[async_trait]
impl Exporter for ParcaExporter {
    async fn export(&self, batch: &ExportBatch) -> Result<(), ExportError> {
        if batch.is_empty() {
            return Ok(());
        }
        let envelopes = batch.envelopes();
        let built = wire::build_request(envelopes, &self.external_labels, self.normalized);
        let refused_error = |refused: &[(usize, String)]| {
            let (i, why) = &refused[0];
            format!(
                "{} profile(s) have no pprof bytes to send (profile {}: {why}); they were dropped",
                refused.len(),
                envelopes[*i].labels.to_selector_string()
            )
        };
        if built.request.series.is_empty() {
            return Err(ExportError::permanent(
                "encode",
                refused_error(&built.refused),
            ));
        }
        let message = Bytes::from(built.request.encode_to_vec());
        self.send(message).await?;
        if built.refused.is_empty() {
            return Ok(());
        }
        let indexes = built.refused.iter().map(|(i, _)| *i).collect();
        Err(ExportError::partial(
            indexes,
            "encode",
            refused_error(&built.refused),
        ))
    }
}
