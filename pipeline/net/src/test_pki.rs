//! Certificates made at test time (rcgen), shared by the tests of every crate
//! (feature `test-pki`, a dev-dependency feature only): a CA, a server
//! certificate for `localhost` and `127.0.0.1` signed by it, a client
//! certificate signed by it, and an unrelated CA; all as PEM files in a
//! temporary directory. Panics on any failure: it serves tests.

use std::path::PathBuf;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

/// The certificates and the directory holding them (removed on drop).
pub struct Pki {
    pub dir: tempfile::TempDir,
    server: (Vec<u8>, Vec<u8>),
}

impl Default for Pki {
    fn default() -> Self {
        Pki::new()
    }
}

impl Pki {
    pub fn new() -> Pki {
        let ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key")).expect("a CA")
        };
        let ours = ca("proflow test CA");
        let other = ca("some other CA");
        let dir = tempfile::tempdir().expect("a temporary directory");
        let write = |name: &str, text: String| {
            std::fs::write(dir.path().join(name), text).expect("write a PEM file")
        };
        write("ca.pem", ours.pem());
        write("other-ca.pem", other.pem());
        let server_key = KeyPair::generate().expect("a key");
        let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .expect("server params")
            .signed_by(&server_key, &ours)
            .expect("a server certificate");
        write("server.pem", server.pem());
        write("server-key.pem", server_key.serialize_pem());
        let client_key = KeyPair::generate().expect("a key");
        let mut client_params =
            CertificateParams::new(vec!["client".to_owned()]).expect("client params");
        client_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "proflow test client");
        let client = client_params
            .signed_by(&client_key, &ours)
            .expect("a client certificate");
        write("client.pem", client.pem());
        write("client-key.pem", client_key.serialize_pem());
        Pki {
            dir,
            server: (server.der().to_vec(), server_key.serialize_der()),
        }
    }

    /// The path of one of the files: `ca.pem`, `other-ca.pem`, `server.pem`,
    /// `server-key.pem`, `client.pem`, `client-key.pem`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `tls:` YAML (flow style) of a proflow listener serving the server
    /// certificate; requiring client certificates of the CA when `mtls`.
    pub fn server_tls(&self, mtls: bool) -> String {
        let mut out = format!(
            "{{cert_file: {}, key_file: {}",
            self.file("server.pem").display(),
            self.file("server-key.pem").display()
        );
        if mtls {
            out.push_str(&format!(
                ", client_ca_file: {}",
                self.file("ca.pem").display()
            ));
        }
        out.push('}');
        out
    }

    /// A rustls server config serving the server certificate (no client
    /// certificates), offering h2 and http/1.1.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![rustls::pki_types::CertificateDer::from(
                    self.server.0.clone(),
                )],
                rustls::pki_types::PrivateKeyDer::try_from(self.server.1.clone())
                    .expect("a private key"),
            )
            .expect("a server config");
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Arc::new(config)
    }
}
