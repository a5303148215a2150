//! Unit tests of the `pyroscope` exporter: config validation, label rules,
//! planning, the request bytes (decoded back with the push.v1 messages), and
//! answers a real Pyroscope cannot be made to give on demand (503 with
//! `Retry-After`, a 400 with a message) from an in-process hyper server.

use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use bytes::Bytes;
use http::{Response, StatusCode};
use http_body_util::{BodyExt, Full};
use proflow_config::Node;
use proflow_core::component::{BuildContext, ErrorClass, Exporter};
use proflow_core::registry::Factory;
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, ExportBatch, Labels, Payload, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};
use proflow_model::push_v1::{LabelPair, PushRequest};
use prost::Message;
use tokio::net::TcpListener;

use super::request::{ingest_query, plan, series_labels};
use super::*;

fn typed(yaml: &str) -> PyroscopeExporterConfig {
    let node = Node::parse(yaml).expect("test YAML parses");
    proflow_config::from_node(&node, "exporters.pyroscope").expect("test config deserializes")
}

fn ctx() -> BuildContext {
    BuildContext {
        id: "pyroscope".into(),
        telemetry: Arc::new(Telemetry::new()),
        memory: proflow_model::memory::MemoryBudget::new(1 << 30),
    }
}

fn exporter(yaml: &str) -> PyroscopeExporter {
    let c = typed(yaml);
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    c.build_pyroscope(&ctx()).expect("builds")
}

#[test]
fn is_registered_and_wants_pprof() {
    let f: Factory = crate::factories()
        .into_iter()
        .find(|f| f.type_name == "pyroscope")
        .expect("pyroscope factory is registered");
    assert_eq!(f.type_name, "pyroscope");
    let c = typed("endpoint: http://localhost:4040\n");
    assert_eq!(c.wants(), Some(Format::Pprof));
    assert_eq!(c.api, Api::Push);
    assert_eq!(c.default_service_name, "unknown_service");
    assert_eq!(c.max_batch_bytes, 4 << 20);
}

#[test]
fn a_password_in_the_endpoint_is_refused_and_never_shown() {
    for endpoint in [
        "http://user:PASS@127.0.0.1:4040",
        "https://PASS@pyroscope.example",
    ] {
        let c = typed(&format!("endpoint: {endpoint}\n"));
        let problems = c.validate();
        let shown = format!("{problems:?}");
        assert!(
            problems.iter().any(|p| p.path == "endpoint"),
            "{endpoint}: {shown}"
        );
        assert!(
            shown.contains("<secret>") && !shown.contains("PASS"),
            "{shown}"
        );
        let err = c.build_pyroscope(&ctx()).expect_err("refused");
        assert!(!err.to_string().contains("PASS"), "{err}");
    }
}

#[test]
fn validation_reports_every_problem() {
    let c = typed(
        "endpoint: ftp://x\n\
         basic_auth: { username: '', password: a, password_file: /p }\n\
         bearer_token: t\n\
         tenant_id: ''\n\
         headers: { Content-Type: x, 'bad name': y }\n\
         external_labels: { __x: a, '1a': b, ok: c }\n\
         default_service_name: ''\n\
         max_batch_bytes: 0\n\
         timeout: 0s\n\
         tls: { cert_file: /c, insecure_skip_verify: true, ca_file: /ca }\n",
    );
    let problems = c.validate();
    let paths: Vec<&str> = problems.iter().map(|p| p.path.as_str()).collect();
    for want in [
        "endpoint",
        "basic_auth.username",
        "basic_auth",
        "tenant_id",
        "headers.Content-Type",
        "headers.bad name",
        "external_labels.__x",
        "external_labels.1a",
        "default_service_name",
        "max_batch_bytes",
        "timeout",
        "tls.key_file",
        "tls.insecure_skip_verify",
    ] {
        assert!(paths.contains(&want), "{want} missing from {problems:?}");
    }
    // basic_auth twice: both password fields, and together with bearer_token.
    assert_eq!(paths.iter().filter(|p| **p == "basic_auth").count(), 2);
    assert!(!paths.contains(&"external_labels.ok"));
    let err = c.build_pyroscope(&ctx()).expect_err("invalid config");
    assert!(err.to_string().contains("max_batch_bytes"), "{err}");
    assert!(
        typed("endpoint: https://p.example/prefix/\n")
            .validate()
            .is_empty()
    );
}

