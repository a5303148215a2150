//! TLS and authentication on proflow's listeners, with certificates made at
//! test time (rcgen) and curl as the client:
//!
//! - a push over TLS with the CA is accepted and written; plain HTTP on the
//!   TLS port and a client without the CA get nothing;
//! - mutual TLS: a client without a certificate is refused at the handshake,
//!   one with a certificate of the CA is served;
//! - bearer tokens: none or a wrong one gets 401 (counted; a client asking
//!   with `Expect: 100-continue` is never asked for the body); the token file
//!   edited, the new token is accepted within seconds and the old one
//!   refused; a token bound to a tenant writes as that tenant, one bound to
//!   none keeps the client's `X-Scope-OrgID`;
//! - basic auth from an htpasswd file (bcrypt);
//! - the telemetry address over TLS;
//! - a renewed server certificate is served without a restart.
//!
//! The OpenTelemetry Collector as a TLS and token client of the `otlp`
//! receiver is in `tests/otlp_receiver.rs`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::pki::Pki;
use common::{Proflow, gzip};

/// What curl got: its exit code, the HTTP status (0 when none) and the body.
struct Curl {
    exit: i32,
    status: u16,
    body: String,
    stderr: String,
}

fn curl(args: &[&str]) -> Curl {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "10", "-o", "-", "-w", "\n%{http_code}"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or(("", &text));
    Curl {
        exit: out.status.code().unwrap_or(-1),
        status: status.trim().parse().unwrap_or(0),
        body: body.to_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn profile_file(dir: &Path) -> String {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(common::now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "tls_hot"], vec![42_000_000]);
    let path = dir.join("profile.pb.gz");
    std::fs::write(&path, gzip(&proflow_model::pprof::encode(&b.build()))).unwrap();
    path.display().to_string()
}

/// `pprof_push` with `extra` (YAML lines at the receiver's level) → `file`.
fn start(extra: &str) -> Proflow {
    let extra: String = extra.lines().map(|l| format!("    {l}\n")).collect();
    Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n{extra}\
             exporters:\n  file:\n    directory: {}\n\
             service:\n  telemetry:\n    address: {}\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    })
}

fn ingest(p: &Proflow, scheme: &str, app: &str) -> String {
    format!(
        "{scheme}://localhost:{}/ingest?name={app}&format=pprof",
        p.ports.receiver.port()
    )
}

fn post_args(file: &str) -> Vec<&str> {
    vec![
        "-X",
        "POST",
        "-H",
        "content-type: application/octet-stream",
        "--data-binary",
        file,
    ]
}

#[test]
fn a_tls_push_with_the_ca_is_written_and_plain_http_gets_nothing() {
    let pki = Pki::new();
    let p = start(&format!("tls: {}", pki.server_tls(false)));
    let file = format!("@{}", profile_file(p.dir.path()));
    let ca = pki.file("ca.pem").display().to_string();

    let mut args = post_args(&file);
    args.extend(["--cacert", &ca]);
    let url = ingest(&p, "https", "tls-app");
    args.push(&url);
    let ok = curl(&args);
    assert_eq!(ok.status, 200, "TLS push: {} {}", ok.body, ok.stderr);
    let written = p.wait_for_files(1, |e| e.label("service_name") == Some("tls-app"));
    assert_eq!(written.len(), 1);

    // Plain HTTP on the TLS port: no HTTP answer at all.
    let mut args = post_args(&file);
    let url = ingest(&p, "http", "plain-app");
    args.push(&url);
    let plain = curl(&args);
    assert_ne!(
        plain.exit, 0,
        "plain HTTP on a TLS port was answered: {}",
        plain.body
    );
    assert_eq!(plain.status, 0);

    // A client that does not trust the CA refuses the server.
    let other = pki.file("other-ca.pem").display().to_string();
    let mut args = post_args(&file);
    args.extend(["--cacert", &other]);
    let url = ingest(&p, "https", "untrusting-app");
    args.push(&url);
    let untrusting = curl(&args);
    assert_eq!(
        untrusting.exit, 60,
        "curl's certificate error: {}",
        untrusting.stderr
    );

    // Counted by the receiver, not waited for in the files: only the TLS
    // push was ever accepted.
    assert_eq!(
        common::metric_sum(
            &p.metrics(),
            "proflow_receiver_accepted_profiles_total",
            &[]
        ),
        1.0,
        "only the TLS push was accepted"
    );
    assert!(
        common::read_index(&p.profiles)
            .iter()
            .all(|e| e.label("service_name") == Some("tls-app")),
        "only the TLS push was written"
    );
}

