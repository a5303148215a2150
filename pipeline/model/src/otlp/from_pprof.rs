//! pprof → OTLP: one OTLP profile per pprof sample type, all referring to one
//! shared dictionary.

use super::dictionary::HashMap;

use super::{BUILD_ID_KEY, ConvertError, DictionaryBuilder, Lost, proto};
use crate::pprof;

/// Converts one decoded pprof profile into OTLP profiles (one per sample
/// type, in order) whose tables are added to `dict`. Fields OTLP has no place
/// for (`drop_frames`, `keep_frames`, comments, `default_sample_type`,
/// `doc_url`, mapping `has_*` flags, `is_folded`) are counted in `lost`.
pub fn pprof_to_otlp(
    p: &pprof::Profile,
    dict: &mut DictionaryBuilder,
    lost: &mut Lost,
) -> Result<Vec<proto::Profile>, ConvertError> {
    let mappings = add_mappings(p, dict, lost)?;
    let functions = add_functions(p, dict)?;
    let locations = add_locations(p, dict, lost, &mappings, &functions)?;

    // Each sample's stack and attributes, shared by every sample type.
    let mut samples = Vec::with_capacity(p.sample.len());
    for (i, s) in p.sample.iter().enumerate() {
        samples.push(shared_sample(p, i, s, dict, &locations)?);
    }

    let profiles = profiles_by_sample_type(p, dict, &samples)?;
    count_lost_fields(p, lost);
    Ok(profiles)
}

/// A sample's stack, attributes and link (their indices in the dictionary),
/// shared by the profiles of every sample type.
type SharedSample = (i32, Vec<i32>, i32);

/// A sample's link: its trace id and span id.
type Link = ([u8; 16], [u8; 8]);

/// The string at index `i` of `p`'s string table.
fn string_at(p: &pprof::Profile, i: i64) -> Result<&str, ConvertError> {
    usize::try_from(i)
        .ok()
        .and_then(|i| p.string_table.get(i))
        .map(String::as_str)
        .ok_or_else(|| {
            ConvertError::new(format!(
                "string index {i} is out of range (the string table has {} entries)",
                p.string_table.len()
            ))
        })
}

/// Adds `p`'s mappings to `dict`, counting their `has_*` flags as lost:
/// their dictionary indices by pprof id.
fn add_mappings(
    p: &pprof::Profile,
    dict: &mut DictionaryBuilder,
    lost: &mut Lost,
) -> Result<HashMap<u64, i32>, ConvertError> {
    let string = |i: i64| string_at(p, i);
    let mut mappings: HashMap<u64, i32> =
        HashMap::with_capacity_and_hasher(p.mapping.len(), Default::default());
    for m in &p.mapping {
        let mut attribute_indices = Vec::new();
        if m.build_id != 0 {
            attribute_indices.push(dict.string_attribute(BUILD_ID_KEY, string(m.build_id)?, ""));
        }
        let filename_strindex = dict.string(string(m.filename)?);
        let index = dict.mapping(proto::Mapping {
            memory_start: m.memory_start,
            memory_limit: m.memory_limit,
            file_offset: m.file_offset,
            filename_strindex,
            attribute_indices,
        });
        mappings.insert(m.id, index);
        let flags = [
            m.has_functions,
            m.has_filenames,
            m.has_line_numbers,
            m.has_inline_frames,
        ];
        lost.add("mapping has_* flags", flags.iter().filter(|&&f| f).count());
    }
    Ok(mappings)
}

/// Adds `p`'s functions to `dict`: their dictionary indices by pprof id.
fn add_functions(
    p: &pprof::Profile,
    dict: &mut DictionaryBuilder,
) -> Result<HashMap<u64, i32>, ConvertError> {
    let string = |i: i64| string_at(p, i);
    let mut functions: HashMap<u64, i32> =
        HashMap::with_capacity_and_hasher(p.function.len(), Default::default());
    for f in &p.function {
        let function = proto::Function {
            name_strindex: dict.string(string(f.name)?),
            system_name_strindex: dict.string(string(f.system_name)?),
            filename_strindex: dict.string(string(f.filename)?),
            start_line: f.start_line,
        };
        functions.insert(f.id, dict.function(function));
    }
    Ok(functions)
}

/// Adds `p`'s locations to `dict`, counting `is_folded` flags as lost:
/// their dictionary indices by pprof id.
fn add_locations(
    p: &pprof::Profile,
    dict: &mut DictionaryBuilder,
    lost: &mut Lost,
    mappings: &HashMap<u64, i32>,
    functions: &HashMap<u64, i32>,
) -> Result<HashMap<u64, i32>, ConvertError> {
    let mut locations: HashMap<u64, i32> =
        HashMap::with_capacity_and_hasher(p.location.len(), Default::default());
    for l in &p.location {
        let mapping_index = match l.mapping_id {
            0 => 0,
            id => *mappings.get(&id).ok_or_else(|| {
                ConvertError::new(format!(
                    "location {} names mapping {id}, which does not exist",
                    l.id
                ))
            })?,
        };
        let mut lines = Vec::with_capacity(l.line.len());
        for line in &l.line {
            let function_index = match line.function_id {
                0 => 0,
                id => *functions.get(&id).ok_or_else(|| {
                    ConvertError::new(format!(
                        "location {} names function {id}, which does not exist",
                        l.id
                    ))
                })?,
            };
            lines.push(proto::Line {
                function_index,
                line: line.line,
                column: line.column,
            });
        }
        if l.is_folded {
            lost.add("location is_folded flags", 1);
        }
        let index = dict.location(proto::Location {
            mapping_index,
            address: l.address,
            lines,
            attribute_indices: Vec::new(),
        });
        locations.insert(l.id, index);
    }
    Ok(locations)
}

