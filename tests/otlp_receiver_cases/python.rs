//! A request built with the official Python classes (`send.py`) arrives
//! unchanged, at proflow directly and through the Collector: every profile
//! resolved through its request's dictionary and compared field by field.

use std::process::Command;
use std::time::Duration;

use proflow_model::otlp::common::{AnyValue, KeyValue, any_value};
use proflow_model::otlp::{collector, json, proto};
use prost::Message;

use super::{Otelcol, otelcol_bin, start_proflow};
use crate::common::{self, Proflow};
use crate::peer_env;

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
    proflow_model::otlp::check_dictionary(d).expect("a valid dictionary");
    proflow_model::otlp::check_dictionary_references(d).expect("valid references");
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
                proflow_model::otlp::check_profile(d, p).expect("a valid profile");
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
fn python_request_arrives_unchanged(proflow: &Proflow, url: &str) -> bool {
    let Some(python) = common::otlp_python_client() else {
        return false;
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
    true
}

/// The proflow half alone: what the official Python classes build reaches
/// proflow's own OTLP/HTTP endpoint and its file exporter unchanged.
#[test]
fn official_python_otlp_request_arrives_unchanged_at_proflow() {
    let (proflow, http_port) = start_proflow();
    if !python_request_arrives_unchanged(
        &proflow,
        &format!("http://127.0.0.1:{http_port}/v1development/profiles"),
    ) {
        return;
    }
    // Each resource's `process.command_args` is an array: it stays an
    // attribute (checked above) but becomes no series label, and that is
    // counted once per scope of profiles (two) and nothing else is.
    let metrics = proflow.metrics();
    let lost = |reason: &str| {
        common::metric_sum(
            &metrics,
            "proflow_receiver_lost_parts_total",
            &[("part", "label"), ("reason", reason)],
        )
    };
    assert_eq!(lost("not_text"), 2.0, "metrics:\n{metrics}");
    assert_eq!(
        common::metric_sum(&metrics, "proflow_receiver_lost_parts_total", &[]),
        2.0,
        "metrics:\n{metrics}"
    );
    assert!(
        proflow
            .log_text()
            .contains("parts of accepted samples could not be converted"),
        "logged once:\n{}",
        proflow.log_text()
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