#[test]
fn mutual_tls_refuses_a_client_without_a_certificate() {
    let pki = Pki::new();
    let p = start(&format!("tls: {}", pki.server_tls(true)));
    let file = format!("@{}", profile_file(p.dir.path()));
    let ca = pki.file("ca.pem").display().to_string();
    let (cert, key) = (
        pki.file("client.pem").display().to_string(),
        pki.file("client-key.pem").display().to_string(),
    );

    let mut args = post_args(&file);
    args.extend(["--cacert", &ca]);
    let url = ingest(&p, "https", "no-cert-app");
    args.push(&url);
    let refused = curl(&args);
    assert_ne!(
        refused.exit, 0,
        "served without a client certificate: {}",
        refused.body
    );
    assert_eq!(refused.status, 0);

    let mut args = post_args(&file);
    args.extend(["--cacert", &ca, "--cert", &cert, "--key", &key]);
    let url = ingest(&p, "https", "mtls-app");
    args.push(&url);
    let ok = curl(&args);
    assert_eq!(
        ok.status, 200,
        "with a client certificate: {} {}",
        ok.body, ok.stderr
    );
    p.wait_for_files(1, |e| e.label("service_name") == Some("mtls-app"));
}

#[test]
fn tokens_are_checked_before_the_body_and_reloaded_when_the_file_changes() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(
        &tokens,
        "# one per line, then the tenant\ntoken-one\ntoken-team team-t\n",
    )
    .unwrap();
    let p = start(&format!(
        "auth: {{bearer_tokens_file: {}}}",
        tokens.display()
    ));
    let file = format!("@{}", profile_file(p.dir.path()));
    let push = |token: Option<&str>, app: &str| {
        let mut args = post_args(&file);
        let header = token.map(|t| format!("authorization: Bearer {t}"));
        if let Some(h) = &header {
            args.extend(["-H", h]);
        }
        let url = ingest(&p, "http", app);
        args.push(&url);
        curl(&args)
    };
    let none = push(None, "anon");
    assert_eq!(none.status, 401, "{}", none.body);
    assert!(none.body.contains("unauthenticated"), "{}", none.body);
    let wrong = push(Some("nope"), "wrong");
    assert_eq!(wrong.status, 401, "{}", wrong.body);
    assert_eq!(push(Some("token-one"), "good").status, 200);
    assert_eq!(push(Some("token-team"), "teamed").status, 200);
    p.wait_for_files(2, |e| {
        matches!(e.label("service_name"), Some("good" | "teamed"))
    });
    let refused = common::metric_sum(
        &p.metrics(),
        "proflow_receiver_refused_requests_total",
        &[("reason", "unauthenticated")],
    );
    assert_eq!(refused, 2.0);

    // Refused before the body is read: a client that asks first
    // (`Expect: 100-continue`) gets its 401 without being asked for the
    // body, while an accepted one is asked for it.
    let asking = |token: &str, app: &str| {
        let header = format!("authorization: Bearer {token}");
        let url = ingest(&p, "http", app);
        let mut args = vec!["-v", "-H", "expect: 100-continue", "-H", &header];
        args.extend(post_args(&file));
        args.push(&url);
        curl(&args)
    };
    let refused_early = asking("nope", "early");
    assert_eq!(refused_early.status, 401, "{}", refused_early.body);
    assert!(
        !refused_early.stderr.contains("100 Continue"),
        "the body was asked for: {}",
        refused_early.stderr
    );
    let accepted = asking("token-one", "asked");
    assert_eq!(accepted.status, 200, "{}", accepted.body);
    assert!(
        accepted.stderr.contains("100 Continue"),
        "curl -v shows the server asking for the body: {}",
        accepted.stderr
    );

    // The file changes: the new token works within seconds, the old one not.
    std::fs::write(&tokens, "token-two\n").unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = push(Some("token-two"), "rotated");
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 401, "{}", r.body);
        assert!(
            Instant::now() < deadline,
            "the new token was never accepted"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(push(Some("token-one"), "stale").status, 401);
    assert!(
        common::read_index(&p.profiles).iter().all(|e| !matches!(
            e.label("service_name"),
            Some("anon" | "wrong" | "stale" | "early")
        )),
        "nothing refused was written"
    );
}

#[test]
fn a_token_bound_to_a_tenant_writes_as_that_tenant() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens");
    std::fs::write(&tokens, "token-team team-t\ntoken-free\n").unwrap();
    // The tenant reaches exporters in the batch metadata; the `pyroscope`
    // exporter sends it as X-Scope-OrgID, which a second proflow's file
    // exporter does not keep, so the first's own file output is read: the
    // file exporter writes the tenant into its index.
    let p = start(&format!(
        "auth: {{bearer_tokens_file: {}}}",
        tokens.display()
    ));
    let file = format!("@{}", profile_file(p.dir.path()));
    // Pushes as `app` with `token` and the client's `org`; the tenant the
    // file index holds for it.
    let tenant_of = |token: &str, org: &str, app: &str| {
        let (auth, org) = (
            format!("authorization: Bearer {token}"),
            format!("x-scope-orgid: {org}"),
        );
        let url = ingest(&p, "http", app);
        let mut args = post_args(&file);
        args.extend(["-H", &auth, "-H", &org, &url]);
        assert_eq!(curl(&args).status, 200);
        let e = p.wait_for_files(1, |e| e.label("service_name") == Some(app));
        let tenant = e[0]
            .raw
            .get("tenant")
            .and_then(|t| t.as_str())
            .map(str::to_owned);
        (tenant, e[0].raw.to_string())
    };
    let (tenant, entry) = tenant_of("token-team", "someone-else", "tenant-app");
    assert_eq!(tenant.as_deref(), Some("team-t"), "index entry: {entry}");
    // A token bound to no tenant keeps the client's X-Scope-OrgID.
    let (tenant, entry) = tenant_of("token-free", "from-the-client", "free-app");
    assert_eq!(
        tenant.as_deref(),
        Some("from-the-client"),
        "index entry: {entry}"
    );
}