/// Sample `i` (`s`) of `p`: its stack, attributes and link added to `dict`.
fn shared_sample(
    p: &pprof::Profile,
    i: usize,
    s: &pprof::Sample,
    dict: &mut DictionaryBuilder,
    locations: &HashMap<u64, i32>,
) -> Result<SharedSample, ConvertError> {
    let string = |i: i64| string_at(p, i);
    let types = p.sample_type.len();
    if s.value.len() != types {
        return Err(ConvertError::new(format!(
            "sample {i} has {} values for {types} sample types",
            s.value.len()
        )));
    }
    let mut stack = Vec::with_capacity(s.location_id.len());
    for id in &s.location_id {
        stack.push(*locations.get(id).ok_or_else(|| {
            ConvertError::new(format!(
                "sample {i} names location {id}, which does not exist"
            ))
        })?);
    }
    let stack_index = dict.stack(stack);
    let link = sample_link(p, s)?;
    let mut attribute_indices = Vec::with_capacity(s.label.len());
    for label in &s.label {
        let key = string(label.key)?;
        if link.is_some() && label.str != 0 && (key == TRACE_ID_LABEL || key == SPAN_ID_LABEL) {
            continue;
        }
        attribute_indices.push(if label.str != 0 {
            dict.string_attribute(key, string(label.str)?, "")
        } else {
            dict.int_attribute(key, label.num, string(label.num_unit)?)
        });
    }
    let link_index = match link {
        Some((t, s)) => dict.link(t.to_vec(), s.to_vec()),
        None => 0,
    };
    Ok((stack_index, attribute_indices, link_index))
}

/// The link of sample `s`: its `trace_id` and `span_id` labels when both
/// hold valid ids (the reverse of what `otlp_to_pprof` writes); anything
/// else under those names stays an attribute.
fn sample_link(p: &pprof::Profile, s: &pprof::Sample) -> Result<Option<Link>, ConvertError> {
    let mut trace_id = None;
    let mut span_id = None;
    for label in &s.label {
        if label.str == 0 {
            continue;
        }
        match string_at(p, label.key)? {
            TRACE_ID_LABEL => trace_id = link_id::<16>(string_at(p, label.str)?),
            SPAN_ID_LABEL => span_id = link_id::<8>(string_at(p, label.str)?),
            _ => {}
        }
    }
    Ok(match (trace_id, span_id) {
        (Some(t), Some(s)) => Some((t, s)),
        _ => None,
    })
}

/// One OTLP profile per sample type of `p`, each with every sample's value
/// of that type.
fn profiles_by_sample_type(
    p: &pprof::Profile,
    dict: &mut DictionaryBuilder,
    samples: &[SharedSample],
) -> Result<Vec<proto::Profile>, ConvertError> {
    let string = |i: i64| string_at(p, i);
    let period_type = match &p.period_type {
        Some(t) => Some(proto::ValueType {
            type_strindex: dict.string(string(t.r#type)?),
            unit_strindex: dict.string(string(t.unit)?),
        }),
        None => None,
    };
    let mut profiles = Vec::with_capacity(p.sample_type.len());
    for (t, sample_type) in p.sample_type.iter().enumerate() {
        let sample_type = proto::ValueType {
            type_strindex: dict.string(string(sample_type.r#type)?),
            unit_strindex: dict.string(string(sample_type.unit)?),
        };
        profiles.push(proto::Profile {
            sample_type: Some(sample_type),
            samples: p
                .sample
                .iter()
                .zip(samples)
                .map(
                    |(s, (stack_index, attribute_indices, link_index))| proto::Sample {
                        stack_index: *stack_index,
                        attribute_indices: attribute_indices.clone(),
                        link_index: *link_index,
                        values: vec![s.value[t]],
                        timestamps_unix_nano: Vec::new(),
                    },
                )
                .collect(),
            time_unix_nano: u64::try_from(p.time_nanos).unwrap_or(0),
            duration_nano: u64::try_from(p.duration_nanos).unwrap_or(0),
            period_type,
            period: p.period,
            ..proto::Profile::default()
        });
    }
    Ok(profiles)
}

/// Counts the fields of `p` OTLP has no place for in `lost`.
fn count_lost_fields(p: &pprof::Profile, lost: &mut Lost) {
    lost.add("drop_frames", usize::from(p.drop_frames != 0));
    lost.add("keep_frames", usize::from(p.keep_frames != 0));
    lost.add("comments", p.comment.len());
    lost.add(
        "default_sample_type",
        usize::from(p.default_sample_type != 0),
    );
    lost.add("doc_url", usize::from(p.doc_url != 0));
}

/// The sample label a link's trace id is read from and written to.
pub const TRACE_ID_LABEL: &str = "trace_id";
/// The sample label a link's span id is read from and written to.
pub const SPAN_ID_LABEL: &str = "span_id";

/// An id of `N` bytes from exactly `2 * N` hex digits, not all zero.
fn link_id<const N: usize>(text: &str) -> Option<[u8; N]> {
    super::id_from_hex::<N>(text).filter(|id| *id != [0; N])
}
