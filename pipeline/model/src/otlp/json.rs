//! OTLP JSON for profiles requests, as the OTLP specification maps protobuf
//! to JSON: lowerCamelCase names (snake_case also read), 64-bit integers as
//! decimal strings (numbers also read), `traceId`, `spanId` and `profileId`
//! as hex, other bytes as base64, zero values omitted, unknown fields
//! ignored. The `opentelemetry-proto` crate's serde support does not follow
//! these rules for profiles, so proflow has its own.
//!
//! [`decode_request`] reads an `ExportProfilesServiceRequest` (what the
//! collector's OTLP/HTTP receiver takes and its file exporter writes, one per
//! line); [`encode_request`] writes one.

use base64::Engine;
use serde_json::{Map, Value, json};

use super::common::{
    AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value,
};
use super::{collector, hex, proto};
use opentelemetry_proto::tonic::resource::v1::Resource;

/// Why a JSON document is not an OTLP profiles request; `path` says where.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("OTLP JSON at `{path}`: {message}")]
pub struct JsonError {
    pub path: String,
    pub message: String,
}

type Result<T> = std::result::Result<T, JsonError>;

fn err<T>(path: &str, message: impl Into<String>) -> Result<T> {
    Err(JsonError {
        path: path.to_owned(),
        message: message.into(),
    })
}

/// An object's field by its JSON name or its protobuf name; `null` is absent.
fn field<'a>(obj: &'a Map<String, Value>, camel: &str, snake: &str) -> Option<&'a Value> {
    obj.get(camel)
        .or_else(|| obj.get(snake))
        .filter(|v| !v.is_null())
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a Map<String, Value>> {
    match v {
        Value::Object(o) => Ok(o),
        _ => err(path, "expected an object"),
    }
}

fn array<'a>(v: Option<&'a Value>, path: &str) -> Result<&'a [Value]> {
    match v {
        None => Ok(&[]),
        Some(Value::Array(a)) => Ok(a),
        Some(_) => err(path, "expected an array"),
    }
}

/// Reads each element of an optional array field with `read`.
fn list<T>(
    obj: &Map<String, Value>,
    camel: &str,
    snake: &str,
    path: &str,
    mut read: impl FnMut(&Value, &str) -> Result<T>,
) -> Result<Vec<T>> {
    let path = format!("{path}.{camel}");
    array(field(obj, camel, snake), &path)?
        .iter()
        .enumerate()
        .map(|(i, v)| read(v, &format!("{path}[{i}]")))
        .collect()
}

/// An integer written as a JSON number or a decimal string.
fn integer(v: Option<&Value>, path: &str) -> Result<i128> {
    match v {
        None => Ok(0),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(i128::from)
            .or_else(|| n.as_u64().map(i128::from))
            .map_or_else(|| err(path, format!("{n} is not an integer")), Ok),
        Some(Value::String(s)) => s
            .parse::<i128>()
            .map_or_else(|_| err(path, format!("{s:?} is not an integer")), Ok),
        Some(_) => err(path, "expected an integer"),
    }
}

fn int<T: TryFrom<i128>>(
    obj: &Map<String, Value>,
    camel: &str,
    snake: &str,
    path: &str,
) -> Result<T> {
    let path = format!("{path}.{camel}");
    let n = integer(field(obj, camel, snake), &path)?;
    T::try_from(n).map_or_else(|_| err(&path, format!("{n} is out of range")), Ok)
}

fn ints<T: TryFrom<i128>>(
    obj: &Map<String, Value>,
    camel: &str,
    snake: &str,
    path: &str,
) -> Result<Vec<T>> {
    list(obj, camel, snake, path, |v, path| {
        let n = integer(Some(v), path)?;
        T::try_from(n).map_or_else(|_| err(path, format!("{n} is out of range")), Ok)
    })
}

fn string(obj: &Map<String, Value>, camel: &str, snake: &str, path: &str) -> Result<String> {
    match field(obj, camel, snake) {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => err(&format!("{path}.{camel}"), "expected a string"),
    }
}