#[test]
fn basic_auth_from_an_htpasswd_file() {
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = dir.path().join("htpasswd");
    // `htpasswd -nbB alice s3cret`, cost 5 to keep the test quick.
    let hash = bcrypt_hash("s3cret");
    std::fs::write(&htpasswd, format!("alice:{hash}\n")).unwrap();
    let p = start(&format!(
        "auth: {{basic_auth: {{htpasswd_file: {}}}}}",
        htpasswd.display()
    ));
    let file = format!("@{}", profile_file(p.dir.path()));
    let push = |user: &str, app: &str| {
        let mut args = post_args(&file);
        args.extend(["-u", user]);
        let url = ingest(&p, "http", app);
        args.push(&url);
        curl(&args).status
    };
    assert_eq!(push("alice:s3cret", "basic-ok"), 200);
    assert_eq!(push("alice:wrong", "basic-wrong"), 401);
    assert_eq!(push("bob:s3cret", "basic-bob"), 401);
    p.wait_for_files(1, |e| e.label("service_name") == Some("basic-ok"));
}

/// The bcrypt hash `htpasswd -nbB` would write (`$2y$`, cost 5 to keep the
/// test quick; a fixed salt, this is a test).
fn bcrypt_hash(password: &str) -> String {
    bcrypt::hash_with_salt(password, 5, [42u8; 16])
        .expect("bcrypt")
        .format_for_version(bcrypt::Version::TwoY)
}

#[test]
fn a_renewed_certificate_is_served_without_a_restart() {
    let first = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (
        dir.path().join("server.pem"),
        dir.path().join("server-key.pem"),
    );
    std::fs::copy(first.file("server.pem"), &cert).unwrap();
    std::fs::copy(first.file("server-key.pem"), &key).unwrap();
    let p = start(&format!(
        "tls: {{cert_file: {}, key_file: {}}}",
        cert.display(),
        key.display()
    ));
    let file = format!("@{}", profile_file(p.dir.path()));
    let push_with = |ca: &Path, app: &str| {
        let ca = ca.display().to_string();
        let mut args = post_args(&file);
        args.extend(["--cacert", &ca]);
        let url = ingest(&p, "https", app);
        args.push(&url);
        curl(&args)
    };
    assert_eq!(push_with(&first.file("ca.pem"), "before").status, 200);
    // A certificate from another CA replaces the files.
    let second = Pki::new();
    std::fs::copy(second.file("server-key.pem"), &key).unwrap();
    std::fs::copy(second.file("server.pem"), &cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while push_with(&second.file("ca.pem"), "after").status != 200 {
        assert!(
            Instant::now() < deadline,
            "the new certificate was not served\n{}",
            p.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_ne!(push_with(&first.file("ca.pem"), "old-ca").exit, 0);
    assert!(p.log_text().contains("TLS certificate files changed"));
}

#[test]
fn the_telemetry_address_serves_over_tls() {
    let pki = Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let telemetry = common::free_port();
    let config = dir.path().join("proflow.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers:\n  pprof_push:\n    endpoint: 127.0.0.1:{}\nexporters:\n  nop: {{}}\n\
             service:\n  telemetry:\n    address: 127.0.0.1:{telemetry}\n    tls: {}\n  \
             pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [nop]\n",
            common::free_port(),
            pki.server_tls(false)
        ),
    )
    .unwrap();
    let log = dir.path().join("proflow.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_proflow"))
        .args(["run", "-c"])
        .arg(&config)
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ca = pki.file("ca.pem").display().to_string();
    let url = format!("https://localhost:{telemetry}/metrics");
    let deadline = Instant::now() + Duration::from_secs(20);
    let got = loop {
        let r = curl(&["--cacert", &ca, &url]);
        if r.status == 200 || Instant::now() >= deadline {
            break r;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let plain = curl(&[&format!("http://localhost:{telemetry}/metrics")]);
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(
        got.status,
        200,
        "{} {}\n{}",
        got.body,
        got.stderr,
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(got.body.contains("proflow_"), "{}", got.body);
    assert_eq!(
        plain.status, 0,
        "plain HTTP answered on the TLS telemetry port"
    );
}
