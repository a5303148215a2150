//! Unit tests of the `parca` exporter: config validation, request building
//! (decoded back from the bytes the exporter writes), label rules, and the
//! answers a real Parca cannot be made to give on demand (UNAVAILABLE,
//! RESOURCE_EXHAUSTED with RetryInfo, INVALID_ARGUMENT) from an in-process
//! gRPC peer.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration as StdDuration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Response};
use http_body_util::{BodyExt, Full};
use proflow_config::Node;
use proflow_core::component::{BuildContext, ErrorClass, Exporter, ExporterConfig, Validate};
use proflow_core::registry::{AnyConfig, Factory};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, ExportBatch, Format, Labels, Payload, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};
use prost::Message;
use tokio::net::TcpListener;

use super::wire::{WriteRawRequest, build_request, profile_name, series_labels};
use super::*;
use crate::client::status::RpcStatus;

// ------------------------------------------------------------------ config

fn factory() -> Factory {
    crate::factories()
        .into_iter()
        .find(|f| f.type_name == "parca")
        .expect("parca factory is registered")
}

fn typed(yaml: &str) -> ParcaExporterConfig {
    let node = Node::parse(yaml).expect("test YAML parses");
    proflow_config::from_node(&node, "exporters.parca").expect("test config deserializes")
}

#[test]
fn defaults() {
    let c = typed("endpoint: 127.0.0.1:7070\n");
    assert!(c.normalized, "as Parca's agent sends");
    assert_eq!(c.timeout.get(), StdDuration::from_secs(10));
    assert_eq!(c.wants(), Some(Format::Pprof));
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    assert_eq!(
        c.origin(&mut Vec::new()),
        Some("https://127.0.0.1:7070".parse().unwrap()),
        "bare host:port is TLS unless insecure"
    );
    let c = typed("endpoint: 127.0.0.1:7070\ntls: { insecure: true }\nnormalized: false\n");
    assert!(!c.normalized);
    assert_eq!(
        c.origin(&mut Vec::new()),
        Some("http://127.0.0.1:7070".parse().unwrap())
    );
}

#[test]
fn a_batch_larger_than_parca_takes_is_refused() {
    let c = typed("endpoint: 127.0.0.1:7070\nsending_queue: { batch: { max_bytes: 40MiB } }\n");
    let problems = c.validate();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(problems[0].path, "sending_queue.batch.max_bytes");
    assert!(
        problems[0].message.contains("32 MiB"),
        "{}",
        problems[0].message
    );
    let c = typed("endpoint: 127.0.0.1:7070\nsending_queue: { batch: { max_bytes: 28MiB } }\n");
    assert!(c.validate().is_empty());
}

#[test]
fn every_problem_is_reported() {
    let node = Node::parse(
        "endpoint: 'https://h:7070/x'\n\
         bearer_token: ' '\n\
         bearer_token_file: /t\n\
         headers: { Authorization: x, Content-Type: y, 'bad name': z }\n\
         timeout: 0s\n\
         external_labels: { '1bad': a, __x: b, empty: '', ok: fine }\n\
         tls: { cert_file: /c.pem }\n\
         sending_queue: { queue_size: 0 }\n",
    )
    .unwrap();
    let e = match factory().parse(&node, "exporters.parca") {
        Err(e) => e,
        Ok(AnyConfig::Exporter(_)) => panic!("the config should be refused"),
        Ok(other) => panic!("parca parsed as {other:?}"),
    };
    let paths: Vec<&str> = e.iter().map(|e| e.path.as_str()).collect();
    for want in [
        "exporters.parca.endpoint",
        "exporters.parca.bearer_token",
        "exporters.parca.bearer_token_file",
        "exporters.parca.headers.authorization",
        "exporters.parca.headers.Content-Type",
        "exporters.parca.headers.bad name",
        "exporters.parca.timeout",
        "exporters.parca.external_labels.1bad",
        "exporters.parca.external_labels.__x",
        "exporters.parca.external_labels.empty",
        "exporters.parca.tls.key_file",
        "exporters.parca.sending_queue.queue_size",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
    assert!(
        !paths.contains(&"exporters.parca.external_labels.ok"),
        "{paths:?}"
    );
    let c = typed("endpoint: ''\n");
    let problems = c.validate();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].message.contains("host:port"), "{problems:?}");
    let c = typed("endpoint: https://h:7070\ntls: { insecure: true }\n");
    assert!(
        c.validate().iter().any(|p| p.path == "tls.insecure"),
        "{:?}",
        c.validate()
    );
}