fn hex_bytes(obj: &Map<String, Value>, camel: &str, snake: &str, path: &str) -> Result<Vec<u8>> {
    let text = string(obj, camel, snake, path)?;
    let path = format!("{path}.{camel}");
    if text.len() % 2 != 0 {
        return err(&path, "hex text of odd length");
    }
    (0..text.len())
        .step_by(2)
        .map(|i| {
            text.get(i..i + 2)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .map_or_else(|| err(&path, format!("{text:?} is not hex")), Ok)
        })
        .collect()
}

fn base64_bytes(obj: &Map<String, Value>, camel: &str, snake: &str, path: &str) -> Result<Vec<u8>> {
    let text = string(obj, camel, snake, path)?;
    base64::engine::general_purpose::STANDARD
        .decode(text.as_bytes())
        .map_or_else(
            |e| err(&format!("{path}.{camel}"), format!("not base64: {e}")),
            Ok,
        )
}

fn message<T>(
    obj: &Map<String, Value>,
    camel: &str,
    snake: &str,
    path: &str,
    read: impl FnOnce(&Value, &str) -> Result<T>,
) -> Result<Option<T>> {
    field(obj, camel, snake)
        .map(|v| read(v, &format!("{path}.{camel}")))
        .transpose()
}

// ------------------------------------------------------------------ decoding

fn any_value(v: &Value, path: &str) -> Result<AnyValue> {
    let o = object(v, path)?;
    let value = if let Some(s) = field(o, "stringValue", "string_value") {
        match s {
            Value::String(s) => Some(any_value::Value::StringValue(s.clone())),
            _ => return err(path, "stringValue must be a string"),
        }
    } else if let Some(b) = field(o, "boolValue", "bool_value") {
        Some(any_value::Value::BoolValue(b.as_bool().map_or_else(
            || err(path, "boolValue must be a boolean"),
            Ok,
        )?))
    } else if field(o, "intValue", "int_value").is_some() {
        Some(any_value::Value::IntValue(int(
            o,
            "intValue",
            "int_value",
            path,
        )?))
    } else if let Some(d) = field(o, "doubleValue", "double_value") {
        let d = match d {
            Value::Number(n) => n.as_f64(),
            Value::String(s) => s.parse().ok(),
            _ => None,
        };
        Some(any_value::Value::DoubleValue(d.map_or_else(
            || err(path, "doubleValue must be a number"),
            Ok,
        )?))
    } else if let Some(a) = field(o, "arrayValue", "array_value") {
        let a = object(a, path)?;
        Some(any_value::Value::ArrayValue(ArrayValue {
            values: list(a, "values", "values", path, any_value)?,
        }))
    } else if let Some(kv) = field(o, "kvlistValue", "kvlist_value") {
        let kv = object(kv, path)?;
        Some(any_value::Value::KvlistValue(KeyValueList {
            values: list(kv, "values", "values", path, key_value)?,
        }))
    } else if field(o, "bytesValue", "bytes_value").is_some() {
        Some(any_value::Value::BytesValue(base64_bytes(
            o,
            "bytesValue",
            "bytes_value",
            path,
        )?))
    } else if field(o, "stringValueStrindex", "string_value_strindex").is_some() {
        Some(any_value::Value::StringValueStrindex(int(
            o,
            "stringValueStrindex",
            "string_value_strindex",
            path,
        )?))
    } else {
        None
    };
    Ok(AnyValue { value })
}

fn key_value(v: &Value, path: &str) -> Result<KeyValue> {
    let o = object(v, path)?;
    Ok(KeyValue {
        key: string(o, "key", "key", path)?,
        value: message(o, "value", "value", path, any_value)?,
        key_strindex: int(o, "keyStrindex", "key_strindex", path)?,
    })
}

fn value_type(v: &Value, path: &str) -> Result<proto::ValueType> {
    let o = object(v, path)?;
    Ok(proto::ValueType {
        type_strindex: int(o, "typeStrindex", "type_strindex", path)?,
        unit_strindex: int(o, "unitStrindex", "unit_strindex", path)?,
    })
}

fn sample(v: &Value, path: &str) -> Result<proto::Sample> {
    let o = object(v, path)?;
    Ok(proto::Sample {
        stack_index: int(o, "stackIndex", "stack_index", path)?,
        attribute_indices: ints(o, "attributeIndices", "attribute_indices", path)?,
        link_index: int(o, "linkIndex", "link_index", path)?,
        values: ints(o, "values", "values", path)?,
        timestamps_unix_nano: ints(o, "timestampsUnixNano", "timestamps_unix_nano", path)?,
    })
}

