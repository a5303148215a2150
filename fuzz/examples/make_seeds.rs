//! Writes the seed corpora of the fuzz targets, `fuzz/seeds/<target>/`:
//! a few small valid inputs each, made here by proflow's own encoders (no
//! corpus is copied from anywhere). Run from `fuzz/`:
//! `cargo run --example make_seeds`. Files are named by what they hold, so
//! running it again rewrites the same files.

use std::fs;
use std::path::Path;

use bytes::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use proflow_core::queue::storage::{record, segment};
use proflow_fuzz::join_parts;
use proflow_model::model::{BatchMeta, Envelope, Labels, Payload, ValueType};
use proflow_model::otlp::{self, json};
use proflow_model::pprof::{self, ProfileBuilder};
use proflow_model::push_v1::{PushRequest, RawProfileSeries};
use proflow_model::testdata;
use prost::Message;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds");
    let put = |target: &str, name: &str, bytes: &[u8]| {
        let dir = root.join(target);
        fs::create_dir_all(&dir).expect("cannot make the seeds folder");
        fs::write(dir.join(name), bytes).expect("cannot write a seed");
    };
    let with = |first: u8, rest: &[u8]| [&[first][..], rest].concat();

    // pprof: a small CPU profile, plain and gzipped, and a heap profile
    // with labels, mappings and two sample types.
    let cpu = pprof::encode(&testdata::cpu_profile(12, 6));
    let cpu_gz = pprof::gzip(&cpu);
    let heap = heap_profile(&[(&["main", "alloc"], 10), (&["main", "work", "alloc"], 4)]);
    let heap_later = heap_profile(&[(&["main", "alloc"], 25), (&["main", "other"], 3)]);
    for target in ["pprof_decode", "pprof_to_otlp"] {
        put(target, "cpu", &cpu);
        put(target, "cpu_gzip", &cpu_gz);
        put(target, "heap", &heap);
    }
    // Two profiles to merge: the same CPU profile twice, and two heap
    // profiles with some stacks in common.
    put("pprof_merge", "cpu_twice", &join_parts(&cpu, &cpu));
    put("pprof_merge", "heaps", &join_parts(&heap, &heap_later));

    // gzip: one member, two members, one with every optional header field
    // (FEXTRA, FNAME, FCOMMENT, FHCRC) and one whose trailer understates it.
    put("gzip", "one_member", &cpu_gz);
    put(
        "gzip",
        "two_members",
        &[&pprof::gzip(b"ab")[..], &pprof::gzip(b"cd")[..]].concat(),
    );
    let mut flagged = cpu_gz[..10].to_vec();
    flagged[3] = 4 | 8 | 16 | 2;
    flagged.extend_from_slice(&[3, 0, b'a', b'b', b'c']);
    flagged.extend_from_slice(b"cpu.pb\0a comment\0");
    flagged.extend_from_slice(&[0x12, 0x34]);
    flagged.extend_from_slice(&cpu_gz[10..]);
    put("gzip", "header_fields", &flagged);
    let mut understated = cpu_gz.to_vec();
    let n = understated.len();
    understated[n - 4..].copy_from_slice(&7u32.to_le_bytes());
    put("gzip", "understated", &understated);

    // push.v1: protobuf (first byte 0) and JSON (1).
    let push = PushRequest {
        series: vec![RawProfileSeries::new(
            [("__name__", "process_cpu"), ("service_name", "shop")],
            [cpu_gz.clone()],
        )],
    };
    put("push_request", "proto", &with(0, &push.encode_to_vec()));
    let push_json = format!(
        r#"{{"series":[{{"labels":[{{"name":"__name__","value":"process_cpu"}},{{"name":"service_name","value":"shop"}}],"samples":[{{"rawProfile":"{}","ID":"1"}}]}}]}}"#,
        base64(&cpu_gz)
    );
    put("push_request", "json", &with(1, push_json.as_bytes()));

    // /ingest: query, NUL, body.
    let folded = b"main;work;hot 30\nmain;idle 5\nmain;work;hot 2\n";
    let query_body = |q: &str, body: &[u8]| [q.as_bytes(), &[0], body].concat();
    put(
        "ingest",
        "pprof",
        &query_body(
            "name=shop.cpu{env=prod}&format=pprof&from=1700000000&until=1700000010",
            &cpu_gz,
        ),
    );
    put(
        "ingest",
        "folded",
        &query_body("name=shop.cpu&sampleRate=100&spyName=rbspy", folded),
    );
    put(
        "ingest",
        "lines",
        &query_body(
            "name=shop.alloc_objects&format=lines",
            b"main;a\nmain;a\nmain;b\n",
        ),
    );
    put(
        "ingest",
        "groups",
        &query_body("name=shop.cpu&format=groups&sampleRate=100", folded),
    );
    // Binary tree and trie bodies (LEB128 name length, name, value, child
    // count per node, depth first): main;hot 30 and main;idle 5.
    let node = |name: &str, value: u8, children: u8| {
        [&[name.len() as u8][..], name.as_bytes(), &[value, children]].concat()
    };
    let tree = [
        node("", 0, 1),
        node("main", 0, 2),
        node("hot", 30, 0),
        node("idle", 5, 0),
    ]
    .concat();
    put(
        "ingest",
        "tree",
        &query_body("name=shop.cpu&format=tree&sampleRate=100", &tree),
    );
    let trie = [
        node("", 0, 1),
        node("main;", 0, 2),
        node("hot", 30, 0),
        node("idle", 5, 0),
    ]
    .concat();
    put(
        "ingest",
        "trie",
        &query_body("name=shop.cpu&format=trie&sampleRate=100", &trie),
    );
    // Speedscope: a sampled profile with fractional weights in seconds, and
    // an evented one in milliseconds, sharing the frames.
    let speedscope = br#"{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{"frames":[{"name":"main"},{"name":"hot"},{"name":"idle"}]},"profiles":[{"type":"sampled","name":"s","unit":"seconds","startValue":0,"endValue":0.04,"samples":[[0,1],[0,2],[0,1]],"weights":[0.01,0.01,0.02]},{"type":"evented","name":"e","unit":"milliseconds","startValue":0,"endValue":30,"events":[{"type":"O","frame":0,"at":0},{"type":"O","frame":1,"at":5},{"type":"C","frame":1,"at":25},{"type":"C","frame":0,"at":30}]}]}"#;
    put(
        "ingest",
        "speedscope",
        &query_body("name=shop.cpu&format=speedscope", speedscope),
    );
    // JFR through /ingest: the recording the real Java agent made (seeds/jfr).
    let recording =
        fs::read(root.join("jfr/agent-itimer.jfr")).expect("seeds/jfr/agent-itimer.jfr");
    put(
        "ingest",
        "jfr",
        &query_body("name=shop&format=jfr", &recording),
    );

    // Debug files: a small C program compiled here with DWARF, the same
    // stripped, and its separate debug file (`objcopy --only-keep-debug`),
    // as a debuginfod server sends them.
    let work = std::env::temp_dir().join(format!("proflow-seeds-{}", std::process::id()));
    fs::create_dir_all(&work).expect("a temporary folder");
    let c = work.join("tiny.c");
    fs::write(
        &c,
        "static int hot(int n) { int s = 0; for (int i = 0; i < n; i++) s += i * i; return s; }\n\
         __attribute__((noinline)) int work(int n) { return hot(n) + 1; }\n\
         int main(int argc, char **argv) { (void)argv; return work(argc * 1000) & 1; }\n",
    )
    .expect("write tiny.c");
    let run = |program: &str, args: &[&std::ffi::OsStr]| {
        let status = std::process::Command::new(program)
            .args(args)
            .status()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        assert!(status.success(), "{program} {args:?} failed: {status}");
    };
    let exe = work.join("tiny");
    let stripped = work.join("tiny.stripped");
    let debug = work.join("tiny.debug");
    run(
        "cc",
        &[
            "-g".as_ref(),
            "-O1".as_ref(),
            // The same bytes from every run: no temporary path in the DWARF.
            format!("-ffile-prefix-map={}=.", work.display()).as_ref(),
            "-Wl,--build-id".as_ref(),
            "-o".as_ref(),
            exe.as_os_str(),
            c.as_os_str(),
        ],
    );
    run(
        "objcopy",
        &[
            "--only-keep-debug".as_ref(),
            exe.as_os_str(),
            debug.as_os_str(),
        ],
    );
    run(
        "strip",
        &["-o".as_ref(), stripped.as_os_str(), exe.as_os_str()],
    );
    for (name, path) in [
        ("with_dwarf", &exe),
        ("stripped", &stripped),
        ("debug_only", &debug),
    ] {
        put(
            "debug_file",
            name,
            &fs::read(path).expect("read a built file"),
        );
    }
    fs::remove_dir_all(&work).expect("remove the temporary folder");

    // Folded text: bit 0 lines, the rest a sample rate.
    put("folded", "folded", &with(20, folded));
    put(
        "folded",
        "lines",
        &with(1, b"main;work\nmain;work\r\nmain\n"),
    );

    // Multipart: Content-Type, NUL, body.
    let form = form_body(
        "BoUnDaRy",
        &[
            ("profile", &cpu_gz),
            ("sample_type_config", br#"{"cpu":{"units":"nanoseconds"}}"#),
        ],
    );
    put(
        "multipart",
        "form",
        &[&b"multipart/form-data; boundary=BoUnDaRy"[..], &[0], &form].concat(),
    );

    // OTLP profiles: protobuf plain (flags 0) and gzipped (1), JSON, and a
    // dictionary with one of its profiles for the wire checks.
    let request = testdata::otlp_request(2, 6, 4);
    let proto = request.encode_to_vec();
    put("otlp_proto", "plain", &with(0, &proto));
    put("otlp_proto", "gzip", &with(1, &pprof::gzip(&proto)));
    put("otlp_json", "request", &json::encode_request(&request));
    // A request's dictionary and first profile, encoded.
    let dictionary_and_profile = |r: &otlp::collector::ExportProfilesServiceRequest| {
        let profile = r
            .resource_profiles
            .first()
            .and_then(|r| r.scope_profiles.first())
            .and_then(|s| s.profiles.first())?;
        Some((
            r.dictionary.as_ref()?.encode_to_vec(),
            profile.encode_to_vec(),
        ))
    };
    if let Some((dict, profile)) = dictionary_and_profile(&request) {
        put("otlp_wire", "profile", &join_parts(&dict, &profile));
        // Two dictionaries and a profile of the second, for the merge.
        if let Some((second, profile)) = dictionary_and_profile(&testdata::otlp_request(1, 3, 2)) {
            put(
                "otlp_wire_merge",
                "two",
                &join_parts(&dict, &join_parts(&second, &profile)),
            );
        }
    }

    // OTLP traces: protobuf (0) and JSON (1).
    let spans = trace_request();
    put("spans", "proto", &with(0, &spans.encode_to_vec()));
    let spans_json = br#"{"resourceSpans":[{"resource":{"attributes":[{"key":"service.name","value":{"stringValue":"shop"}}]},"scopeSpans":[{"spans":[{"traceId":"0102030405060708090a0b0c0d0e0f10","spanId":"1112131415161718","parentSpanId":"","name":"GET /cart","startTimeUnixNano":"1700000000000000000","endTimeUnixNano":"1700000000500000000"}]}]}]}"#;
    put("spans", "json", &with(1, spans_json));

    // Kafka records: setting, headers, NUL, value.
    let headers = "proflow.encoding=pprof\nproflow.tenant=t1\nproflow.label.__name__=process_cpu\nproflow.label.service_name=shop\nproflow.start=1700000000000000000\nother";
    put(
        "kafka_record",
        "pprof",
        &[&[0][..], headers.as_bytes(), &[0], &cpu_gz].concat(),
    );
    put(
        "kafka_record",
        "otlp_proto",
        &[&[0][..], &[0], &proto].concat(),
    );
    put(
        "kafka_record",
        "otlp_json",
        &[
            &[3][..],
            b"proflow.label.env=prod",
            &[0],
            &json::encode_request(&request),
        ]
        .concat(),
    );

    // Queue records: a pprof profile and one that arrived as OTLP.
    let meta = BatchMeta {
        receiver: "pprof_push".into(),
        tenant: Some("t1".to_owned()),
        tenant_bound: false,
        client: "127.0.0.1:4040".parse().ok(),
        this_host: false,
    };
    let envelope = Envelope {
        labels: Labels::from_pairs([("__name__", "process_cpu"), ("service_name", "shop")]),
        start_unix_nanos: 1_700_000_000_000_000_000,
        end_unix_nanos: 1_700_000_010_000_000_000,
        sample_types: vec![ValueType::new("cpu", "nanoseconds")],
        period_type: Some(ValueType::new("cpu", "nanoseconds")),
        period: 10_000_000,
        payload: Payload::from_bytes(cpu_gz.clone(), 1 << 20),
    };
    let pprof_record =
        record::encode(std::slice::from_ref(&envelope), &meta).expect("a seed record");
    put("queue_record", "pprof", &pprof_record);
    let split = otlp::split_raw(
        &Bytes::from(proto.clone()),
        &otlp::AttributeLabels::default(),
    )
    .expect("the seed request splits");
    if let Some(e) = split.envelopes.into_iter().next() {
        put(
            "queue_record",
            "otlp",
            &record::encode(&[e], &BatchMeta::default()).expect("a seed record"),
        );
    }

    // Segments: header and frames, one torn; an acknowledgement file.
    let salt = 0x5eed_f00d;
    let mut seg = segment::segment_header(salt).to_vec();
    for r in [&b"first record"[..], &pprof_record, b""] {
        seg.extend_from_slice(&segment::frame_header(salt, r));
        seg.extend_from_slice(r);
    }
    put("queue_segment", "segment", &seg);
    let torn = seg.len() - 3;
    put("queue_segment", "torn", &seg[..torn]);
    let acks: Vec<u8> = [16u64, 40]
        .iter()
        .flat_map(|&o| segment::ack_entry(7, o))
        .collect();
    put("queue_segment", "acks", &acks);

    // Service discovery: JSON (0) and YAML (1).
    let sd_json = br#"[{"targets":["app-1:6060","app-2:6060"],"labels":{"env":"prod","team":"shop"}},{"targets":["10.0.0.1:8080"]}]"#;
    put("scrape_sd", "json", &with(0, sd_json));
    let sd_yaml = b"- targets: ['app-1:6060', 'app-2:6060']\n  labels:\n    env: prod\n- targets:\n    - '[::1]:8080'\n  labels: &common {team: shop}\n- targets: [db:9090]\n  labels: *common\n";
    put("scrape_sd", "yaml", &with(1, sd_yaml));

    // Deltas: two heap scrapes of one process.
    put("scrape_delta", "heap", &join_parts(&heap, &heap_later));
    put("scrape_delta", "cpu", &join_parts(&cpu, &cpu));

    // trace_link: a profile whose samples carry otel-profiling-go's
    // labels (span_id, span_name, trace_id), as pprof (0) and as OTLP (2).
    let traced = traced_profile();
    put("trace_link", "pprof", &with(0, &traced));
    put("trace_link", "otlp_drop", &with(3, &traced));

    // Config: the project's own example.
    put(
        "config",
        "gateway",
        include_bytes!("../../examples/gateway.yaml"),
    );

    // Perf maps as Node, CPython and the JVM write them, read in two parts
    // (the first ends half-way).
    put(
        "perf_map",
        "runtimes",
        &with(
            0x80,
            b"301b3a257fde 40 JS:~hot /app/index.js:10:25\n7febeacbb97f b py::hot:/app/x.py\n0x00007f5fd8f22d80 0x00000000000000b8 void Hot.spin(long)\n",
        ),
    );

    // Every /ingest seed reaches its format's parser and converts: a seed
    // refused at the door would leave that parser unfuzzed.
    for entry in fs::read_dir(root.join("ingest")).expect("seeds/ingest") {
        let path = entry.expect("a seed").path();
        let seed = fs::read(&path).expect("read a seed");
        let split = seed.iter().position(|&b| b == 0).expect("query, NUL, body");
        let query = String::from_utf8_lossy(&seed[..split]);
        match proflow_receivers::pprof_push::fuzzing::ingest(&query, &seed[split + 1..]) {
            Ok(envelopes) if !envelopes.is_empty() => {}
            other => panic!("the seed {} does not convert: {other:?}", path.display()),
        }
    }
}

