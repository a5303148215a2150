//! `tls` of a listener: rustls with a certificate and key, optionally
//! requiring client certificates signed by `client_ca_file` (mutual TLS),
//! from `min_version` on. The files are read again when they change (checked
//! every [`RELOAD_EVERY`]), so a renewed certificate is served without a
//! restart; a change that does not load is logged and the previous setup
//! stays.

use std::path::Path;
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use tokio_util::sync::CancellationToken;

use proflow_config::FieldError;

pub use super::watch::RELOAD_EVERY;

pub use proflow_config::{ServerTlsSettings, TlsVersion};

/// Loading and checking a server's TLS files.
pub trait ServerTlsFiles {
    /// Every problem, under `prefix` (`tls`, `grpc.tls`, …): the files are
    /// loaded once, so a missing or broken file fails validation.
    fn problems(&self, prefix: &str) -> Vec<FieldError>;
    /// The rustls config these files make, or the field at fault and why.
    fn load(&self) -> Result<ServerConfig, (&'static str, String)>;
    /// The files to watch.
    fn files(&self) -> Vec<&Path>;
}

impl ServerTlsFiles for ServerTlsSettings {
    fn problems(&self, prefix: &str) -> Vec<FieldError> {
        match self.load() {
            Ok(_) => Vec::new(),
            Err((field, message)) => vec![FieldError::new(format!("{prefix}.{field}"), message)],
        }
    }

    fn load(&self) -> Result<ServerConfig, (&'static str, String)> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let versions: &[&rustls::SupportedProtocolVersion] = match self.min_version {
            TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .map_err(|e| ("min_version", format!("TLS setup failed: {e}")))?;
        let builder = match &self.client_ca_file {
            Some(path) => {
                let mut roots = rustls::RootCertStore::empty();
                for cert in certs(path).map_err(|e| ("client_ca_file", e))? {
                    roots.add(cert).map_err(|e| {
                        (
                            "client_ca_file",
                            format!("`{}`: a certificate is not usable: {e}", path.display()),
                        )
                    })?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                        .build()
                        .map_err(|e| ("client_ca_file", format!("`{}`: {e}", path.display())))?;
                builder.with_client_cert_verifier(verifier)
            }
            None => builder.with_no_client_auth(),
        };
        let chain = certs(&self.cert_file).map_err(|e| ("cert_file", e))?;
        let key = PrivateKeyDer::from_pem_file(&self.key_file).map_err(|e| {
            (
                "key_file",
                format!(
                    "`{}`: no usable PEM private key: {e}",
                    self.key_file.display()
                ),
            )
        })?;
        let mut config = builder.with_single_cert(chain, key).map_err(|e| {
            (
                "key_file",
                format!("cert_file and key_file do not make a certificate: {e}"),
            )
        })?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(config)
    }

    fn files(&self) -> Vec<&Path> {
        let mut out = vec![self.cert_file.as_path(), self.key_file.as_path()];
        out.extend(self.client_ca_file.as_deref());
        out
    }
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("`{}`: not PEM certificates: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("`{}` holds no PEM certificate", path.display()));
    }
    Ok(certs)
}

/// The TLS of a running listener: the current rustls config, replaced when
/// the files change.
#[derive(Debug)]
pub struct ServerTls {
    settings: ServerTlsSettings,
    /// For HTTP/1 and HTTP/2 listeners, and for HTTP/2-only ones (gRPC:
    /// ALPN offers `h2` alone, so a client that cannot speak it fails the
    /// handshake instead of getting a broken connection).
    current: RwLock<(Arc<ServerConfig>, Arc<ServerConfig>)>,
}

/// Both configs of one load: ALPN `h2, http/1.1` and `h2` alone.
fn both(config: ServerConfig) -> (Arc<ServerConfig>, Arc<ServerConfig>) {
    let mut h2 = config.clone();
    h2.alpn_protocols = vec![b"h2".to_vec()];
    (Arc::new(config), Arc::new(h2))
}

impl ServerTls {
    /// Loads the files (errors name the field) and starts watching them
    /// until `stop`.
    pub fn start(
        settings: ServerTlsSettings,
        what: &str,
        stop: CancellationToken,
    ) -> Result<Arc<ServerTls>, String> {
        // Stamped before reading, so a change made meanwhile is seen.
        let stamped = super::watch::stamps(&settings.files());
        let config = settings
            .load()
            .map_err(|(field, e)| format!("tls.{field}: {e}"))?;
        let tls = Arc::new(ServerTls {
            settings,
            current: RwLock::new(both(config)),
        });
        let watched = tls.clone();
        let what = what.to_owned();
        super::watch::watch_files(&tls.settings.files(), stamped, stop, move || match watched
            .settings
            .load()
        {
            Ok(config) => {
                *watched
                    .current
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = both(config);
                tracing::info!(listener = %what, "TLS certificate files changed; new connections use them");
            }
            Err((field, e)) => {
                tracing::error!(listener = %what, field = %format!("tls.{field}"), error = %e, "TLS files changed but do not load; still serving the previous certificate");
            }
        });
        Ok(tls)
    }

    /// The acceptor for the next connection (of an HTTP/2-only listener
    /// when `h2_only`).
    pub fn acceptor(&self, h2_only: bool) -> tokio_rustls::TlsAcceptor {
        let current = self
            .current
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        tokio_rustls::TlsAcceptor::from(if h2_only {
            current.1.clone()
        } else {
            current.0.clone()
        })
    }
}
