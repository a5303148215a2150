//! Unit tests of the `otlp` exporter: config validation, request planning,
//! and the transport against an in-process peer (a hyper server speaking
//! gRPC framing and OTLP/HTTP) for answers a real peer cannot be made to
//! give on demand (RESOURCE_EXHAUSTED with RetryInfo, 503, partial success).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::io::Read;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration as StdDuration;

use base64::Engine as _;
use bytes::Bytes;
use http::{HeaderMap, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::{Body, Frame, Incoming};
use proflow_config::Node;
use proflow_core::component::{BuildContext, ErrorClass, ExporterConfig};
use proflow_core::registry::{AnyConfig, Factory};
use proflow_core::telemetry::Telemetry;
use proflow_model::model::{BatchMeta, Envelope, ExportBatch, Labels, Payload, ValueType};
use proflow_model::otlp::collector::{
    ExportProfilesPartialSuccess, ExportProfilesServiceRequest, ExportProfilesServiceResponse,
};
use proflow_model::otlp::{DictionaryBuilder, Lost, OtlpProfiles, pprof_to_otlp};
use proflow_model::pprof::ProfileBuilder;
use prost::Message;
use tokio::net::TcpListener;

use super::transport::EXPORT_PATH;
use super::transport::Wire;
use super::*;
use crate::client::status::RpcStatus;
use proflow_core::component::Validate;
use proflow_model::model::Format;
use proflow_model::otlp::SharedDictionary;

// ------------------------------------------------------------------ config

fn factory() -> Factory {
    crate::factories()
        .into_iter()
        .find(|f| f.type_name == "otlp")
        .expect("otlp factory is registered")
}

fn parse(yaml: &str) -> Result<Arc<dyn ExporterConfig>, Vec<proflow_config::Error>> {
    let node = Node::parse(yaml).expect("test YAML parses");
    match factory().parse(&node, "exporters.otlp")? {
        AnyConfig::Exporter(c) => Ok(c),
        other => panic!("otlp parsed as {other:?}"),
    }
}

fn typed(yaml: &str) -> OtlpExporterConfig {
    let node = Node::parse(yaml).expect("test YAML parses");
    proflow_config::from_node(&node, "exporters.otlp").expect("test config deserializes")
}

#[test]
fn defaults_follow_the_collector() {
    let c = typed("endpoint: 127.0.0.1:4317\n");
    assert_eq!(c.protocol, Protocol::Grpc);
    assert_eq!(c.compression, Compression::Gzip);
    assert_eq!(c.timeout.get(), StdDuration::from_secs(10));
    assert_eq!(c.max_batch_size, 500);
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    assert_eq!(
        c.wire(),
        Ok(Wire::Grpc {
            origin: "https://127.0.0.1:4317".parse().unwrap()
        }),
        "bare host:port is TLS unless insecure"
    );
    assert_eq!(c.wants(), Some(Format::Otlp));
    let c = typed("endpoint: 127.0.0.1:4317\ntls: { insecure: true }\n");
    assert_eq!(
        c.wire(),
        Ok(Wire::Grpc {
            origin: "http://127.0.0.1:4317".parse().unwrap()
        })
    );
    let c = typed("protocol: http\nendpoint: http://h:4040/\nencoding: json\n");
    assert_eq!(
        c.wire(),
        Ok(Wire::Http {
            url: "http://h:4040/v1development/profiles".parse().unwrap(),
            json: true
        }),
        "the path is appended once, like otlphttp"
    );
    let c = typed("protocol: http\nprofiles_endpoint: https://h/custom/path\n");
    assert_eq!(
        c.wire(),
        Ok(Wire::Http {
            url: "https://h/custom/path".parse().unwrap(),
            json: false
        })
    );
}

#[test]
fn every_problem_is_reported() {
    let e = parse(
        "protocol: grpc\n\
         endpoint: 'http://h:4317/v1'\n\
         profiles_endpoint: http://x\n\
         encoding: json\n\
         headers: { Content-Type: text/plain, 'bad name': x, ok: \"line\\nbreak\" }\n\
         timeout: 0s\n\
         max_batch_size: 0\n\
         tls: { cert_file: /c.pem, insecure_skip_verify: true, ca_file: /ca.pem }\n\
         sending_queue: { queue_size: 0 }\n",
    )
    .expect_err("invalid config");
    let paths: Vec<&str> = e.iter().map(|e| e.path.as_str()).collect();
    for want in [
        "exporters.otlp.profiles_endpoint",
        "exporters.otlp.encoding",
        "exporters.otlp.endpoint",
        "exporters.otlp.headers.Content-Type",
        "exporters.otlp.headers.bad name",
        "exporters.otlp.headers.ok",
        "exporters.otlp.timeout",
        "exporters.otlp.max_batch_size",
        "exporters.otlp.tls.key_file",
        "exporters.otlp.tls.insecure_skip_verify",
        "exporters.otlp.sending_queue.queue_size",
    ] {
        assert!(paths.contains(&want), "{want} missing from {paths:?}");
    }
    assert!(e.iter().all(|e| e.line > 0), "{e:?}");
}

#[test]
fn endpoint_and_tls_contradictions_are_reported() {
    let problems = |yaml: &str| -> Vec<String> {
        typed(yaml)
            .validate()
            .into_iter()
            .map(|p| format!("{}: {}", p.path, p.message))
            .collect()
    };
    assert!(problems("protocol: grpc\n")[0].starts_with("endpoint: must be set"));
    assert!(problems("protocol: http\n")[0].starts_with("endpoint: must be set"));
    assert!(
        problems("protocol: http\nendpoint: h:4318\n")[0].contains("URL with its scheme"),
        "http needs a URL"
    );
    assert!(problems("endpoint: ftp://h:1\n")[0].contains("not supported"));
    assert!(
        problems("endpoint: https://h:4317\ntls: { insecure: true }\n")[0]
            .starts_with("tls.insecure:")
    );
    assert!(
        problems("protocol: http\nendpoint: http://h\ntls: { ca_file: /ca.pem }\n")[0]
            .starts_with("tls: ")
    );
    assert!(
        problems("endpoint: h:1\ntls: { insecure: true, insecure_skip_verify: true }\n")[0]
            .starts_with("tls.insecure_skip_verify:")
    );
    let e = parse("endpoint: h:1\nunknown: 1\n").expect_err("unknown field");
    assert!(e[0].message.contains("unknown"), "{e:?}");
}

#[test]
fn unreadable_tls_files_fail_the_build_with_the_path() {
    let c = typed("endpoint: h:4317\ntls: { ca_file: /nonexistent/ca.pem }\n");
    assert!(c.validate().is_empty());
    let err = c.build_otlp(&ctx("otlp")).expect_err("missing CA file");
    assert!(err.0.contains("/nonexistent/ca.pem"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.pem");
    std::fs::write(&empty, "not a certificate").unwrap();
    let c = typed(&format!(
        "endpoint: h:4317\ntls: {{ ca_file: '{}' }}\n",
        empty.display()
    ));
    let err = c
        .build_otlp(&ctx("otlp"))
        .expect_err("no certificate in file");
    assert!(err.0.contains("no PEM certificate"), "{err}");
}

// ------------------------------------------------------------------ plan

fn envelope(service: &str, funcs: &[&str], value: i64) -> Envelope {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    b.sample_root_first(funcs.iter().copied(), vec![value]);
    let mut dict = DictionaryBuilder::new();
    let profiles = pprof_to_otlp(&b.build(), &mut dict, &mut Lost::default()).unwrap();
    let o = OtlpProfiles::decoded(dict.finish(), profiles);
    Envelope {
        labels: Labels::from_pairs([("service_name", service)]),
        start_unix_nanos: 1,
        end_unix_nanos: 2,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: None,
        period: 0,
        payload: Payload::from_otlp(o),
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

fn batch_of(runs: &[(Option<&str>, usize)]) -> ExportBatch {
    let mut b = ExportBatch::new();
    let mut n = 0;
    for (tenant, count) in runs {
        let envs = (0..*count)
            .map(|_| {
                n += 1;
                envelope("svc", &["main", &format!("f{n}")], n)
            })
            .collect();
        b.push(envs, meta(*tenant));
    }
    b
}

#[test]
fn plan_splits_by_tenant_and_size_only() {
    let b = batch_of(&[(Some("a"), 3), (Some("a"), 2), (Some("b"), 1), (None, 2)]);
    let got = plan(b.sources(), 4, false);
    let want = vec![
        Planned {
            tenant: Some("a".into()),
            indexes: 0..4,
        },
        Planned {
            tenant: Some("a".into()),
            indexes: 4..5,
        },
        Planned {
            tenant: Some("b".into()),
            indexes: 5..6,
        },
        Planned {
            tenant: None,
            indexes: 6..8,
        },
    ];
    assert_eq!(got, want);
    // A configured X-Scope-OrgID wins: only the size splits.
    let got = plan(b.sources(), 4, true);
    assert_eq!(
        got.iter().map(|p| p.indexes.clone()).collect::<Vec<_>>(),
        vec![0..4, 4..8]
    );
    assert!(got.iter().all(|p| p.tenant.is_none()));
    // One request when the batch fits.
    assert_eq!(plan(b.sources(), 500, true).len(), 1);
    // An empty tenant is no tenant.
    let b = batch_of(&[(Some(""), 1), (None, 1)]);
    assert_eq!(plan(b.sources(), 10, false).len(), 1);
}

#[test]
fn profiles_of_a_large_dictionary_keep_it_in_a_request_of_their_own() {
    use proflow_model::testdata::otlp_request;
    // Two received requests with large dictionaries (4 services x 2
    // profiles each) between small profiles.
    let large = |b: &mut ExportBatch| {
        let mut r = otlp_request(4, 140, 700);
        let dict = Arc::new(SharedDictionary::from_decoded(
            r.dictionary.take().unwrap_or_default(),
        ));
        assert!(dict.entries() >= PASS_THROUGH_ENTRIES);
        let envs: Vec<Envelope> = r
            .resource_profiles
            .into_iter()
            .flat_map(|rp| rp.scope_profiles)
            .flat_map(|sp| sp.profiles)
            .map(|p| {
                let mut e = envelope("svc", &["main"], 1);
                e.payload =
                    Payload::from_otlp(OtlpProfiles::new(dict.clone(), None, vec![p.into()], 0));
                e
            })
            .collect();
        b.push(envs, meta(None));
    };
    let mut b = ExportBatch::new();
    b.push(
        vec![envelope("svc", &["a"], 1), envelope("svc", &["b"], 2)],
        meta(None),
    );
    large(&mut b);
    large(&mut b);
    b.push(vec![envelope("svc", &["c"], 3)], meta(None));
    let got: Vec<_> = plan(b.sources(), 500, false)
        .into_iter()
        .map(|p| p.indexes)
        .collect();
    assert_eq!(got, vec![0..2, 2..10, 10..18, 18..19]);
}

// ------------------------------------------------------------------ peer

/// What the in-process peer answers to the next request.
#[derive(Debug, Clone)]
enum Reply {
    /// gRPC OK with this partial success.
    GrpcOk(Option<ExportProfilesPartialSuccess>),
    /// A gRPC error status with optional `google.rpc.Status` details.
    GrpcError {
        code: i32,
        message: String,
        details: Option<Vec<u8>>,
    },
    /// An HTTP answer.
    Http {
        status: u16,
        content_type: &'static str,
        retry_after: Option<&'static str>,
        body: Vec<u8>,
    },
}

/// One request the peer saw: path, headers and the request message
/// (unframed and gunzipped).
#[derive(Debug, Clone)]
struct Seen {
    path: String,
    headers: HeaderMap,
    grpc_compressed: bool,
    message: Vec<u8>,
}

#[derive(Clone, Default)]
struct Peer {
    script: Arc<Mutex<VecDeque<Reply>>>,
    seen: Arc<Mutex<Vec<Seen>>>,
}

/// A response body of one data frame and optional trailers (gRPC's shape).
struct Framed {
    frames: VecDeque<Frame<Bytes>>,
}

impl Body for Framed {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.frames.pop_front().map(Ok))
    }
}

fn gunzip(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .read_to_end(&mut out)
        .expect("valid gzip");
    out
}

impl Peer {
    fn then(&self, reply: Reply) -> &Self {
        self.script.lock().unwrap().push_back(reply);
        self
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    async fn start(&self) -> SocketAddr {
        self.start_with(None).await
    }

    /// Serves plaintext, or TLS when given an acceptor.
    async fn start_with(&self, tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let peer = self.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let peer = peer.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    match tls {
                        Some(acceptor) => {
                            // A client that refuses our certificate ends here.
                            if let Ok(stream) = acceptor.accept(stream).await {
                                peer.serve(stream).await;
                            }
                        }
                        None => peer.serve(stream).await,
                    }
                });
            }
        });
        addr
    }

    async fn serve<S>(self, stream: S)
    where
        S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    {
        crate::test_peer::serve(stream, move |req| {
            let peer = self.clone();
            async move { peer.answer(req).await }
        })
        .await;
    }

    async fn answer(&self, req: http::Request<Incoming>) -> Response<Framed> {
        let (parts, body) = req.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        let grpc = parts
            .headers
            .get("content-type")
            .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let (grpc_compressed, message) = if grpc {
            let compressed = body[0] == 1;
            let len = u32::from_be_bytes(body[1..5].try_into().unwrap()) as usize;
            let payload = &body[5..5 + len];
            (
                compressed,
                if compressed {
                    gunzip(payload)
                } else {
                    payload.to_vec()
                },
            )
        } else if parts.headers.get("content-encoding").is_some() {
            (false, gunzip(&body))
        } else {
            (false, body.to_vec())
        };
        self.seen.lock().unwrap().push(Seen {
            path: parts.uri.path().to_owned(),
            headers: parts.headers.clone(),
            grpc_compressed,
            message,
        });
        let reply = self.script.lock().unwrap().pop_front();
        let reply = reply.unwrap_or(if grpc {
            Reply::GrpcOk(None)
        } else {
            Reply::Http {
                status: 200,
                content_type: "application/x-protobuf",
                retry_after: None,
                body: Vec::new(),
            }
        });
        match reply {
            Reply::GrpcOk(partial) => {
                let msg = ExportProfilesServiceResponse {
                    partial_success: partial,
                }
                .encode_to_vec();
                let mut frame = vec![0u8];
                frame.extend_from_slice(&(msg.len() as u32).to_be_bytes());
                frame.extend_from_slice(&msg);
                let mut trailers = HeaderMap::new();
                trailers.insert("grpc-status", "0".parse().unwrap());
                let mut r = Response::new(Framed {
                    frames: VecDeque::from([
                        Frame::data(Bytes::from(frame)),
                        Frame::trailers(trailers),
                    ]),
                });
                r.headers_mut()
                    .insert("content-type", "application/grpc".parse().unwrap());
                r
            }
            Reply::GrpcError {
                code,
                message,
                details,
            } => {
                // Trailers-only response: the status in the headers.
                let mut r = Response::new(Framed {
                    frames: VecDeque::new(),
                });
                let h = r.headers_mut();
                h.insert("content-type", "application/grpc".parse().unwrap());
                h.insert("grpc-status", code.to_string().parse().unwrap());
                h.insert("grpc-message", message.parse().unwrap());
                if let Some(d) = details {
                    let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(d);
                    h.insert("grpc-status-details-bin", b64.parse().unwrap());
                }
                r
            }
            Reply::Http {
                status,
                content_type,
                retry_after,
                body,
            } => {
                let mut r = Response::new(Framed {
                    frames: VecDeque::from([Frame::data(Bytes::from(body))]),
                });
                *r.status_mut() = StatusCode::from_u16(status).unwrap();
                r.headers_mut()
                    .insert("content-type", content_type.parse().unwrap());
                if let Some(ra) = retry_after {
                    r.headers_mut().insert("retry-after", ra.parse().unwrap());
                }
                r
            }
        }
    }
}

