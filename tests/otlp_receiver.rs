//! proflow's `otlp` receiver against the real OpenTelemetry Collector: the
//! test posts OTLP profiles to a collector of its own (started from the
//! `otelcol` peer's binary with a config of its own), whose `otlp_grpc` or
//! `otlp_http` exporter forwards them to proflow's `otlp` receiver; proflow's
//! `file` exporter writes them as OTLP JSON, and the test checks functions,
//! values and resource attributes against what it sent.
//!
//! A request built with the official Python classes (`opentelemetry-proto`
//! from PyPI, `tests/peers/apps/otlp-python/send.py`, run by the Python of
//! `PROFLOW_OTLP_PYTHON` from `tests/peers/install-clients`) goes the same
//! way, collector's OTLP/HTTP receiver → `otlp_grpc` → proflow, and every
//! profile must arrive unchanged: resolved through each request's
//! dictionary, all fields equal and the samples equal as multisets.

// Both helpers include `peer_skip` (the first test to use the two): each
// gets its own copy, which only means a skip is recorded by the one that saw it.
#![allow(clippy::duplicate_mod)]

mod common;
mod peer_env;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Proflow, free_port, http_client};
use proflow_pipeline::otlp::common::{AnyValue, InstrumentationScope, KeyValue, any_value};
use proflow_pipeline::otlp::{DictionaryBuilder, Resource, collector, json, proto};
use prost::Message;

/// The collector binary the `otelcol` peer was built into.
fn otelcol_bin(peer: &peer_env::Peer) -> PathBuf {
    if let Some(bin) = peer.get("BIN") {
        return PathBuf::from(bin);
    }
    // A collector started by an older `up` did not report its binary.
    let home = std::env::var("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/proflow-peers/otelcol-v0.158.0/src/otelcol-proflow")
}

/// A collector of the test's own, killed on drop.
struct Otelcol {
    child: Child,
    http: String,
    log: PathBuf,
    _dir: tempfile::TempDir,
}

impl Otelcol {
    /// Starts `bin` with an OTLP receiver on free ports and `exporter`
    /// (a YAML body for the `exporter_type` exporter) in the profiles pipeline.
    fn start(bin: &Path, exporter_type: &str, exporter: &str) -> Otelcol {
        let dir = tempfile::tempdir().unwrap();
        let (grpc, http) = (free_port(), free_port());
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: 127.0.0.1:{grpc}}}\n      http: {{endpoint: 127.0.0.1:{http}}}\nexporters:\n  {exporter_type}:\n{exporter}\nservice:\n  telemetry:\n    metrics: {{level: none}}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [{exporter_type}]\n"
        );
        let config_path = dir.path().join("otelcol.yaml");
        std::fs::write(&config_path, &config).unwrap();
        let log = dir.path().join("otelcol.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .arg("--config")
            .arg(&config_path)
            .arg("--feature-gates=+service.profilesSupport")
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut otelcol = Otelcol {
            child,
            http: format!("127.0.0.1:{http}"),
            log,
            _dir: dir,
        };
        // Ready once the profiles path takes an empty request.
        let client = http_client();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ok = client
                .post(otelcol.url())
                .header("content-type", "application/json")
                .body("{}")
                .send()
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return otelcol;
            }
            if let Ok(Some(status)) = otelcol.child.try_wait() {
                panic!(
                    "the collector exited with {status}:\n{}\nconfig:\n{config}",
                    otelcol.log_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "the collector did not get ready:\n{}",
                otelcol.log_text()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn url(&self) -> String {
        format!("http://{}/v1development/profiles", self.http)
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Otelcol {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- collector log ----\n{}", self.log_text());
        }
    }
}

/// proflow with an `otlp` receiver (gRPC on the standard receiver port,
/// HTTP on a port picked for each attempt of the start, so a retry after a
/// port was taken gets a fresh one, returned beside it) and a `file`
/// exporter writing OTLP JSON.
fn start_proflow() -> (Proflow, u16) {
    let mut http_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        http_port = free_port();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}}}\n      http: {{endpoint: 127.0.0.1:{http_port}}}\nexporters:\n  file:\n    directory: {}\n    format: otlp_json\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    (proflow, http_port)
}

