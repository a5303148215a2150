//! The `scrape` receiver's `tls_config`, `authorization` and `basic_auth`
//! against a target that demands them: the real Go program serving
//! `net/http/pprof` (`tests/peers/apps/goscrape`) behind Debian's nginx
//! (`tests/common/tls_front.rs`), which asks for TLS, client certificates of the test
//! CA and credentials.

mod common;
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/scrape_support.rs"]
mod scrape_support;
#[path = "common/tls_front.rs"]
mod tls_front;

use std::time::Duration;

use peer_env::go_target;
use scrape_support::{only, start, targets, wait_entries};

/// `tls_config`, `authorization` and `basic_auth` against a target that
/// demands them: goscrape behind nginx, one listener asking for a client
/// certificate of the test CA and a bearer token, one asking for basic auth
/// (an htpasswd file). The jobs with the right settings scrape profiles;
/// a wrong token, a wrong password, a missing client certificate and
/// another CA are refused, each target down with the reason on `/targets`,
/// and nothing of theirs is written.
#[test]
fn tls_client_certificates_and_credentials_against_a_target_that_demands_them() {
    let Some(target) = go_target(&[]) else {
        return;
    };
    let Some(nginx) = tls_front::nginx() else {
        return;
    };
    let pki = common::pki::Pki::new();
    let dir = tempfile::tempdir().unwrap();
    let htpasswd = dir.path().join("htpasswd");
    std::fs::write(&htpasswd, "scraper:{PLAIN}s3cret\n").unwrap();
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, "s3cret").unwrap();
    let token = "scrape-token-1";
    let front = tls_front::TlsFront::start(
        &nginx,
        &pki,
        &[
            tls_front::Server {
                client_certs: true,
                http2: false,
                location: format!(
                    "if ($http_authorization != \"Bearer {token}\") {{ return 401; }} proxy_pass http://{};",
                    target.endpoint
                ),
            },
            tls_front::Server {
                client_certs: false,
                http2: false,
                location: format!(
                    "auth_basic scrape; auth_basic_user_file {}; proxy_pass http://{};",
                    htpasswd.display(),
                    target.endpoint
                ),
            },
        ],
    );
    let (with_cert, with_basic) = (
        format!("127.0.0.1:{}", front.ports[0]),
        format!("127.0.0.1:{}", front.ports[1]),
    );
    let (ca, other_ca, cert, key) = (
        pki.file("ca.pem").display().to_string(),
        pki.file("other-ca.pem").display().to_string(),
        pki.file("client.pem").display().to_string(),
        pki.file("client-key.pem").display().to_string(),
    );
    let job = |name: &str, target: &str, tls: &str, auth: &str| {
        format!(
            "- job_name: {name}\n  scheme: https\n  scrape_interval: 2s\n  scrape_timeout: 2s\n  \
             tls_config: {tls}\n  {auth}\n  static_configs: [{{targets: ['{target}']}}]\n  {}\n",
            only(&["goroutine"])
        )
    };
    let full_tls = format!("{{ca_file: {ca}, cert_file: {cert}, key_file: {key}}}");
    let bearer = format!("authorization: {{credentials: {token}}}");
    let basic = format!(
        "basic_auth: {{username: scraper, password_file: {}}}",
        password_file.display()
    );
    let jobs = [
        job("bearer", &with_cert, &full_tls, &bearer),
        job("basic", &with_basic, &format!("{{ca_file: {ca}}}"), &basic),
        job(
            "wrong_token",
            &with_cert,
            &full_tls,
            "authorization: {credentials: not-the-token}",
        ),
        job(
            "no_cert",
            &with_cert,
            &format!("{{ca_file: {ca}}}"),
            &bearer,
        ),
        job(
            "wrong_password",
            &with_basic,
            &format!("{{ca_file: {ca}}}"),
            "basic_auth: {username: scraper, password: wrong}",
        ),
        job(
            "wrong_ca",
            &with_basic,
            &format!("{{ca_file: {other_ca}}}"),
            &basic,
        ),
    ]
    .concat();
    let proflow = start(&jobs);
    for good in ["bearer", "basic"] {
        wait_entries(&proflow, 1, Duration::from_secs(60), |e| {
            e.label("job") == Some(good)
        });
    }
    let bad = ["wrong_token", "no_cert", "wrong_password", "wrong_ca"];
    let mut metrics = String::new();
    let all_failed = peer_env::poll(Duration::from_secs(60), || {
        metrics = proflow.metrics();
        bad.iter()
            .all(|job| {
                common::metric_sum(
                    &metrics,
                    "proflow_scrape_failures_total",
                    &[("scrape_job", job)],
                ) >= 1.0
            })
            .then_some(())
    });
    assert!(
        all_failed.is_some(),
        "not every refused job failed:\n{metrics}\nlog:\n{}",
        proflow.log_text()
    );
    // Why each is down, as `/targets` says: the front's 401 for a wrong
    // token or password, its 400 without a client certificate, the unknown
    // issuer of its certificate for another CA.
    let page = targets(&proflow);
    let active = page["activeTargets"].as_array().expect("activeTargets");
    for (job, why) in [
        ("bearer", ""),
        ("basic", ""),
        ("wrong_token", "401"),
        ("no_cert", "400"),
        ("wrong_password", "401"),
        ("wrong_ca", "UnknownIssuer"),
    ] {
        let t = active
            .iter()
            .find(|t| t["scrapePool"] == job)
            .unwrap_or_else(|| panic!("no target of {job}: {page}"));
        let error = t["lastError"].as_str().unwrap_or_default();
        if why.is_empty() {
            assert_eq!(t["health"], "up", "{t}");
        } else {
            assert_eq!(t["health"], "down", "{t}");
            assert!(error.contains(why), "{job}: want {why} in {t}");
        }
    }
    let written: Vec<String> = common::read_index(&proflow.profiles)
        .iter()
        .filter_map(|e| e.label("job").map(str::to_owned))
        .filter(|j| bad.contains(&j.as_str()))
        .collect();
    assert!(written.is_empty(), "refused jobs wrote {written:?}");
}