fn ctx(id: &str) -> BuildContext {
    BuildContext {
        id: id.into(),
        telemetry: Arc::new(Telemetry::new()),
        memory: proflow_model::memory::MemoryBudget::new(1 << 30),
    }
}

fn exporter(yaml: &str) -> (OtlpExporter, Arc<Telemetry>) {
    let c = typed(yaml);
    assert!(c.validate().is_empty(), "{:?}", c.validate());
    let ctx = ctx("otlp");
    (c.build_otlp(&ctx).expect("builds"), ctx.telemetry)
}

fn decode_request(bytes: &[u8]) -> ExportProfilesServiceRequest {
    ExportProfilesServiceRequest::decode(bytes).expect("a valid ExportProfilesServiceRequest")
}

fn profile_count(r: &ExportProfilesServiceRequest) -> usize {
    r.resource_profiles
        .iter()
        .flat_map(|r| &r.scope_profiles)
        .map(|s| s.profiles.len())
        .sum()
}

/// Every function name the request's samples reach.
fn function_names(r: &ExportProfilesServiceRequest) -> Vec<String> {
    let d = r.dictionary.as_ref().expect("a dictionary");
    let mut names: Vec<String> = d
        .function_table
        .iter()
        .skip(1)
        .map(|f| d.string_table[f.name_strindex as usize].clone())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn grpc_sends_one_request_per_tenant_with_headers_and_gzip() {
    let peer = Peer::default();
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!(
        "endpoint: {addr}\ntls: {{ insecure: true }}\nheaders: {{ Authorization: Bearer t0k }}\n"
    ));
    let batch = batch_of(&[(Some("team-a"), 2), (Some("team-b"), 1), (None, 1)]);
    exp.export(&batch).await.expect("delivered");
    let seen = peer.seen();
    assert_eq!(seen.len(), 3, "one request per tenant run");
    let tenants: Vec<Option<&str>> = seen
        .iter()
        .map(|s| s.headers.get("x-scope-orgid").map(|v| v.to_str().unwrap()))
        .collect();
    assert_eq!(tenants, vec![Some("team-a"), Some("team-b"), None]);
    for s in &seen {
        assert_eq!(s.path, EXPORT_PATH);
        assert_eq!(s.headers["authorization"], "Bearer t0k");
        assert_eq!(s.headers["grpc-encoding"], "gzip");
        assert!(s.grpc_compressed, "gzip is the default");
        assert!(s.headers.contains_key("grpc-timeout"));
    }
    let first = decode_request(&seen[0].message);
    assert_eq!(profile_count(&first), 2);
    assert_eq!(
        function_names(&first),
        vec!["f1", "f2", "main"],
        "one deduplicated dictionary"
    );
    let attrs = &first.resource_profiles[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes;
    assert_eq!(attrs[0].key, "service.name");
}

#[tokio::test]
async fn configured_tenant_header_wins_and_max_batch_size_splits() {
    let peer = Peer::default();
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!(
        "endpoint: http://{addr}\ncompression: none\nmax_batch_size: 2\n\
         headers: {{ X-Scope-OrgID: fixed }}\n"
    ));
    let batch = batch_of(&[(Some("team-a"), 3), (Some("team-b"), 2)]);
    exp.export(&batch).await.expect("delivered");
    let seen = peer.seen();
    let sizes: Vec<usize> = seen
        .iter()
        .map(|s| profile_count(&decode_request(&s.message)))
        .collect();
    assert_eq!(sizes, vec![2, 2, 1]);
    for s in &seen {
        assert_eq!(s.headers["x-scope-orgid"], "fixed");
        assert!(!s.grpc_compressed);
        assert!(!s.headers.contains_key("grpc-encoding"));
    }
}

