//! TLS for clients, one rustls setup every component uses (exporters to
//! their backends, the scrape receiver to its targets): CA roots from a file
//! or the system, an optional client certificate for mutual TLS, and
//! `insecure_skip_verify` for tests. rustls with ring: no OpenSSL, no C
//! toolchain.
//!
//! Components take [`ClientTlsSettings`] in their configs (as `tls`, or
//! Prometheus's `tls_config`) and pass it here as a [`ClientTls`], which
//! also carries what a kubeconfig gives inline.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use proflow_config::ClientTlsSettings;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};

/// The files and switches of a client's TLS, borrowed from a component's
/// config.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClientTls<'a> {
    /// PEM CA certificates that sign the peer's certificate; replace the
    /// system's roots.
    pub ca_file: Option<&'a Path>,
    /// PEM client certificate chain (mutual TLS); needs `key_file`.
    pub cert_file: Option<&'a Path>,
    /// PEM private key of `cert_file`.
    pub key_file: Option<&'a Path>,
    /// PEM CA certificates given inline (a kubeconfig's
    /// `certificate-authority-data`); added to `ca_file`'s.
    pub ca_pem: Option<&'a [u8]>,
    /// PEM client certificate chain given inline; needs `key_pem`, and
    /// stands in for `cert_file`.
    pub cert_pem: Option<&'a [u8]>,
    /// PEM private key of `cert_pem`, inline.
    pub key_pem: Option<&'a [u8]>,
    /// Accept any server certificate (encrypted, not authenticated).
    pub insecure_skip_verify: bool,
}

impl<'a> From<&'a ClientTlsSettings> for ClientTls<'a> {
    fn from(tls: &'a ClientTlsSettings) -> Self {
        ClientTls {
            ca_file: tls.ca_file.as_deref(),
            cert_file: tls.cert_file.as_deref(),
            key_file: tls.key_file.as_deref(),
            insecure_skip_verify: tls.insecure_skip_verify,
            ..ClientTls::default()
        }
    }
}

/// The rustls client config of a peer: the CA file's roots (else the
/// system's), an optional client certificate, or no verification at all when
/// `insecure_skip_verify`. `uses_tls` false: the roots are not even loaded
/// (a plaintext connection never uses them). Errors name the field
/// (`tls.ca_file`, …) and what to do.
pub fn client_config(tls: &ClientTls<'_>, uses_tls: bool) -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS setup failed: {e}"))?;
    let builder = if tls.insecure_skip_verify {
        tracing::warn!(
            "tls.insecure_skip_verify is on: the peer's certificate is not checked, so anyone on the path can read and change the traffic; use it for tests only, and set tls.ca_file instead"
        );
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(NoVerification {
                algorithms: provider.signature_verification_algorithms,
            }))
    } else {
        let mut roots = RootCertStore::empty();
        if let Some(pem) = tls.ca_pem {
            for cert in parse_certs(pem, "the inline CA data")? {
                roots
                    .add(cert)
                    .map_err(|e| format!("the inline CA data: a certificate is not usable: {e}"))?;
            }
        }
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
            None if tls.ca_pem.is_some() => {}
            None if uses_tls => {
                let found = rustls_native_certs::load_native_certs();
                for e in &found.errors {
                    tracing::warn!(error = %e, "could not load some system CA certificates");
                }
                let (_added, _ignored) = roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(
                        "no system CA certificates were found: set the CA file of this TLS config (`ca_file`)".to_owned()
                    );
                }
            }
            None => {}
        }
        builder.with_root_certificates(roots)
    };
    if let (Some(cert), Some(key)) = (tls.cert_pem, tls.key_pem) {
        let chain = parse_certs(cert, "the inline client certificate data")?;
        let key = PrivateKeyDer::from_pem_slice(key)
            .map_err(|e| format!("the inline client key data: no usable PEM private key: {e}"))?;
        return builder.with_client_auth_cert(chain, key).map_err(|e| {
            format!("the inline client certificate and key do not make a client certificate: {e}")
        });
    }
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

fn parse_certs(pem: &[u8], what: &str) -> Result<Vec<CertificateDer<'static>>, String> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{what}: not PEM certificates: {e}"))?;
    if certs.is_empty() {
        return Err(format!("{what} holds no PEM certificate"));
    }
    Ok(certs)
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
