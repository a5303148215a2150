//! The `pyroscope` and `parca` exporters' TLS settings against the real
//! servers behind a real TLS front: Debian's nginx terminates TLS with a
//! certificate of the test CA, asks for client certificates of that CA
//! (`ssl_verify_client on`), and passes the requests to the real Pyroscope
//! (HTTP) and the real Parca (gRPC, `grpc_pass` over HTTP/2). Neither server
//! serves TLS itself in its test setup; nginx is what a deployment puts in
//! front of them.
//!
//! One push fans out, per backend, to three exporters told apart by an
//! external label `via`:
//! - `good`: the CA (`tls.ca_file`) and a client certificate of it
//!   (`tls.cert_file`, `tls.key_file`): the profile reaches the server and
//!   reads back with the totals pushed;
//! - `wrong_ca`: another CA: the front's certificate is refused (logged as
//!   `UnknownIssuer`), nothing is sent;
//! - `no_cert`: the CA but no client certificate: the front answers 400
//!   ("No required SSL certificate was sent"), logged by proflow with that
//!   status and by nginx with its reason.
//!
//! The refused exporters retry nothing, so each fails its one profile for
//! good (`proflow_exporter_failed_profiles_total`) and sends none.
//!
//! The `otlp` exporter's TLS against the OpenTelemetry Collector, which
//! serves TLS itself, is in `tests/otlp_exporter.rs`.

mod common;
// Both helper modules include `peer_skip` (one copy each, same skip rules).
#[allow(clippy::duplicate_mod)]
#[path = "common/peer_env.rs"]
mod peer_env;
#[path = "common/readback.rs"]
mod readback;
#[path = "common/tls_front.rs"]
mod tls_front;

use std::time::Duration;

use common::pki::Pki;
use common::{HOT_FUNCTION, Totals, WARM_FUNCTION};
use tls_front::{Server, TlsFront, nginx};

/// How long a server may take to show what it was sent.
const READ_BACK_TIMEOUT: Duration = Duration::from_secs(60);

/// A front with new certificates, asking for client certificates, passing
/// to what `location` says (HTTP/2 for `grpc_pass`); None when nginx is
/// missing (a skip, see `tls_front`).
fn front_of(location: String, http2: bool) -> Option<(Pki, TlsFront)> {
    let nginx = nginx()?;
    let pki = Pki::new();
    let front = TlsFront::start(
        &nginx,
        &pki,
        &[Server {
            client_certs: true,
            http2,
            location,
        }],
    );
    Some((pki, front))
}

/// The `tls:` of each case, by its `via` label.
fn tls_of(pki: &Pki, via: &str) -> String {
    let ca = match via {
        "wrong_ca" => pki.file("other-ca.pem"),
        _ => pki.file("ca.pem"),
    };
    let mut tls = format!("ca_file: {}", ca.display());
    if via != "no_cert" {
        tls.push_str(&format!(
            ", cert_file: {}, key_file: {}",
            pki.file("client.pem").display(),
            pki.file("client-key.pem").display()
        ));
    }
    format!("{{{tls}}}")
}

const CASES: [&str; 3] = ["good", "wrong_ca", "no_cert"];

/// proflow's log as records: a record starts with a timestamp line and
/// takes the lines after it that do not (a server's message may hold line
/// breaks).
fn log_records(log: &str) -> Vec<String> {
    let starts_record = |l: &str| {
        let b = l.as_bytes();
        b.len() > 10 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T'
    };
    let mut records: Vec<String> = Vec::new();
    for line in log.lines() {
        match records.last_mut() {
            Some(last) if !starts_record(line) => {
                last.push('\n');
                last.push_str(line);
            }
            _ => records.push(line.to_owned()),
        }
    }
    records
}