#[tokio::test]
async fn grpc_resource_exhausted_with_retry_info_is_retryable_after_its_delay() {
    let peer = Peer::default();
    peer.then(Reply::GrpcError {
        code: 8,
        message: "rate limited".into(),
        details: Some(RpcStatus::retry_after_encoded(4)),
    })
    .then(Reply::GrpcError {
        code: 8,
        message: "message too large".into(),
        details: None,
    })
    .then(Reply::GrpcError {
        code: 3,
        message: "profile is invalid".into(),
        details: None,
    });
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!("endpoint: {addr}\ntls: {{ insecure: true }}\n"));
    let batch = batch_of(&[(None, 2)]);
    let e = exp.export(&batch).await.expect_err("throttled");
    assert_eq!(
        e.class,
        ErrorClass::Retryable {
            retry_after: Some(StdDuration::from_secs(4))
        }
    );
    assert!(e.message.contains("rate limited"), "{e:?}");
    let e = exp.export(&batch).await.expect_err("too large");
    assert_eq!(e.class, ErrorClass::Permanent, "no RetryInfo: permanent");
    let e = exp.export(&batch).await.expect_err("invalid");
    assert_eq!(e.class, ErrorClass::Permanent);
    assert_eq!(e.reason, "invalid_argument");
    assert_eq!(e.refused, None, "the whole batch");
}

