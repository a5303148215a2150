//! The real OpenTelemetry Collector peer (profiles enabled): export one OTLP
//! profile (OTLP 1.10 JSON: a request-level dictionary and index-based samples)
//! to its OTLP/HTTP receiver and find it again in what its file exporter wrote.

use std::time::Duration;

use crate::peer_env;

#[test]
fn exported_profile_reaches_the_file_exporter() {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let http_endpoint = otelcol.var("HTTP_ENDPOINT").to_owned();
    let file_path = otelcol.var("FILE_PATH").to_owned();
    let service = peer_env::unique("proflow-smoke-");
    let hot = peer_env::unique("proflowSmokeHot_");
    let now = peer_env::now_nanos();

    // Index 0 of every dictionary table is the empty/zero entry, as OTLP requires.
    let request = serde_json::json!({
        "resourceProfiles": [{
            "resource": { "attributes": [
                { "key": "service.name", "value": { "stringValue": service } },
            ]},
            "scopeProfiles": [{
                "scope": { "name": "proflow-smoke" },
                "profiles": [{
                    "sampleType": { "typeStrindex": 1, "unitStrindex": 2 },
                    "periodType": { "typeStrindex": 1, "unitStrindex": 2 },
                    "period": "10000000",
                    "timeUnixNano": (now - 10_000_000_000).to_string(),
                    "durationNano": "10000000000",
                    "samples": [
                        { "stackIndex": 1, "values": ["3000000000"] },
                        { "stackIndex": 2, "values": ["1000000000"] },
                    ],
                }],
            }],
        }],
        "dictionary": {
            "stringTable": ["", "cpu", "nanoseconds", hot, "main"],
            "functionTable": [{}, { "nameStrindex": 3 }, { "nameStrindex": 4 }],
            "locationTable": [{},
                { "lines": [{ "functionIndex": 1 }] },
                { "lines": [{ "functionIndex": 2 }] }],
            // Leaf first: hot called from main; main alone.
            "stackTable": [{}, { "locationIndices": [1, 2] }, { "locationIndices": [2] }],
            "mappingTable": [{}],
            "attributeTable": [{}],
            "linkTable": [{}],
        },
    });
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("HTTP client");
    let url = format!("http://{http_endpoint}/v1development/profiles");
    let response = http
        .post(&url)
        .header("Content-Type", "application/json")
        .body(request.to_string())
        .send()
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status();
    let body = response.text().unwrap_or_default();
    assert!(status.is_success(), "OTLP export: {status} {body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    assert!(
        answer["partialSuccess"]["rejectedProfiles"].is_null()
            || answer["partialSuccess"]["rejectedProfiles"] == "0",
        "collector rejected profiles: {body}"
    );

    // The file exporter writes one ExportProfilesServiceRequest per line, with
    // resource attributes possibly moved into the string table (OTLP 1.10).
    let line = peer_env::poll(Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&file_path).ok()?;
        text.lines()
            .filter(|l| l.contains(&service))
            .find_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
    });
    let line = line.unwrap_or_else(|| {
        panic!("no line with {service} in the collector's file export {file_path} within 20 s")
    });
    let strings: Vec<&str> = line["dictionary"]["stringTable"]
        .as_array()
        .map(|a| a.iter().filter_map(|s| s.as_str()).collect())
        .unwrap_or_default();
    assert!(
        strings.contains(&hot.as_str()),
        "{hot} not in the exported string table: {line}"
    );
    let samples = &line["resourceProfiles"][0]["scopeProfiles"][0]["profiles"][0]["samples"];
    assert_eq!(
        samples.as_array().map(Vec::len),
        Some(2),
        "exported samples: {line}"
    );
}