#[test]
fn bearer_token_file_is_read_and_missing_file_fails_the_build() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("token");
    std::fs::write(&path, "s3cret\n").unwrap();
    let c = typed(&format!(
        "endpoint: 127.0.0.1:1\ntls: {{ insecure: true }}\nbearer_token_file: {}\n",
        path.display()
    ));
    let e = c.build_parca(&ctx()).expect("builds");
    assert_eq!(e.headers.get("authorization").unwrap(), "Bearer s3cret");
    let c = typed(&format!(
        "endpoint: 127.0.0.1:1\ntls: {{ insecure: true }}\nbearer_token_file: {}\n",
        dir.path().join("missing").display()
    ));
    let err = c.build_parca(&ctx()).expect_err("no such file");
    assert!(err.to_string().contains("missing"), "{err}");
}

// ------------------------------------------------------------------ request

fn pprof_bytes(funcs: &[&str], value: i64, gzipped: bool) -> Bytes {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_000_000_000, 10_000_000_000)
        .sample_root_first(funcs.iter().copied(), vec![value]);
    let plain = pprof::encode(&b.build());
    if gzipped { pprof::gzip(&plain) } else { plain }
}

fn envelope(labels: &[(&str, &str)], bytes: Bytes) -> Envelope {
    Envelope {
        labels: Labels::from_pairs(labels.iter().copied()),
        start_unix_nanos: 1_000_000_000,
        end_unix_nanos: 11_000_000_000,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: Some(ValueType::new("cpu", "nanoseconds")),
        period: 10_000_000,
        payload: Payload::from_bytes(bytes, 64 << 20),
    }
}