fn profile(v: &Value, path: &str) -> Result<proto::Profile> {
    let o = object(v, path)?;
    Ok(proto::Profile {
        sample_type: message(o, "sampleType", "sample_type", path, value_type)?,
        samples: list(o, "samples", "samples", path, sample)?,
        time_unix_nano: int(o, "timeUnixNano", "time_unix_nano", path)?,
        duration_nano: int(o, "durationNano", "duration_nano", path)?,
        period_type: message(o, "periodType", "period_type", path, value_type)?,
        period: int(o, "period", "period", path)?,
        profile_id: hex_bytes(o, "profileId", "profile_id", path)?,
        dropped_attributes_count: int(
            o,
            "droppedAttributesCount",
            "dropped_attributes_count",
            path,
        )?,
        original_payload_format: string(
            o,
            "originalPayloadFormat",
            "original_payload_format",
            path,
        )?,
        original_payload: base64_bytes(o, "originalPayload", "original_payload", path)?,
        attribute_indices: ints(o, "attributeIndices", "attribute_indices", path)?,
    })
}

fn scope_profiles(v: &Value, path: &str) -> Result<proto::ScopeProfiles> {
    let o = object(v, path)?;
    Ok(proto::ScopeProfiles {
        scope: message(o, "scope", "scope", path, |v, path| {
            let o = object(v, path)?;
            Ok(InstrumentationScope {
                name: string(o, "name", "name", path)?,
                version: string(o, "version", "version", path)?,
                attributes: list(o, "attributes", "attributes", path, key_value)?,
                dropped_attributes_count: int(
                    o,
                    "droppedAttributesCount",
                    "dropped_attributes_count",
                    path,
                )?,
            })
        })?,
        profiles: list(o, "profiles", "profiles", path, profile)?,
        schema_url: string(o, "schemaUrl", "schema_url", path)?,
    })
}

fn resource_profiles(v: &Value, path: &str) -> Result<proto::ResourceProfiles> {
    let o = object(v, path)?;
    Ok(proto::ResourceProfiles {
        resource: message(o, "resource", "resource", path, |v, path| {
            let o = object(v, path)?;
            Ok(Resource {
                attributes: list(o, "attributes", "attributes", path, key_value)?,
                dropped_attributes_count: int(
                    o,
                    "droppedAttributesCount",
                    "dropped_attributes_count",
                    path,
                )?,
                ..Resource::default()
            })
        })?,
        scope_profiles: list(o, "scopeProfiles", "scope_profiles", path, scope_profiles)?,
        schema_url: string(o, "schemaUrl", "schema_url", path)?,
    })
}

