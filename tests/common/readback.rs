//! Reading profiles back from the real backends, for the tests that send
//! through proflow's exporters: Pyroscope's merged flame graph
//! (`SelectMergeStacktraces`) and Parca's merged pprof (`/api/profiles/query`
//! through its REST gateway), each reduced to per-function totals.
//!
//! Totals are per function name: the sum of the values of every sample (or
//! flame graph node) of that function, as `common::Totals` counts the files
//! proflow wrote. The functions must not recurse (a function twice on one
//! stack would count twice in a flame graph).

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use proflow_model::pprof;

/// Per function, a total (the same type as `common::Totals`).
pub type Totals = BTreeMap<String, i64>;

/// A client that reads a multi-tenant Pyroscope as `tenant` (every
/// request carries its `X-Scope-OrgID`).
pub fn tenant_reader(tenant: &str) -> reqwest::blocking::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert(
        "X-Scope-OrgID",
        reqwest::header::HeaderValue::from_str(tenant).expect("a header value"),
    );
    reqwest::blocking::Client::builder()
        .default_headers(headers)
        .timeout(std::time::Duration::from_secs(10))
        .build()
        .expect("an HTTP client")
}

/// Now in Unix milliseconds.
fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// A JSON integer that proto3 JSON may write as a string.
fn int(v: &serde_json::Value) -> i64 {
    match v {
        serde_json::Value::String(s) => s.parse().unwrap_or(0),
        other => other.as_i64().unwrap_or(0),
    }
}

/// Per function of `functions`, the sum of the totals of its flame graph
/// nodes. A level's `values` are groups of four: x offset (relative to the
/// previous node's end), total, self, name index.
pub fn flamegraph_totals(flamegraph: &serde_json::Value, functions: &[&str]) -> Totals {
    let empty = Vec::new();
    let names: Vec<&str> = flamegraph["names"]
        .as_array()
        .unwrap_or(&empty)
        .iter()
        .map(|n| n.as_str().unwrap_or_default())
        .collect();
    let mut totals = Totals::new();
    for level in flamegraph["levels"].as_array().unwrap_or(&empty) {
        let values: Vec<i64> = level["values"]
            .as_array()
            .unwrap_or(&empty)
            .iter()
            .map(int)
            .collect();
        for node in values.chunks_exact(4) {
            let name = names.get(node[3] as usize).copied().unwrap_or_default();
            if functions.contains(&name) {
                *totals.entry(name.to_owned()).or_default() += node[1];
            }
        }
    }
    totals
}

