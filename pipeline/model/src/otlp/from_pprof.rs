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
    let string = |i: i64| -> Result<&str, ConvertError> {
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
    };

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

    // Each sample's stack and attributes, shared by every sample type.
    let types = p.sample_type.len();
    let mut samples = Vec::with_capacity(p.sample.len());
    for (i, s) in p.sample.iter().enumerate() {
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
        // `trace_id` and `span_id` labels holding valid ids are the sample's
        // link (the reverse of what `otlp_to_pprof` writes); anything else
        // under those names stays an attribute.
        let mut trace_id = None;
        let mut span_id = None;
        for label in &s.label {
            if label.str == 0 {
                continue;
            }
            match string(label.key)? {
                TRACE_ID_LABEL => trace_id = link_id::<16>(string(label.str)?),
                SPAN_ID_LABEL => span_id = link_id::<8>(string(label.str)?),
                _ => {}
            }
        }
        let link = match (trace_id, span_id) {
            (Some(t), Some(s)) => Some((t, s)),
            _ => None,
        };
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
        samples.push((stack_index, attribute_indices, link_index));
    }

    let period_type = match &p.period_type {
        Some(t) => Some(proto::ValueType {
            type_strindex: dict.string(string(t.r#type)?),
            unit_strindex: dict.string(string(t.unit)?),
        }),
        None => None,
    };
    let mut profiles = Vec::with_capacity(types);
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
                .zip(&samples)
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

    lost.add("drop_frames", usize::from(p.drop_frames != 0));
    lost.add("keep_frames", usize::from(p.keep_frames != 0));
    lost.add("comments", p.comment.len());
    lost.add(
        "default_sample_type",
        usize::from(p.default_sample_type != 0),
    );
    lost.add("doc_url", usize::from(p.doc_url != 0));
    Ok(profiles)
}

/// The sample label a link's trace id is read from and written to.
pub const TRACE_ID_LABEL: &str = "trace_id";
/// The sample label a link's span id is read from and written to.
pub const SPAN_ID_LABEL: &str = "span_id";

/// An id of `N` bytes from exactly `2 * N` hex digits, not all zero.
fn link_id<const N: usize>(text: &str) -> Option<[u8; N]> {
    super::id_from_hex::<N>(text).filter(|id| *id != [0; N])
}
