//! The `otlp` receiver over real HTTP and gRPC: started on `127.0.0.1:0`
//! through the public API, its ports read from the `LocalAddrs` handle;
//! gRPC requests go through the generated tonic client, HTTP ones through a
//! plain hyper client. The pipeline side is a recording `Consumer`.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use proflow_config::ByteSize;
use proflow_core::component::{BuildContext, Receiver, ReceiverContext};
use proflow_core::telemetry::Telemetry;
use proflow_model::memory::MemoryBudget;
use proflow_model::model::{BatchMeta, Envelope, ValueType};
use proflow_model::otlp::common::{AnyValue, InstrumentationScope, KeyValue, any_value};
use proflow_model::otlp::{DictionaryBuilder, Resource, collector, json, proto};
use proflow_model::spans::{Span, SpanConsumer};
use proflow_net::server::{HttpListenerSettings, ListenerSettings, TenantLimitsSettings};
use proflow_receivers::otlp::{GrpcConfig, HttpConfig, OtlpConfig, Protocols};
use prost::Message;
use tokio_util::sync::CancellationToken;
use tonic::codec::CompressionEncoding;

mod common;
use common::{Answer, Recorder, Reply};

// ------------------------------------------------------------------ harness

/// Records the spans a receiver in a traces pipeline hands on.
#[derive(Default)]
struct SpanRecorder(Mutex<Vec<Span>>);

impl SpanConsumer for SpanRecorder {
    fn consume_spans(&self, spans: &[Span]) {
        self.0.lock().unwrap().extend_from_slice(spans);
    }
}

struct Harness {
    spans: Arc<SpanRecorder>,
    grpc: SocketAddr,
    http: SocketAddr,
    recorder: Arc<Recorder>,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

const LIMIT: u64 = 64 << 10;

impl Harness {
    async fn start() -> Harness {
        Harness::start_with(true, false).await
    }

    /// `profiles`: in a profiles pipeline; `traces`: in a traces pipeline.
    async fn start_with(profiles: bool, traces: bool) -> Harness {
        Harness::start_limited(profiles, traces, None).await
    }

    /// [`Harness::start_with`] with the receiver's `limits`.
    async fn start_limited(
        profiles: bool,
        traces: bool,
        limits: Option<TenantLimitsSettings>,
    ) -> Harness {
        let config = OtlpConfig {
            protocols: Protocols {
                grpc: Some(GrpcConfig {
                    listener: ListenerSettings::on("127.0.0.1:0"),
                    max_recv_msg_size_mib: 1,
                }),
                http: Some(HttpConfig {
                    listener: HttpListenerSettings::on("127.0.0.1:0"),
                    max_request_body_size: ByteSize::kib(LIMIT >> 10),
                    max_decompressed_size: ByteSize::kib(256),
                    max_decoded_size: ByteSize::mib(8),
                }),
            },
            resource_to_labels: Default::default(),
            limits,
        };
        let telemetry = Arc::new(Telemetry::new());
        let build = BuildContext {
            id: "otlp".into(),
            telemetry: telemetry.clone(),
            memory: proflow_model::memory::MemoryBudget::new(1 << 30),
        };
        let receiver = config.build_receiver(&build).unwrap();
        let addrs = receiver.local_addrs();
        assert_eq!(addrs.grpc(), None, "not bound before start");
        let recorder = Recorder::new();
        let shutdown = CancellationToken::new();
        let spans = Arc::new(SpanRecorder::default());
        let serve = Box::new(receiver)
            .start(ReceiverContext {
                id: "otlp".into(),
                consumer: recorder.clone(),
                telemetry: build.receiver_telemetry(),
                shutdown: shutdown.clone(),
                memory: MemoryBudget::new(64 << 20),
                takes_profiles: profiles,
                spans: traces.then(|| spans.clone() as Arc<dyn SpanConsumer>),
                listeners: Default::default(),
            })
            .await
            .unwrap();
        Harness {
            spans,
            grpc: addrs.grpc().expect("bound once started"),
            http: addrs.http().expect("bound once started"),
            recorder,
            telemetry,
            shutdown,
            server: tokio::spawn(serve),
        }
    }

    fn answer(&self, answer: Answer) {
        self.recorder.answer(answer);
    }

    fn batches(&self) -> Vec<(Vec<Envelope>, Arc<BatchMeta>)> {
        self.recorder.batches()
    }