#[tokio::test]
async fn partial_success_delivers_and_counts_rejected() {
    let peer = Peer::default();
    let partial = ExportProfilesPartialSuccess {
        rejected_profiles: 1,
        error_message: "sample type unknown".into(),
    };
    peer.then(Reply::GrpcOk(Some(partial.clone())))
        .then(Reply::GrpcOk(Some(partial)));
    let addr = peer.start().await;
    let (exp, telemetry) = exporter(&format!("endpoint: {addr}\ntls: {{ insecure: true }}\n"));
    let batch = batch_of(&[(None, 2)]);
    exp.export(&batch).await.expect("delivered");
    exp.export(&batch).await.expect("delivered");
    let metrics = telemetry.render();
    let line = metrics
        .lines()
        .find(|l| l.contains("dropped") && l.contains("rejected_by_peer"))
        .unwrap_or_else(|| panic!("no rejected_by_peer count in\n{metrics}"));
    assert!(line.ends_with(" 2"), "{line}");
    assert_eq!(exp.logged.lock().unwrap().len(), 1, "one distinct message");
}

#[tokio::test]
async fn connection_refused_is_retryable() {
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    for yaml in [
        format!("endpoint: {addr}\ntls: {{ insecure: true }}\n"),
        format!("protocol: http\nendpoint: http://{addr}\n"),
    ] {
        let (exp, _) = exporter(&yaml);
        let e = exp
            .export(&batch_of(&[(None, 1)]))
            .await
            .expect_err("nobody listens");
        assert!(
            matches!(e.class, ErrorClass::Retryable { .. }),
            "{yaml}: {e:?}"
        );
        assert_eq!(e.reason, "unavailable", "{e:?}");
        assert!(e.message.contains("refused"), "the reason is shown: {e:?}");
    }
}

