//! Hostile input, second round: bodies whose work (CPU, or memory the
//! budget did not see) grows faster than their bytes.
//!
//! - One OTLP request of 2,000 one-sample profiles sharing a dictionary of
//!   200,000 strings (656 KB), behind an exporter that wants pprof: each
//!   profile used to decode and check the whole dictionary again, on the
//!   request's async task (19.3 s of a core for one request). Now the
//!   dictionary is decoded once per request, and a large batch is converted
//!   on the blocking pool.
//! - A speedscope body of 200,000 nested opens at one instant (a few KB
//!   gzipped, no `Content-Encoding`), three clients in a loop: each open
//!   used to copy the stack above it (quadratic), on the async worker (the
//!   body was small on the wire).
//! - A gzipped trie of nameless open nodes (3 bytes each, 20 Mi of them in
//!   61 KB), three at once: each node's bookkeeping used to go uncharged
//!   (393 MB over idle with a 128 MiB budget).
//!
//! Asserted: `/healthz` answers within [`HEALTHZ_BOUND`] all along (it did
//! not answer within 30 s before), an innocent push beside the attacks gets
//! 200 within [`PUSH_BOUND`], every attack is answered (200 or a 4xx), and
//! the collector's peak memory stays under budget + queue + 64 MiB.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::profiles::v1development as otlp;
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

use super::common::{self, Proflow, cpu_profile, gzip, ingest_query};
use super::peak_rss;

/// The slowest `/healthz` answer allowed while an attack is in flight. The
/// issue's bound is 50 ms for the release build; the tests run the debug
/// build beside other work, so this is looser, and still far below what the
/// attacks took before (seconds to no answer at all).
const HEALTHZ_BOUND: Duration = Duration::from_millis(500);
/// The slowest answer to an innocent small push beside the attacks.
const PUSH_BOUND: Duration = Duration::from_secs(1);

/// Asks `/healthz` every 20 ms until `done`; returns the slowest answer
/// (a failed request counts as the time it took to fail).
fn watch_healthz(proflow: &Proflow, done: Arc<AtomicBool>) -> thread::JoinHandle<Duration> {
    let url = format!("http://{}/healthz", proflow.ports.telemetry);
    thread::spawn(move || {
        let http = reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .expect("an HTTP client");
        let mut slowest = Duration::ZERO;
        while !done.load(Ordering::SeqCst) {
            let started = Instant::now();
            let ok = http.get(&url).send().is_ok_and(|r| r.status().is_success());
            let took = started.elapsed();
            slowest = slowest.max(if ok { took } else { Duration::from_secs(30) });
            thread::sleep(Duration::from_millis(20));
        }
        slowest
    })
}