/// Starts proflow with `pprof_push` fanned out to a `file` exporter and one
/// `kind` exporter per case (to `front`'s TLS port), pushes one
/// profile of `app`, and waits until the good case has sent it and the
/// other two have failed it for good. Returns proflow and the totals the
/// `file` exporter wrote.
fn push_through(kind: &str, front: &TlsFront, pki: &Pki, app: &str) -> (common::Proflow, Totals) {
    let endpoint = format!("https://127.0.0.1:{}", front.ports[0]);
    let mut exporters = String::new();
    for via in CASES {
        exporters.push_str(&format!(
            "  {kind}/{via}:\n    endpoint: {endpoint}\n    tls: {}\n    external_labels: {{via: {via}}}\n",
            tls_of(pki, via)
        ));
        if via != "good" {
            exporters.push_str("    retry_on_failure: {enabled: false}\n");
        }
    }
    let names: Vec<String> = CASES.iter().map(|v| format!("{kind}/{v}")).collect();
    let proflow = common::Proflow::start(|ports, profiles| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  file:\n    directory: {}\n{exporters}service:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [pprof_push]\n      exporters: [file, {}]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry,
            names.join(", ")
        )
    });
    common::push_valid(&proflow, app);
    common::wait_one_sent_one_failed(
        &proflow,
        &[&format!("{kind}/good")],
        &[&format!("{kind}/wrong_ca"), &format!("{kind}/no_cert")],
    );
    let log = proflow.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains(&format!("{kind}/wrong_ca")) && l.contains("UnknownIssuer")),
        "the wrong CA's failure should name the unknown issuer:\n{log}"
    );
    // nginx finishes the handshake, answers 400 with its reason in the body
    // and says why in its own log. The exporter's record of it: Pyroscope's
    // logs the status as a field and the body nginx sent; Parca's (gRPC)
    // names the HTTP status it got in place of a gRPC answer.
    let no_cert = format!("exporter={kind}/no_cert ");
    let refusal = log_records(&log).into_iter().find(|r| {
        r.contains(&no_cert)
            && match kind {
                "pyroscope" => {
                    r.contains(" status=400 ") && r.contains("No required SSL certificate was sent")
                }
                _ => r.contains("the peer answered HTTP 400 Bad Request instead of gRPC"),
            }
    });
    assert!(
        refusal.is_some(),
        "the front's 400 for the missing client certificate should be logged for {kind}/no_cert:\n{log}"
    );
    let path = match kind {
        "pyroscope" => "/push.v1.PusherService/Push",
        _ => "/parca.profilestore.v1alpha1.ProfileStoreService/WriteRaw",
    };
    let front_log = front.log_text();
    assert!(
        front_log.lines().any(|l| l.contains(
            "client sent no required SSL certificate while reading client request headers"
        ) && l.contains(&format!("request: \"POST {path} "))),
        "nginx should log the request to {path} without a client certificate:\n{front_log}"
    );
    let mut want = Totals::new();
    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app));
    for e in &entries {
        common::add_function_totals(
            &mut want,
            &common::read_profile(&e.path),
            &[HOT_FUNCTION, WARM_FUNCTION],
            None,
        );
    }
    assert!(!want.is_empty(), "the file exporter wrote {entries:?}");
    (proflow, want)
}

#[test]
fn pyroscope_behind_a_tls_front_takes_the_ca_and_client_certificate_only() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let Some((pki, front)) = front_of(
        format!(
            "proxy_pass http://{}; proxy_http_version 1.1;",
            pyroscope.endpoint()
        ),
        false,
    ) else {
        return;
    };
    let app = common::unique_name("tls-front-pyroscope");
    let (proflow, want) = push_through("pyroscope", &front, &pki, &app);
    let selector = format!("{{service_name=\"{app}\",via=\"good\"}}");
    let (same, got, answer) = readback::pyroscope_wait(
        &common::http_client(),
        &pyroscope.http_base(),
        (
            &selector,
            &[HOT_FUNCTION, WARM_FUNCTION],
            "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        ),
        READ_BACK_TIMEOUT,
        |t| *t == want,
    );
    assert!(
        same,
        "Pyroscope has {got:?} ({answer}) for {selector}; the file exporter wrote {want:?}\nlog:\n{}",
        proflow.log_text()
    );
}

#[test]
fn parca_behind_a_tls_front_takes_the_ca_and_client_certificate_only() {
    let Some(parca) = peer_env::peer("parca") else {
        return;
    };
    let Some((pki, front)) = front_of(format!("grpc_pass grpc://{};", parca.endpoint()), true)
    else {
        return;
    };
    let app = common::unique_name("tls-front-parca");
    let (proflow, want) = push_through("parca", &front, &pki, &app);
    let http = common::http_client();
    let base = parca.http_base();
    let query = format!(
        "process_cpu:cpu:nanoseconds:cpu:nanoseconds:delta{{service_name=\"{app}\",via=\"good\"}}"
    );
    let mut last = String::new();
    let mut got = Totals::new();
    let same = peer_env::poll(READ_BACK_TIMEOUT, || {
        let merged = readback::parca_merge(&http, &base, &query, &mut last)?;
        got = Totals::new();
        common::add_function_totals(&mut got, &merged, &[HOT_FUNCTION, WARM_FUNCTION], None);
        (got == want).then_some(())
    });
    assert!(
        same.is_some(),
        "Parca's merge of {query} has {got:?}, the file exporter wrote {want:?}; last answer: {last}\nlog:\n{}",
        proflow.log_text()
    );
}