fn dictionary(v: &Value, path: &str) -> Result<proto::ProfilesDictionary> {
    let o = object(v, path)?;
    Ok(proto::ProfilesDictionary {
        mapping_table: list(o, "mappingTable", "mapping_table", path, |v, path| {
            let o = object(v, path)?;
            Ok(proto::Mapping {
                memory_start: int(o, "memoryStart", "memory_start", path)?,
                memory_limit: int(o, "memoryLimit", "memory_limit", path)?,
                file_offset: int(o, "fileOffset", "file_offset", path)?,
                filename_strindex: int(o, "filenameStrindex", "filename_strindex", path)?,
                attribute_indices: ints(o, "attributeIndices", "attribute_indices", path)?,
            })
        })?,
        location_table: list(o, "locationTable", "location_table", path, |v, path| {
            let o = object(v, path)?;
            Ok(proto::Location {
                mapping_index: int(o, "mappingIndex", "mapping_index", path)?,
                address: int(o, "address", "address", path)?,
                lines: list(o, "lines", "lines", path, |v, path| {
                    let o = object(v, path)?;
                    Ok(proto::Line {
                        function_index: int(o, "functionIndex", "function_index", path)?,
                        line: int(o, "line", "line", path)?,
                        column: int(o, "column", "column", path)?,
                    })
                })?,
                attribute_indices: ints(o, "attributeIndices", "attribute_indices", path)?,
            })
        })?,
        function_table: list(o, "functionTable", "function_table", path, |v, path| {
            let o = object(v, path)?;
            Ok(proto::Function {
                name_strindex: int(o, "nameStrindex", "name_strindex", path)?,
                system_name_strindex: int(o, "systemNameStrindex", "system_name_strindex", path)?,
                filename_strindex: int(o, "filenameStrindex", "filename_strindex", path)?,
                start_line: int(o, "startLine", "start_line", path)?,
            })
        })?,
        link_table: list(o, "linkTable", "link_table", path, |v, path| {
            let o = object(v, path)?;
            Ok(proto::Link {
                trace_id: hex_bytes(o, "traceId", "trace_id", path)?,
                span_id: hex_bytes(o, "spanId", "span_id", path)?,
            })
        })?,
        string_table: list(o, "stringTable", "string_table", path, |v, path| match v {
            Value::String(s) => Ok(s.clone()),
            _ => err(path, "expected a string"),
        })?,
        attribute_table: list(o, "attributeTable", "attribute_table", path, |v, path| {
            let o = object(v, path)?;
            Ok(proto::KeyValueAndUnit {
                key_strindex: int(o, "keyStrindex", "key_strindex", path)?,
                value: message(o, "value", "value", path, any_value)?,
                unit_strindex: int(o, "unitStrindex", "unit_strindex", path)?,
            })
        })?,
        stack_table: list(o, "stackTable", "stack_table", path, |v, path| {
            let o = object(v, path)?;
            Ok(proto::Stack {
                location_indices: ints(o, "locationIndices", "location_indices", path)?,
            })
        })?,
    })
}

/// The largest message [`decode_request`] builds from one JSON object.
const LARGEST_MESSAGE: usize = {
    use std::mem::size_of;
    let sizes = [
        size_of::<collector::ExportProfilesServiceRequest>(),
        size_of::<proto::ResourceProfiles>(),
        size_of::<proto::ScopeProfiles>(),
        size_of::<proto::Profile>(),
        size_of::<proto::ProfilesDictionary>(),
        size_of::<proto::Sample>(),
        size_of::<proto::Mapping>(),
        size_of::<proto::Location>(),
        size_of::<proto::Line>(),
        size_of::<proto::Function>(),
        size_of::<proto::Link>(),
        size_of::<proto::KeyValueAndUnit>(),
        size_of::<proto::Stack>(),
        size_of::<proto::ValueType>(),
        size_of::<Resource>(),
        size_of::<InstrumentationScope>(),
        size_of::<KeyValue>(),
        size_of::<AnyValue>(),
        size_of::<ArrayValue>(),
        size_of::<KeyValueList>(),
    ];
    let mut largest = 0;
    let mut i = 0;
    while i < sizes.len() {
        if sizes[i] > largest {
            largest = sizes[i];
        }
        i += 1;
    }
    largest
};

/// An upper bound of the memory [`decode_request`] allocates for `bytes`
/// (the JSON tree and the messages built from it, alive together), known
/// before decoding: grant it, or refuse the request, first.
pub fn decode_cost(bytes: &[u8]) -> usize {
    let shape = crate::json_shape::JsonShape::scan(bytes);
    // Each object becomes at most one message, each scalar at most a
    // string or an integer.
    shape
        .tree_bytes()
        .saturating_add(shape.built_bytes(LARGEST_MESSAGE, std::mem::size_of::<String>()))
}

/// Reads one `ExportProfilesServiceRequest` from OTLP JSON.
pub fn decode_request(bytes: &[u8]) -> Result<collector::ExportProfilesServiceRequest> {
    let v: Value =
        serde_json::from_slice(bytes).map_or_else(|e| err("", format!("not JSON: {e}")), Ok)?;
    let o = object(&v, "")?;
    Ok(collector::ExportProfilesServiceRequest {
        resource_profiles: list(
            o,
            "resourceProfiles",
            "resource_profiles",
            "",
            resource_profiles,
        )?,
        dictionary: message(o, "dictionary", "dictionary", "", dictionary)?,
    })
}

// ------------------------------------------------------------------ encoding

/// Adds `key: value` unless `value` is the field's zero value.
struct Obj(Map<String, Value>);

