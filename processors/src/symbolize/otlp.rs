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
use proflow_symbolize::{Lines, Symbols};

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
    let todo = unnamed_locations(&dict);
    if todo.is_empty() {
        return (None, counts);
    }
    let named = look_up_lines(&dict, todo, pid, sources, symbols, &mut counts);
    if named.is_empty() {
        return (None, counts);
    }

    let mut dict = dict.into_owned();
    add_lines(&mut dict, named);
    (Some(Arc::new(SharedDictionary::from_decoded(dict))), counts)
}

/// The indexes of the locations with an address and no lines (entry 0, the
/// zero value, left out).
fn unnamed_locations(dict: &proto::ProfilesDictionary) -> Vec<usize> {
    dict.location_table
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, l)| l.lines.is_empty() && l.address != 0)
        .map(|(i, _)| i)
        .collect()
}

/// String `i` of the dictionary's table (`""` when there is none).
fn string(dict: &proto::ProfilesDictionary, i: i32) -> &str {
    usize::try_from(i)
        .ok()
        .and_then(|i| dict.string_table.get(i))
        .map_or("", String::as_str)
}

/// Attribute `i`'s key and string value.
fn attribute(dict: &proto::ProfilesDictionary, i: i32) -> Option<(&str, &str)> {
    let a = dict.attribute_table.get(usize::try_from(i).ok()?)?;
    let value = match a.value.as_ref()?.value.as_ref()? {
        common::any_value::Value::StringValue(s) => s.as_str(),
        common::any_value::Value::StringValueStrindex(i) => string(dict, *i),
        _ => return None,
    };
    Some((string(dict, a.key_strindex), value))
}

/// Looks up the lines of each location of `todo`, counting the frames by
/// result; the lines of those named, by location index.
fn look_up_lines(
    dict: &proto::ProfilesDictionary,
    todo: Vec<usize>,
    pid: Option<u32>,
    sources: &mut Sources,
    symbols: &mut Symbols,
    counts: &mut Counts,
) -> Vec<(usize, Lines)> {
    // Each mapping's source, found once (by mapping index).
    let mut found: HashMap<usize, Source> = HashMap::new();
    let mut named = Vec::with_capacity(todo.len());
    for i in todo {
        let loc = &dict.location_table[i];
        let (source, kind) = location_source(dict, loc, pid, sources, &mut found);
        match sources::lookup(&source, loc.address, kind, symbols) {
            Ok(lines) => {
                *counts.entry(reason::SYMBOLIZED).or_default() += 1;
                named.push((i, lines));
            }
            Err(why) => *counts.entry(why).or_default() += 1,
        }
    }
    named
}

/// Where the symbols of a location are and what kind of address it holds;
/// a mapping's source is found once and kept in `found`.
fn location_source(
    dict: &proto::ProfilesDictionary,
    loc: &proto::Location,
    pid: Option<u32>,
    sources: &mut Sources,
    found: &mut HashMap<usize, Source>,
) -> (Source, AddressKind) {
    let frame_type = loc
        .attribute_indices
        .iter()
        .filter_map(|&a| attribute(dict, a))
        .find(|(k, _)| *k == FRAME_TYPE_KEY)
        .map(|(_, v)| v);
    let mi = usize::try_from(loc.mapping_index)
        .ok()
        .filter(|&m| m > 0 && m < dict.mapping_table.len());
    let kernel = frame_type == Some("kernel") || (mi.is_none() && loc.address >= KERNEL_START);
    match mi {
        _ if kernel => (sources.kernel(), AddressKind::Virtual),
        None => (Source::Missing(reason::NO_MAPPING), AddressKind::Virtual),
        Some(mi) => {
            let mapping = &dict.mapping_table[mi];
            let source = found
                .entry(mi)
                .or_insert_with(|| mapping_source(dict, mapping, pid, sources))
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
    }
}

/// Where the symbols of a mapping's file are, by its path and build id.
fn mapping_source(
    dict: &proto::ProfilesDictionary,
    mapping: &proto::Mapping,
    pid: Option<u32>,
    sources: &mut Sources,
) -> Source {
    let build_id = mapping
        .attribute_indices
        .iter()
        .filter_map(|&a| attribute(dict, a))
        .find(|(k, _)| *k == otlp::BUILD_ID_KEY)
        .and_then(|(_, v)| sources::normalize_build_id(v));
    sources.find(&MappingId {
        path: string(dict, mapping.filename_strindex).to_owned(),
        build_id,
        pid,
    })
}

/// Gives each named location its lines, appending the functions and
/// strings they need to the dictionary's tables (each once).
fn add_lines(dict: &mut proto::ProfilesDictionary, named: Vec<(usize, Lines)>) {
    // Entry 0 of every table is the zero value; a sender with no functions
    // (addresses only) may have sent none, and a new function must not
    // land at 0.
    if dict.string_table.is_empty() {
        dict.string_table.push(String::new());
    }
    if dict.function_table.is_empty() {
        dict.function_table.push(proto::Function::default());
    }
    let mut tables = TableIndex::new(dict);
    for (i, lines) in named {
        let mut out = Vec::with_capacity(lines.len());
        for l in lines.iter() {
            let name = tables.string(&mut dict.string_table, &l.function);
            let file = match &l.file {
                Some(f) => tables.string(&mut dict.string_table, f),
                None => 0,
            };
            let index = tables.function(&mut dict.function_table, name, file);
            out.push(proto::Line {
                function_index: index,
                line: i64::from(l.line),
                column: 0,
            });
        }
        dict.location_table[i].lines = out;
    }
}

/// The dictionary's strings and functions by content, so that each new one
/// is appended once.
struct TableIndex {
    strings: HashMap<String, i32>,
    /// By name and file string index.
    functions: HashMap<(i32, i32), i32>,
}

impl TableIndex {
    /// Indexes the dictionary's strings and functions (past entry 0).
    fn new(dict: &proto::ProfilesDictionary) -> Self {
        let mut strings: HashMap<String, i32> = HashMap::with_capacity(dict.string_table.len());
        for (i, s) in dict.string_table.iter().enumerate() {
            strings.entry(s.clone()).or_insert(i as i32);
        }
        let functions: HashMap<(i32, i32), i32> = dict
            .function_table
            .iter()
            .enumerate()
            .skip(1)
            .map(|(i, f)| ((f.name_strindex, f.filename_strindex), i as i32))
            .collect();
        TableIndex { strings, functions }
    }

    /// The index of `s` in `table`, appended there when new.
    fn string(&mut self, table: &mut Vec<String>, s: &str) -> i32 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = table.len() as i32;
        table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    /// The index of the function named `name` in `file` in `table`,
    /// appended there when new.
    fn function(&mut self, table: &mut Vec<proto::Function>, name: i32, file: i32) -> i32 {
        *self.functions.entry((name, file)).or_insert_with(|| {
            table.push(proto::Function {
                name_strindex: name,
                system_name_strindex: name,
                filename_strindex: file,
                start_line: 0,
            });
            table.len() as i32 - 1
        })
    }
}
