//! `tls` of a server (a receiver's listener, the telemetry address) and of
//! a client (every component that connects out), with the OpenTelemetry
//! Collector's field names. The files are loaded (and a server's watched)
//! by `proflow_net`.

use std::path::PathBuf;

use serde::Deserialize;

use crate::validate::FieldError;

/// The oldest TLS version a listener accepts.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
pub enum TlsVersion {
    #[serde(rename = "1.2")]
    #[default]
    Tls12,
    #[serde(rename = "1.3")]
    Tls13,
}

/// `tls` of a server.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ServerTlsSettings {
    /// PEM certificate chain the server presents.
    pub cert_file: PathBuf,
    /// PEM private key of `cert_file`.
    pub key_file: PathBuf,
    /// PEM CA certificates; when set, clients must present a certificate
    /// signed by one of them (mutual TLS).
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// `"1.2"` (default) or `"1.3"`.
    #[serde(default)]
    pub min_version: TlsVersion,
}

/// `tls` (`tls_config` in a scrape job) of a component that connects out:
/// the files and switch every client takes, declared once. The exporters
/// embed it beside gRPC's `insecure`; the scrape receiver, its discovery
/// and Kafka take it as it is. Loaded by `proflow_net::tls`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct ClientTlsSettings {
    /// PEM CA certificates that sign the peer's certificate; replace the
    /// system's roots. Unset: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate chain, for peers that want mutual TLS; needs
    /// `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Accept any peer certificate (still encrypted, not authenticated).
    /// For tests only.
    pub insecure_skip_verify: bool,
}

impl ClientTlsSettings {
    /// Whether any file is named.
    pub fn has_files(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// Every problem, each under `prefix` (`tls`, `tls_config`, …).
    pub fn problems(&self, prefix: &str) -> Vec<FieldError> {
        let mut problems = Vec::new();
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => problems.push(FieldError::new(
                format!("{prefix}.key_file"),
                format!(
                    "must be set with `{prefix}.cert_file`: a client certificate needs its key"
                ),
            )),
            (None, Some(_)) => problems.push(FieldError::new(
                format!("{prefix}.cert_file"),
                format!("must be set with `{prefix}.key_file`: a key needs its certificate"),
            )),
            _ => {}
        }
        if self.insecure_skip_verify && self.ca_file.is_some() {
            problems.push(FieldError::new(
                format!("{prefix}.insecure_skip_verify"),
                format!(
                    "makes `{prefix}.ca_file` unused: verification is skipped; remove one of them"
                ),
            ));
        }
        problems
    }
}