    fn metric(&self, needle: &str) -> bool {
        self.telemetry.render().contains(needle)
    }

    async fn post(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        self.send("POST", path, headers, body.into()).await
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
        common::send(self.http, method, path, headers, body).await
    }

    async fn client(&self) -> ProfilesServiceClient<tonic::transport::Channel> {
        ProfilesServiceClient::connect(format!("http://{}", self.grpc))
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.server)
            .await
            .expect("serving stops on shutdown")
            .unwrap();
    }
}

impl Reply {
    fn response(&self) -> collector::ExportProfilesServiceResponse {
        assert_eq!(self.status, 200, "{}", self.text());
        collector::ExportProfilesServiceResponse::decode(self.body.as_ref()).unwrap()
    }

    /// The protobuf `google.rpc.Status` of a refusal.
    fn status_message(&self) -> RpcStatus {
        assert_eq!(self.header("content-type"), Some("application/x-protobuf"));
        RpcStatus::decode(self.body.as_ref()).unwrap()
    }
}

/// `google.rpc.Status`, to read what the receiver sends.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<ProtoAny>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoAny {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

const PATH: &str = "/v1development/profiles";
const PROTOBUF: (&str, &str) = ("content-type", "application/x-protobuf");
const T0: u64 = 1_700_000_000_000_000_000;

// ----------------------------------------------------------------- requests

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        key_strindex: 0,
    }
}

