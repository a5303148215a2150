//! The `pprof_push` receiver over real HTTP: it is started on `127.0.0.1:0`
//! through the public API (`Receiver::start`), its port read from the
//! `LocalAddr` handle, and requests are sent the way Pyroscope clients send
//! them. The pipeline side is a small recording `Consumer` (our own interface).

use std::io::Write;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use proflow_config::ByteSize;
use proflow_core::component::{BuildContext, Receiver, ReceiverConfig, ReceiverContext};
use proflow_core::telemetry::Telemetry;
use proflow_model::memory::MemoryBudget;
use proflow_model::model::{BatchMeta, Envelope, ValueType};
use proflow_model::pprof::{self, ProfileBuilder};
use proflow_model::push_v1::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use proflow_net::server::HttpListenerSettings;
use proflow_receivers::pprof_push::PprofPushConfig;
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

mod common;
use common::{Answer, Recorder, Reply};

// ------------------------------------------------------------------ harness

struct Harness {
    addr: SocketAddr,
    recorder: Arc<Recorder>,
    telemetry: Arc<Telemetry>,
    shutdown: CancellationToken,
    server: tokio::task::JoinHandle<()>,
}

impl Harness {
    async fn start() -> Harness {
        Harness::start_with(PprofPushConfig::default()).await
    }

    /// Started with `config`, its endpoint and body limits set for tests.
    async fn start_with(config: PprofPushConfig) -> Harness {
        let config = PprofPushConfig {
            listener: HttpListenerSettings::on("127.0.0.1:0"),
            max_request_body_size: ByteSize::kib(64),
            max_decompressed_size: ByteSize::kib(256),
            ..config
        };
        let telemetry = Arc::new(Telemetry::new());
        let build = BuildContext {
            id: "pprof_push".into(),
            telemetry: telemetry.clone(),
            memory: proflow_model::memory::MemoryBudget::new(1 << 30),
        };
        let receiver = config.build_receiver(&build).unwrap();
        let local_addr = receiver.local_addr();
        assert_eq!(local_addr.get(), None, "not bound before start");
        let recorder = Recorder::new();
        let shutdown = CancellationToken::new();
        let serve = Box::new(receiver)
            .start(ReceiverContext {
                id: "pprof_push".into(),
                consumer: recorder.clone(),
                telemetry: build.receiver_telemetry(),
                shutdown: shutdown.clone(),
                memory: MemoryBudget::new(64 << 20),
                takes_profiles: true,
                spans: None,
                listeners: Default::default(),
            })
            .await
            .unwrap();
        let addr = local_addr.get().expect("bound once start returned");
        assert_ne!(addr.port(), 0);
        Harness {
            addr,
            recorder,
            telemetry,
            shutdown,
            server: tokio::spawn(serve),
        }
    }

    fn answer(&self, answer: Answer) {
        self.recorder.answer(answer);
    }

    fn batches(&self) -> Vec<Vec<Envelope>> {
        self.recorder
            .batches()
            .into_iter()
            .map(|(b, _)| b)
            .collect()
    }

    fn metas(&self) -> Vec<Arc<BatchMeta>> {
        self.recorder
            .batches()
            .into_iter()
            .map(|(_, m)| m)
            .collect()
    }

    fn metric(&self, needle: &str) -> bool {
        self.telemetry.render().contains(needle)
    }

    async fn post(&self, path: &str, headers: &[(&str, &str)], body: impl Into<Bytes>) -> Reply {
        self.send("POST", path, headers, body.into()).await
    }

    async fn send(&self, method: &str, path: &str, headers: &[(&str, &str)], body: Bytes) -> Reply {
        common::send(self.addr, method, path, headers, body).await
    }