impl Obj {
    fn new() -> Self {
        Obj(Map::new())
    }
    fn int(mut self, key: &str, n: impl Into<i128> + Copy, as_string: bool) -> Self {
        let n: i128 = n.into();
        if n != 0 {
            let v = if as_string {
                json!(n.to_string())
            } else {
                json!(n as i64)
            };
            self.0.insert(key.to_owned(), v);
        }
        self
    }
    fn str(mut self, key: &str, s: &str) -> Self {
        if !s.is_empty() {
            self.0.insert(key.to_owned(), json!(s));
        }
        self
    }
    fn val(mut self, key: &str, v: Option<Value>) -> Self {
        if let Some(v) = v {
            self.0.insert(key.to_owned(), v);
        }
        self
    }
    fn arr(mut self, key: &str, items: Vec<Value>) -> Self {
        if !items.is_empty() {
            self.0.insert(key.to_owned(), Value::Array(items));
        }
        self
    }
    fn done(self) -> Value {
        Value::Object(self.0)
    }
}

fn ints32(v: &[i32]) -> Vec<Value> {
    v.iter().map(|n| json!(n)).collect()
}

fn any_value_json(v: &AnyValue) -> Value {
    match &v.value {
        None => json!({}),
        Some(any_value::Value::StringValue(s)) => json!({ "stringValue": s }),
        Some(any_value::Value::BoolValue(b)) => json!({ "boolValue": b }),
        Some(any_value::Value::IntValue(n)) => json!({ "intValue": n.to_string() }),
        Some(any_value::Value::DoubleValue(d)) => json!({ "doubleValue": d }),
        Some(any_value::Value::ArrayValue(a)) => {
            json!({ "arrayValue": { "values": a.values.iter().map(any_value_json).collect::<Vec<_>>() } })
        }
        Some(any_value::Value::KvlistValue(kv)) => {
            json!({ "kvlistValue": { "values": kv.values.iter().map(key_value_json).collect::<Vec<_>>() } })
        }
        Some(any_value::Value::BytesValue(b)) => {
            json!({ "bytesValue": base64::engine::general_purpose::STANDARD.encode(b) })
        }
        Some(any_value::Value::StringValueStrindex(i)) => json!({ "stringValueStrindex": i }),
    }
}

fn key_value_json(kv: &KeyValue) -> Value {
    Obj::new()
        .str("key", &kv.key)
        .val("value", kv.value.as_ref().map(any_value_json))
        .int("keyStrindex", kv.key_strindex, false)
        .done()
}

fn value_type_json(t: &proto::ValueType) -> Value {
    Obj::new()
        .int("typeStrindex", t.type_strindex, false)
        .int("unitStrindex", t.unit_strindex, false)
        .done()
}

fn profile_json(p: &proto::Profile) -> Value {
    let samples = p
        .samples
        .iter()
        .map(|s| {
            Obj::new()
                .int("stackIndex", s.stack_index, false)
                .arr("attributeIndices", ints32(&s.attribute_indices))
                .int("linkIndex", s.link_index, false)
                .arr(
                    "values",
                    s.values.iter().map(|v| json!(v.to_string())).collect(),
                )
                .arr(
                    "timestampsUnixNano",
                    s.timestamps_unix_nano
                        .iter()
                        .map(|t| json!(t.to_string()))
                        .collect(),
                )
                .done()
        })
        .collect();
    let mut o = Obj::new()
        .val("sampleType", p.sample_type.as_ref().map(value_type_json))
        .arr("samples", samples)
        .int("timeUnixNano", p.time_unix_nano, true)
        .int("durationNano", p.duration_nano, true)
        .val("periodType", p.period_type.as_ref().map(value_type_json))
        .int("period", p.period, true)
        .str("profileId", &hex(&p.profile_id))
        .int("droppedAttributesCount", p.dropped_attributes_count, false)
        .str("originalPayloadFormat", &p.original_payload_format);
    if !p.original_payload.is_empty() {
        o = o.str(
            "originalPayload",
            &base64::engine::general_purpose::STANDARD.encode(&p.original_payload),
        );
    }
    o.arr("attributeIndices", ints32(&p.attribute_indices))
        .done()
}

