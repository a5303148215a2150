//! Every push format the `pprof_push` receiver takes arrives as a profile file:
//! raw pprof on `/ingest` (plain and gzip), multipart like pyroscope-go,
//! folded text, and Connect `Push` in protobuf (plain and gzip) and JSON;
//! each file holds, per sample type and function, the totals sent.

mod common;

use std::collections::BTreeMap;

use common::{HOT_FUNCTION, IndexEntry, Proflow, WARM_FUNCTION};
use proflow_model::pprof::{self, Profile};

/// The functions of [`common::cpu_profile`] and of the folded push.
const FUNCTIONS: [&str; 3] = ["main", HOT_FUNCTION, WARM_FUNCTION];

/// Per sample type (`type/unit`) and function of [`FUNCTIONS`], the sum of
/// the values of the samples whose stack holds it.
type SampleTotals = BTreeMap<(String, String), i64>;

fn sample_totals(profile: &Profile) -> SampleTotals {
    let string = |i: i64| {
        profile
            .string_table
            .get(i as usize)
            .cloned()
            .unwrap_or_default()
    };
    let types: Vec<String> = profile
        .sample_type
        .iter()
        .map(|st| format!("{}/{}", string(st.r#type), string(st.unit)))
        .collect();
    let mut totals = SampleTotals::new();
    for (frames, sample) in pprof::stacks_root_first(profile) {
        for (ty, value) in types.iter().zip(&sample.value) {
            for f in FUNCTIONS.iter().filter(|f| frames.contains(f)) {
                *totals.entry((ty.clone(), (*f).to_owned())).or_default() += value;
            }
        }
    }
    totals
}

/// What a push of [`common::cpu_profile`] sent, read from its bytes.
fn sent_cpu_profile() -> SampleTotals {
    let sent = pprof::decode(&common::cpu_profile().into(), 1 << 20).expect("a pprof profile");
    let totals = sample_totals(&sent);
    assert!(
        totals.len() == FUNCTIONS.len() && totals.values().all(|v| *v > 0),
        "the pushed profile holds every function once: {totals:?}"
    );
    totals
}

/// Waits for the one file of `app`, checks its labels (`service_name`, the
/// relabelled `team=core`, a `__name__`, and `extra`) and that its sample
/// totals per sample type and function are those `sent`; returns the entry.
fn expect_profile_file(
    proflow: &Proflow,
    app: &str,
    extra: &[(&str, &str)],
    sent: &SampleTotals,
) -> IndexEntry {
    let entries = proflow.wait_for_files(1, |e| e.label("service_name") == Some(app));
    let entry = entries[0].clone();
    assert_eq!(entry.label("team"), Some("core"), "{:?}", entry.raw);
    assert!(
        entry.label("__name__").is_some_and(|n| !n.is_empty()),
        "no __name__: {:?}",
        entry.raw
    );
    for (k, v) in extra {
        assert_eq!(entry.label(k), Some(*v), "label {k}: {:?}", entry.raw);
    }
    let written = sample_totals(&common::read_profile(&entry.path));
    assert_eq!(
        &written,
        sent,
        "sample totals of {} (left) against those sent (right)",
        entry.path.display()
    );
    entry
}

fn raw_pprof(gzipped: bool) {
    let proflow = Proflow::start_default("");
    let app = common::unique_name(if gzipped { "raw-gzip" } else { "raw-plain" });
    let body = if gzipped {
        common::gzip(&common::cpu_profile())
    } else {
        common::cpu_profile()
    };
    proflow
        .post(
            &common::ingest_query(&format!("{app}{{env=e2e,region=local}}"), Some("pprof")),
            &[("content-type", "application/octet-stream")],
            body,
        )
        .expect_status(200, "raw pprof push");
    expect_profile_file(
        &proflow,
        &app,
        &[("env", "e2e"), ("region", "local")],
        &sent_cpu_profile(),
    );
}

#[test]
fn raw_pprof_plain() {
    raw_pprof(false);
}

#[test]
fn raw_pprof_gzip() {
    raw_pprof(true);
}

#[test]
fn multipart_like_pyroscope_go() {
    let proflow = Proflow::start_default("");
    let app = common::unique_name("multipart");
    let boundary = "e2e0boundary0a1b2c3d4e5f";
    let mut body = Vec::new();
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"profile\"; filename=\"profile.pprof\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        )
        .as_bytes(),
    );
    body.extend_from_slice(&common::gzip(&common::cpu_profile()));
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    // pyroscope-go: from/until in nanoseconds, spyName gospy, no format.
    let until = common::now_nanos();
    let query = format!(
        "/ingest?name={}&from={}&until={until}&spyName=gospy&sampleRate=100",
        common::percent_encode(&format!("{app}{{lang=go}}")),
        until - 10_000_000_000
    );
    let content_type = format!("multipart/form-data; boundary={boundary}");
    proflow
        .post(&query, &[("content-type", content_type.as_str())], body)
        .expect_status(200, "multipart push");
    expect_profile_file(&proflow, &app, &[("lang", "go")], &sent_cpu_profile());
}

#[test]
fn folded_text() {
    let proflow = Proflow::start_default("");
    let app = common::unique_name("folded");
    let body = format!("main;{HOT_FUNCTION} 30\nmain;{WARM_FUNCTION} 10\n");
    let query = format!(
        "{}&units=samples&aggregationType=sum",
        common::ingest_query(&format!("{app}{{kind=folded}}"), Some("folded"))
    );
    proflow
        .post(&query, &[("content-type", "text/plain")], body.into_bytes())
        .expect_status(200, "folded push");
    // Each counted sample of a CPU profile at sampleRate=100 is worth
    // 1 s / 100, in nanoseconds.
    let sample = 10_000_000;
    let cpu = |f: &str, samples: i64| {
        (
            ("cpu/nanoseconds".to_owned(), f.to_owned()),
            samples * sample,
        )
    };
    let sent = SampleTotals::from([
        cpu("main", 40),
        cpu(HOT_FUNCTION, 30),
        cpu(WARM_FUNCTION, 10),
    ]);
    expect_profile_file(&proflow, &app, &[("kind", "folded")], &sent);
}

fn connect_labels(app: &str) -> Vec<(&str, &str)> {
    vec![
        ("__name__", "process_cpu"),
        ("service_name", app),
        ("flavor", "connect"),
    ]
}

fn connect_proto(gzipped: bool) {
    let proflow = Proflow::start_default("");
    let app = common::unique_name(if gzipped {
        "connect-gzip"
    } else {
        "connect-proto"
    });
    let request = common::push::request(&connect_labels(&app), common::cpu_profile());
    let mut body = prost::Message::encode_to_vec(&request);
    let mut headers = vec![("content-type", "application/proto")];
    if gzipped {
        body = common::gzip(&body);
        headers.push(("content-encoding", "gzip"));
    }
    let reply = proflow.post("/push.v1.PusherService/Push", &headers, body);
    reply.expect_status(200, "Connect proto push");
    assert!(
        reply.content_type.starts_with("application/proto"),
        "a Connect proto reply is application/proto, got {:?}",
        reply.content_type
    );
    let entry = expect_profile_file(
        &proflow,
        &app,
        &[("flavor", "connect")],
        &sent_cpu_profile(),
    );
    assert_eq!(entry.label("__name__"), Some("process_cpu"));
}

#[test]
fn connect_push_proto() {
    connect_proto(false);
}

#[test]
fn connect_push_proto_gzip() {
    connect_proto(true);
}

#[test]
fn connect_push_json() {
    let proflow = Proflow::start_default("");
    let app = common::unique_name("connect-json");
    let labels: Vec<serde_json::Value> = connect_labels(&app)
        .into_iter()
        .map(|(k, v)| serde_json::json!({"name": k, "value": v}))
        .collect();
    let body = serde_json::json!({
        "series": [{
            "labels": labels,
            "samples": [{"rawProfile": common::base64(&common::cpu_profile())}],
        }]
    });
    let reply = proflow.post(
        "/push.v1.PusherService/Push",
        &[("content-type", "application/json")],
        body.to_string().into_bytes(),
    );
    reply.expect_status(200, "Connect JSON push");
    assert!(
        reply.content_type.starts_with("application/json"),
        "a Connect JSON reply is application/json, got {:?}",
        reply.content_type
    );
    let entry = expect_profile_file(
        &proflow,
        &app,
        &[("flavor", "connect")],
        &sent_cpu_profile(),
    );
    assert_eq!(entry.label("__name__"), Some("process_cpu"));
}

#[test]
fn base64_encoder_matches_rfc4648() {
    // The JSON test depends on this helper; check it against RFC 4648's vectors.
    for (input, want) in [
        ("", ""),
        ("f", "Zg=="),
        ("fo", "Zm8="),
        ("foo", "Zm9v"),
        ("foob", "Zm9vYg=="),
        ("fooba", "Zm9vYmE="),
        ("foobar", "Zm9vYmFy"),
    ] {
        assert_eq!(common::base64(input.as_bytes()), want, "base64({input:?})");
    }
}