#[tokio::test]
async fn http_posts_gzip_protobuf_and_reads_answers() {
    let peer = Peer::default();
    let status = RpcStatus {
        code: 3,
        message: "dictionary is required".into(),
        details: Vec::new(),
    };
    peer.then(Reply::Http {
        status: 503,
        content_type: "text/plain",
        retry_after: Some("4"),
        body: b"overloaded".to_vec(),
    })
    .then(Reply::Http {
        status: 400,
        content_type: "application/x-protobuf",
        retry_after: None,
        body: status.encode_to_vec(),
    })
    .then(Reply::Http {
        status: 200,
        content_type: "application/json",
        retry_after: None,
        body: br#"{"partialSuccess":{"rejectedProfiles":"3","errorMessage":"odd"}}"#.to_vec(),
    });
    let addr = peer.start().await;
    let (exp, telemetry) = exporter(&format!(
        "protocol: http\nendpoint: http://{addr}/prefix\nheaders: {{ X-Extra: 1 }}\n"
    ));
    let batch = batch_of(&[(Some("t"), 2)]);
    let e = exp.export(&batch).await.expect_err("503");
    assert_eq!(
        e.class,
        ErrorClass::Retryable {
            retry_after: Some(StdDuration::from_secs(4))
        }
    );
    let e = exp.export(&batch).await.expect_err("400");
    assert_eq!(e.class, ErrorClass::Permanent);
    assert!(e.message.contains("dictionary is required"), "{e:?}");
    exp.export(&batch).await.expect("200 with partial success");
    assert!(
        telemetry
            .render()
            .lines()
            .any(|l| l.contains("rejected_by_peer") && l.ends_with(" 3"))
    );
    let seen = peer.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(s.path, "/prefix/v1development/profiles");
        assert_eq!(s.headers["content-type"], "application/x-protobuf");
        assert_eq!(s.headers["content-encoding"], "gzip");
        assert_eq!(s.headers["x-extra"], "1");
        assert_eq!(s.headers["x-scope-orgid"], "t");
        assert_eq!(profile_count(&decode_request(&s.message)), 2);
    }
}

