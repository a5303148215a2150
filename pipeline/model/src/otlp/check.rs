//! Structural checks of OTLP profiles, made before anything uses them.
//!
//! OTLP profiles 1.10 renumbered `Sample`'s fields, so a request from a sender
//! on an earlier version decodes without any protobuf error into wrong
//! indexes. Every index is therefore checked against its table, entry 0 of
//! every table must be the zero value, and a sample must carry values or
//! timestamps (as many of each when it has both). The messages name the
//! likely version mismatch.

use super::{ConvertError, proto};

pub(crate) const VERSION_HINT: &str = "is the sender on OTLP profiles 1.10 (v1development)? Earlier versions numbered Sample's fields differently, which decodes without error into wrong indexes";

/// Where an index was found out of range: the message names the likely cause.
pub(crate) fn out_of_range(what: &str, i: i32, len: usize) -> ConvertError {
    ConvertError::new(format!(
        "{what} index {i} is out of range (its table has {len} entries); {VERSION_HINT}"
    ))
}

/// `table[i]`, or the error that names the likely version mismatch.
pub(crate) fn get<'a, T>(table: &'a [T], what: &str, i: i32) -> Result<&'a T, ConvertError> {
    usize::try_from(i)
        .ok()
        .and_then(|i| table.get(i))
        .ok_or_else(|| out_of_range(what, i, table.len()))
}

fn in_range(len: usize, what: &str, i: i32) -> Result<(), ConvertError> {
    match usize::try_from(i) {
        Ok(u) if u < len => Ok(()),
        _ => Err(out_of_range(what, i, len)),
    }
}

/// Levels of messages an attribute's value may hold below itself (arrays,
/// key-value lists and their values): prost decodes 100 levels, and a
/// request, its dictionary and the attribute take three above the value.
/// Deeper, the request proflow sends on could not be decoded.
pub const MAX_VALUE_NESTING: usize = 97;

/// Checks an attribute's value at `level` (0: the attribute's own): every
/// string it refers to (`string_value_strindex`, `key_strindex`, at any
/// depth) is one of `strings`, and it nests no deeper than
/// [`MAX_VALUE_NESTING`].
pub(crate) fn check_value(
    v: &super::common::AnyValue,
    level: usize,
    strings: usize,
) -> Result<(), ConvertError> {
    use super::common::any_value::Value;
    let deeper = |extra: usize| {
        if level + extra > MAX_VALUE_NESTING {
            Err(ConvertError::new(format!(
                "an attribute value nests arrays or lists more than {MAX_VALUE_NESTING} levels deep"
            )))
        } else {
            Ok(())
        }
    };
    deeper(0)?;
    match &v.value {
        Some(Value::StringValueStrindex(i)) => in_range(strings, "string", *i),
        // ArrayValue one level down, its values two.
        Some(Value::ArrayValue(a)) => {
            deeper(1)?;
            a.values
                .iter()
                .try_for_each(|x| check_value(x, level + 2, strings))
        }
        // KeyValueList one level down, its KeyValues two, their values three.
        Some(Value::KvlistValue(l)) => {
            deeper(1)?;
            l.values.iter().try_for_each(|kv| {
                deeper(2)?;
                in_range(strings, "string", kv.key_strindex)?;
                kv.value
                    .as_ref()
                    .map_or(Ok(()), |x| check_value(x, level + 3, strings))
            })
        }
        _ => Ok(()),
    }
}

/// Checks what the spec requires of every table: entry 0 present and the
/// zero value wherever a table is used.
pub fn check_dictionary(d: &proto::ProfilesDictionary) -> Result<(), ConvertError> {
    let zero = |what: &str, ok: bool| {
        if ok {
            Ok(())
        } else {
            Err(ConvertError::new(format!(
                "entry 0 of the dictionary's {what} is not the zero value, as OTLP profiles 1.10 requires; is the sender on another version?"
            )))
        }
    };
    zero(
        "string_table",
        d.string_table.first().is_none_or(String::is_empty),
    )?;
    zero(
        "mapping_table",
        d.mapping_table
            .first()
            .is_none_or(|m| *m == proto::Mapping::default()),
    )?;
    zero(
        "location_table",
        d.location_table
            .first()
            .is_none_or(|l| *l == proto::Location::default()),
    )?;
    zero(
        "function_table",
        d.function_table
            .first()
            .is_none_or(|f| *f == proto::Function::default()),
    )?;
    zero(
        "link_table",
        d.link_table
            .first()
            .is_none_or(|l| *l == proto::Link::default()),
    )?;
    zero(
        "stack_table",
        d.stack_table
            .first()
            .is_none_or(|s| *s == proto::Stack::default()),
    )?;
    // An empty value (`{"value": {}}`, as the collector writes entry 0) is
    // the zero value too.
    zero(
        "attribute_table",
        d.attribute_table.first().is_none_or(|a| {
            a.key_strindex == 0
                && a.unit_strindex == 0
                && a.value.as_ref().is_none_or(|v| v.value.is_none())
        }),
    )
}

