//! The real Grafana Pyroscope peer: push a pprof built in Rust through
//! Pyroscope's Connect push API, then find its function again through
//! `/querier.v1.QuerierService/SelectMergeStacktraces`.

use std::time::Duration;

use proflow_model::pprof::{self, ProfileBuilder};
use proflow_model::push_v1::{PushRequest, RawProfileSeries};
use prost::Message;

use crate::peer_env;

#[test]
fn pushed_pprof_is_found_by_select_merge_stacktraces() {
    let Some(pyroscope) = peer_env::peer("pyroscope") else {
        return;
    };
    let base = pyroscope.http_base();
    let service = peer_env::unique("proflow-smoke-");
    let hot = peer_env::unique("proflowSmokeHot_");

    // A 10 s CPU profile ending now: 3 s in the hot function, 1 s in its caller.
    let now = peer_env::now_nanos();
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", "proflowSmokeCaller", &hot], vec![3_000_000_000])
        .sample_root_first(["main", "proflowSmokeCaller"], vec![1_000_000_000]);
    let raw = pprof::gzip(&pprof::encode(&b.build()));

    let request = PushRequest {
        series: vec![RawProfileSeries::new(
            [("__name__", "process_cpu"), ("service_name", &service)],
            [raw],
        )],
    };
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client");
    let response = http
        .post(format!("{base}/push.v1.PusherService/Push"))
        .header("Content-Type", "application/proto")
        .body(request.encode_to_vec())
        .send()
        .expect("POST /push.v1.PusherService/Push");
    let status = response.status();
    let body = response.text().unwrap_or_default();
    assert!(status.is_success(), "push: {status} {body}");

    let query = serde_json::json!({
        "profileTypeID": "process_cpu:cpu:nanoseconds:cpu:nanoseconds",
        "labelSelector": format!("{{service_name=\"{service}\"}}"),
        "start": now / 1_000_000 - 3_600_000,
        "end": now / 1_000_000 + 60_000,
    });
    let mut last = String::new();
    let found = peer_env::poll(Duration::from_secs(60), || {
        let response = http
            .post(format!(
                "{base}/querier.v1.QuerierService/SelectMergeStacktraces"
            ))
            .header("Content-Type", "application/json")
            .body(query.to_string())
            .send()
            .ok()?;
        let status = response.status();
        let text = response.text().unwrap_or_default();
        last = format!("{status} {text}");
        if !status.is_success() {
            return None;
        }
        let body: serde_json::Value = serde_json::from_str(&text).ok()?;
        let names = body["flamegraph"]["names"].as_array()?;
        names
            .iter()
            .any(|n| n.as_str() == Some(hot.as_str()))
            .then_some(body)
    });
    let body = found.unwrap_or_else(|| {
        panic!("{hot} not in SelectMergeStacktraces for {service} within 60 s; last answer: {last}")
    });
    // Total is the sum of the pushed values (Connect JSON writes int64 as a string).
    let total = &body["flamegraph"]["total"];
    let total = total
        .as_str()
        .and_then(|s| s.parse::<i64>().ok())
        .or_else(|| total.as_i64());
    assert_eq!(total, Some(4_000_000_000), "flamegraph total: {body}");
}