/// A Go-style heap profile: alloc and inuse types, a mapping, a label.
fn heap_profile(stacks: &[(&[&str], i64)]) -> Vec<u8> {
    let mut b = ProfileBuilder::new();
    b.sample_type("alloc_objects", "count")
        .sample_type("alloc_space", "bytes")
        .sample_type("inuse_space", "bytes")
        .period("space", "bytes", 524_288)
        .time(1_700_000_000_000_000_000, 0);
    for (stack, n) in stacks {
        b.sample_root_first(stack.iter().copied(), vec![*n, n * 512, n * 128]);
    }
    let mut p = b.build();
    let file = p.string_table.len() as i64;
    p.string_table.push("/usr/bin/shop".to_owned());
    p.mapping.push(pprof::Mapping {
        id: 1,
        memory_start: 0x40_0000,
        memory_limit: 0x80_0000,
        filename: file,
        ..Default::default()
    });
    let (key, value) = (p.string_table.len() as i64, p.string_table.len() as i64 + 1);
    p.string_table
        .extend(["thread".to_owned(), "main".to_owned()]);
    if let Some(s) = p.sample.first_mut() {
        s.label.push(pprof::Label {
            key,
            str: value,
            ..Default::default()
        });
    }
    pprof::encode(&p).to_vec()
}

