//! Bad pushes are refused with the right status and a JSON `{"code","message"}`
//! body, counted in `/metrics`, and the receiver keeps serving valid pushes.

mod common;

use common::Proflow;

/// Small limits so the size tests stay cheap.
const LIMITS: &str = "max_request_body_size: 64KiB\nmax_decompressed_size: 1MiB\n";
const REFUSED: &str = "proflow_receiver_refused_requests_total";

/// What a refusal must look like.
struct Refusal {
    status: u16,
    /// The Connect code of the JSON body, when it is a standard mapping.
    code: Option<&'static str>,
    /// The `reason` label of the refusal counter.
    reason: &'static str,
}

const BAD_REQUEST: Refusal = Refusal {
    status: 400,
    code: Some("invalid_argument"),
    reason: "bad_request",
};
const TOO_LARGE: Refusal = Refusal {
    status: 413,
    code: Some("resource_exhausted"),
    reason: "too_large",
};
const UNSUPPORTED: Refusal = Refusal {
    status: 415,
    code: None,
    reason: "unsupported_media_type",
};

/// Sends one bad request, checks the refusal, then checks a valid push still
/// works and the refusal was counted once, under the expected reason.
fn refused_then_served(
    what: &str,
    path_and_query: impl FnOnce(&str) -> String,
    headers: &[(&str, &str)],
    body: Vec<u8>,
    want: Refusal,
) {
    let status = want.status;
    let proflow = Proflow::start_default(LIMITS);
    let app = common::unique_name("bad");
    let reply = proflow.post(&path_and_query(&app), headers, body);
    reply.expect_status(status, what);
    let (code, message) = reply.expect_json_error(what);
    eprintln!("{what}: HTTP {status} code={code:?} message={message:?}");
    if let Some(want_code) = want.code {
        assert_eq!(code, want_code, "{what}: error code (message {message:?})");
    }

    // The server keeps serving.
    let good = common::unique_name("good");
    common::push_valid(&proflow, &good);
    proflow.wait_for_files(1, |e| e.label("service_name") == Some(good.as_str()));

    let metrics = proflow.metrics();
    let refused: Vec<_> = common::metric_samples(&metrics, REFUSED)
        .into_iter()
        .filter(|(labels, _)| labels.get("receiver").map(String::as_str) == Some("pprof_push"))
        .filter(|(_, v)| *v > 0.0)
        .collect();
    let total: f64 = refused.iter().map(|(_, v)| v).sum();
    assert_eq!(
        total,
        1.0,
        "{what}: expected exactly one refusal counted in {REFUSED}{{receiver=\"pprof_push\"}}; metrics:\n{}",
        metrics
            .lines()
            .filter(|l| l.contains("refused"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        refused[0].0.get("reason").map(String::as_str),
        Some(want.reason),
        "{what}: reason label of the counted refusal: {:?}",
        refused[0].0
    );
}

fn pprof_query(app: &str) -> String {
    common::ingest_query(app, Some("pprof"))
}

const OCTET: [(&str, &str); 1] = [("content-type", "application/octet-stream")];

#[test]
fn malformed_protobuf() {
    // Field 1 (sample_type) claims a 2^31-byte message in a 20-byte body.
    let mut body = vec![0x0a, 0x80, 0x80, 0x80, 0x80, 0x08];
    body.extend_from_slice(b"not a profile at all");
    refused_then_served(
        "malformed pprof protobuf",
        pprof_query,
        &OCTET,
        body,
        BAD_REQUEST,
    );
}

#[test]
fn malformed_connect_push_request() {
    let body = vec![0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f, 0x01, 0x02];
    refused_then_served(
        "malformed Connect PushRequest",
        |_| "/push.v1.PusherService/Push".to_owned(),
        &[("content-type", "application/proto")],
        body,
        BAD_REQUEST,
    );
}

#[test]
fn profile_that_would_decode_too_large() {
    // 200,000 samples with one empty label each: 800 KB that would decode to
    // some 44 MB, over 32 times its size.
    let body = common::gzip(&[0x12, 0x02, 0x1a, 0x00].repeat(200_000));
    refused_then_served(
        "profile over its decoded-size budget",
        pprof_query,
        &OCTET,
        body,
        BAD_REQUEST,
    );
}

#[test]
fn corrupt_gzip() {
    let mut body = common::gzip(&common::cpu_profile());
    // Keep the gzip header, garble the deflate stream and the trailer.
    for b in body.iter_mut().skip(12) {
        *b ^= 0x5a;
    }
    refused_then_served("corrupt gzip", pprof_query, &OCTET, body, BAD_REQUEST);
}

#[test]
fn bad_name_syntax() {
    refused_then_served(
        "bad name syntax",
        |app| common::ingest_query(&format!("{app}{{env=e2e"), Some("pprof")),
        &OCTET,
        common::gzip(&common::cpu_profile()),
        BAD_REQUEST,
    );
}

#[test]
fn unknown_format() {
    refused_then_served(
        "unknown format",
        |app| common::ingest_query(app, Some("no-such-format")),
        &OCTET,
        common::gzip(&common::cpu_profile()),
        BAD_REQUEST,
    );
}

/// A multipart form as the Pyroscope Java agent sends it, of `parts`.
fn agent_form(parts: &[(&str, &[u8])]) -> (String, Vec<u8>) {
    let boundary = "e2ejfrboundary";
    let mut body = Vec::new();
    for (name, data) in parts {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"{name}\"\r\n\r\n"
            )
            .as_bytes(),
        );
        body.extend_from_slice(data);
        body.extend_from_slice(b"\r\n");
    }
    body.extend_from_slice(format!("--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

#[test]
fn jfr_that_is_not_a_recording() {
    let (content_type, body) = agent_form(&[("jfr", b"FLR\0 not really a recording")]);
    refused_then_served(
        "jfr part that is not a recording",
        |app| common::ingest_query(app, Some("jfr")),
        &[("content-type", content_type.as_str())],
        body,
        BAD_REQUEST,
    );
    // A recording's header claiming more than the upload holds.
    let mut header = b"FLR\0\0\x02\0\x01".to_vec();
    header.extend_from_slice(&(1u64 << 40).to_be_bytes());
    header.extend_from_slice(&[0; 52]);
    refused_then_served(
        "raw recording claiming a terabyte",
        |app| common::ingest_query(app, Some("jfr")),
        &OCTET,
        header,
        BAD_REQUEST,
    );
}

#[test]
fn speedscope_that_is_not_speedscope() {
    refused_then_served(
        "speedscope without its $schema",
        |app| common::ingest_query(app, Some("speedscope")),
        &[("content-type", "application/json")],
        br#"{"profiles": [{"type": "sampled", "samples": [[0]], "weights": [1]}]}"#.to_vec(),
        BAD_REQUEST,
    );
}

#[test]
fn push_of_an_unknown_content_type() {
    refused_then_served(
        "Push as text/plain",
        |_| "/push.v1.PusherService/Push".to_owned(),
        &[("content-type", "text/plain")],
        b"hello".to_vec(),
        UNSUPPORTED,
    );
}

#[test]
fn jfr_form_without_a_recording() {
    let (content_type, body) = agent_form(&[("labels", b"")]);
    refused_then_served(
        "jfr form without a jfr part",
        |app| common::ingest_query(app, Some("jfr")),
        &[("content-type", content_type.as_str())],
        body,
        BAD_REQUEST,
    );
}

#[test]
fn body_over_max_request_body_size() {
    // 96 KiB against a 64 KiB limit.
    let body = vec![0x42; 96 * 1024];
    refused_then_served("body too large", pprof_query, &OCTET, body, TOO_LARGE);
}

#[test]
fn gzip_bomb_over_max_decompressed_size() {
    // 16 MiB of zeros compresses to ~16 KiB: under the body limit, far over
    // the 1 MiB decompressed limit.
    let bomb = {
        use std::io::Write as _;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        enc.write_all(&vec![0u8; 16 << 20]).expect("gzip to memory");
        enc.finish().expect("gzip to memory")
    };
    assert!(bomb.len() < 64 * 1024, "bomb is {} bytes", bomb.len());
    refused_then_served("gzip bomb", pprof_query, &OCTET, bomb, TOO_LARGE);
}