/// A request of `services.len()` resources, each with one scope of
/// `profiles_each` CPU profiles (`main;work;hot` = 30ms and `main;idle` =
/// 10ms). The pod name attribute is written by reference, as the
/// collector writes attributes.
fn request(services: &[&str], profiles_each: usize) -> collector::ExportProfilesServiceRequest {
    let mut d = DictionaryBuilder::new();
    let frames = |d: &mut DictionaryBuilder, names: &[&str]| {
        let locations = names
            .iter()
            .rev()
            .map(|n| {
                let name = d.string(n);
                let f = d.function(proto::Function {
                    name_strindex: name,
                    ..Default::default()
                });
                d.location(proto::Location {
                    lines: vec![proto::Line {
                        function_index: f,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            })
            .collect();
        d.stack(locations)
    };
    let hot = frames(&mut d, &["main", "work", "hot"]);
    let idle = frames(&mut d, &["main", "idle"]);
    let samples = d.string("samples");
    let count = d.string("count");
    let cpu = d.string("cpu");
    let nanos = d.string("nanoseconds");
    let pod_key = d.string("k8s.pod.name");
    let pod_value = d.string("pod-7");
    let profile = proto::Profile {
        sample_type: Some(proto::ValueType {
            type_strindex: samples,
            unit_strindex: count,
        }),
        samples: vec![
            proto::Sample {
                stack_index: hot,
                values: vec![3],
                ..Default::default()
            },
            proto::Sample {
                stack_index: idle,
                values: vec![1],
                ..Default::default()
            },
        ],
        time_unix_nano: T0,
        duration_nano: 10_000_000_000,
        period_type: Some(proto::ValueType {
            type_strindex: cpu,
            unit_strindex: nanos,
        }),
        period: 10_000_000,
        ..Default::default()
    };
    collector::ExportProfilesServiceRequest {
        resource_profiles: services
            .iter()
            .map(|service| proto::ResourceProfiles {
                resource: Some(Resource {
                    attributes: vec![
                        string_kv("service.name", service),
                        KeyValue {
                            key: String::new(),
                            key_strindex: pod_key,
                            value: Some(AnyValue {
                                value: Some(any_value::Value::StringValueStrindex(pod_value)),
                            }),
                        },
                    ],
                    ..Default::default()
                }),
                scope_profiles: vec![proto::ScopeProfiles {
                    scope: Some(InstrumentationScope {
                        name: "test".into(),
                        attributes: vec![string_kv("profiler.mode", "cpu")],
                        ..Default::default()
                    }),
                    profiles: vec![profile.clone(); profiles_each],
                    ..Default::default()
                }],
                schema_url: "https://opentelemetry.io/schemas/1.30.0".into(),
            })
            .collect(),
        dictionary: Some(d.finish()),
    }
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

/// What every envelope of [`request`] looks like.
fn assert_cpu_envelope(e: &Envelope, service: &str) {
    assert_eq!(
        e.labels.to_selector_string(),
        format!(
            r#"{{__name__="process_cpu", k8s_pod_name="pod-7", profiler_mode="cpu", service_name="{service}"}}"#
        )
    );
    assert_eq!(e.sample_types, vec![ValueType::new("samples", "count")]);
    assert_eq!(e.period_type, Some(ValueType::new("cpu", "nanoseconds")));
    assert_eq!(e.period, 10_000_000);
    assert_eq!(e.start_unix_nanos, T0 as i64);
    assert_eq!(e.end_unix_nanos, T0 as i64 + 10_000_000_000);
    let otlp = e.payload.otlp().unwrap();
    assert_eq!(otlp.profiles.len(), 1);
    assert_eq!(otlp.profiles[0].decoded().unwrap().samples.len(), 2);
    let context = otlp.context.as_ref().unwrap();
    assert_eq!(
        context.resource.attributes[1],
        string_kv("k8s.pod.name", "pod-7"),
        "attributes by reference are written inline"
    );
    assert_eq!(context.scope.name, "test");
}

// -------------------------------------------------------------------- tests

#[tokio::test]
async fn http_protobuf_json_and_gzip_are_accepted() {
    let h = Harness::start().await;
    let body = request(&["checkout"], 1).encode_to_vec();

    let reply = h
        .post(PATH, &[PROTOBUF, ("x-scope-orgid", "team-a")], body.clone())
        .await;
    assert_eq!(reply.response(), Default::default(), "nothing refused");
    assert_eq!(reply.header("content-type"), Some("application/x-protobuf"));

    let reply = h
        .post(PATH, &[PROTOBUF, ("content-encoding", "gzip")], gzip(&body))
        .await;
    assert_eq!(reply.response(), Default::default());

    let json_body = json::encode_request(&request(&["checkout"], 1));
    let reply = h
        .post(PATH, &[("content-type", "application/json")], json_body)
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("application/json"));
    assert_eq!(reply.text(), "{}");

    let batches = h.batches();
    assert_eq!(batches.len(), 3);
    for (envelopes, _) in &batches {
        assert_eq!(envelopes.len(), 1);
        assert_cpu_envelope(&envelopes[0], "checkout");
    }
    assert_eq!(batches[0].1.tenant.as_deref(), Some("team-a"));
    assert_eq!(batches[1].1.tenant, None);
    assert!(h.metric(r#"proflow_receiver_accepted_profiles_total{receiver="otlp"} 3"#));
    h.stop().await;
}

#[tokio::test]
async fn grpc_plain_and_gzip_are_accepted() {
    let h = Harness::start().await;
    let mut client = h.client().await;
    let mut req = tonic::Request::new(request(&["api"], 2));
    req.metadata_mut()
        .insert("x-scope-orgid", "team-b".parse().unwrap());
    let response = client.export(req).await.unwrap().into_inner();
    assert_eq!(response.partial_success, None);

    let mut gz = h.client().await.send_compressed(CompressionEncoding::Gzip);
    gz.export(request(&["api"], 1)).await.unwrap();

    let batches = h.batches();
    assert_eq!(batches.len(), 2);
    assert_eq!(batches[0].0.len(), 2);
    assert_eq!(batches[0].1.tenant.as_deref(), Some("team-b"));
    assert!(batches[0].1.client.is_some());
    for e in batches.iter().flat_map(|(b, _)| b) {
        assert_cpu_envelope(e, "api");
    }
    h.stop().await;
}

#[tokio::test]
async fn every_envelope_shares_the_one_dictionary() {
    let h = Harness::start().await;
    let body = request(&["a", "b"], 2).encode_to_vec();
    let reply = h.post(PATH, &[PROTOBUF], body.clone()).await;
    assert_eq!(reply.response(), Default::default());
    let (envelopes, _) = h.batches().remove(0);
    assert_eq!(envelopes.len(), 4, "one per (resource, scope, profile)");
    let forms: Vec<_> = envelopes
        .iter()
        .map(|e| e.payload.otlp().unwrap())
        .collect();
    for f in &forms {
        assert!(Arc::ptr_eq(&f.dictionary, &forms[0].dictionary));
    }
    // One context per scope: shared by that scope's profiles only.
    let context = |i: usize| forms[i].context.clone().unwrap();
    assert!(Arc::ptr_eq(&context(0), &context(1)));
    assert!(!Arc::ptr_eq(&context(1), &context(2)));
    assert_eq!(envelopes[2].labels.get("service_name"), Some("b"));
    // Profiles and dictionary are the bytes that arrived, not decoded copies.
    assert!(forms[0].dictionary.is_raw());
    assert!(forms.iter().all(|f| f.profiles[0].is_raw()));
    // The body is counted once over all four, not four times.
    let total: usize = envelopes.iter().map(Envelope::size_bytes).sum();
    assert!(
        total >= body.len() && total < body.len() + 8192,
        "{total} vs {}",
        body.len()
    );
    h.stop().await;
}

#[tokio::test]
async fn broken_profiles_are_refused_alone_in_partial_success() {
    let h = Harness::start().await;
    let mut req = request(&["a"], 3);
    req.resource_profiles[0].scope_profiles[0].profiles[1].samples[0].stack_index = 99;
    let reply = h.post(PATH, &[PROTOBUF], req.encode_to_vec()).await;
    let partial = reply.response().partial_success.expect("partial success");
    assert_eq!(partial.rejected_profiles, 1);
    assert!(
        partial.error_message.contains("stack index 99"),
        "{}",
        partial.error_message
    );
    assert_eq!(h.batches()[0].0.len(), 2, "the valid ones went on");
    assert!(h.metric(r#"reason="invalid_profile"} 1"#));

    // The same over gRPC.
    let response = h.client().await.export(req).await.unwrap().into_inner();
    assert_eq!(response.partial_success.unwrap().rejected_profiles, 1);
    h.stop().await;
}

/// The request of a sender on OTLP profiles 1.9, which numbered Sample's
/// values 2 (1.10 reads field 2 as attribute indexes): it decodes without
/// error into nonsense as 1.10, and is converted.
fn v1_9_request() -> Vec<u8> {
    let good = request(&["old"], 1);
    let mut bytes = collector::ExportProfilesServiceRequest {
        resource_profiles: vec![],
        dictionary: good.dictionary.clone(),
    }
    .encode_to_vec();
    // Sample{stack_index=1: 1, values=2 (1.9): [30]}
    let sample = [0x08, 0x01, 0x12, 0x01, 30];
    let mut profile = vec![0x12, sample.len() as u8];
    profile.extend_from_slice(&sample);
    let mut scope = vec![0x12, profile.len() as u8];
    scope.extend_from_slice(&profile);
    let mut resource = vec![0x12, scope.len() as u8];
    resource.extend_from_slice(&scope);
    bytes.push(0x0a);
    prost::encoding::encode_varint(resource.len() as u64, &mut bytes);
    bytes.extend_from_slice(&resource);
    bytes
}

#[tokio::test]
async fn a_1_9_request_is_converted_with_its_values() {
    let h = Harness::start().await;
    let reply = h.post(PATH, &[PROTOBUF], v1_9_request()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (envelopes, _) = h.batches().remove(0);
    let otlp = envelopes[0].payload.otlp().unwrap();
    let sample = &otlp.profiles[0].decoded().unwrap().samples[0];
    assert_eq!(
        (sample.values.clone(), sample.attribute_indices.clone()),
        (vec![30], vec![])
    );
    assert!(
        h.metric(r#"proflow_receiver_upgraded_requests_total{receiver="otlp",from="otlp_1_9"} 1"#),
        "{}",
        h.telemetry.render()
    );
    h.stop().await;
}

#[tokio::test]
async fn bad_dictionaries_and_old_versions_are_refused_with_the_version_named() {
    let h = Harness::start().await;
    let mut bad = request(&["a"], 1);
    bad.dictionary.as_mut().unwrap().stack_table[1]
        .location_indices
        .push(1000);
    let reply = h.post(PATH, &[PROTOBUF], bad.encode_to_vec()).await;
    assert_eq!(reply.status, 400);
    let status = reply.status_message();
    assert_eq!(status.code, tonic::Code::InvalidArgument as i32);
    assert!(
        status.message.contains("dictionary is invalid"),
        "{}",
        status.message
    );
    assert!(status.message.contains("1.10"), "{}", status.message);

    // JSON requests get the status in JSON.
    let reply = h
        .post(
            PATH,
            &[("content-type", "application/json")],
            json::encode_request(&bad),
        )
        .await;
    assert_eq!(reply.status, 400);
    let v: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(v["code"], 3);
    assert!(v["message"].as_str().unwrap().contains("1.10"));

    let err = h.client().await.export(bad).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("1.10"), "{}", err.message());

    // A sample with nothing to count in either layout (what a sender on a
    // version before 1.8 can look like): refused, naming 1.10.
    let mut old = request(&["old"], 1);
    old.resource_profiles[0].scope_profiles[0].profiles[0].samples[0] = Default::default();
    let reply = h.post(PATH, &[PROTOBUF], old.encode_to_vec()).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    let message = reply.status_message().message;
    assert!(message.contains("1.10"), "{message}");

    let mut no_dictionary = request(&["a"], 2);
    no_dictionary.dictionary = None;
    let reply = h
        .post(PATH, &[PROTOBUF], no_dictionary.encode_to_vec())
        .await;
    assert_eq!(reply.status, 400);
    assert!(reply.status_message().message.contains("no dictionary"));

    let reply = h.post(PATH, &[PROTOBUF], &b"\x0a\x05\x01"[..]).await;
    assert_eq!(reply.status, 400);
    assert!(h.batches().is_empty());
    assert!(
        h.metric(r#"reason="bad_request"} 6"#),
        "{}",
        h.telemetry.render()
    );
    h.stop().await;
}

#[tokio::test]
async fn oversized_requests_are_refused() {
    let h = Harness::start().await;
    // Large enough to pass either limit: many profiles of random-ish values.
    let mut big = request(&["a"], 1);
    let p = &mut big.resource_profiles[0].scope_profiles[0].profiles[0];
    p.samples[0].values = (0..20_000).map(|i| i * 7919).collect();
    p.samples[0].timestamps_unix_nano = Vec::new();
    assert!(big.encoded_len() as u64 > LIMIT);
    let reply = h.post(PATH, &[PROTOBUF], big.encode_to_vec()).await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(
        reply
            .status_message()
            .message
            .contains("max_request_body_size")
    );

    // gRPC's limit is in MiB: make the message pass 1 MiB.
    big.resource_profiles[0].scope_profiles[0].profiles[0].samples[0].values =
        (0..400_000).map(|i| i * 7919).collect();
    assert!(big.encoded_len() > 1 << 20);
    let err = h.client().await.export(big).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message().contains("max_recv_msg_size_mib"),
        "{}",
        err.message()
    );

    // A gzip bomb: tiny on the wire, past max_decompressed_size inflated.
    let bomb = gzip(&vec![0u8; 1 << 20]);
    let reply = h
        .post(PATH, &[PROTOBUF, ("content-encoding", "gzip")], bomb)
        .await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(
        h.metric(r#"reason="too_large"} 3"#),
        "{}",
        h.telemetry.render()
    );
    h.stop().await;
}

#[tokio::test]
async fn wrong_content_type_method_and_path() {
    let h = Harness::start().await;
    let body = request(&["a"], 1).encode_to_vec();
    let reply = h
        .post(PATH, &[("content-type", "text/plain")], body.clone())
        .await;
    assert_eq!(reply.status, 415);
    assert!(
        reply.text().contains("application/x-protobuf"),
        "{}",
        reply.text()
    );
    let reply = h.send("GET", PATH, &[], Bytes::new()).await;
    assert_eq!(reply.status, 405);
    assert_eq!(reply.header("allow"), Some("POST"));
    let reply = h.post("/v1/traces", &[PROTOBUF], body).await;
    assert_eq!(reply.status, 404);
    assert!(h.batches().is_empty());
    assert!(h.metric(r#"reason="unsupported_media_type"} 1"#));
    h.stop().await;
}

#[tokio::test]
async fn backpressure_asks_the_sender_to_retry_later() {
    let h = Harness::start().await;
    h.answer(Answer::Backpressure(Duration::new(1, 2)));
    let reply = h
        .post(PATH, &[PROTOBUF], request(&["a"], 1).encode_to_vec())
        .await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.header("retry-after"), Some("2"), "rounded up");

    let err = h
        .client()
        .await
        .export(request(&["a"], 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    let details = RpcStatus::decode(err.details()).unwrap();
    assert_eq!(details.code, tonic::Code::ResourceExhausted as i32);
    let retry = &details.details[0];
    assert_eq!(retry.type_url, "type.googleapis.com/google.rpc.RetryInfo");
    let delay = RetryInfo::decode(retry.value.as_slice())
        .unwrap()
        .retry_delay
        .unwrap();
    assert_eq!((delay.seconds, delay.nanos), (1, 2));

    h.answer(Answer::ShuttingDown);
    let reply = h
        .post(PATH, &[PROTOBUF], request(&["a"], 1).encode_to_vec())
        .await;
    assert_eq!(reply.status, 503);
    let err = h
        .client()
        .await
        .export(request(&["a"], 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    assert!(h.metric(r#"reason="backpressure"} 2"#));
    h.stop().await;
}

#[tokio::test]
async fn a_tenant_past_its_rate_is_refused_with_the_time_to_retry() {
    // 1 KiB/s, 8 KiB at once, for tenant `noisy`; no limit for the others.
    let limits: TenantLimitsSettings = serde_saphyr::from_str(
        "overrides:\n  noisy: {ingestion_rate_mb: 0.0009765625, ingestion_burst_size_mb: 0.0078125}\n",
    )
    .unwrap();
    let h = Harness::start_limited(true, false, Some(limits)).await;
    let body = request(&["a"], 1).encode_to_vec();
    let noisy = [PROTOBUF, ("x-scope-orgid", "noisy")];
    let mut accepted = 0;
    let started = std::time::Instant::now();
    let refused = loop {
        let reply = h.post(PATH, &noisy, body.clone()).await;
        match reply.status {
            200 => accepted += 1,
            429 => break reply,
            other => panic!("{other}"),
        }
        assert!(accepted < 100, "the noisy tenant is never refused");
    };
    // The burst's worth, and what 1 KiB/s refills while the requests go
    // (on a slow machine one more: 27 of 26 seen).
    let burst = (8 << 10) / body.len();
    let refilled = (started.elapsed().as_secs_f64() * 1024.0 / body.len() as f64).ceil() as usize;
    assert!(
        (burst..=burst + refilled).contains(&accepted),
        "{accepted} accepted, the burst holds {burst}, {refilled} refilled"
    );
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((1..=2).contains(&wait), "{wait}");
    // gRPC: RESOURCE_EXHAUSTED with the delay (the Collector retries then).
    // What refilled while the client connected may take a request or two.
    let mut client = h.client().await;
    let mut err = None;
    for _ in 0..20 {
        let mut req = tonic::Request::new(request(&["a"], 1));
        req.metadata_mut()
            .insert("x-scope-orgid", "noisy".parse().unwrap());
        if let Err(e) = client.export(req).await {
            err = Some(e);
            break;
        }
    }
    let err = err.expect("the noisy tenant is refused over gRPC too");
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    assert!(
        err.message().contains("push rate limit"),
        "{}",
        err.message()
    );
    let details = RpcStatus::decode(err.details()).unwrap();
    assert_eq!(
        details.details[0].type_url,
        "type.googleapis.com/google.rpc.RetryInfo"
    );
    // Another tenant, and no tenant, are not limited.
    for headers in [&[PROTOBUF, ("x-scope-orgid", "quiet")][..], &[PROTOBUF][..]] {
        for _ in 0..20 {
            assert_eq!(h.post(PATH, headers, body.clone()).await.status, 200);
        }
    }
    assert!(h.metric(r#"reason="rate_limited"} 2"#));
    h.stop().await;
}

/// A tenant's active series limit (Pyroscope's `max_global_series_per_tenant`):
/// a request that would add more series is refused whole, 429 over HTTP
/// and RESOURCE_EXHAUSTED over gRPC, with Pyroscope's words; known series
/// pass.
#[tokio::test]
async fn a_tenant_past_its_active_series_is_refused() {
    let limits: TenantLimitsSettings =
        serde_saphyr::from_str("max_global_series_per_tenant: 2\n").unwrap();
    let h = Harness::start_limited(true, false, Some(limits)).await;
    let team = [PROTOBUF, ("x-scope-orgid", "team")];
    let post = |services: &'static [&'static str]| {
        h.post(PATH, &team, request(services, 1).encode_to_vec())
    };
    assert_eq!(post(&["a", "b"]).await.status, 200);
    let refused = post(&["b", "c"]).await;
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert!(
        refused
            .text()
            .contains("Maximum active series limit exceeded (2/2)"),
        "{}",
        refused.text()
    );
    assert_eq!(post(&["a"]).await.status, 200);
    let mut client = h.client().await;
    let mut req = tonic::Request::new(request(&["d"], 1));
    req.metadata_mut()
        .insert("x-scope-orgid", "team".parse().unwrap());
    let err = client.export(req).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::ResourceExhausted);
    // Another tenant counts its own.
    let other = [PROTOBUF, ("x-scope-orgid", "other")];
    let reply = h
        .post(PATH, &other, request(&["c", "d"], 1).encode_to_vec())
        .await;
    assert_eq!(reply.status, 200);
    assert!(h.metric(r#"reason="series_limit"} 2"#));
    h.stop().await;
}

#[tokio::test]
async fn unknown_grpc_methods_are_unimplemented() {
    let h = Harness::start().await;
    let channel = tonic::transport::Endpoint::new(format!("http://{}", h.grpc))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = "/opentelemetry.proto.collector.logs.v1.LogsService/Export"
        .parse()
        .unwrap();
    let err = grpc
        .unary::<_, collector::ExportProfilesServiceResponse, _>(
            tonic::Request::new(request(&["a"], 1)),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    h.stop().await;
}

// -------------------------------------------------------------------- traces

fn trace_request() -> TraceRequest {
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as OtelSpan};
    let span = |t: u8, s: u8, name: &str| OtelSpan {
        trace_id: vec![t; 16],
        span_id: vec![s; 8],
        name: name.into(),
        start_time_unix_nano: T0,
        end_time_unix_nano: T0 + 1_000_000,
        attributes: vec![string_kv("http.route", "/cart")],
        ..Default::default()
    };
    TraceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![string_kv("service.name", "checkout")],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![
                    span(1, 2, "GET /cart"),
                    span(3, 4, "SELECT"),
                    span(0, 5, "zero trace"),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

type TraceRequest = opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;

#[tokio::test]
async fn traces_feed_the_span_consumer_over_grpc_and_http() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    let h = Harness::start_with(true, true).await;
    let mut client = TraceServiceClient::connect(format!("http://{}", h.grpc))
        .await
        .unwrap()
        .send_compressed(CompressionEncoding::Gzip);
    let response = client.export(trace_request()).await.unwrap().into_inner();
    let partial = response
        .partial_success
        .expect("the zero trace id is refused");
    assert_eq!(partial.rejected_spans, 1);
    {
        let spans = h.spans.0.lock().unwrap();
        assert_eq!(spans.len(), 2);
        assert_eq!(spans[0].trace_id, [1; 16]);
        assert_eq!(spans[0].span_id, [2; 8]);
        assert_eq!(spans[0].name, "GET /cart");
        assert_eq!(&*spans[0].service, "checkout");
        assert_eq!(
            spans[0].end_unix_nanos - spans[0].start_unix_nanos,
            1_000_000
        );
    }
    let reply = h
        .post("/v1/traces", &[PROTOBUF], trace_request().encode_to_vec())
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let json = r#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"web"}}]},"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"1112131415161718","name":"GET /","startTimeUnixNano":"1","endTimeUnixNano":"2"}]}]}]}"#;
    let reply = h
        .post("/v1/traces", &[("content-type", "application/json")], json)
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.text(), "{}");
    assert_eq!(h.spans.0.lock().unwrap().len(), 5);
    assert!(h.metric(r#"proflow_receiver_accepted_spans_total{receiver="otlp"} 5"#));
    assert!(h.metric(r#"proflow_receiver_refused_spans_total{receiver="otlp"} 2"#));
    // Nothing went to the profiles pipelines.
    assert!(h.batches().is_empty());

    let reply = h.post("/v1/traces", &[PROTOBUF], &b"\xff\xff"[..]).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply
            .status_message()
            .message
            .contains("ExportTraceServiceRequest")
    );
    h.stop().await;
}

#[tokio::test]
async fn a_signal_the_receiver_has_no_pipeline_for_is_refused_saying_so() {
    use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
    let h = Harness::start_with(true, false).await;
    let mut client = TraceServiceClient::connect(format!("http://{}", h.grpc))
        .await
        .unwrap();
    let err = client.export(trace_request()).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(
        err.message().contains("in no traces pipeline"),
        "{}",
        err.message()
    );
    let reply = h
        .post("/v1/traces", &[PROTOBUF], trace_request().encode_to_vec())
        .await;
    assert_eq!(reply.status, 404, "{}", reply.text());
    h.stop().await;

    let h = Harness::start_with(false, true).await;
    let err = h
        .client()
        .await
        .export(request(&["a"], 1))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented);
    assert!(
        err.message().contains("in no profiles pipeline"),
        "{}",
        err.message()
    );
    assert!(h.batches().is_empty());
    h.stop().await;
}