#[tokio::test]
async fn http_json_encoding_sends_otlp_json() {
    let peer = Peer::default();
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!(
        "protocol: http\nendpoint: http://{addr}\nencoding: json\ncompression: none\n"
    ));
    exp.export(&batch_of(&[(None, 3)]))
        .await
        .expect("delivered");
    let seen = peer.seen();
    assert_eq!(seen[0].headers["content-type"], "application/json");
    assert!(!seen[0].headers.contains_key("content-encoding"));
    let r = otlp::json::decode_request(&seen[0].message).expect("OTLP JSON");
    assert_eq!(profile_count(&r), 3);
    assert_eq!(function_names(&r), vec!["f1", "f2", "f3", "main"]);
}

#[tokio::test]
async fn a_split_batch_reports_refused_indexes_and_never_resends_delivered_ones() {
    let ok = || Reply::Http {
        status: 200,
        content_type: "application/x-protobuf",
        retry_after: None,
        body: Vec::new(),
    };
    let refuse = |status: u16| Reply::Http {
        status,
        content_type: "text/plain",
        retry_after: Some("0"),
        body: b"no".to_vec(),
    };
    // The first request fails retryably: nothing delivered, the queue may
    // retry the whole batch.
    let peer = Peer::default();
    peer.then(refuse(503));
    let addr = peer.start().await;
    let yaml = format!(
        "protocol: http\nendpoint: http://{addr}\nmax_batch_size: 1\n\
         retry_on_failure: {{ initial_interval: 1ms }}\n"
    );
    let (exp, _) = exporter(&yaml);
    let e = exp.export(&batch_of(&[(None, 3)])).await.expect_err("503");
    assert!(matches!(e.class, ErrorClass::Retryable { .. }), "{e:?}");
    assert_eq!(e.refused, None);
    assert_eq!(peer.seen().len(), 1, "stops at the first failure");

    // A permanent refusal in the middle: only that profile is refused.
    let peer = Peer::default();
    peer.then(ok()).then(refuse(400)).then(ok());
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!(
        "protocol: http\nendpoint: http://{addr}\nmax_batch_size: 1\n"
    ));
    let e = exp.export(&batch_of(&[(None, 3)])).await.expect_err("400");
    assert_eq!(e.refused, Some(vec![1]));
    assert_eq!(e.class, ErrorClass::Permanent);
    assert_eq!(peer.seen().len(), 3);

    // A retryable failure after a delivery is retried in place.
    let peer = Peer::default();
    peer.then(ok()).then(refuse(503)).then(ok()).then(ok());
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!(
        "protocol: http\nendpoint: http://{addr}\nmax_batch_size: 1\n\
         retry_on_failure: {{ initial_interval: 1ms }}\n"
    ));
    exp.export(&batch_of(&[(None, 3)]))
        .await
        .expect("retried in place");
    assert_eq!(peer.seen().len(), 4, "3 requests and one retry");

    // ... unless retry is off: then what is left is refused, not resent.
    let peer = Peer::default();
    peer.then(ok()).then(refuse(503));
    let addr = peer.start().await;
    let (exp, _) = exporter(&format!(
        "protocol: http\nendpoint: http://{addr}\nmax_batch_size: 1\n\
         retry_on_failure: {{ enabled: false }}\n"
    ));
    let e = exp
        .export(&batch_of(&[(None, 3)]))
        .await
        .expect_err("gave up");
    assert_eq!(e.refused, Some(vec![1, 2]));
    assert_eq!(peer.seen().len(), 2, "the third was never tried");
}