/// Two samples in one span (labels as otel-profiling-go writes them) and
/// one outside any.
fn traced_profile() -> Vec<u8> {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_700_000_000_000_000_000, 10_000_000_000);
    b.sample_root_first(["main", "handle"], vec![20_000_000]);
    b.sample_root_first(["main", "handle", "db"], vec![10_000_000]);
    b.sample_root_first(["main", "idle"], vec![5_000_000]);
    let mut p = b.build();
    let mut intern = |s: &str| {
        p.string_table.push(s.to_owned());
        p.string_table.len() as i64 - 1
    };
    let labels = [
        (intern("span_id"), intern("1112131415161718")),
        (intern("span_name"), intern("GET /cart")),
        (
            intern("trace_id"),
            intern("0102030405060708090a0b0c0d0e0f10"),
        ),
    ];
    for s in p.sample.iter_mut().take(2) {
        for &(key, str) in &labels {
            s.label.push(pprof::Label {
                key,
                str,
                ..Default::default()
            });
        }
    }
    pprof::gzip(&pprof::encode(&p)).to_vec()
}

fn trace_request() -> ExportTraceServiceRequest {
    let span = |id: u8, parent: &[u8], name: &str| Span {
        trace_id: (1..=16).collect(),
        span_id: vec![id; 8],
        parent_span_id: parent.to_vec(),
        name: name.to_owned(),
        start_time_unix_nano: 1_700_000_000_000_000_000,
        end_time_unix_nano: 1_700_000_000_500_000_000,
        ..Default::default()
    };
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".to_owned(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("shop".to_owned())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_spans: vec![ScopeSpans {
                spans: vec![
                    span(1, &[], "GET /cart"),
                    span(2, &[1; 8], "db query"),
                    span(0, &[], "zero id"),
                ],
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// A multipart body as Go's `mime/multipart` writes one.
fn form_body(boundary: &str, parts: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in parts {
        out.extend_from_slice(format!("--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\nContent-Type: application/octet-stream\r\n\r\n").as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    out
}

/// Standard base64 with padding.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
