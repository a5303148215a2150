//! Certificates made at test time (rcgen): a CA, a server certificate for
//! `localhost` and `127.0.0.1` signed by it, a client certificate signed by
//! it, and an unrelated CA; all as PEM files in a temporary directory.

use std::path::PathBuf;

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

pub struct Pki {
    pub dir: tempfile::TempDir,
}

impl Pki {
    pub fn new() -> Pki {
        let ca = |name: &str| {
            let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
            params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            params
                .distinguished_name
                .push(rcgen::DnType::CommonName, name);
            CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap()
        };
        let ours = ca("proflow test CA");
        let other = ca("some other CA");
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", ours.pem());
        write("other-ca.pem", other.pem());
        let server_key = KeyPair::generate().unwrap();
        let server = CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&server_key, &ours)
            .unwrap();
        write("server.pem", server.pem());
        write("server-key.pem", server_key.serialize_pem());
        let client_key = KeyPair::generate().unwrap();
        let mut client_params = CertificateParams::new(vec!["client".to_owned()]).unwrap();
        client_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "proflow test client");
        let client = client_params.signed_by(&client_key, &ours).unwrap();
        write("client.pem", client.pem());
        write("client-key.pem", client_key.serialize_pem());
        Pki { dir }
    }

    /// The path of one of the files: `ca.pem`, `other-ca.pem`, `server.pem`,
    /// `server-key.pem`, `client.pem`, `client-key.pem`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// `tls:` YAML (flow style) serving the server certificate; with the
    /// client CA when `mtls`.
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
}