// ------------------------------------------------------------------ TLS

/// The shared test certificates (`proflow_net::test_pki`), plus the
/// server's TLS acceptor and file paths as text.
struct Pki {
    pki: proflow_net::test_pki::Pki,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl Pki {
    fn new() -> Pki {
        let pki = proflow_net::test_pki::Pki::new();
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.server_config());
        Pki { pki, acceptor }
    }

    fn file(&self, name: &str) -> String {
        self.pki.file(name).display().to_string()
    }
}

#[tokio::test]
async fn tls_verifies_the_peer_with_the_ca_file() {
    let pki = Pki::new();
    let peer = Peer::default();
    let addr = peer.start_with(Some(pki.acceptor.clone())).await;
    let port = addr.port();
    let ca = pki.file("ca.pem");
    for yaml in [
        format!("endpoint: localhost:{port}\ntls: {{ ca_file: '{ca}' }}\n"),
        format!("protocol: http\nendpoint: https://127.0.0.1:{port}\ntls: {{ ca_file: '{ca}' }}\n"),
        format!("endpoint: https://127.0.0.1:{port}\ntls: {{ insecure_skip_verify: true }}\n"),
    ] {
        let (exp, _) = exporter(&yaml);
        exp.export(&batch_of(&[(None, 1)]))
            .await
            .unwrap_or_else(|e| panic!("{yaml}: {e:?}"));
    }
    assert_eq!(peer.seen().len(), 3);
    // A certificate from another CA is refused before anything is sent; the
    // peer may be fixed (or the CA file replaced), so it is retryable.
    let other = pki.file("other-ca.pem");
    for yaml in [
        format!("endpoint: localhost:{port}\ntls: {{ ca_file: '{other}' }}\n"),
        format!(
            "protocol: http\nendpoint: https://localhost:{port}\ntls: {{ ca_file: '{other}' }}\n"
        ),
    ] {
        let (exp, _) = exporter(&yaml);
        let e = exp
            .export(&batch_of(&[(None, 1)]))
            .await
            .expect_err("unknown issuer");
        assert!(
            matches!(e.class, ErrorClass::Retryable { .. }),
            "{yaml}: {e:?}"
        );
        assert!(
            e.message.contains("UnknownIssuer"),
            "the reason is shown: {e:?}"
        );
    }
    assert_eq!(peer.seen().len(), 3, "nothing reached the peer");
}
