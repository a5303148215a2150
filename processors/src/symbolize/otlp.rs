//! Names the unnamed locations of an OTLP payload's dictionary: each
//! location with an address and no lines gets lines, the functions and
//! strings they need are appended to the dictionary's tables, and the
//! profiles (which refer to locations through stacks) are kept as they are.
//!
//! Addresses: a location whose `profile.frame.type` attribute is `native`
//! holds an ELF virtual address, as the OpenTelemetry eBPF profiler writes
//! them (it subtracts a byte from return addresses itself); `kernel`, a
//! kernel address. Any other location holds a runtime address in its
//! mapping, as pprof does (proflow's pprof → OTLP conversion keeps them).
//! A mapping's build id is its `process.executable.build_id.gnu` attribute.

use std::collections::HashMap;
use std::sync::Arc;

use proflow_model::otlp::{self, OtlpProfiles, SharedDictionary, common, proto};
use proflow_symbolize::Symbols;

use super::profile::Counts;
use super::sources::{self, AddressKind, KERNEL_START, MappingId, Source, Sources, reason};

/// The attribute the OpenTelemetry eBPF profiler marks each frame's kind by.
pub const FRAME_TYPE_KEY: &str = "profile.frame.type";

/// `o` with the dictionary `named` in place of its own.
pub fn with_dictionary(o: &OtlpProfiles, named: Arc<SharedDictionary>) -> OtlpProfiles {
    let shared = named.heap_size();
    OtlpProfiles::new(named, o.context.clone(), o.profiles.clone(), shared)
}

/// The dictionary with its unnamed locations named, or `None` when there
/// are none to name or none could be; with the frames counted by result
/// either way. Payloads cut from one request share their dictionary, so
/// this is done once per dictionary, not per payload.
pub fn symbolize(
    dictionary: &SharedDictionary,
    pid: Option<u32>,
    sources: &mut Sources,
    symbols: &mut Symbols,
) -> (Option<Arc<SharedDictionary>>, Counts) {
    let mut counts = Counts::new();
    let Ok(dict) = dictionary.decoded() else {
        // Receivers check dictionaries; one that cannot be read goes on for
        // the exporters to report.
        return (None, counts);
    };
    let todo: Vec<usize> = dict
        .location_table
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| l.lines.is_empty() && l.address != 0)
        .map(|(i, _)| i)
        .collect();
    if todo.is_empty() {
        return (None, counts);
    }
    let string = |i: i32| -> &str {
        usize::try_from(i)
            .ok()
            .and_then(|i| dict.string_table.get(i))
            .map_or("", String::as_str)
    };
    // An attribute's key and string value.
    let attribute = |i: i32| -> Option<(&str, &str)> {
        let a = dict.attribute_table.get(usize::try_from(i).ok()?)?;
        let value = match a.value.as_ref()?.value.as_ref()? {
            common::any_value::Value::StringValue(s) => s.as_str(),
            common::any_value::Value::StringValueStrindex(i) => string(*i),
            _ => return None,
        };
        Some((string(a.key_strindex), value))
    };
    let mut found: HashMap<usize, Source> = HashMap::new();
    let mut named = Vec::with_capacity(todo.len());
    for i in todo {
        let loc = &dict.location_table[i];
        let frame_type = loc
            .attribute_indices
            .iter()
            .filter_map(|&a| attribute(a))
            .find(|(k, _)| *k == FRAME_TYPE_KEY)
            .map(|(_, v)| v);
        let mi = usize::try_from(loc.mapping_index)
            .ok()
            .filter(|&m| m > 0 && m < dict.mapping_table.len());
        let kernel = frame_type == Some("kernel") || (mi.is_none() && loc.address >= KERNEL_START);
        let (source, kind) = match mi {
            _ if kernel => (sources.kernel(), AddressKind::Virtual),
            None => (Source::Missing(reason::NO_MAPPING), AddressKind::Virtual),
            Some(mi) => {
                let mapping = &dict.mapping_table[mi];
                let source = found
                    .entry(mi)
                    .or_insert_with(|| {
                        let build_id = mapping
                            .attribute_indices
                            .iter()
                            .filter_map(|&a| attribute(a))
                            .find(|(k, _)| *k == otlp::BUILD_ID_KEY)
                            .and_then(|(_, v)| sources::normalize_build_id(v));
                        sources.find(&MappingId {
                            path: string(mapping.filename_strindex).to_owned(),
                            build_id,
                            pid,
                        })
                    })
                    .clone();
                let kind = if frame_type == Some("native") {
                    AddressKind::Virtual
                } else {
                    AddressKind::Runtime {
                        memory_start: mapping.memory_start,
                        memory_limit: mapping.memory_limit,
                        file_offset: mapping.file_offset,
                    }
                };
                (source, kind)
            }
        };
        match sources::lookup(&source, loc.address, kind, symbols) {
            Ok(lines) => {
                *counts.entry(reason::SYMBOLIZED).or_default() += 1;
                named.push((i, lines));
            }
            Err(why) => *counts.entry(why).or_default() += 1,
        }
    }
    if named.is_empty() {
        return (None, counts);
    }

    let mut dict = dict.into_owned();
    // Entry 0 of every table is the zero value; a sender with no functions
    // (addresses only) may have sent none, and a new function must not
    // land at 0.
    if dict.string_table.is_empty() {
        dict.string_table.push(String::new());
    }
    if dict.function_table.is_empty() {
        dict.function_table.push(proto::Function::default());
    }
    let mut strings: HashMap<String, i32> = HashMap::with_capacity(dict.string_table.len());
    for (i, s) in dict.string_table.iter().enumerate() {
        strings.entry(s.clone()).or_insert(i as i32);
    }
    let mut functions: HashMap<(i32, i32), i32> = dict
        .function_table
        .iter()
        .enumerate()
        .skip(1)
        .map(|(i, f)| ((f.name_strindex, f.filename_strindex), i as i32))
        .collect();
    let mut intern = |table: &mut Vec<String>, s: &str| -> i32 {
        if let Some(&i) = strings.get(s) {
            return i;
        }
        let i = table.len() as i32;
        table.push(s.to_owned());
        strings.insert(s.to_owned(), i);
        i
    };
    for (i, lines) in named {
        let mut out = Vec::with_capacity(lines.len());
        for l in lines.iter() {
            let name = intern(&mut dict.string_table, &l.function);
            let file = match &l.file {
                Some(f) => intern(&mut dict.string_table, f),
                None => 0,
            };
            let function_table = &mut dict.function_table;
            let index = *functions.entry((name, file)).or_insert_with(|| {
                function_table.push(proto::Function {
                    name_strindex: name,
                    system_name_strindex: name,
                    filename_strindex: file,
                    start_line: 0,
                });
                function_table.len() as i32 - 1
            });
            out.push(proto::Line {
                function_index: index,
                line: i64::from(l.line),
                column: 0,
            });
        }
        dict.location_table[i].lines = out;
    }
    (Some(Arc::new(SharedDictionary::from_decoded(dict))), counts)
}
