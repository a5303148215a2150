//! The real Parca peer: WriteRaw a pprof built in Rust, then query it back
//! (merged, as a pprof report) and find its function.
//!
//! Parca serves gRPC, gRPC-Web and a REST gateway (grpc-gateway, JSON with
//! proto field names in lowerCamelCase, bytes as base64) on one port; this
//! test uses the gateway under `/api`: `POST /api/profiles/writeraw` is
//! `ProfileStoreService/WriteRaw`, `GET /api/profiles/query` is
//! `QueryService/Query`, `GET /api/profiles/types` is `QueryService/ProfileTypes`.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use proflow_model::pprof::{self, ProfileBuilder};

use crate::peer_env;
use crate::readback::rfc3339;

#[test]
fn write_raw_pprof_then_query_it_back() {
    let Some(parca) = peer_env::peer("parca") else {
        return;
    };
    let base = parca.http_base();
    let job = peer_env::unique("proflow-smoke-");
    let hot = peer_env::unique("proflowSmokeHot_");

    // A 10 s CPU profile ending now (duration != 0, so Parca files it as delta).
    let now = peer_env::now_nanos();
    let mut b = ProfileBuilder::new();
    b.sample_type("samples", "count")
        .sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now - 10_000_000_000, 10_000_000_000)
        .sample_root_first(
            ["main", "proflowSmokeCaller", &hot],
            vec![300, 3_000_000_000],
        )
        .sample_root_first(["main", "proflowSmokeCaller"], vec![100, 1_000_000_000]);
    let raw = pprof::gzip(&pprof::encode(&b.build()));

    let write = serde_json::json!({
        "series": [{
            "labels": { "labels": [
                { "name": "__name__", "value": "proflow_smoke" },
                { "name": "job", "value": job },
            ]},
            "samples": [{ "rawProfile": BASE64.encode(&raw) }],
        }],
        "normalized": true,
    });
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client");
    let response = http
        .post(format!("{base}/api/profiles/writeraw"))
        .header("Content-Type", "application/json")
        .body(write.to_string())
        .send()
        .expect("POST /api/profiles/writeraw");
    let status = response.status();
    let body = response.text().unwrap_or_default();
    assert!(status.is_success(), "WriteRaw: {status} {body}");

    // Each pprof sample type becomes its own profile type.
    let cpu_type = "proflow_smoke:cpu:nanoseconds:cpu:nanoseconds:delta";
    let types = get_json(&http, &format!("{base}/api/profiles/types"));
    let listed: Vec<String> = types["types"]
        .as_array()
        .map(|types| {
            types
                .iter()
                .map(|t| {
                    format!(
                        "{}:{}:{}:{}:{}{}",
                        t["name"].as_str().unwrap_or(""),
                        t["sampleType"].as_str().unwrap_or(""),
                        t["sampleUnit"].as_str().unwrap_or(""),
                        t["periodType"].as_str().unwrap_or(""),
                        t["periodUnit"].as_str().unwrap_or(""),
                        if t["delta"].as_bool() == Some(true) {
                            ":delta"
                        } else {
                            ""
                        },
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    assert!(
        listed.iter().any(|t| t == cpu_type),
        "{cpu_type} not among Parca's profile types: {listed:?}"
    );

    let start = rfc3339((now / 1_000_000_000) - 3600);
    let end = rfc3339((now / 1_000_000_000) + 60);
    let query = format!("{cpu_type}{{job=\"{job}\"}}");
    let url = reqwest::Url::parse_with_params(
        &format!("{base}/api/profiles/query"),
        &[
            ("mode", "MODE_MERGE"),
            ("merge.query", query.as_str()),
            ("merge.start", start.as_str()),
            ("merge.end", end.as_str()),
            ("reportType", "REPORT_TYPE_PPROF"),
        ],
    )
    .expect("query URL");
    let mut last = String::new();
    let merged = peer_env::poll(Duration::from_secs(30), || {
        let response = http.get(url.clone()).send().ok()?;
        let status = response.status();
        let text = response.text().unwrap_or_default();
        last = format!("{status} {text}");
        let body: serde_json::Value = serde_json::from_str(&text).ok()?;
        let bytes = BASE64.decode(body["pprof"].as_str()?).ok()?;
        let profile = pprof::decode(&bytes::Bytes::from(bytes), 64 << 20).ok()?;
        let has_hot =
            pprof::stacks_root_first(&profile).any(|(frames, _)| frames.contains(&hot.as_str()));
        has_hot.then_some(profile)
    });
    let merged = merged.unwrap_or_else(|| {
        panic!("{hot} not in Parca's merged pprof for {query} within 30 s; last answer: {last}")
    });
    let total: i64 = merged.sample.iter().filter_map(|s| s.value.first()).sum();
    assert_eq!(total, 4_000_000_000, "merged cpu nanoseconds");
}

fn get_json(http: &reqwest::blocking::Client, url: &str) -> serde_json::Value {
    let response = http
        .get(url)
        .send()
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status();
    let body = response.text().unwrap_or_default();
    assert!(status.is_success(), "GET {url}: {status} {body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {body}"))
}