fn dictionary_json(d: &proto::ProfilesDictionary) -> Value {
    let mappings = d
        .mapping_table
        .iter()
        .map(|m| {
            Obj::new()
                .int("memoryStart", m.memory_start, true)
                .int("memoryLimit", m.memory_limit, true)
                .int("fileOffset", m.file_offset, true)
                .int("filenameStrindex", m.filename_strindex, false)
                .arr("attributeIndices", ints32(&m.attribute_indices))
                .done()
        })
        .collect();
    let locations = d
        .location_table
        .iter()
        .map(|l| {
            let lines = l
                .lines
                .iter()
                .map(|line| {
                    Obj::new()
                        .int("functionIndex", line.function_index, false)
                        .int("line", line.line, true)
                        .int("column", line.column, true)
                        .done()
                })
                .collect();
            Obj::new()
                .int("mappingIndex", l.mapping_index, false)
                .int("address", l.address, true)
                .arr("lines", lines)
                .arr("attributeIndices", ints32(&l.attribute_indices))
                .done()
        })
        .collect();
    let functions = d
        .function_table
        .iter()
        .map(|f| {
            Obj::new()
                .int("nameStrindex", f.name_strindex, false)
                .int("systemNameStrindex", f.system_name_strindex, false)
                .int("filenameStrindex", f.filename_strindex, false)
                .int("startLine", f.start_line, true)
                .done()
        })
        .collect();
    let links = d
        .link_table
        .iter()
        .map(|l| {
            Obj::new()
                .str("traceId", &hex(&l.trace_id))
                .str("spanId", &hex(&l.span_id))
                .done()
        })
        .collect();
    let attributes = d
        .attribute_table
        .iter()
        .map(|a| {
            Obj::new()
                .int("keyStrindex", a.key_strindex, false)
                .val("value", a.value.as_ref().map(any_value_json))
                .int("unitStrindex", a.unit_strindex, false)
                .done()
        })
        .collect();
    let stacks = d
        .stack_table
        .iter()
        .map(|s| {
            Obj::new()
                .arr("locationIndices", ints32(&s.location_indices))
                .done()
        })
        .collect();
    Obj::new()
        .arr("mappingTable", mappings)
        .arr("locationTable", locations)
        .arr("functionTable", functions)
        .arr("linkTable", links)
        .arr(
            "stringTable",
            d.string_table.iter().map(|s| json!(s)).collect(),
        )
        .arr("attributeTable", attributes)
        .arr("stackTable", stacks)
        .done()
}

/// Writes one `ExportProfilesServiceRequest` as OTLP JSON.
pub fn encode_request(r: &collector::ExportProfilesServiceRequest) -> Vec<u8> {
    let resources = r
        .resource_profiles
        .iter()
        .map(|rp| {
            let resource = rp.resource.as_ref().map(|res| {
                Obj::new()
                    .arr(
                        "attributes",
                        res.attributes.iter().map(key_value_json).collect(),
                    )
                    .int(
                        "droppedAttributesCount",
                        res.dropped_attributes_count,
                        false,
                    )
                    .done()
            });
            let scopes = rp
                .scope_profiles
                .iter()
                .map(|sp| {
                    let scope = sp.scope.as_ref().map(|s| {
                        Obj::new()
                            .str("name", &s.name)
                            .str("version", &s.version)
                            .arr(
                                "attributes",
                                s.attributes.iter().map(key_value_json).collect(),
                            )
                            .int("droppedAttributesCount", s.dropped_attributes_count, false)
                            .done()
                    });
                    Obj::new()
                        .val("scope", scope)
                        .arr("profiles", sp.profiles.iter().map(profile_json).collect())
                        .str("schemaUrl", &sp.schema_url)
                        .done()
                })
                .collect();
            Obj::new()
                .val("resource", resource)
                .arr("scopeProfiles", scopes)
                .str("schemaUrl", &rp.schema_url)
                .done()
        })
        .collect();
    let doc = Obj::new()
        .arr("resourceProfiles", resources)
        .val("dictionary", r.dictionary.as_ref().map(dictionary_json))
        .done();
    // Serializing a Value into a Vec cannot fail.
    serde_json::to_vec(&doc).unwrap_or_default()
}