/// An OTLP request of `profiles` one-sample CPU profiles whose dictionary
/// holds `strings` one-byte strings besides the few they use.
fn wide_dictionary_request(profiles: usize, strings: usize) -> Vec<u8> {
    let mut string_table: Vec<String> = ["", "cpu", "nanoseconds", "main"]
        .into_iter()
        .map(String::from)
        .collect();
    string_table.extend(std::iter::repeat_n("x".to_owned(), strings));
    let dictionary = otlp::ProfilesDictionary {
        mapping_table: vec![otlp::Mapping::default()],
        location_table: vec![
            otlp::Location::default(),
            otlp::Location {
                lines: vec![otlp::Line {
                    function_index: 1,
                    ..Default::default()
                }],
                ..Default::default()
            },
        ],
        function_table: vec![
            otlp::Function::default(),
            otlp::Function {
                name_strindex: 3,
                ..Default::default()
            },
        ],
        link_table: vec![otlp::Link::default()],
        string_table,
        attribute_table: vec![otlp::KeyValueAndUnit::default()],
        stack_table: vec![
            otlp::Stack::default(),
            otlp::Stack {
                location_indices: vec![1],
            },
        ],
    };
    let now = common::now_nanos() as u64;
    let profiles = (0..profiles)
        .map(|i| otlp::Profile {
            sample_type: Some(otlp::ValueType {
                type_strindex: 1,
                unit_strindex: 2,
            }),
            samples: vec![otlp::Sample {
                stack_index: 1,
                values: vec![10_000_000],
                ..Default::default()
            }],
            // A window of its own each, so none merges with another.
            time_unix_nano: now - 1_000_000_000 * (i as u64 + 1),
            duration_nano: 1_000_000_000,
            ..Default::default()
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles: vec![otlp::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![KeyValue {
                    key: "service.name".into(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue("wide.dictionary".into())),
                    }),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            scope_profiles: vec![otlp::ScopeProfiles {
                profiles,
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dictionary),
    }
    .encode_to_vec()
}

/// Speedscope JSON of one evented profile: `opens` opens of one frame, all
/// at time 0, never closed.
fn nested_opens(opens: usize) -> Vec<u8> {
    let events = vec![r#"{"type":"O","at":0,"frame":0}"#; opens].join(",");
    format!(
        r#"{{"$schema":"https://www.speedscope.app/file-format-schema.json","shared":{{"frames":[{{"name":"a"}}]}},"profiles":[{{"type":"evented","name":"e","unit":"milliseconds","startValue":0,"endValue":1,"events":[{events}]}}]}}"#
    )
    .into_bytes()
}

fn assert_answered(what: &str, status: u16) {
    assert!(
        status == 200 || (400..500).contains(&status),
        "{what} was answered {status}: every attack gets 200 or a 4xx"
    );
}

#[test]
fn requests_whose_work_outgrows_their_bytes_never_stall_the_collector() {
    let mut otlp_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        otlp_port = common::free_port();
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\n  otlp:\n    protocols:\n      http:\n        endpoint: 127.0.0.1:{otlp_port}\nexporters:\n  file:\n    directory: {}\n    sending_queue: {{queue_size: 10000}}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push, otlp], exporters: [file]}}\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    let done = Arc::new(AtomicBool::new(false));
    let healthz = watch_healthz(&proflow, done.clone());

    // The wide dictionary, twice at once.
    let wide = Arc::new(wide_dictionary_request(2_000, 200_000));
    eprintln!("OTLP request: {} KiB", wide.len() >> 10);
    let url = format!("http://127.0.0.1:{otlp_port}/v1development/profiles");
    let started = Instant::now();
    let senders: Vec<_> = (0..2)
        .map(|_| {
            let (wide, url) = (wide.clone(), url.clone());
            thread::spawn(move || {
                common::http_client()
                    .post(&url)
                    .header("Content-Type", "application/x-protobuf")
                    .body(wide.to_vec())
                    .send()
                    .map_or(0, |r| r.status().as_u16())
            })
        })
        .collect();
    for s in senders {
        assert_eq!(
            s.join().expect("a sender"),
            200,
            "the wide dictionary (0: no answer within the client's timeout)"
        );
    }
    let wide_took = started.elapsed();

    // Nested opens, three clients in a loop for 5 s, beside an innocent
    // folded push every 100 ms.
    let opens = Arc::new(gzip(&nested_opens(200_000)));
    eprintln!("speedscope body: {} KiB gzipped", opens.len() >> 10);
    let until = Instant::now() + Duration::from_secs(5);
    let attackers: Vec<_> = (0..3)
        .map(|_| {
            let (opens, url) = (
                opens.clone(),
                proflow.receiver_url(&ingest_query("nested_opens.cpu", Some("speedscope"))),
            );
            thread::spawn(move || {
                let http = common::http_client();
                let mut answers = Vec::new();
                while Instant::now() < until {
                    answers.push(
                        http.post(&url)
                            .body(opens.to_vec())
                            .send()
                            .map_or(0, |r| r.status().as_u16()),
                    );
                }
                answers
            })
        })
        .collect();
    let folded = b"main;work 100\n".to_vec();
    let mut slowest_push = Duration::ZERO;
    let mut pushes = 0;
    while Instant::now() < until {
        let started = Instant::now();
        let reply = proflow.post(
            &ingest_query("innocent", Some("folded")),
            &[],
            folded.clone(),
        );
        slowest_push = slowest_push.max(started.elapsed());
        reply.expect_status(200, "an innocent push");
        pushes += 1;
        thread::sleep(Duration::from_millis(100));
    }
    let mut attacks = 0;
    for a in attackers {
        for status in a.join().expect("an attacker") {
            assert_answered("a speedscope body of nested opens", status);
            attacks += 1;
        }
    }
    done.store(true, Ordering::SeqCst);
    let slowest_healthz = healthz.join().expect("the healthz watcher");
    eprintln!(
        "two wide dictionaries answered in {wide_took:?}; {attacks} nested-open bodies; {pushes} innocent pushes, the slowest {slowest_push:?}; slowest /healthz {slowest_healthz:?}"
    );
    assert!(
        wide_took < Duration::from_secs(10),
        "two OTLP requests of 2,000 profiles sharing a 200,000-string dictionary took {wide_took:?}"
    );
    assert!(attacks >= 3, "each attacker was answered at least once");
    assert!(
        slowest_push <= PUSH_BOUND,
        "an innocent push beside the attacks took {slowest_push:?}"
    );
    assert!(
        slowest_healthz <= HEALTHZ_BOUND,
        "/healthz took {slowest_healthz:?} while the attacks ran\nlog:\n{}",
        proflow.log_text()
    );
    // Every profile of the wide requests is written.
    let deadline = Instant::now() + Duration::from_secs(60);
    let written = loop {
        let written = common::metric_sum(
            &proflow.metrics(),
            "proflow_exporter_sent_profiles_total",
            &[("exporter", "file")],
        );
        if written >= 4_000.0 || Instant::now() > deadline {
            break written;
        }
        thread::sleep(Duration::from_millis(200));
    };
    assert!(
        written >= 4_000.0,
        "the file exporter wrote {written} profiles of the two wide requests' 4,000"
    );
}

#[test]
fn a_trie_of_empty_nodes_is_charged_to_the_budget() {
    let proflow = Proflow::start(|ports, _| {
        format!(
            "receivers:\n  pprof_push:\n    endpoint: {}\nexporters:\n  nop:\n    sending_queue: {{max_bytes: 16MiB}}\nservice:\n  limits:\n    max_in_flight_bytes: 128MiB\n  telemetry:\n    address: {}\n  pipelines:\n    profiles: {{receivers: [pprof_push], exporters: [nop]}}\n",
            ports.receiver, ports.telemetry
        )
    });
    // Warm the allocator with a small push first, so the idle size is the
    // running collector's.
    proflow
        .post(
            &ingest_query("small", Some("pprof")),
            &[],
            gzip(&cpu_profile()),
        )
        .expect_status(200, "a small push");
    let idle = peak_rss(proflow.pid());
    let trie = Arc::new(gzip(&b"\x00\x00\x01".repeat(20 << 20)));
    eprintln!("trie: {} KiB gzipped", trie.len() >> 10);
    let senders: Vec<_> = (0..3)
        .map(|_| {
            let (trie, url) = (
                trie.clone(),
                proflow.receiver_url(&ingest_query("trie_bomb.cpu", Some("trie"))),
            );
            thread::spawn(move || {
                common::http_client()
                    .post(&url)
                    .header("Content-Encoding", "gzip")
                    .body(trie.to_vec())
                    .send()
                    .map_or((0, String::new()), |r| {
                        (r.status().as_u16(), r.text().unwrap_or_default())
                    })
            })
        })
        .collect();
    let answers: Vec<(u16, String)> = senders
        .into_iter()
        .map(|s| s.join().expect("a sender"))
        .collect();
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert!(
        statuses.iter().all(|s| [413, 429].contains(s)),
        "a trie of 20 Mi open nodes must be refused for memory: {answers:?}"
    );
    let peak = peak_rss(proflow.pid());
    let bound = idle + (128 << 20) + (16 << 20) + (64 << 20);
    eprintln!(
        "three tries: {statuses:?}; peak {} MiB, idle {} MiB, bound {} MiB",
        peak >> 20,
        idle >> 20,
        bound >> 20
    );
    assert!(
        peak <= bound,
        "peak memory {} MiB over the bound {} MiB (idle + budget + queue + 64 MiB)",
        peak >> 20,
        bound >> 20
    );
    proflow
        .post(
            &ingest_query("small", Some("pprof")),
            &[],
            gzip(&cpu_profile()),
        )
        .expect_status(200, "a push after the attack");
}
