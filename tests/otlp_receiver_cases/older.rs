//! A request of OTLP profiles 1.9, made by `gootlpold` (tests/peers/apps:
//! the opentelemetry-proto project's own Go bindings of release 1.9.0, as
//! producers released before 1.10 send it), arrives converted: every
//! sample's value, attribute and link as the program sent them.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use super::common::{self, metric_sum};
use super::{json, peer_env, stacks, start_proflow};

/// One sample as gootlpold printed it.
#[derive(Debug, serde::Deserialize)]
struct Sent {
    stack: String,
    value: i64,
    attribute: String,
    linked: bool,
}

#[test]
fn a_1_9_request_arrives_converted_with_nothing_lost() {
    let Some(program) = peer_env::go_app("gootlpold") else {
        return;
    };
    let (proflow, http_port) = start_proflow();
    let service = peer_env::unique("proflow-otlp-1-9-");
    let url = format!("http://127.0.0.1:{http_port}/v1development/profiles");
    let output = Command::new(&program)
        .args([&url, &service])
        .output()
        .expect("run gootlpold");
    assert!(
        output.status.success(),
        "gootlpold: {}\n{}\nlog:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr),
        proflow.log_text()
    );
    let sent: Vec<Sent> = serde_json::from_slice(&output.stdout).expect("gootlpold's JSON");
    let entries = common::written_entries(&proflow, &service, Duration::from_secs(30));
    assert_eq!(entries.len(), 1, "one profile sent, one written");
    let written = json::decode_request(&std::fs::read(&entries[0].path).unwrap()).unwrap();
    let want: BTreeMap<String, i64> = sent.iter().map(|s| (s.stack.clone(), s.value)).collect();
    assert_eq!(stacks(&written), want, "the values of every stack");

    // Each sample's attribute and link, resolved through the dictionary.
    let d = written.dictionary.as_ref().unwrap();
    let samples = &written.resource_profiles[0].scope_profiles[0].profiles[0].samples;
    let mut got = Vec::new();
    for s in samples {
        let attributes: Vec<String> = s
            .attribute_indices
            .iter()
            .map(|&i| {
                let kv = &d.attribute_table[i as usize];
                let value = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                    Some(proflow_model::otlp::common::any_value::Value::StringValue(v)) => {
                        v.clone()
                    }
                    other => format!("{other:?}"),
                };
                format!("{}={value}", d.string_table[kv.key_strindex as usize])
            })
            .collect();
        let link = &d.link_table[s.link_index as usize];
        got.push((
            attributes,
            s.link_index != 0 && link.trace_id == vec![0xab; 16],
        ));
    }
    got.sort();
    let mut expected: Vec<(Vec<String>, bool)> = sent
        .iter()
        .map(|s| (vec![format!("thread.name={}", s.attribute)], s.linked))
        .collect();
    expected.sort();
    assert_eq!(got, expected, "attributes and links of the samples");
    let metrics = proflow.metrics();
    assert_eq!(
        metric_sum(
            &metrics,
            "proflow_receiver_upgraded_requests_total",
            &[("receiver", "otlp"), ("from", "otlp_1_9")]
        ),
        1.0,
        "the conversion is counted\n{metrics}"
    );
}