/// Checks every reference inside the dictionary (stacks → locations,
/// locations → mappings, lines → functions, everything → strings), after
/// [`check_dictionary`]. With this and [`check_profile`] passed, no lookup
/// of a profile's index can fail.
pub fn check_dictionary_references(d: &proto::ProfilesDictionary) -> Result<(), ConvertError> {
    let strings = d.string_table.len().max(1);
    let attrs = d.attribute_table.len().max(1);
    let string = |i: i32| in_range(strings, "string", i);
    let attributes = |v: &[i32]| v.iter().try_for_each(|&a| in_range(attrs, "attribute", a));
    for a in &d.attribute_table {
        string(a.key_strindex)?;
        string(a.unit_strindex)?;
        // Strings the value refers to, at any depth (as the wire check reads it).
        if let Some(v) = &a.value {
            check_value(v, 0, strings)?;
        }
    }
    for m in &d.mapping_table {
        string(m.filename_strindex)?;
        attributes(&m.attribute_indices)?;
    }
    for f in &d.function_table {
        string(f.name_strindex)?;
        string(f.system_name_strindex)?;
        string(f.filename_strindex)?;
    }
    let mappings = d.mapping_table.len().max(1);
    let functions = d.function_table.len().max(1);
    for l in &d.location_table {
        in_range(mappings, "mapping", l.mapping_index)?;
        attributes(&l.attribute_indices)?;
        for line in &l.lines {
            in_range(functions, "function", line.function_index)?;
        }
    }
    let locations = d.location_table.len().max(1);
    for s in &d.stack_table {
        for &l in &s.location_indices {
            in_range(locations, "location", l)?;
        }
    }
    Ok(())
}

/// Checks one profile against a dictionary that passed both dictionary
/// checks: every index in range, and each sample with values or timestamps
/// (as many of each when it has both).
pub fn check_profile(
    d: &proto::ProfilesDictionary,
    p: &proto::Profile,
) -> Result<(), ConvertError> {
    let strings = d.string_table.len().max(1);
    let attrs = d.attribute_table.len().max(1);
    for t in p.sample_type.iter().chain(p.period_type.iter()) {
        in_range(strings, "string", t.type_strindex)?;
        in_range(strings, "string", t.unit_strindex)?;
    }
    for &a in &p.attribute_indices {
        in_range(attrs, "attribute", a)?;
    }
    let stacks = d.stack_table.len().max(1);
    let links = d.link_table.len().max(1);
    for (n, s) in p.samples.iter().enumerate() {
        in_range(stacks, "stack", s.stack_index)?;
        in_range(links, "link", s.link_index)?;
        for &a in &s.attribute_indices {
            in_range(attrs, "attribute", a)?;
        }
        match (s.values.len(), s.timestamps_unix_nano.len()) {
            (0, 0) => {
                return Err(ConvertError::new(format!(
                    "sample {n} has neither values nor timestamps; {VERSION_HINT}"
                )));
            }
            (v, t) if v > 0 && t > 0 && v != t => {
                return Err(ConvertError::new(format!(
                    "sample {n} has {v} values but {t} timestamps; OTLP profiles 1.10 requires as many of each"
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dict() -> proto::ProfilesDictionary {
        let mut b = super::super::DictionaryBuilder::new();
        let f = b.function(proto::Function {
            name_strindex: 1,
            ..Default::default()
        });
        let _ = b.string("main");
        let l = b.location(proto::Location {
            lines: vec![proto::Line {
                function_index: f,
                ..Default::default()
            }],
            ..Default::default()
        });
        b.stack(vec![l]);
        b.finish()
    }

    #[test]
    fn a_valid_profile_passes() {
        let d = dict();
        check_dictionary(&d).unwrap();
        check_dictionary_references(&d).unwrap();
        let p = proto::Profile {
            samples: vec![proto::Sample {
                stack_index: 1,
                values: vec![3],
                ..Default::default()
            }],
            ..Default::default()
        };
        check_profile(&d, &p).unwrap();
    }

    #[test]
    fn bad_references_name_the_table_and_the_version() {
        let mut d = dict();
        d.stack_table[1].location_indices.push(99);
        let e = check_dictionary_references(&d).unwrap_err().0;
        assert!(e.contains("location index 99") && e.contains("1.10"), "{e}");

        let d = dict();
        let p = proto::Profile {
            samples: vec![proto::Sample {
                stack_index: 7,
                values: vec![1],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(
            check_profile(&d, &p)
                .unwrap_err()
                .0
                .contains("stack index 7")
        );
        let p = proto::Profile {
            samples: vec![proto::Sample {
                stack_index: 1,
                values: vec![1, 2],
                timestamps_unix_nano: vec![5],
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(
            check_profile(&d, &p)
                .unwrap_err()
                .0
                .contains("2 values but 1 timestamps")
        );
        let p = proto::Profile {
            samples: vec![proto::Sample::default()],
            ..Default::default()
        };
        assert!(
            check_profile(&d, &p)
                .unwrap_err()
                .0
                .contains("neither values")
        );
    }
}