    /// A good request still works (the server survived what came before).
    async fn assert_still_serving(&self) {
        let before = self.batches().len();
        let reply = self
            .post(
                "/ingest?name=alive&format=pprof",
                &[],
                pprof::encode(&cpu_profile(0)),
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(self.batches().len(), before + 1);
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
    /// The Connect-style error body: (code, message).
    fn error(&self) -> (String, String) {
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "{}",
            self.text()
        );
        let v: serde_json::Value = serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("error body is not JSON ({e}): {}", self.text()));
        (
            v["code"].as_str().unwrap_or_default().to_owned(),
            v["message"].as_str().unwrap_or_default().to_owned(),
        )
    }
}

// ----------------------------------------------------------------- profiles

fn cpu_profile(time_nanos: i64) -> pprof::Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type("samples", "count")
        .sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(time_nanos, 10_000_000_000);
    b.sample_root_first(["main", "work", "hot"], vec![3, 30_000_000]);
    b.build()
}

fn block_profile() -> pprof::Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type("contentions", "count")
        .sample_type("delay", "nanoseconds");
    b.sample_root_first(["main", "lock"], vec![2, 500]);
    b.build()
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    enc.write_all(bytes).unwrap();
    enc.finish().unwrap()
}

fn multipart(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in parts {
        out.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n"
            )
            .as_bytes(),
        );
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

/// One series of a PushRequest: its labels and raw profiles.
type Series<'a> = (&'a [(&'a str, &'a str)], Vec<Bytes>);

