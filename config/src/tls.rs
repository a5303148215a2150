//! `tls` of a server (a receiver's listener, the telemetry address): the
//! OpenTelemetry Collector's field names. The files are loaded and watched
//! by `proflow_net::server::tls`.

use std::path::PathBuf;

use serde::Deserialize;

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