fn label_pairs(s: &wire::RawProfileSeries) -> Vec<(String, String)> {
    s.labels
        .as_ref()
        .map(|l| {
            l.labels
                .iter()
                .map(|l| (l.name.clone(), l.value.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn request_groups_by_label_set_and_carries_the_bytes_as_they_arrived() {
    let a1 = pprof_bytes(&["main", "a"], 1, true);
    let b1 = pprof_bytes(&["main", "b"], 2, false);
    let a2 = pprof_bytes(&["main", "a2"], 3, true);
    let envelopes = vec![
        envelope(
            &[
                ("__name__", "process_cpu"),
                ("service_name", "a"),
                ("__session_id__", "x"),
                ("__delta__", "false"),
            ],
            a1.clone(),
        ),
        envelope(&[("service_name", "b"), ("env", "")], b1.clone()),
        envelope(
            &[("__name__", "process_cpu"), ("service_name", "a")],
            a2.clone(),
        ),
    ];
    let external = vec![
        ("cluster".to_owned(), "eu".to_owned()),
        ("service_name".to_owned(), "ignored".to_owned()),
    ];
    let built = build_request(&envelopes, &external, true);
    assert!(built.refused.is_empty());
    // What goes on the wire, decoded back.
    let bytes = built.request.encode_to_vec();
    let r = WriteRawRequest::decode(bytes.as_slice()).expect("decodes");
    assert!(r.normalized);
    assert_eq!(r.tenant, "");
    assert_eq!(r.series.len(), 2, "two label sets");
    let own = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect()
    };
    assert_eq!(
        label_pairs(&r.series[0]),
        own(&[
            ("__name__", "process_cpu"),
            ("cluster", "eu"),
            ("service_name", "a")
        ]),
        "other `__` labels dropped, external labels added but not over the profile's own"
    );
    assert_eq!(
        label_pairs(&r.series[1]),
        own(&[
            ("__name__", "process_cpu"),
            ("cluster", "eu"),
            ("service_name", "b")
        ]),
        "__name__ from the sample type; empty labels dropped"
    );
    let raw: Vec<&Bytes> = r.series[0].samples.iter().map(|s| &s.raw_profile).collect();
    assert_eq!(raw, vec![&a1, &a2]);
    assert_eq!(r.series[1].samples.len(), 1);
    assert_eq!(
        r.series[1].samples[0].raw_profile, b1,
        "plain pprof stays plain"
    );
    for e in &envelopes {
        assert!(!e.payload.is_decoded(), "no payload was decoded");
    }
}

#[test]
fn profile_names_follow_the_sample_types() {
    let mut e = envelope(&[], Bytes::new());
    assert_eq!(profile_name(&e), "process_cpu");
    e.period_type = None;
    e.sample_types = vec![
        ValueType::new("alloc_objects", "count"),
        ValueType::new("alloc_space", "bytes"),
    ];
    assert_eq!(profile_name(&e), "memory");
    e.sample_types = vec![ValueType::new("goroutine", "count")];
    assert_eq!(profile_name(&e), "goroutine");
    e.sample_types = vec![ValueType::new("contentions", "count")];
    assert_eq!(profile_name(&e), "contentions");
    e.sample_types = vec![ValueType::new("wall-time.x", "ns")];
    assert_eq!(profile_name(&e), "wall_time_x");
    e.sample_types = vec![ValueType::new("9lives", "count")];
    assert_eq!(profile_name(&e), "_9lives");
    e.sample_types.clear();
    assert_eq!(profile_name(&e), "unknown");
    let labels = series_labels(&e, &[]);
    assert_eq!(labels, vec![("__name__".to_owned(), "unknown".to_owned())]);
}

// ------------------------------------------------------------------ peer

/// What the in-process peer answers, in order; OK once the script is empty.
#[derive(Clone)]
enum Reply {
    Ok,
    Error {
        code: i32,
        message: &'static str,
        details: Option<Vec<u8>>,
    },
}

/// A request the peer saw: path, headers and the unframed message.
type Seen = (String, HeaderMap, Vec<u8>);

#[derive(Clone, Default)]
struct Peer {
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Peer {
    fn then(&self, reply: Reply) -> &Self {
        self.script.lock().unwrap().push_back(reply);
        self
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
        let body = body.collect().await.unwrap().to_bytes();
        assert_eq!(body[0], 0, "the request message is not compressed again");
        let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
        self.seen.lock().unwrap().push((
            parts.uri.path().to_owned(),
            parts.headers.clone(),
            body[5..5 + len].to_vec(),
        ));
        let reply = self.script.lock().unwrap().pop_front().unwrap_or(Reply::Ok);
        // Trailers-only answers: the status in the headers.
        let mut r = Response::new(Full::new(Bytes::new()));
        let h = r.headers_mut();
        h.insert("content-type", "application/grpc".parse().unwrap());
        match reply {
            Reply::Ok => {
                h.insert("grpc-status", "0".parse().unwrap());
            }
            Reply::Error {
                code,
                message,
                details,
            } => {
                h.insert("grpc-status", code.to_string().parse().unwrap());
                h.insert("grpc-message", message.parse().unwrap());
                if let Some(d) = details {
                    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(d);
                    h.insert("grpc-status-details-bin", b64.parse().unwrap());
                }
            }
        }
        r
    }
}

fn ctx() -> BuildContext {
    BuildContext {
        id: "parca".into(),
        telemetry: Arc::new(Telemetry::new()),
        memory: proflow_model::memory::MemoryBudget::new(1 << 30),
    }
}

fn exporter(addr: SocketAddr, extra: &str) -> ParcaExporter {
    let c = typed(&format!(
        "endpoint: {addr}\ntls: {{ insecure: true }}\n{extra}"
    ));
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    c.build_parca(&ctx()).expect("builds")
}

fn batch(envelopes: Vec<Envelope>) -> ExportBatch {
    let mut b = ExportBatch::new();
    b.push(
        envelopes,
        Arc::new(BatchMeta {
            receiver: "pprof_push".into(),
            tenant: None,
            tenant_bound: false,
            client: None,
            this_host: false,
        }),
    );
    b
}

#[tokio::test]
async fn write_raw_carries_headers_token_and_series() {
    let peer = Peer::default();
    let addr = peer.start().await;
    let e = exporter(
        addr,
        "bearer_token: tok\nheaders: { x-team: prof }\nexternal_labels: { region: r1 }\n",
    );
    let raw = pprof_bytes(&["main", "hot"], 5, true);
    e.export(&batch(vec![envelope(
        &[("service_name", "s")],
        raw.clone(),
    )]))
    .await
    .expect("delivered");
    let seen = peer.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    let (path, headers, message) = &seen[0];
    assert_eq!(path, WRITE_RAW_PATH);
    assert_eq!(headers.get("authorization").unwrap(), "Bearer tok");
    assert_eq!(headers.get("x-team").unwrap(), "prof");
    let r = WriteRawRequest::decode(message.as_slice()).unwrap();
    assert_eq!(r.series.len(), 1);
    assert_eq!(
        label_pairs(&r.series[0]),
        vec![
            ("__name__".to_owned(), "process_cpu".to_owned()),
            ("region".to_owned(), "r1".to_owned()),
            ("service_name".to_owned(), "s".to_owned()),
        ]
    );
    assert_eq!(r.series[0].samples[0].raw_profile, raw);
}

#[tokio::test]
async fn answers_are_classified_and_invalid_argument_is_permanent() {
    let peer = Peer::default();
    peer.then(Reply::Error {
        code: 14,
        message: "restarting",
        details: None,
    })
    .then(Reply::Error {
        code: 4,
        message: "slow",
        details: None,
    })
    .then(Reply::Error {
        code: 8,
        message: "slow down",
        details: Some(RpcStatus::retry_after_encoded(2)),
    })
    .then(Reply::Error {
        code: 8,
        message: "too large",
        details: None,
    })
    .then(Reply::Error {
        code: 3,
        message: "bad profile",
        details: None,
    })
    .then(Reply::Error {
        code: 3,
        message: "bad profile",
        details: None,
    });
    let addr = peer.start().await;
    let e = exporter(addr, "");
    let b = batch(vec![envelope(
        &[("__name__", "x")],
        pprof_bytes(&["f"], 1, true),
    )]);
    let unavailable = e.export(&b).await.expect_err("UNAVAILABLE");
    assert_eq!(
        unavailable.class,
        ErrorClass::Retryable { retry_after: None }
    );
    assert_eq!(unavailable.reason, "unavailable");
    let deadline = e.export(&b).await.expect_err("DEADLINE_EXCEEDED");
    assert_eq!(deadline.class, ErrorClass::Retryable { retry_after: None });
    let exhausted = e
        .export(&b)
        .await
        .expect_err("RESOURCE_EXHAUSTED + RetryInfo");
    assert_eq!(
        exhausted.class,
        ErrorClass::Retryable {
            retry_after: Some(StdDuration::from_secs(2))
        }
    );
    let too_large = e.export(&b).await.expect_err("RESOURCE_EXHAUSTED alone");
    assert_eq!(too_large.class, ErrorClass::Permanent);
    for _ in 0..2 {
        let invalid = e.export(&b).await.expect_err("INVALID_ARGUMENT");
        assert_eq!(invalid.class, ErrorClass::Permanent);
        assert!(invalid.message.contains("bad profile"), "{invalid:?}");
        assert!(invalid.message.contains("Parca WriteRaw"), "{invalid:?}");
    }
    assert_eq!(
        e.logged.lock().unwrap().len(),
        1,
        "one distinct message remembered"
    );
    e.export(&b).await.expect("then OK");
}

#[tokio::test]
async fn connection_refused_is_retryable() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let e = exporter(addr, "timeout: 2s\n");
    let b = batch(vec![envelope(
        &[("__name__", "x")],
        pprof_bytes(&["f"], 1, true),
    )]);
    let err = e.export(&b).await.expect_err("nobody listens");
    assert!(matches!(err.class, ErrorClass::Retryable { .. }), "{err:?}");
}
