//! What the HTTP exporters (`otlp`, `pyroscope`) share: the rustls client
//! config built from their TLS settings, the hyper-util client on top of it,
//! `Retry-After`, and error chains for messages. Exporters depend on this
//! module, never on each other.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// Longest wait a peer may ask for; a larger `RetryInfo`/`Retry-After` is
/// capped so one odd answer cannot park a queue consumer for hours (the
/// queue's `max_elapsed_time` still applies on top).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(300);

/// An error with its sources, `a: b: c`.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        let text = inner.to_string();
        if !s.contains(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        source = inner.source();
    }
    s
}

/// A `Retry-After` header in delay-seconds form (the HTTP-date form is not
/// read: OTLP peers send seconds, and without it the queue's backoff applies).
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let seconds: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The TLS files and switches an exporter's `tls` block names.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TlsFiles<'a> {
    pub ca_file: Option<&'a Path>,
    pub cert_file: Option<&'a Path>,
    pub key_file: Option<&'a Path>,
    pub insecure_skip_verify: bool,
}

/// The pooled HTTP/1.1 + HTTP/2 (ALPN) client of an HTTP exporter: plain
/// for `http://` URLs, rustls for `https://` ones; connects lazily.
pub(crate) type HttpClient = Client<HttpsConnector<HttpConnector>, Full<Bytes>>;

/// An [`HttpClient`] with `tls` (the roots are loaded only when
/// `uses_tls`); `http2_only` for gRPC (h2c on `http://`, ALPN h2 on TLS).
pub(crate) fn http_client(
    tls: &TlsFiles<'_>,
    uses_tls: bool,
    connect_timeout: Duration,
    http2_only: bool,
) -> Result<HttpClient, String> {
    let config = client_tls_config(tls, uses_tls)?;
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    http.set_connect_timeout(Some(connect_timeout));
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_or_http();
    let connector = if http2_only {
        builder.enable_http2().wrap_connector(http)
    } else {
        builder.enable_all_versions().wrap_connector(http)
    };
    Ok(Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_timer(TokioTimer::new())
        .http2_only(http2_only)
        .build(connector))
}

/// The rustls client config of the peer: the CA file's roots (else the
/// system's), an optional client certificate, or no verification at all when
/// `insecure_skip_verify`. `uses_tls` false: the roots are not even loaded.
pub(crate) fn client_tls_config(
    tls: &TlsFiles<'_>,
    uses_tls: bool,
) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?;
    let builder = if tls.insecure_skip_verify {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification {
                algorithms: provider.signature_verification_algorithms,
            }))
    } else {
        let mut roots = RootCertStore::empty();
        match tls.ca_file {
            Some(path) => {
                for cert in read_certs(path, "tls.ca_file")? {
                    roots.add(cert).map_err(|e| {
                        format!(
                            "tls.ca_file `{}`: a certificate is not usable: {e}",
                            path.display()
                        )
                    })?;
                }
            }
            None if uses_tls => {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::warn!(error = %e, "could not load some system CA certificates");
                }
                let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(
                        "no system CA certificates were found: set `tls.ca_file`".to_owned()
                    );
                }
            }
            None => {}
        }
        builder.with_root_certificates(roots)
    };
    match (tls.cert_file, tls.key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "tls.cert_file")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                format!(
                    "tls.key_file `{}`: no usable PEM private key: {e}",
                    key.display()
                )
            })?;
            builder.with_client_auth_cert(chain, key).map_err(|e| {
                format!("tls.cert_file/tls.key_file do not make a client certificate: {e}")
            })
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn read_certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = fs::read(path).map_err(|e| format!("{field} `{}`: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{field} `{}`: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{field} `{}` holds no PEM certificate",
            path.display()
        ));
    }
    Ok(certs)
}

/// `insecure_skip_verify`: accepts any server certificate (signatures of the
/// handshake are still checked, so the connection is encrypted, just not
/// authenticated).
#[derive(Debug)]
struct NoVerification {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