fn string_kv(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.into())),
        }),
        key_strindex: 0,
    }
}

/// The stacks (root first) and values sent.
const STACKS: [(&[&str], i64); 3] = [
    (&["main", "serve", "parse"], 70),
    (&["main", "serve", "write"], 20),
    (&["main", "gc"], 5),
];

/// A request of one CPU profile of [`STACKS`] from `service`.
fn request(service: &str) -> collector::ExportProfilesServiceRequest {
    let mut d = DictionaryBuilder::new();
    let mut samples = Vec::new();
    for (frames, value) in STACKS {
        let locations = frames
            .iter()
            .rev()
            .map(|name| {
                let name = d.string(name);
                let f = d.function(proto::Function {
                    name_strindex: name,
                    ..Default::default()
                });
                d.location(proto::Location {
                    lines: vec![proto::Line {
                        function_index: f,
                        ..Default::default()
                    }],
                    ..Default::default()
                })
            })
            .collect();
        samples.push(proto::Sample {
            stack_index: d.stack(locations),
            values: vec![value],
            ..Default::default()
        });
    }
    let sample_type = proto::ValueType {
        type_strindex: d.string("cpu"),
        unit_strindex: d.string("nanoseconds"),
    };
    let now = peer_env::now_nanos() as u64;
    collector::ExportProfilesServiceRequest {
        resource_profiles: vec![proto::ResourceProfiles {
            resource: Some(Resource {
                attributes: vec![
                    string_kv("service.name", service),
                    string_kv("host.name", "box-1"),
                ],
                ..Default::default()
            }),
            scope_profiles: vec![proto::ScopeProfiles {
                scope: Some(InstrumentationScope {
                    name: "proflow-test".into(),
                    ..Default::default()
                }),
                profiles: vec![proto::Profile {
                    sample_type: Some(sample_type),
                    period_type: Some(sample_type),
                    period: 10_000_000,
                    time_unix_nano: now,
                    duration_nano: 1_000_000_000,
                    samples,
                    ..Default::default()
                }],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(d.finish()),
    }
}

fn text(strings: &[String], inline: &str, index: i32) -> String {
    if inline.is_empty() {
        strings.get(index as usize).cloned().unwrap_or_default()
    } else {
        inline.to_owned()
    }
}

/// Resource attributes (string values) of a request's first resource.
fn resource_attributes(r: &collector::ExportProfilesServiceRequest) -> BTreeMap<String, String> {
    let strings = &r.dictionary.as_ref().unwrap().string_table;
    r.resource_profiles[0]
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .filter_map(|kv| {
            let value = match kv.value.as_ref()?.value.as_ref()? {
                any_value::Value::StringValue(s) => s.clone(),
                any_value::Value::StringValueStrindex(i) => text(strings, "", *i),
                _ => return None,
            };
            Some((text(strings, &kv.key, kv.key_strindex), value))
        })
        .collect()
}

/// Value per stack (root first, `;`-joined) of every profile in a request.
fn stacks(r: &collector::ExportProfilesServiceRequest) -> BTreeMap<String, i64> {
    let d = r.dictionary.as_ref().unwrap();
    let mut out = BTreeMap::new();
    for p in r
        .resource_profiles
        .iter()
        .flat_map(|rp| &rp.scope_profiles)
        .flat_map(|sp| &sp.profiles)
    {
        for s in &p.samples {
            let stack = &d.stack_table[s.stack_index as usize];
            let names: Vec<String> = stack
                .location_indices
                .iter()
                .rev()
                .flat_map(|&l| &d.location_table[l as usize].lines)
                .map(|line| {
                    let f = &d.function_table[line.function_index as usize];
                    d.string_table[f.name_strindex as usize].clone()
                })
                .collect();
            *out.entry(names.join(";")).or_default() += s.values.iter().sum::<i64>();
        }
    }
    out
}

/// Sends a request to the collector, waits for proflow's file and checks it.
fn forward_and_check(exporter_type: &str, exporter: impl Fn(&Proflow, u16) -> String) {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let (proflow, http_port) = start_proflow();
    let otelcol = Otelcol::start(&bin, exporter_type, &exporter(&proflow, http_port));
    post_and_check(&proflow, &otelcol.url());
}

/// Posts a request to `url` (which leads to `proflow`), waits for proflow's
/// file and checks it against what was sent.
fn post_and_check(proflow: &Proflow, url: &str) {
    let service = peer_env::unique("proflow-otlp-in-");
    let sent = request(&service);
    let accepted = || {
        common::metric_sum(
            &proflow.metrics(),
            "proflow_receiver_accepted_profiles_total",
            &[("receiver", "otlp")],
        )
    };
    let accepted_before = accepted();
    let reply = http_client()
        .post(url)
        .header("content-type", "application/x-protobuf")
        .body(sent.encode_to_vec())
        .send()
        .unwrap();
    assert!(reply.status().is_success(), "{:?}", reply.text());
    proflow.wait_for_files(1, |e| e.label("service_name") == Some(&service));
    // Counted once everything accepted is written: a second copy would be
    // accepted and written too.
    let entries = common::written_entries(proflow, &service, Duration::from_secs(30));
    assert_eq!(entries.len(), 1, "one profile sent, one written");
    assert_eq!(
        accepted() - accepted_before,
        1.0,
        "one profile sent, one accepted"
    );
    let written = json::decode_request(&std::fs::read(&entries[0].path).unwrap()).unwrap();
    assert_eq!(stacks(&written), stacks(&sent), "functions and values");
    let attributes = resource_attributes(&written);
    assert_eq!(attributes.get("service.name"), Some(&service));
    assert_eq!(
        attributes.get("host.name").map(String::as_str),
        Some("box-1")
    );
    assert_eq!(entries[0].label("__name__"), Some("process_cpu"));
    assert_eq!(entries[0].label("host_name"), Some("box-1"));
}

/// The proflow half alone (no peer): what proflow's own OTLP/HTTP endpoint
/// takes is what its file exporter writes.
#[test]
fn proflow_writes_what_its_otlp_receiver_took() {
    let (proflow, http_port) = start_proflow();
    post_and_check(
        &proflow,
        &format!("http://127.0.0.1:{http_port}/v1development/profiles"),
    );
}

#[test]
fn the_collectors_otlp_grpc_exporter_delivers_to_proflow() {
    forward_and_check("otlp_grpc", |proflow, _| {
        format!(
            "    endpoint: {}\n    tls: {{insecure: true}}\n",
            proflow.ports.receiver
        )
    });
}

#[test]
fn the_collectors_otlp_http_exporter_delivers_to_proflow() {
    forward_and_check("otlp_http", |_, http_port| {
        format!("    endpoint: http://127.0.0.1:{http_port}\n")
    });
}

// ---- OTLP built with the official Python classes -------------------------
//
// `tests/peers/apps/otlp-python/send.py` builds a request of two resources and
// three profiles with the `opentelemetry-proto` package (PyPI), posts it and
// writes the bytes it posted to a file. What proflow's file exporter writes
// is compared with those bytes after resolving every index through each
// request's own dictionary: indexes, the dictionary's order and whether a
// string is written inline or by reference into the string table may differ
// (the collector and proflow's compact dictionary renumber), the profiles
// they describe may not.

/// An attribute value with every string resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Value {
    Unset,
    Str(String),
    Bool(bool),
    Int(i64),
    /// Rust's `{:?}` of the `f64`: the shortest text that reads back as the
    /// same number, so equal text is an equal value (and `Ord` holds).
    Double(String),
    Bytes(Vec<u8>),
    Array(Vec<Value>),
    Map(Vec<(String, Value)>),
}

/// (key, value, unit): a resource, scope or dictionary attribute, resolved.
type Attribute = (String, Value, String);

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Frame {
    function: String,
    system_name: String,
    filename: String,
    start_line: i64,
    line: i64,
    column: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Mapping {
    filename: String,
    memory_start: u64,
    memory_limit: u64,
    file_offset: u64,
    /// The build id among them.
    attributes: Vec<Attribute>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Location {
    address: u64,
    mapping: Option<Mapping>,
    /// Innermost first: all but the last were inlined into the last.
    lines: Vec<Frame>,
    attributes: Vec<Attribute>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Sample {
    /// Leaf first.
    stack: Vec<Location>,
    values: Vec<i64>,
    timestamps: Vec<u64>,
    attributes: Vec<Attribute>,
    /// (trace id, span id) in hex.
    link: Option<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Scope {
    name: String,
    version: String,
    attributes: Vec<Attribute>,
    dropped_attributes_count: u32,
}

/// One profile with its resource and scope, every index resolved.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct ResolvedProfile {
    /// `service.name` first, for sorting and messages.
    service: String,
    sample_type: (String, String),
    resource: Vec<Attribute>,
    resource_dropped_attributes_count: u32,
    scope: Scope,
    period_type: (String, String),
    period: i64,
    time_unix_nano: u64,
    duration_nano: u64,
    profile_id: String,
    attributes: Vec<Attribute>,
    dropped_attributes_count: u32,
    original_payload_format: String,
    original_payload: Vec<u8>,
    /// A multiset: sorted.
    samples: Vec<Sample>,
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Resolves a request's profiles through its dictionary.
struct Resolver<'a> {
    d: &'a proto::ProfilesDictionary,
}

impl Resolver<'_> {
    fn string(&self, i: i32) -> String {
        self.d
            .string_table
            .get(i as usize)
            .unwrap_or_else(|| panic!("string index {i} out of range"))
            .clone()
    }

    fn value(&self, v: Option<&AnyValue>) -> Value {
        use any_value::Value as V;
        match v.and_then(|v| v.value.as_ref()) {
            None => Value::Unset,
            Some(V::StringValue(s)) => Value::Str(s.clone()),
            Some(V::StringValueStrindex(i)) => Value::Str(self.string(*i)),
            Some(V::BoolValue(b)) => Value::Bool(*b),
            Some(V::IntValue(i)) => Value::Int(*i),
            Some(V::DoubleValue(f)) => Value::Double(format!("{f:?}")),
            Some(V::BytesValue(b)) => Value::Bytes(b.clone()),
            Some(V::ArrayValue(a)) => {
                Value::Array(a.values.iter().map(|v| self.value(Some(v))).collect())
            }
            Some(V::KvlistValue(kvs)) => {
                let mut map: Vec<(String, Value)> = kvs
                    .values
                    .iter()
                    .map(|kv| {
                        let (k, v, _) = self.key_value(kv);
                        (k, v)
                    })
                    .collect();
                map.sort();
                Value::Map(map)
            }
        }
    }

    fn key_value(&self, kv: &KeyValue) -> Attribute {
        let key = if kv.key.is_empty() {
            self.string(kv.key_strindex)
        } else {
            kv.key.clone()
        };
        (key, self.value(kv.value.as_ref()), String::new())
    }

    /// Attributes are a set: their order carries no meaning.
    fn key_values(&self, kvs: &[KeyValue]) -> Vec<Attribute> {
        let mut out: Vec<Attribute> = kvs.iter().map(|kv| self.key_value(kv)).collect();
        out.sort();
        out
    }

    fn attributes(&self, indices: &[i32]) -> Vec<Attribute> {
        let mut out: Vec<Attribute> = indices
            .iter()
            .map(|&i| {
                let a = &self.d.attribute_table[i as usize];
                (
                    self.string(a.key_strindex),
                    self.value(a.value.as_ref()),
                    self.string(a.unit_strindex),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn value_type(&self, t: Option<&proto::ValueType>) -> (String, String) {
        t.map(|t| (self.string(t.type_strindex), self.string(t.unit_strindex)))
            .unwrap_or_default()
    }

    fn location(&self, i: i32) -> Location {
        let l = &self.d.location_table[i as usize];
        let mapping = (l.mapping_index != 0).then(|| {
            let m = &self.d.mapping_table[l.mapping_index as usize];
            Mapping {
                filename: self.string(m.filename_strindex),
                memory_start: m.memory_start,
                memory_limit: m.memory_limit,
                file_offset: m.file_offset,
                attributes: self.attributes(&m.attribute_indices),
            }
        });
        let lines = l
            .lines
            .iter()
            .map(|line| {
                let f = &self.d.function_table[line.function_index as usize];
                Frame {
                    function: self.string(f.name_strindex),
                    system_name: self.string(f.system_name_strindex),
                    filename: self.string(f.filename_strindex),
                    start_line: f.start_line,
                    line: line.line,
                    column: line.column,
                }
            })
            .collect();
        Location {
            address: l.address,
            mapping,
            lines,
            attributes: self.attributes(&l.attribute_indices),
        }
    }

    fn sample(&self, s: &proto::Sample) -> Sample {
        let stack = &self.d.stack_table[s.stack_index as usize];
        Sample {
            stack: stack
                .location_indices
                .iter()
                .map(|&l| self.location(l))
                .collect(),
            values: s.values.clone(),
            timestamps: s.timestamps_unix_nano.clone(),
            attributes: self.attributes(&s.attribute_indices),
            link: (s.link_index != 0).then(|| {
                let l = &self.d.link_table[s.link_index as usize];
                (hex(&l.trace_id), hex(&l.span_id))
            }),
        }
    }
}

/// Every profile of `r`, resolved through its dictionary.
fn resolve(r: &collector::ExportProfilesServiceRequest) -> Vec<ResolvedProfile> {
    let d = r.dictionary.as_ref().expect("a request with a dictionary");
    proflow_pipeline::otlp::check_dictionary(d).expect("a valid dictionary");
    proflow_pipeline::otlp::check_dictionary_references(d).expect("valid references");
    let x = Resolver { d };
    let mut out = Vec::new();
    for rp in &r.resource_profiles {
        let resource = rp.resource.clone().unwrap_or_default();
        let resource_attributes = x.key_values(&resource.attributes);
        let service = resource_attributes
            .iter()
            .find(|(k, _, _)| k == "service.name")
            .and_then(|(_, v, _)| match v {
                Value::Str(s) => Some(s.clone()),
                _ => None,
            })
            .unwrap_or_default();
        for sp in &rp.scope_profiles {
            let scope = sp.scope.clone().unwrap_or_default();
            for p in &sp.profiles {
                proflow_pipeline::otlp::check_profile(d, p).expect("a valid profile");
                let mut samples: Vec<Sample> = p.samples.iter().map(|s| x.sample(s)).collect();
                samples.sort();
                out.push(ResolvedProfile {
                    service: service.clone(),
                    sample_type: x.value_type(p.sample_type.as_ref()),
                    resource: resource_attributes.clone(),
                    resource_dropped_attributes_count: resource.dropped_attributes_count,
                    scope: Scope {
                        name: scope.name.clone(),
                        version: scope.version.clone(),
                        attributes: x.key_values(&scope.attributes),
                        dropped_attributes_count: scope.dropped_attributes_count,
                    },
                    period_type: x.value_type(p.period_type.as_ref()),
                    period: p.period,
                    time_unix_nano: p.time_unix_nano,
                    duration_nano: p.duration_nano,
                    profile_id: hex(&p.profile_id),
                    attributes: x.attributes(&p.attribute_indices),
                    dropped_attributes_count: p.dropped_attributes_count,
                    original_payload_format: p.original_payload_format.clone(),
                    original_payload: p.original_payload.clone(),
                    samples,
                });
            }
        }
    }
    out.sort();
    out
}

/// Runs `send.py` against `url` (an OTLP/HTTP profiles endpoint that leads to
/// `proflow`), waits for the three profiles it sends in proflow's files and
/// checks them against the bytes it sent.
fn python_request_arrives_unchanged(proflow: &Proflow, url: &str) {
    let python = match common::otlp_python_client() {
        Ok(p) => p,
        Err(why) => {
            // Panics unless PROFLOW_SKIP_PEERS=1 outside CI; then a loud skip.
            let _: Option<()> = common::missing_peer(&format!(
                "the Python opentelemetry-proto client is not available: {why}"
            ));
            return;
        }
    };
    let tag = peer_env::unique("proflow-otlp-py-");
    let sent_path = proflow.dir.path().join("python-request.pb");
    let (status, output) = common::run_bounded(
        Command::new(&python)
            .arg(common::peers_dir().join("apps/otlp-python/send.py"))
            .arg("--url")
            .arg(url)
            .arg("--tag")
            .arg(&tag)
            .arg("--out")
            .arg(&sent_path),
        &proflow.dir.path().join("send.log"),
        Duration::from_secs(60),
    );
    assert!(status.success(), "send.py failed ({status}):\n{output}");
    let sent_bytes = std::fs::read(&sent_path).unwrap();
    let sent = resolve(&collector::ExportProfilesServiceRequest::decode(&sent_bytes[..]).unwrap());
    assert_eq!(sent.len(), 3, "send.py sends three profiles");

    let prefix = format!("{tag}-");
    let entries = proflow.wait_for_files(sent.len(), |e| {
        e.label("service_name")
            .is_some_and(|s| s.starts_with(&prefix))
    });
    let mut written = Vec::new();
    for entry in &entries {
        let bytes = std::fs::read(&entry.path).unwrap();
        let request = json::decode_request(&bytes)
            .unwrap_or_else(|e| panic!("{}: {e}", entry.path.display()));
        written.extend(resolve(&request));
    }
    written.sort();
    assert_eq!(
        written.len(),
        sent.len(),
        "one file per profile sent; written: {:?}",
        entries.iter().map(|e| &e.path).collect::<Vec<_>>()
    );
    for (w, s) in written.iter().zip(&sent) {
        let what = format!("profile {} {:?}", s.service, s.sample_type);
        let without_samples = |p: &ResolvedProfile| ResolvedProfile {
            samples: Vec::new(),
            ..p.clone()
        };
        assert_eq!(
            without_samples(w),
            without_samples(s),
            "{what}: resource, scope or profile fields as proflow wrote them (left) and as Python sent them (right)"
        );
        let only_in = |a: &ResolvedProfile, b: &ResolvedProfile| -> Vec<Sample> {
            let mut rest = b.samples.clone();
            a.samples
                .iter()
                .filter(|x| match rest.iter().position(|y| y == *x) {
                    Some(i) => {
                        rest.remove(i);
                        false
                    }
                    None => true,
                })
                .cloned()
                .collect()
        };
        assert!(
            w.samples == s.samples,
            "{what}: the samples differ\nonly written: {:#?}\nonly sent: {:#?}",
            only_in(w, s),
            only_in(s, w)
        );
    }
    // The series labels come from those attributes: the index says so too.
    for (service, mode, host) in [
        ("checkout", "sampling", "web-1"),
        ("search", "tracing", "web-2"),
    ] {
        let service_name = format!("{tag}-{service}");
        for e in entries
            .iter()
            .filter(|e| e.label("service_name") == Some(service_name.as_str()))
        {
            assert_eq!(e.label("profiler_mode"), Some(mode), "{:?}", e.path);
            assert_eq!(e.label("host_name"), Some(host), "{:?}", e.path);
        }
    }
}

/// The proflow half alone: what the official Python classes build reaches
/// proflow's own OTLP/HTTP endpoint and its file exporter unchanged.
#[test]
fn official_python_otlp_request_arrives_unchanged_at_proflow() {
    let (proflow, http_port) = start_proflow();
    python_request_arrives_unchanged(
        &proflow,
        &format!("http://127.0.0.1:{http_port}/v1development/profiles"),
    );
}

/// The path: Python (`opentelemetry-proto`) → the collector's OTLP/HTTP
/// receiver → its `otlp_grpc` exporter → proflow's `otlp` gRPC receiver →
/// `file` (otlp_json), and the profiles arrive unchanged.
#[test]
fn official_python_otlp_request_arrives_unchanged_through_the_collector() {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let (proflow, _) = start_proflow();
    let otelcol = Otelcol::start(
        &bin,
        "otlp_grpc",
        &format!(
            "    endpoint: {}\n    tls: {{insecure: true}}\n",
            proflow.ports.receiver
        ),
    );
    python_request_arrives_unchanged(&proflow, &otelcol.url());
}

// ---- TLS and tokens: the Collector as a client of a secured receiver -------

/// proflow's `otlp` receiver with TLS (certificates of `pki`) and a bearer
/// token file on both protocols, and the HTTP port it listens on (picked
/// for each attempt of the start).
fn start_secured_proflow(pki: &common::pki::Pki, tokens: &Path) -> (Proflow, u16) {
    let secured = format!(
        "tls: {}, auth: {{bearer_tokens_file: {}}}",
        pki.server_tls(false),
        tokens.display()
    );
    // Picked for each attempt of the start, as in `start_proflow`.
    let mut http_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        http_port = free_port();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}, {secured}}}\n      http: {{endpoint: 127.0.0.1:{http_port}, {secured}}}\nexporters:\n  file:\n    directory: {}\n    format: otlp_json\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    (proflow, http_port)
}

/// The collector's exporter body for a secured proflow: TLS with the test
/// CA, `token` as the bearer token.
fn secured_exporter(endpoint: &str, ca: &Path, token: &str) -> String {
    format!(
        "    endpoint: {endpoint}\n    tls: {{ca_file: {}}}\n    headers: {{authorization: \"Bearer {token}\"}}\n    retry_on_failure: {{enabled: false}}\n",
        ca.display()
    )
}

#[test]
fn the_collector_delivers_over_tls_with_a_token_and_is_refused_without_one() {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let pki = common::pki::Pki::new();
    let tokens = pki.dir.path().join("tokens");
    std::fs::write(&tokens, "collector-token\n").unwrap();
    let (proflow, http_port) = start_secured_proflow(&pki, &tokens);
    let ca = pki.file("ca.pem");
    let grpc_endpoint = format!("localhost:{}", proflow.ports.receiver.port());
    let http_endpoint = format!("https://localhost:{http_port}");
    // Both protocols, with the token: delivered and checked like the plain runs.
    for (ty, endpoint) in [("otlp_grpc", &grpc_endpoint), ("otlp_http", &http_endpoint)] {
        let otelcol = Otelcol::start(
            &bin,
            ty,
            &secured_exporter(endpoint, &ca, "collector-token"),
        );
        post_and_check(&proflow, &otelcol.url());
    }
    // A wrong token: refused (UNAUTHENTICATED / 401), counted, nothing written;
    // one protocol after the other, so each one's refusal is seen.
    let before = common::read_index(&proflow.profiles).len();
    let refused = || {
        common::metric_sum(
            &proflow.metrics(),
            "proflow_receiver_refused_requests_total",
            &[("reason", "unauthenticated")],
        )
    };
    // Kept running until proflow saw the refusal: their exporters send from a queue.
    let mut running = Vec::new();
    for (ty, endpoint) in [("otlp_grpc", &grpc_endpoint), ("otlp_http", &http_endpoint)] {
        let already = refused();
        let otelcol = Otelcol::start(&bin, ty, &secured_exporter(endpoint, &ca, "wrong"));
        let _ = http_client()
            .post(otelcol.url())
            .header("content-type", "application/x-protobuf")
            .body(request("refused-service").encode_to_vec())
            .send()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while refused() <= already {
            assert!(
                Instant::now() < deadline,
                "the collector's {ty} requests with a wrong token were not refused as unauthenticated ({already})\n{}",
                proflow.metrics()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        running.push(otelcol);
    }
    assert_eq!(common::read_index(&proflow.profiles).len(), before);
    drop(running);
}

/// proflow's only exporter stalls with a full queue (the default
/// `drop_newest`): what no exporter can take is refused with
/// `RESOURCE_EXHAUSTED` and `RetryInfo`, not answered OK and dropped, so
/// the real Collector's `otlp_grpc` exporter keeps it and sends it again;
/// once the exporter recovers, every request the Collector took arrives.
#[test]
fn the_collector_sends_again_what_a_stalled_proflow_refused() {
    let Some(peer) = peer_env::peer("otelcol") else {
        return;
    };
    let bin = otelcol_bin(&peer);
    let service = peer_env::unique("proflow-stalled-");
    // Picked for each attempt of the start, as in `start_proflow`.
    let mut http_port = 0;
    let proflow = Proflow::start(|ports, profiles| {
        http_port = free_port();
        std::fs::create_dir_all(profiles).unwrap();
        // Where the exporter must create the service's directory, a file is in the way.
        std::fs::write(profiles.join(&service), b"in the way").unwrap();
        format!(
            "receivers:\n  otlp:\n    protocols:\n      grpc: {{endpoint: {}}}\n      http: {{endpoint: 127.0.0.1:{http_port}}}\nexporters:\n  file:\n    directory: {}\n    format: otlp_json\n    sending_queue: {{queue_size: 1, num_consumers: 1, wait_when_full: 100ms}}\n    retry_on_failure: {{initial_interval: 100ms, max_interval: 100ms, max_elapsed_time: 0s}}\nservice:\n  telemetry:\n    address: {}\n  pipelines:\n    profiles:\n      receivers: [otlp]\n      exporters: [file]\n",
            ports.receiver,
            profiles.display(),
            ports.telemetry
        )
    });
    let otelcol = Otelcol::start(
        &bin,
        "otlp_grpc",
        &format!(
            "    endpoint: {}\n    tls: {{insecure: true}}\n    retry_on_failure: {{initial_interval: 200ms, max_interval: 1s, max_elapsed_time: 120s}}\n",
            proflow.ports.receiver
        ),
    );
    const N: usize = 4;
    let send = || {
        let reply = http_client()
            .post(otelcol.url())
            .header("content-type", "application/x-protobuf")
            .body(request(&service).encode_to_vec())
            .send()
            .unwrap();
        assert!(reply.status().is_success(), "{:?}", reply.text());
    };
    let wait_metric = |what: &str, metric: &str, labels: &[(&str, &str)]| {
        let deadline = Instant::now() + Duration::from_secs(60);
        while common::metric_sum(&proflow.metrics(), metric, labels) < 1.0 {
            assert!(
                Instant::now() < deadline,
                "{what} never happened\n{}\ncollector:\n{}",
                proflow.log_text(),
                otelcol.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // The first fills the stalled exporter's queue; the Collector's sends
    // after it find no exporter with room and are refused as retryable.
    send();
    wait_metric(
        "the first request queued",
        "proflow_exporter_queue_profiles",
        &[("exporter", "file")],
    );
    for _ in 1..N {
        send();
    }
    wait_metric(
        "a refusal of the Collector's send",
        "proflow_receiver_refused_requests_total",
        &[("receiver", "otlp"), ("reason", "backpressure")],
    );
    std::fs::remove_file(proflow.profiles.join(&service)).unwrap();
    proflow.wait_for_files(N, |e| e.label("service_name") == Some(&service));
    // Counted once everything accepted is written: a request the Collector
    // sent again after proflow took it would be a second copy here.
    let entries = common::written_entries(&proflow, &service, Duration::from_secs(60));
    assert_eq!(
        entries.len(),
        N,
        "every request the Collector took arrived once"
    );
    let metrics = proflow.metrics();
    assert_eq!(
        common::metric_sum(
            &metrics,
            "proflow_receiver_accepted_profiles_total",
            &[("receiver", "otlp")]
        ),
        N as f64,
        "proflow accepted each of the Collector's {N} requests once\n{metrics}"
    );
    assert_eq!(
        common::metric_sum(&metrics, "proflow_exporter_dropped_profiles_total", &[]),
        0.0,
        "nothing answered OK was dropped\n{metrics}"
    );
}