/// POSTs a Connect JSON request to Pyroscope; the answer if it is a success
/// with a JSON body, else `Err` with what came back.
fn pyroscope_call(
    http: &reqwest::blocking::Client,
    base: &str,
    path: &str,
    body: serde_json::Value,
) -> Result<serde_json::Value, String> {
    let response = http
        .post(format!("{base}{path}"))
        .header("Content-Type", "application/json")
        .body(body.to_string())
        .send()
        .map_err(|e| format!("{path}: {e}"))?;
    let status = response.status();
    let text = response.text().unwrap_or_default();
    if !status.is_success() {
        return Err(format!("{path}: {status} {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("{path}: {e}: {text}"))
}

/// Pyroscope's merged stack traces for `selector` (e.g.
/// `{service_name="x"}`) over the last hour, reduced to the totals of
/// `functions`. With `profile_type` (e.g.
/// `process_cpu:cpu:nanoseconds:cpu:nanoseconds`) that type is read;
/// without, every type Pyroscope lists is tried and the first with any of the
/// functions is taken. Returns the totals and the type read (or, when none
/// had them, what was seen).
pub fn pyroscope_totals(
    http: &reqwest::blocking::Client,
    base: &str,
    selector: &str,
    functions: &[&str],
    profile_type: Option<&str>,
) -> (Totals, String) {
    let now = now_ms();
    let (start, end) = (now - 3_600_000, now + 60_000);
    let ids: Vec<String> = match profile_type {
        Some(t) => vec![t.to_owned()],
        None => pyroscope_call(
            http,
            base,
            "/querier.v1.QuerierService/ProfileTypes",
            serde_json::json!({ "start": start, "end": end }),
        )
        .ok()
        .and_then(|types| {
            types["profileTypes"].as_array().map(|a| {
                a.iter()
                    .filter_map(|t| t["ID"].as_str().map(str::to_owned))
                    .collect()
            })
        })
        .unwrap_or_default(),
    };
    let mut seen = Vec::new();
    for id in &ids {
        let answer = match pyroscope_call(
            http,
            base,
            "/querier.v1.QuerierService/SelectMergeStacktraces",
            serde_json::json!({
                "profileTypeID": id,
                "labelSelector": selector,
                "start": start,
                "end": end,
            }),
        ) {
            Ok(a) => a,
            Err(e) => {
                seen.push(e);
                continue;
            }
        };
        let totals = flamegraph_totals(&answer["flamegraph"], functions);
        if !totals.is_empty() {
            return (totals, id.clone());
        }
        seen.push(format!("{id}: none of {functions:?}"));
    }
    (
        Totals::new(),
        format!("no profile type had them; types {ids:?}; {seen:?}"),
    )
}

/// Reads [`pyroscope_totals`] of `functions` for `selector` under
/// `profile_type` every 500 ms until `done` takes them or `timeout` has
/// passed. Returns whether `done` took them, the last totals and what
/// Pyroscope answered (for the failure message).
pub fn pyroscope_wait(
    http: &reqwest::blocking::Client,
    base: &str,
    (selector, functions, profile_type): (&str, &[&str], &str),
    timeout: std::time::Duration,
    done: impl Fn(&Totals) -> bool,
) -> (bool, Totals, String) {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let (totals, answer) =
            pyroscope_totals(http, base, selector, functions, Some(profile_type));
        if done(&totals) {
            return (true, totals, answer);
        }
        if std::time::Instant::now() >= deadline {
            return (false, totals, answer);
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// Pyroscope's merged profile of the samples of `spans` (16-hex span ids,
/// as `SelectMergeSpanProfile` selects them by their `span_id` label) for
/// `selector` and `profile_type` over the last hour, reduced to the totals
/// of `functions`.
pub fn pyroscope_span_totals(
    http: &reqwest::blocking::Client,
    base: &str,
    selector: &str,
    profile_type: &str,
    spans: &[String],
    functions: &[&str],
) -> Result<Totals, String> {
    let now = now_ms();
    let answer = pyroscope_call(
        http,
        base,
        "/querier.v1.QuerierService/SelectMergeSpanProfile",
        serde_json::json!({
            "profileTypeID": profile_type,
            "labelSelector": selector,
            "spanSelector": spans,
            "start": now - 3_600_000,
            "end": now + 60_000,
        }),
    )?;
    Ok(flamegraph_totals(&answer["flamegraph"], functions))
}

pub use proflow_core::telemetry::rfc3339;

/// Parca's merged pprof for `query` (`TYPE{labels}`) over the last hour, if
/// it answers one; `last` gets the status and start of the last answer.
pub fn parca_merge(
    http: &reqwest::blocking::Client,
    base: &str,
    query: &str,
    last: &mut String,
) -> Option<pprof::Profile> {
    let now = now_ms() / 1000;
    let (start, end) = (rfc3339(now - 3600), rfc3339(now + 60));
    let url = reqwest::Url::parse_with_params(
        &format!("{base}/api/profiles/query"),
        &[
            ("mode", "MODE_MERGE"),
            ("merge.query", query),
            ("merge.start", start.as_str()),
            ("merge.end", end.as_str()),
            ("reportType", "REPORT_TYPE_PPROF"),
        ],
    )
    .ok()?;
    let response = match http.get(url).send() {
        Ok(r) => r,
        Err(e) => {
            *last = e.to_string();
            return None;
        }
    };
    let status = response.status();
    let text = response.text().unwrap_or_default();
    *last = format!("{status} {}", text.chars().take(500).collect::<String>());
    let body: serde_json::Value = serde_json::from_str(&text).ok()?;
    let bytes = BASE64.decode(body["pprof"].as_str()?).ok()?;
    pprof::decode(&bytes::Bytes::from(bytes), 64 << 20).ok()
}

/// Waits (up to `timeout`) until Pyroscope reads back, in `profile_type`,
/// the same totals of `functions` for the services `direct` and `through`,
/// and `direct`'s are `complete`. Returns them, or else both last reads.
#[allow(clippy::too_many_arguments)]
pub fn same_service_totals(
    http: &reqwest::blocking::Client,
    base: &str,
    direct: &str,
    through: &str,
    functions: &[&str],
    profile_type: &str,
    timeout: std::time::Duration,
    complete: impl Fn(&Totals) -> bool,
) -> Result<Totals, (Totals, Totals)> {
    let read = |service: &str| {
        pyroscope_totals(
            http,
            base,
            &format!("{{service_name=\"{service}\"}}"),
            functions,
            Some(profile_type),
        )
        .0
    };
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let (a, b) = (read(direct), read(through));
        if complete(&a) && a == b {
            return Ok(a);
        }
        if std::time::Instant::now() >= deadline {
            return Err((a, b));
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
}

/// POSTs `body` as `content_type` to `url` (a backend's or proflow's
/// `/ingest`), and fails the test, naming the URL and the answer, unless it
/// succeeds.
pub fn post_ok(http: &reqwest::blocking::Client, url: &str, content_type: &str, body: Vec<u8>) {
    let reply = http
        .post(url)
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = reply.status();
    assert!(
        status.is_success(),
        "POST {url}: {status} {}",
        reply.text().unwrap_or_default()
    );
}