fn push_request(series: &[Series<'_>]) -> PushRequest {
    PushRequest {
        series: series
            .iter()
            .map(|(labels, profiles)| RawProfileSeries {
                labels: labels
                    .iter()
                    .map(|(n, v)| LabelPair {
                        name: n.to_string(),
                        value: v.to_string(),
                    })
                    .collect(),
                samples: profiles
                    .iter()
                    .map(|p| RawSample {
                        raw_profile: p.clone(),
                        id: "0b5c6a2e-0000-4000-8000-000000000000".into(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

const T: i64 = 1_700_000_000_000_000_000;

// -------------------------------------------------------------------- /ingest

#[tokio::test]
async fn raw_pprof_plain_and_gzip() {
    let h = Harness::start().await;
    let plain = pprof::encode(&cpu_profile(T));
    let reply = h
        .post(
            "/ingest?name=checkout%7Benv%3Dprod%7D&format=pprof&from=1700000000&until=1700000010&spyName=gospy",
            &[("content-type", "application/octet-stream")],
            plain.clone(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    // @pyroscope/nodejs 0.6: gzip body, octet-stream, times in seconds.
    let gz = Bytes::from(gzip(&plain));
    let reply = h
        .post(
            "/pyroscope/ingest?format=pprof&name=web&from=1700000000&until=1700000010&spyName=nodespy&sampleRate=100",
            &[("content-type", "application/octet-stream")],
            gz.clone(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let batches = h.batches();
    assert_eq!(batches.len(), 2, "one batch per request");
    let e = &batches[0][0];
    assert_eq!(
        e.labels.to_selector_string(),
        r#"{__delta__="false", __name__="process_cpu", env="prod", pyroscope_spy="gospy", service_name="checkout"}"#
    );
    assert_eq!(e.start_unix_nanos, T);
    assert_eq!(e.end_unix_nanos, T + 10_000_000_000);
    assert_eq!(
        e.sample_types,
        vec![
            ValueType::new("samples", "count"),
            ValueType::new("cpu", "nanoseconds")
        ]
    );
    assert_eq!(e.period, 10_000_000);
    assert_eq!(
        e.payload.encoded().unwrap().bytes,
        plain,
        "bytes kept as they arrived"
    );
    let e = &batches[1][0];
    assert_eq!(e.labels.get("service_name"), Some("web"));
    assert_eq!(e.payload.encoded().unwrap().bytes, gz);
    assert!(e.payload.encoded().unwrap().gzipped);
    assert!(!e.payload.is_decoded(), "pass-through never decodes");
    assert!(h.metric(r#"proflow_receiver_accepted_profiles_total{receiver="pprof_push"} 2"#));
    h.stop().await;
}

#[tokio::test]
async fn multipart_like_pyroscope_go() {
    let h = Harness::start().await;
    let profile = gzip(&pprof::encode(&block_profile()));
    let config = br#"{"contentions":{"units":"lock_samples","display-name":"block_count"},"delay":{"units":"lock_nanoseconds","display-name":"block_duration"}}"#;
    let body = multipart(
        "b0undary",
        &[("profile", &profile), ("sample_type_config", config)],
    );
    let reply = h
        .post(
            "/ingest?name=svc%7B__session_id__%3Dabc%2Cotel.scope.name%3Dcom.grafana.pyroscope%2Fgodeltaprof%7D&from=1700000000000000000&until=1700000015000000000&spyName=gospy&sampleRate=0&units=&aggregationType=",
            &[("content-type", "multipart/form-data; boundary=b0undary")],
            body,
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let batches = h.batches();
    let e = &batches[0][0];
    assert_eq!(
        e.labels.to_selector_string(),
        r#"{__delta__="false", __name__="block", __session_id__="abc", otel_scope_name="com.grafana.pyroscope/godeltaprof", pyroscope_spy="gospy", service_name="svc"}"#
    );
    assert_eq!(e.end_unix_nanos - e.start_unix_nanos, 15_000_000_000);
    assert_eq!(
        e.payload.encoded().unwrap().bytes.as_ref(),
        profile.as_slice()
    );

    // Without sample_type_config Go's contentions/delay read as mutex.
    let body = multipart("x", &[("profile", &profile)]);
    let reply = h
        .post(
            "/ingest?name=svc",
            &[("content-type", "multipart/form-data; boundary=x")],
            body,
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(h.batches()[1][0].labels.get("__name__"), Some("mutex"));
    h.stop().await;
}

#[tokio::test]
async fn folded_text_is_converted() {
    let h = Harness::start().await;
    let reply = h
        .post(
            "/ingest?name=rbapp.cpu%7Bhost%3Da%7D&from=1700000000&until=1700000010&spyName=rbspy&sampleRate=100&format=folded",
            &[("content-type", "text/plain")],
            "main;work;hot 3\nmain;idle 1\n",
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // No format means folded too; `lines` counts lines.
    let reply = h
        .post("/ingest?name=rbapp.alloc_space", &[], "main;alloc 4096\n")
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = h
        .post(
            "/ingest?name=x.wall&format=lines&sampleRate=0",
            &[],
            "a;b\na;b\n",
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let batches = h.batches();
    let cpu = &batches[0][0];
    assert_eq!(
        cpu.labels.to_selector_string(),
        r#"{__delta__="false", __name__="process_cpu", host="a", pyroscope_spy="rbspy", service_name="rbapp"}"#
    );
    assert_eq!(cpu.sample_types, vec![ValueType::new("cpu", "nanoseconds")]);
    assert_eq!(cpu.period, 10_000_000);
    let p = cpu.payload.decoded().unwrap();
    let stacks: Vec<(Vec<&str>, i64)> = pprof::stacks_root_first(&p)
        .map(|(s, sample)| (s, sample.value[0]))
        .collect();
    assert_eq!(
        stacks,
        vec![
            (vec!["main", "work", "hot"], 30_000_000),
            (vec!["main", "idle"], 10_000_000)
        ]
    );
    let mem = &batches[1][0];
    assert_eq!(mem.labels.get("__name__"), Some("memory"));
    assert_eq!(
        mem.sample_types,
        vec![ValueType::new("alloc_space", "bytes")]
    );
    let wall = &batches[2][0];
    assert_eq!(wall.labels.get("__name__"), Some("wall"));
    assert_eq!(wall.payload.decoded().unwrap().sample[0].value, vec![2]);
    h.stop().await;
}

// ---------------------------------------------------------------------- Push

#[tokio::test]
async fn push_proto_gzip_like_pyroscope_rs() {
    let h = Harness::start().await;
    let cpu = pprof::encode(&cpu_profile(T));
    let req = push_request(&[
        (
            &[
                ("__name__", "process_cpu"),
                ("service_name", "rs-app"),
                ("otel.scope.name", "com.grafana.pyroscope/rust"),
            ],
            vec![cpu.clone()],
        ),
        (&[("service_name", "other")], vec![cpu.clone(), cpu.clone()]),
    ]);
    let reply = h
        .post(
            "/push.v1.PusherService/Push",
            &[
                ("content-type", "application/proto"),
                ("content-encoding", "gzip"),
                ("user-agent", "pyroscope-rs/pyspy/0.5 reqwest"),
                ("x-scope-orgid", "team-a"),
            ],
            gzip(&req.encode_to_vec()),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.headers.get("content-type").unwrap(),
        "application/proto"
    );
    assert!(reply.body.is_empty(), "empty PushResponse");
    let batches = h.batches();
    assert_eq!(batches.len(), 1, "all series of a request in one batch");
    assert_eq!(batches[0].len(), 3);
    assert_eq!(
        batches[0][0].labels.to_selector_string(),
        r#"{__name__="process_cpu", otel_scope_name="com.grafana.pyroscope/rust", service_name="rs-app"}"#
    );
    assert_eq!(batches[0][0].start_unix_nanos, T);
    assert_eq!(batches[0][0].payload.encoded().unwrap().bytes, cpu);
    assert_eq!(batches[0][1].labels.get("__name__"), Some("process_cpu"));
    assert_eq!(batches[0][2].labels.get("service_name"), Some("other"));
    let meta = &h.metas()[0];
    assert_eq!(
        meta.tenant.as_deref(),
        Some("team-a"),
        "X-Scope-OrgID names the tenant"
    );
    assert_eq!(&*meta.receiver, "pprof_push");

    // Plain proto, no __name__ and no service_name.
    let req = push_request(&[(&[], vec![pprof::encode(&block_profile())])]);
    let reply = h
        .post(
            "/push.v1.PusherService/Push",
            &[("content-type", "application/proto")],
            req.encode_to_vec(),
        )
        .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let e = &h.batches()[1][0];
    assert_eq!(h.metas()[1].tenant, None);
    assert_eq!(e.labels.get("service_name"), Some("unknown_service"));
    assert_eq!(e.labels.get("__name__"), Some("mutex"));
    h.stop().await;
}

#[tokio::test]
async fn push_json_plain_and_gzip() {
    let h = Harness::start().await;
    let raw = pprof::gzip(&pprof::encode(&cpu_profile(T)));
    let b64 = base64::engine::general_purpose::STANDARD.encode(&raw);
    let json = format!(
        r#"{{"series":[{{"labels":[{{"name":"__name__","value":"process_cpu"}},{{"name":"service_name","value":"js"}}],"samples":[{{"rawProfile":"{b64}","ID":"1"}}]}}]}}"#
    );
    for encoding in ["identity", "gzip"] {
        let body = if encoding == "gzip" {
            gzip(json.as_bytes())
        } else {
            json.clone().into_bytes()
        };
        let reply = h
            .post(
                "/push.v1.PusherService/Push",
                &[
                    ("content-type", "application/json"),
                    ("content-encoding", encoding),
                    ("connect-protocol-version", "1"),
                ],
                body,
            )
            .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(
            reply.headers.get("content-type").unwrap(),
            "application/json"
        );
        assert_eq!(reply.text(), "{}");
    }
    let batches = h.batches();
    assert_eq!(batches.len(), 2);
    for b in &batches {
        assert_eq!(b[0].labels.get("service_name"), Some("js"));
        assert_eq!(b[0].payload.encoded().unwrap().bytes, raw);
    }
    h.stop().await;
}

// --------------------------------------------------------------- bad input

#[tokio::test]
async fn bad_input_gets_4xx_json_and_the_server_keeps_serving() {
    let h = Harness::start().await;
    let good = pprof::encode(&cpu_profile(T));
    let bomb = gzip(&vec![0u8; 4 << 20]);
    assert!(bomb.len() < 64 << 10, "the bomb fits the request limit");
    let too_big = vec![b'a'; (64 << 10) + 1];
    // 60,000 samples with one empty label each: 240 KB that would decode to
    // 12 MB, over 32 times its size.
    let decodes_too_large = [0x12, 0x02, 0x1a, 0x00].repeat(60_000);
    let decoded_limit = format!(
        "once decoded, more than its limit of {} bytes",
        pprof::decoded_budget(decodes_too_large.len())
    );
    let push = "/push.v1.PusherService/Push";
    let proto = ("content-type", "application/proto");
    // method, path, headers, body, status, Connect code, a word the message has.
    type Case<'a> = (
        &'a str,
        &'a str,
        Vec<(&'a str, &'a str)>,
        Vec<u8>,
        u16,
        &'a str,
        &'a str,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "POST",
            push,
            vec![proto],
            b"\x0a\xff\xff\xff\x0f".to_vec(),
            400,
            "invalid_argument",
            "malformed PushRequest",
        ),
        (
            "POST",
            push,
            vec![proto, ("content-encoding", "gzip")],
            b"\x1f\x8b\x08\x00garbage".to_vec(),
            400,
            "invalid_argument",
            "corrupt gzip",
        ),
        (
            "POST",
            push,
            vec![proto, ("content-encoding", "gzip")],
            bomb.clone(),
            413,
            "resource_exhausted",
            "max_decompressed_size",
        ),
        (
            "POST",
            push,
            vec![("content-type", "text/xml")],
            good.to_vec(),
            415,
            "unimplemented",
            "application/proto",
        ),
        (
            "POST",
            push,
            vec![proto, ("content-encoding", "br")],
            good.to_vec(),
            415,
            "unimplemented",
            "Content-Encoding",
        ),
        (
            "POST",
            push,
            vec![proto],
            push_request(&[(&[], vec![])]).encode_to_vec(),
            400,
            "invalid_argument",
            "no profiles",
        ),
        (
            "POST",
            push,
            vec![proto],
            push_request(&[(&[("bad-label", "x")], vec![good.clone()])]).encode_to_vec(),
            400,
            "invalid_argument",
            "bad-label",
        ),
        (
            "POST",
            push,
            vec![("content-type", "application/json")],
            b"{\"series\": [".to_vec(),
            400,
            "invalid_argument",
            "malformed JSON",
        ),
        (
            "GET",
            push,
            vec![],
            vec![],
            405,
            "unimplemented",
            "send POST",
        ),
        (
            "POST",
            "/ingest?name=a&format=pprof",
            vec![],
            b"\x1f\x8b\x08\x00garbage".to_vec(),
            400,
            "invalid_argument",
            "corrupt gzip",
        ),
        (
            "POST",
            "/ingest?name=a&format=pprof",
            vec![],
            b"definitely not protobuf".to_vec(),
            400,
            "invalid_argument",
            "pprof",
        ),
        (
            "POST",
            "/ingest?name=a&format=pprof",
            vec![],
            gzip(&decodes_too_large),
            400,
            "invalid_argument",
            &decoded_limit,
        ),
        (
            "POST",
            "/ingest?name=a&format=pprof",
            vec![],
            bomb,
            413,
            "resource_exhausted",
            "max_decompressed_size",
        ),
        (
            "POST",
            "/ingest?name=a%7Bk%3Dv&format=pprof",
            vec![],
            good.to_vec(),
            400,
            "invalid_argument",
            "not closed",
        ),
        (
            "POST",
            "/ingest?name=a%7Bbad-key%3Dv%7D&format=pprof",
            vec![],
            good.to_vec(),
            400,
            "invalid_argument",
            "bad-key",
        ),
        (
            "POST",
            "/ingest?format=pprof",
            vec![],
            good.to_vec(),
            400,
            "invalid_argument",
            "application name is missing",
        ),
        (
            "POST",
            "/ingest?name=a&format=protobuf3",
            vec![],
            good.to_vec(),
            400,
            "invalid_argument",
            "unknown format",
        ),
        (
            "POST",
            "/ingest?name=a&format=jfr",
            vec![("content-type", "multipart/form-data; boundary=x")],
            b"--x--\r\n".to_vec(),
            400,
            "invalid_argument",
            "no `jfr` part",
        ),
        (
            "POST",
            "/ingest?name=a",
            vec![("content-type", "multipart/form-data; boundary=x")],
            multipart("x", &[("other", b"1")]),
            400,
            "invalid_argument",
            "no `profile` part",
        ),
        (
            "POST",
            "/ingest?name=a&format=pprof",
            vec![],
            too_big,
            413,
            "resource_exhausted",
            "max_request_body_size",
        ),
        (
            "POST",
            "/ingest?name=a&from=tomorrow",
            vec![],
            b"a 1".to_vec(),
            400,
            "invalid_argument",
            "from",
        ),
        (
            "POST",
            "/ingest?name=my.app",
            vec![],
            b"a;b 1".to_vec(),
            400,
            "invalid_argument",
            "not a profile type",
        ),
        (
            "POST",
            "/ingest?name=a",
            vec![],
            b"a;b lots".to_vec(),
            400,
            "invalid_argument",
            "line 1",
        ),
        (
            "PUT",
            "/ingest?name=a",
            vec![],
            vec![],
            405,
            "unimplemented",
            "send POST",
        ),
        (
            "POST",
            "/v1/nothing",
            vec![],
            vec![],
            404,
            "unimplemented",
            "/ingest",
        ),
    ];
    for (method, path, headers, body, status, code, needle) in cases {
        let reply = h.send(method, path, &headers, Bytes::from(body)).await;
        assert_eq!(reply.status, status, "{method} {path}: {}", reply.text());
        let (got_code, message) = reply.error();
        assert_eq!(got_code, code, "{method} {path}: {message}");
        assert!(
            message.contains(needle),
            "{method} {path}: {message:?} should mention {needle:?}"
        );
        if status == 405 {
            assert_eq!(reply.headers.get("allow").unwrap(), "POST");
        }
        h.assert_still_serving().await;
    }
    assert!(
        h.batches()
            .iter()
            .all(|b| b[0].labels.get("service_name") == Some("alive"))
    );
    for reason in [
        "bad_request",
        "too_large",
        "unsupported_media_type",
        "method_not_allowed",
        "not_found",
    ] {
        assert!(
            h.metric(&format!(
                r#"proflow_receiver_refused_requests_total{{receiver="pprof_push",reason="{reason}"}}"#
            )),
            "{reason}: {}",
            h.telemetry.render()
        );
    }
    h.stop().await;
}

#[tokio::test]
async fn chunked_body_over_the_limit_is_cut_off() {
    let h = Harness::start().await;
    // No Content-Length: the limit must hold while streaming.
    let mut stream = tokio::net::TcpStream::connect(h.addr).await.unwrap();
    let head = "POST /ingest?name=a&format=pprof HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\n\r\n";
    stream.write_all(head.as_bytes()).await.unwrap();
    let chunk = vec![b'a'; 16 << 10];
    for _ in 0..5 {
        let mut frame = format!("{:x}\r\n", chunk.len()).into_bytes();
        frame.extend_from_slice(&chunk);
        frame.extend_from_slice(b"\r\n");
        if stream.write_all(&frame).await.is_err() {
            break; // the server may already have answered and closed
        }
    }
    let _ = stream.write_all(b"0\r\n\r\n").await;
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.read_to_end(&mut response)).await;
    let text = String::from_utf8_lossy(&response);
    assert!(text.starts_with("HTTP/1.1 413"), "{text}");
    assert!(text.contains("max_request_body_size"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("connection: close"),
        "a refusal before the body was read closes the connection, and says so: {text}"
    );
    h.assert_still_serving().await;
    h.stop().await;
}

// ------------------------------------------------------------ backpressure

#[tokio::test]
async fn backpressure_is_429_with_retry_after() {
    let h = Harness::start().await;
    h.answer(Answer::Backpressure(Duration::from_millis(1500)));
    let req = push_request(&[(
        &[("service_name", "a")],
        vec![
            pprof::encode(&cpu_profile(T)),
            pprof::encode(&cpu_profile(T)),
        ],
    )]);
    let reply = h
        .post(
            "/push.v1.PusherService/Push",
            &[("content-type", "application/proto")],
            req.encode_to_vec(),
        )
        .await;
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.headers.get("retry-after").unwrap(), "2", "rounded up");
    assert_eq!(reply.headers.get("connection").unwrap(), "close");
    let (code, message) = reply.error();
    assert_eq!(code, "resource_exhausted");
    assert!(message.contains("slow"), "{message}");
    assert!(h.metric(
        r#"proflow_receiver_refused_profiles_total{receiver="pprof_push",reason="backpressure"} 2"#
    ));

    let reply = h.post("/ingest?name=a", &[], "main;work 1\n").await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.headers.get("retry-after").unwrap(), "2");

    h.answer(Answer::ShuttingDown);
    let reply = h.post("/ingest?name=a", &[], "main;work 1\n").await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.error().0, "unavailable");

    h.answer(Answer::Accept);
    h.assert_still_serving().await;
    assert_eq!(
        h.batches().len(),
        1,
        "only the last request reached the pipeline"
    );
    h.stop().await;
}

// --------------------------------------------------------------- lifecycle

#[tokio::test]
async fn bind_errors_name_the_address() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let config = PprofPushConfig {
        listener: HttpListenerSettings::on(addr.to_string()),
        ..PprofPushConfig::default()
    };
    let telemetry = Arc::new(Telemetry::new());
    let build = BuildContext {
        id: "pprof_push/busy".into(),
        telemetry,
        memory: proflow_model::memory::MemoryBudget::new(1 << 30),
    };
    let receiver = config.build(&build).unwrap();
    let recorder = Recorder::new();
    let err = match receiver
        .start(ReceiverContext {
            id: build.id.clone(),
            consumer: recorder,
            telemetry: build.receiver_telemetry(),
            shutdown: CancellationToken::new(),
            memory: MemoryBudget::new(64 << 20),
            takes_profiles: true,
            spans: None,
            listeners: Default::default(),
        })
        .await
    {
        Ok(_) => panic!("bound a taken port"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains(&addr.to_string()), "{err}");
    assert!(err.contains("pprof_push/busy"), "{err}");
}

// ------------------------------------------------------------- tenant limits

/// The stacks of a recorded profile, root first.
fn stacks_of(e: &Envelope) -> Vec<Vec<String>> {
    let p = e.payload.decoded().unwrap();
    pprof::stacks_root_first(&p)
        .map(|(s, _)| s.into_iter().map(str::to_owned).collect())
        .collect()
}

/// The tenant's profile and series limits at the receiver itself (the
/// comparison with the real Pyroscope is `tests/tenants.rs`): past the
/// samples, sample-labels and size limits a request is refused (400,
/// Pyroscope's words for the path); a deep stack is cut to its root-most
/// frames, pprof or folded, and the frames cut counted; past the series
/// limit, 429; a tenant id Pyroscope would not take, 400.
#[tokio::test]
async fn profile_and_series_limits_refuse_and_cut_at_the_receiver() {
    let limits = serde_saphyr::from_str(
        "max_profile_size_bytes: 3000\nmax_profile_stacktrace_samples: 3\n\
         max_profile_stacktrace_sample_labels: 1\nmax_profile_stacktrace_depth: 2\n\
         max_global_series_per_tenant: 3\n",
    )
    .unwrap();
    let h = Harness::start_with(PprofPushConfig {
        limits: Some(limits),
        ..PprofPushConfig::default()
    })
    .await;
    let team = [("X-Scope-OrgID", "team")];
    let ingest = |app: &str| format!("/ingest?name={app}&format=pprof");
    let profile_with = |samples: usize, labels: &[(&str, &str)], depth: usize| {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds").time(1, 1);
        for i in 0..samples {
            let frames: Vec<u64> = (0..depth).map(|d| b.frame(&format!("f{i}_{d}"))).collect();
            // Leaf first: f{i}_{depth-1} is the leaf, f{i}_0 the root.
            b.sample_with_labels(frames.into_iter().rev().collect(), vec![1], labels);
        }
        pprof::gzip(&pprof::encode(&b.build()))
    };
    // Four samples, one over.
    let r = h.post(&ingest("a"), &team, profile_with(4, &[], 1)).await;
    assert_eq!(r.status, 400);
    assert!(
        r.text().contains(
            "exceeds the samples count limit (max_profile_stacktrace_samples, actual: 4, limit: 3)"
        ),
        "{}",
        r.text()
    );
    // Two labels on a sample, one over.
    let r = h
        .post(
            &ingest("a"),
            &team,
            profile_with(1, &[("x", "1"), ("y", "2")], 1),
        )
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.text()
            .contains("max_profile_stacktrace_sample_labels, actual: 2, limit: 1"),
        "{}",
        r.text()
    );
    // A pprof body larger than 3000 bytes plain, in /ingest's words.
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    b.sample_root_first(["main", &"x".repeat(4000)], vec![1]);
    let r = h
        .post(&ingest("a"), &team, pprof::gzip(&pprof::encode(&b.build())))
        .await;
    assert_eq!(r.status, 400);
    assert!(
        r.text()
            .contains("decompressed size exceeds maximum allowed size of 3000 bytes"),
        "{}",
        r.text()
    );
    assert!(h.batches().is_empty(), "nothing refused was passed on");
    // A stack of four frames, as gzipped pprof and as folded text: cut to
    // its two root-most.
    let r = h
        .post(&ingest("deep"), &team, profile_with(1, &[], 4))
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let r = h
        .post(
            "/ingest?name=deep.cpu&format=folded",
            &team,
            "f0_0;f0_1;f0_2;f0_3 5\n",
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text());
    let batches = h.batches();
    assert_eq!(batches.len(), 2);
    for b in &batches {
        assert_eq!(
            stacks_of(&b[0]),
            vec![vec!["f0_0".to_owned(), "f0_1".to_owned()]]
        );
    }
    assert!(
        h.metric(r#"proflow_receiver_lost_parts_total{receiver="pprof_push",part="frame",reason="max_profile_stacktrace_depth"} 4"#),
        "{}",
        h.telemetry.render()
    );
    // Series, for a tenant of its own: three fit, a fourth not.
    let series = [("X-Scope-OrgID", "series")];
    for app in ["s1", "s2", "s3"] {
        assert_eq!(
            h.post(&ingest(app), &series, profile_with(1, &[], 1))
                .await
                .status,
            200
        );
    }
    let r = h
        .post(&ingest("s4"), &series, profile_with(1, &[], 1))
        .await;
    assert_eq!(r.status, 429, "{}", r.text());
    assert!(
        r.text()
            .contains("Maximum active series limit exceeded (3/3)"),
        "{}",
        r.text()
    );
    // Another tenant counts its own; a known series passes.
    assert_eq!(
        h.post(&ingest("s4"), &team, profile_with(1, &[], 1))
            .await
            .status,
        200
    );
    assert_eq!(
        h.post(&ingest("s1"), &series, profile_with(1, &[], 1))
            .await
            .status,
        200
    );
    // A tenant id Pyroscope would not take.
    for bad in ["a/b", "..", &"t".repeat(151)] {
        let r = h
            .post(
                &ingest("a"),
                &[("X-Scope-OrgID", bad)],
                profile_with(1, &[], 1),
            )
            .await;
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.text().contains("is not a tenant id"), "{}", r.text());
    }
    for (tenant, reason) in [
        ("team", "samples_limit"),
        ("team", "sample_labels_limit"),
        ("team", "profile_size_limit"),
        ("series", "series_limit"),
    ] {
        assert!(
            h.metric(&format!(r#"proflow_receiver_tenant_refused_requests_total{{receiver="pprof_push",tenant="{tenant}",reason="{reason}"}} 1"#)),
            "{reason}: {}",
            h.telemetry.render()
        );
    }
    h.stop().await;
}
