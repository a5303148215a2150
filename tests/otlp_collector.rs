//! proflow's pprof → OTLP conversion and OTLP JSON codec against the real
//! OpenTelemetry Collector: a profile converted by proflow is sent to the
//! collector's OTLP/HTTP receiver (as OTLP JSON and as protobuf), the
//! collector accepts it without rejecting anything, and what its file exporter
//! writes (OTLP JSON, resource attributes by reference into the string table)
//! is read back with proflow's decoder and converted to pprof with the same
//! totals per stack and sample type as the source.

#[path = "common/peer_env.rs"]
mod peer_env;

use std::collections::BTreeMap;
use std::time::Duration;

use proflow_model::otlp::{self, DictionaryBuilder, Lost, collector, common, json, proto};
use proflow_model::pprof;
use proflow_model::testdata::{TYPICAL_FUNCTIONS, TYPICAL_SAMPLES, cpu_profile};
use prost::Message;

/// Totals per (sample type, stack of function names, leaf first).
fn totals(p: &pprof::Profile) -> BTreeMap<(String, String), i64> {
    let s = |i: i64| p.string_table[i as usize].clone();
    let mut out = BTreeMap::new();
    for sample in &p.sample {
        let stack: Vec<String> = sample
            .location_id
            .iter()
            .flat_map(|id| {
                let l = p.location.iter().find(|l| l.id == *id).unwrap();
                l.line.iter().map(|line| {
                    let f = p
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .unwrap();
                    s(f.name)
                })
            })
            .collect();
        for (t, st) in p.sample_type.iter().enumerate() {
            *out.entry((s(st.r#type), stack.join(";"))).or_default() += sample.value[t];
        }
    }
    out
}

/// A key's or string value's text, inline or by reference into the strings.
fn text(inline: &str, strindex: i32, strings: &[String]) -> String {
    if inline.is_empty() {
        strings.get(strindex as usize).cloned().unwrap_or_default()
    } else {
        inline.to_owned()
    }
}

fn service_name(rp: &proto::ResourceProfiles, strings: &[String]) -> Option<String> {
    rp.resource.as_ref()?.attributes.iter().find_map(|kv| {
        (text(&kv.key, kv.key_strindex, strings) == "service.name").then(|| {
            match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                Some(common::any_value::Value::StringValue(s)) => s.clone(),
                Some(common::any_value::Value::StringValueStrindex(i)) => text("", *i, strings),
                _ => String::new(),
            }
        })
    })
}

fn send_and_read_back(content_type: &str) {
    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let source = cpu_profile(TYPICAL_SAMPLES, TYPICAL_FUNCTIONS);
    let service = peer_env::unique("proflow-otlp-");
    let mut dict = DictionaryBuilder::new();
    let mut lost = Lost::default();
    let profiles = otlp::pprof_to_otlp(&source, &mut dict, &mut lost).unwrap();
    let request = collector::ExportProfilesServiceRequest {
        resource_profiles: vec![proto::ResourceProfiles {
            resource: Some(opentelemetry_proto_resource(&service)),
            scope_profiles: vec![proto::ScopeProfiles {
                scope: Some(common::InstrumentationScope {
                    name: "proflow".into(),
                    ..Default::default()
                }),
                profiles,
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dict.finish()),
    };
    let body = if content_type == "application/json" {
        json::encode_request(&request)
    } else {
        request.encode_to_vec()
    };
    post_accepted(&otelcol, content_type, body);
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(
        totals(&read_back(&otelcol, &service)),
        totals(&source),
        "the same totals per stack and sample type came back through the collector"
    );
}

/// POSTs an OTLP request to the collector's OTLP/HTTP receiver; it must be
/// accepted with no profile rejected.
fn post_accepted(otelcol: &peer_env::Peer, content_type: &str, body: Vec<u8>) {
    let url = format!(
        "http://{}/v1development/profiles",
        otelcol.var("HTTP_ENDPOINT")
    );
    let response = reqwest::blocking::Client::new()
        .post(&url)
        .header("Content-Type", content_type)
        .body(body)
        .send()
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let status = response.status();
    let answer = response.bytes().unwrap_or_default();
    assert!(status.is_success(), "{content_type}: {status} {answer:?}");
    if content_type != "application/json" {
        let answer = collector::ExportProfilesServiceResponse::decode(answer.as_ref()).unwrap();
        assert_eq!(
            answer.partial_success.map_or(0, |p| p.rejected_profiles),
            0,
            "the collector rejected profiles"
        );
    } else {
        let answer: serde_json::Value = serde_json::from_slice(&answer).unwrap_or_default();
        let rejected = &answer["partialSuccess"]["rejectedProfiles"];
        assert!(
            rejected.is_null() || rejected == "0",
            "the collector rejected profiles: {answer}"
        );
    }
}

/// What the collector's file exporter wrote for `service`, read with
/// proflow's OTLP JSON decoder and converted to one pprof profile with
/// nothing lost.
fn read_back(otelcol: &peer_env::Peer, service: &str) -> pprof::Profile {
    let file = otelcol.var("FILE_PATH").to_owned();
    let line = peer_env::poll(Duration::from_secs(20), || {
        let text = std::fs::read_to_string(&file).ok()?;
        text.lines()
            .find(|l| l.contains(service))
            .map(str::to_owned)
    })
    .unwrap_or_else(|| panic!("no line with {service} in the collector's file export {file}"));
    let written =
        json::decode_request(line.as_bytes()).expect("proflow reads the collector's OTLP JSON");
    let dict = written.dictionary.as_ref().expect("a dictionary");
    let rp = written
        .resource_profiles
        .iter()
        .find(|rp| service_name(rp, &dict.string_table).as_deref() == Some(service))
        .unwrap_or_else(|| panic!("no resource with service.name={service}: {line}"));
    let profiles: Vec<proto::Profile> = rp
        .scope_profiles
        .iter()
        .flat_map(|sp| sp.profiles.iter().cloned())
        .collect();
    let mut lost = Lost::default();
    let mut back = otlp::otlp_to_pprof(dict, &profiles, &mut lost).expect("converts back");
    assert!(lost.is_empty(), "{lost:?}");
    assert_eq!(back.len(), 1, "{back:?}");
    back.remove(0)
}

fn opentelemetry_proto_resource(
    service: &str,
) -> opentelemetry_proto::tonic::resource::v1::Resource {
    opentelemetry_proto::tonic::resource::v1::Resource {
        attributes: vec![common::KeyValue {
            key: "service.name".into(),
            value: Some(common::AnyValue {
                value: Some(common::any_value::Value::StringValue(service.to_owned())),
            }),
            key_strindex: 0,
        }],
        ..Default::default()
    }
}

#[test]
fn otlp_json_from_proflow_goes_through_the_collector_unchanged() {
    send_and_read_back("application/json");
}

#[test]
fn otlp_protobuf_from_proflow_goes_through_the_collector_unchanged() {
    send_and_read_back("application/x-protobuf");
}

/// The `file` exporter's `format: otlp_json` output is what the collector's
/// OTLP/HTTP receiver takes: a file written by proflow is posted as it is,
/// accepted, and comes out of the collector with the same totals.
#[test]
fn a_file_written_as_otlp_json_is_taken_by_the_collector() {
    use proflow_exporters::file::{FileExporter, FileExporterConfig};
    use proflow_model::model::{Envelope, Labels, Payload, ValueType};

    let Some(otelcol) = peer_env::peer("otelcol") else {
        return;
    };
    let service = peer_env::unique("proflow-file-otlp-");
    let source = cpu_profile(TYPICAL_SAMPLES, TYPICAL_FUNCTIONS);
    let dir = tempfile::tempdir().unwrap();
    let config: FileExporterConfig = serde_json::from_value(serde_json::json!({
        "directory": dir.path(),
        "format": "otlp_json",
    }))
    .unwrap();
    let exporter = FileExporter::open(&config, "file").unwrap();
    exporter
        .write_batch(&[Envelope {
            labels: Labels::from_pairs([
                ("service_name", service.as_str()),
                ("__name__", "process_cpu"),
            ]),
            start_unix_nanos: source.time_nanos,
            end_unix_nanos: source.time_nanos + source.duration_nanos,
            sample_types: vec![
                ValueType::new("samples", "count"),
                ValueType::new("cpu", "nanoseconds"),
            ],
            period_type: Some(ValueType::new("cpu", "nanoseconds")),
            period: source.period,
            payload: Payload::from_bytes(pprof::encode(&source), 64 << 20),
        }])
        .unwrap();
    let written = std::fs::read_dir(dir.path().join(&service))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".otlp.json"))
        .expect("an .otlp.json file");
    post_accepted(
        &otelcol,
        "application/json",
        std::fs::read(&written).unwrap(),
    );
    assert_eq!(totals(&read_back(&otelcol, &service)), totals(&source));
}
