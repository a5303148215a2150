//! Debian's nginx as a TLS front for tests: it terminates TLS with the test
//! CA's server certificate (`common::pki`), asks for client certificates of
//! that CA where a server says so, and passes requests to a real server
//! (`proxy_pass`, or `grpc_pass` over HTTP/2). It stands where a deployment
//! puts a TLS proxy in front of a server that serves plain HTTP in the
//! tests' setup (Pyroscope, Parca, a Go program's `net/http/pprof`).
//!
//! nginx comes from `NGINX`, else `/usr/sbin/nginx` (`scripts/test`
//! installs it); without it the test is skipped through the peer-skip rules
//! (under `CI` that fails the run).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;

/// nginx, or a skip (see the module docs).
pub fn nginx() -> Option<PathBuf> {
    let bin = std::env::var_os("NGINX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/sbin/nginx"));
    if bin.is_file() {
        Some(bin)
    } else {
        common::missing_peer(&format!(
            "nginx (the TLS front): {} is missing; apt-get install nginx, or set NGINX",
            bin.display()
        ))
    }
}

/// One TLS listener of the front.
pub struct Server {
    /// Ask for a client certificate of the test CA (`ssl_verify_client on`).
    pub client_certs: bool,
    /// Serve HTTP/2 (for `grpc_pass`).
    pub http2: bool,
    /// The directives of `location /`, e.g. `proxy_pass http://host:port;`.
    pub location: String,
}

/// nginx in the foreground, one free port per [`Server`], killed on drop.
pub struct TlsFront {
    child: Child,
    /// The servers' ports, in the order given.
    pub ports: Vec<u16>,
    pub dir: tempfile::TempDir,
}

impl TlsFront {
    pub fn start(nginx: &Path, pki: &common::pki::Pki, servers: &[Server]) -> TlsFront {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().display();
        let ports: Vec<u16> = servers.iter().map(|_| common::free_port()).collect();
        let mut blocks = String::new();
        for (s, port) in servers.iter().zip(&ports) {
            let mut tls = format!(
                "ssl_certificate {}; ssl_certificate_key {};",
                pki.file("server.pem").display(),
                pki.file("server-key.pem").display()
            );
            if s.client_certs {
                tls.push_str(&format!(
                    " ssl_client_certificate {}; ssl_verify_client on;",
                    pki.file("ca.pem").display()
                ));
            }
            let h2 = if s.http2 { " http2" } else { "" };
            blocks.push_str(&format!(
                "  server {{\n    listen 127.0.0.1:{port} ssl{h2};\n    {tls}\n    location / {{ {} }}\n  }}\n",
                s.location
            ));
        }
        // Workers run as root: the temporary directory is root's.
        let config = format!(
            "user root;\nworker_processes 1;\ndaemon off;\npid {d}/nginx.pid;\nerror_log {d}/error.log info;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log {d}/access.log;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
             fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
             client_max_body_size 16m;\n{blocks}}}\n"
        );
        let conf = dir.path().join("nginx.conf");
        std::fs::write(&conf, &config).unwrap();
        let log = std::fs::File::create(dir.path().join("stderr.log")).unwrap();
        let child = Command::new(nginx)
            .arg("-c")
            .arg(&conf)
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", nginx.display()));
        let mut front = TlsFront { child, ports, dir };
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Ok(Some(status)) = front.child.try_wait() {
                panic!("nginx exited with {status}:\n{}", front.log_text());
            }
            let listening = front
                .ports
                .iter()
                .all(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok());
            if listening {
                return front;
            }
            assert!(
                Instant::now() < deadline,
                "nginx did not listen:\n{}",
                front.log_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn log_text(&self) -> String {
        ["stderr.log", "error.log"]
            .iter()
            .map(|f| std::fs::read_to_string(self.dir.path().join(f)).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for TlsFront {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- nginx log ----\n{}", self.log_text());
        }
    }
}