#[test]
fn labels_keep_name_and_delta_fill_service_name_and_add_external() {
    let labels = Labels::from_pairs([
        ("__name__", "process_cpu"),
        ("__delta__", "false"),
        ("__session_id__", "s"),
        ("__tenant__", "t"),
        ("env", "prod"),
    ]);
    let external: BTreeMap<String, String> = [("env", "dev"), ("region", "eu")]
        .into_iter()
        .map(|(a, b)| (a.to_owned(), b.to_owned()))
        .collect();
    let got = series_labels(&labels, &external, "fallback");
    let want: Vec<(String, String)> = [
        ("__delta__", "false"),
        ("__name__", "process_cpu"),
        ("env", "prod"),
        ("region", "eu"),
        ("service_name", "fallback"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    assert_eq!(got, want);
    let own = Labels::from_pairs([("__name__", "x"), ("service_name", "mine")]);
    let got = series_labels(&own, &BTreeMap::new(), "fallback");
    assert!(got.contains(&("service_name".into(), "mine".into())));
}

#[test]
fn ingest_query_names_the_app_and_tags() {
    let labels: Vec<(String, String)> = [
        ("__delta__", "false"),
        ("__name__", "process_cpu"),
        ("env", "prod"),
        ("service_name", "my.app"),
    ]
    .into_iter()
    .map(|(a, b)| (a.to_owned(), b.to_owned()))
    .collect();
    let q = ingest_query(&labels, 10_500_000_000, 20_000_000_001).unwrap();
    assert_eq!(
        q,
        "name=my.app%7Benv%3Dprod%7D&from=10&until=21&format=pprof"
    );
    let bad_value = vec![
        ("service_name".to_owned(), "a".to_owned()),
        ("k".to_owned(), "x,y".to_owned()),
    ];
    assert!(ingest_query(&bad_value, 0, 0).is_err());
    let bad_app = vec![("service_name".to_owned(), "a b".to_owned())];
    assert!(ingest_query(&bad_app, 0, 0).is_err());
}

fn gz_pprof(func: &str, value: i64) -> Bytes {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_000_000_000, 10_000_000_000)
        .sample_root_first(["main", func], vec![value]);
    pprof::gzip(&pprof::encode(&b.build()))
}

fn envelope(service: Option<&str>, func: &str, value: i64) -> Envelope {
    let mut labels = Labels::from_pairs([("__name__", "process_cpu")]);
    if let Some(s) = service {
        labels.set("service_name", s);
    }
    Envelope {
        labels,
        start_unix_nanos: 1_000_000_000,
        end_unix_nanos: 11_000_000_000,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: None,
        period: 0,
        payload: Payload::from_bytes(gz_pprof(func, value), 1 << 20),
    }
}

fn meta(tenant: Option<&str>) -> Arc<BatchMeta> {
    Arc::new(BatchMeta {
        receiver: "pprof_push".into(),
        tenant: tenant.map(str::to_owned),
        tenant_bound: false,
        client: None,
        this_host: false,
    })
}

/// A profile whose `__name__` a relabel removed is named from its sample
/// types, as Pyroscope names what it receives.
#[tokio::test]
async fn a_profile_without_a_name_is_named_from_its_sample_types() {
    let peer = Peer::new(vec![(200, vec![], "")]);
    let addr = peer.start().await;
    let exp = exporter(&format!("endpoint: http://{addr}\ncompression: none\n"));
    let mut unnamed = envelope(Some("a"), "f", 1);
    unnamed.labels.remove("__name__");
    let mut batch = ExportBatch::new();
    batch.push(vec![unnamed], meta(None));
    exp.export(&batch).await.expect("sent");
    let seen = peer.seen();
    let push = PushRequest::decode(&seen[0].body[..]).expect("a push request");
    let names: Vec<&str> = push.series[0]
        .labels
        .iter()
        .filter(|l| l.name == "__name__")
        .map(|l| l.value.as_str())
        .collect();
    assert_eq!(names, ["process_cpu"]);
}

#[test]
fn plan_splits_by_tenant_and_bytes() {
    let mut b = ExportBatch::new();
    b.push(
        vec![envelope(Some("a"), "f", 1), envelope(Some("a"), "g", 2)],
        meta(Some("t1")),
    );
    b.push(vec![envelope(Some("a"), "h", 3)], meta(Some("t2")));
    let one = b.envelopes()[0].payload.size_bytes();
    let got = plan(b.sources(), 10 << 20, false, false);
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].indexes, 0..2);
    assert_eq!(got[0].tenant.as_deref(), Some("t1"));
    assert_eq!(got[1].tenant.as_deref(), Some("t2"));
    // A configured tenant_id: one request; a byte cap of one profile: three.
    assert_eq!(plan(b.sources(), 10 << 20, true, false).len(), 1);
    assert_eq!(plan(b.sources(), one, true, false).len(), 3);
    assert_eq!(plan(b.sources(), 10 << 20, true, true).len(), 3, "ingest");
}

/// What the in-process server saw of one request.
#[derive(Debug, Clone)]
struct Seen {
    path_and_query: String,
    headers: http::HeaderMap,
    body: Vec<u8>,
}

/// One canned answer: status, headers, body.
type Answer = (u16, Vec<(&'static str, &'static str)>, &'static str);

/// An in-process peer answering each request with the next of `answers`
/// (the last one repeats), recording what it got.
#[derive(Clone)]
struct Peer {
    answers: Arc<Mutex<Vec<Answer>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Peer {
    fn new(answers: Vec<Answer>) -> Self {
        Peer {
            answers: Arc::new(Mutex::new(answers)),
            seen: Arc::new(Mutex::new(Vec::new())),
        }
    }

    async fn start(&self) -> SocketAddr {
        let peer = self.clone();
        crate::test_peer::listen(move |req| {
            let peer = peer.clone();
            async move { peer.answer(req).await }
        })
        .await
    }

    async fn answer(&self, req: http::Request<hyper::body::Incoming>) -> Response<Full<Bytes>> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes().to_vec();
        self.seen.lock().unwrap().push(Seen {
            path_and_query: parts.uri.path_and_query().unwrap().to_string(),
            headers: parts.headers,
            body,
        });
        let (status, headers, text) = {
            let mut answers = self.answers.lock().unwrap();
            if answers.len() > 1 {
                answers.remove(0)
            } else {
                answers[0].clone()
            }
        };
        let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
        *r.status_mut() = StatusCode::from_u16(status).unwrap();
        for (k, v) in headers {
            r.headers_mut().insert(k, v.parse().unwrap());
        }
        r
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn gunzip(b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(b)
        .read_to_end(&mut out)
        .unwrap();
    out
}

#[tokio::test]
async fn push_request_carries_series_labels_and_the_arrived_bytes() {
    let peer = Peer::new(vec![(200, vec![], "")]);
    let addr = peer.start().await;
    let exp = exporter(&format!(
        "endpoint: http://{addr}/\n\
         external_labels: {{ cluster: c1 }}\n\
         basic_auth: {{ username: u, password: p }}\n"
    ));
    let envs = vec![
        envelope(Some("a"), "f", 1),
        envelope(Some("a"), "g", 2),
        envelope(None, "h", 3),
    ];
    let arrived: Vec<Bytes> = envs
        .iter()
        .map(|e| e.payload.encoded().unwrap().bytes)
        .collect();
    let mut batch = ExportBatch::new();
    batch.push(envs, meta(Some("team-a")));
    exp.export(&batch).await.expect("delivered");
    for e in batch.envelopes() {
        assert!(!e.payload.is_decoded(), "the exporter must not decode");
    }
    let seen = peer.seen();
    assert_eq!(seen.len(), 1);
    let s = &seen[0];
    assert_eq!(s.path_and_query, PUSH_PATH);
    assert_eq!(s.headers["content-type"], "application/proto");
    assert_eq!(s.headers["content-encoding"], "gzip");
    assert_eq!(s.headers["x-scope-orgid"], "team-a");
    assert_eq!(s.headers["authorization"], "Basic dTpw");
    let request = PushRequest::decode(&gunzip(&s.body)[..]).expect("a PushRequest");
    assert_eq!(request.series.len(), 2, "{request:?}");
    let a = &request.series[0];
    assert_eq!(
        a.labels,
        vec![
            LabelPair::new("__name__", "process_cpu"),
            LabelPair::new("cluster", "c1"),
            LabelPair::new("service_name", "a"),
        ]
    );
    assert_eq!(a.samples.len(), 2);
    assert_eq!(
        a.samples[0].raw_profile, arrived[0],
        "bytes as they arrived"
    );
    assert_eq!(a.samples[1].raw_profile, arrived[1]);
    let b = &request.series[1];
    assert!(
        b.labels
            .contains(&LabelPair::new("service_name", "unknown_service"))
    );
    assert_eq!(b.samples[0].raw_profile, arrived[2]);
}

#[tokio::test]
async fn retryable_answers_honour_retry_after_and_permanent_ones_are_logged_once() {
    let peer = Peer::new(vec![
        (503, vec![("retry-after", "7")], "ingester unavailable"),
        (500, vec![], "boom"),
        (429, vec![], "slow down"),
        (
            400,
            vec![("content-type", "application/json")],
            r#"{"code":"invalid_argument","message":"invalid labels: __name__ missing"}"#,
        ),
    ]);
    let addr = peer.start().await;
    let exp = exporter(&format!("endpoint: http://{addr}\ntenant_id: fixed\n"));
    let mut batch = ExportBatch::new();
    batch.push(vec![envelope(Some("a"), "f", 1)], meta(Some("ignored")));

    let e = exp.export(&batch).await.expect_err("503");
    assert_eq!(
        e.class,
        ErrorClass::Retryable {
            retry_after: Some(StdDuration::from_secs(7))
        }
    );
    assert_eq!(e.reason, "unavailable");
    assert!(e.message.contains("ingester unavailable"), "{e:?}");
    let e = exp.export(&batch).await.expect_err("500");
    assert_eq!(e.class, ErrorClass::Retryable { retry_after: None });
    assert_eq!(e.reason, "server_error");
    let e = exp.export(&batch).await.expect_err("429");
    assert_eq!(e.reason, "too_many_requests");
    assert!(matches!(e.class, ErrorClass::Retryable { .. }));
    for _ in 0..2 {
        let e = exp.export(&batch).await.expect_err("400");
        assert_eq!(e.class, ErrorClass::Permanent);
        assert_eq!(e.reason, "bad_request");
        assert!(
            e.message.contains("invalid labels: __name__ missing"),
            "{e:?}"
        );
    }
    assert_eq!(exp.logged.lock().unwrap().len(), 1, "one distinct message");
    for s in peer.seen() {
        assert_eq!(s.headers["x-scope-orgid"], "fixed", "tenant_id wins");
    }
    for s in [429, 500, 502, 503, 504, 599] {
        assert!(status_retryable(s), "{s}");
    }
    for s in [400, 401, 403, 404, 413, 422] {
        assert!(!status_retryable(s), "{s}");
    }
}

#[tokio::test]
async fn ingest_sends_one_profile_a_request_and_refuses_unnamed_profiles() {
    let peer = Peer::new(vec![(200, vec![], "")]);
    let addr = peer.start().await;
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token.path(), "s3cret\n").unwrap();
    let exp = exporter(&format!(
        "endpoint: http://{addr}\napi: ingest\nbearer_token_file: {}\n",
        token.path().display()
    ));
    // No `__name__` and no named sample type: nothing to name it by.
    let mut unnamed = envelope(Some("b"), "g", 2);
    unnamed.labels.remove("__name__");
    unnamed.sample_types = vec![ValueType::new("", "count")];
    let envs = vec![
        envelope(Some("a"), "f", 1),
        unnamed,
        envelope(Some("c"), "h", 3),
    ];
    let arrived = envs[0].payload.encoded().unwrap().bytes;
    let mut batch = ExportBatch::new();
    batch.push(envs, meta(None));
    let e = exp.export(&batch).await.expect_err("one refused");
    assert_eq!(e.refused, Some(vec![1]));
    assert_eq!(e.reason, "no_profile_name");
    let seen = peer.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[0].path_and_query,
        "/ingest?name=a%7B%7D&from=1&until=11&format=pprof"
    );
    assert_eq!(seen[0].headers["authorization"], "Bearer s3cret");
    assert_eq!(
        seen[0].body,
        arrived.to_vec(),
        "the gzip pprof as it arrived"
    );
    assert!(seen[1].path_and_query.starts_with("/ingest?name=c%7B%7D"));
}

#[tokio::test]
async fn nobody_listening_is_retryable() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let exp = exporter(&format!("endpoint: http://{addr}\n"));
    let mut batch = ExportBatch::new();
    batch.push(vec![envelope(Some("a"), "f", 1)], meta(None));
    let e = exp.export(&batch).await.expect_err("refused");
    assert_eq!(e.reason, "unavailable");
    assert!(matches!(e.class, ErrorClass::Retryable { .. }), "{e:?}");
}

#[test]
fn base64_matches_the_rfc_examples() {
    for (plain, encoded) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(base64_encode(plain.as_bytes()), encoded);
    }
}
