//! The structural checks of [`super::check`], made on the protobuf bytes
//! without decoding them: a receiver that keeps the bytes as they arrived
//! checks a dictionary ([`check_dictionary_wire`]) and each profile
//! ([`check_profile_wire`]) in one walk each and allocates nothing per
//! sample. The rules are the same: entry 0 of every table the zero value,
//! every index in range, a sample with values or timestamps (as many of each
//! when it has both); plus what decoding would refuse (bad framing, a known
//! field with the wrong wire type, strings that are not UTF-8).

use prost::Message;

use super::ConvertError;
use super::check::{VERSION_HINT, out_of_range};
use super::common::AnyValue;
use crate::wire::{self, Value};

/// What a dictionary's tables hold, as a profile's checks need it.
#[derive(Debug, Clone, Default)]
pub struct DictionaryIndex<'a> {
    pub mappings: usize,
    pub locations: usize,
    pub functions: usize,
    pub links: usize,
    pub attributes: usize,
    pub stacks: usize,
    /// The string table, in order.
    pub strings: Vec<&'a str>,
}

impl DictionaryIndex<'_> {
    /// String `i`, if in range.
    pub fn string(&self, i: i32) -> Option<&str> {
        usize::try_from(i)
            .ok()
            .and_then(|i| self.strings.get(i))
            .copied()
    }
}

/// A checked profile's series facts: sample type, period, times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProfileFacts {
    /// `(type_strindex, unit_strindex)`.
    pub sample_type: Option<(i32, i32)>,
    pub period_type: Option<(i32, i32)>,
    pub period: i64,
    pub time_unix_nano: u64,
    pub duration_nano: u64,
}

fn bad(what: &str, e: impl std::fmt::Display) -> ConvertError {
    ConvertError::new(format!("{what}: {e}"))
}

fn wire_type(what: &str, field: u32) -> ConvertError {
    ConvertError::new(format!("{what}: field {field} has the wrong wire type"))
}

/// What a known field's wire type must be for decoding to take it.
#[derive(Clone, Copy)]
enum Kind {
    Varint,
    Fixed64,
    /// A string, bytes or a message.
    Bytes,
    /// A repeated varint field: one varint, or packed ones.
    Varints,
    /// A repeated fixed64 field: one, or packed ones.
    Fixed64s,
    /// A repeated message field.
    Messages,
    /// An optional `AnyValue` message.
    AnyValue,
}

/// The wire kinds of each message's fields 1, 2, 3, ... (OTLP profiles 1.10).
const PROFILE: &[Kind] = &[
    Kind::Bytes,
    Kind::Bytes,
    Kind::Fixed64,
    Kind::Varint,
    Kind::Bytes,
    Kind::Varint,
    Kind::Bytes,
    Kind::Varint,
    Kind::Bytes,
    Kind::Bytes,
    Kind::Varints,
];
const SAMPLE: &[Kind] = &[
    Kind::Varint,
    Kind::Varints,
    Kind::Varint,
    Kind::Varints,
    Kind::Fixed64s,
];
const VALUE_TYPE: &[Kind] = &[Kind::Varint, Kind::Varint];
const MAPPING: &[Kind] = &[
    Kind::Varint,
    Kind::Varint,
    Kind::Varint,
    Kind::Varint,
    Kind::Varints,
];
const LOCATION: &[Kind] = &[Kind::Varint, Kind::Varint, Kind::Messages, Kind::Varints];
const LINE: &[Kind] = &[Kind::Varint, Kind::Varint, Kind::Varint];
const FUNCTION: &[Kind] = &[Kind::Varint, Kind::Varint, Kind::Varint, Kind::Varint];
const LINK: &[Kind] = &[Kind::Bytes, Kind::Bytes];
const ATTRIBUTE: &[Kind] = &[Kind::Varint, Kind::AnyValue, Kind::Varint];
const STACK: &[Kind] = &[Kind::Varints];

/// Refuses a known field (by `schema`) whose wire type decoding would
/// refuse, as it would: unknown fields are skipped, as decoding skips them.
fn known(schema: &[Kind], what: &str, field: u32, v: &Value<'_>) -> Result<(), ConvertError> {
    let Some(kind) = (field as usize).checked_sub(1).and_then(|i| schema.get(i)) else {
        return Ok(());
    };
    let ok = match (kind, v) {
        (Kind::Varint | Kind::Varints, Value::Varint(_))
        | (Kind::Fixed64 | Kind::Fixed64s, Value::Fixed64(_))
        | (Kind::Bytes | Kind::Messages | Kind::AnyValue, Value::Bytes(_)) => true,
        (Kind::Varints, Value::Bytes(packed)) => {
            let mut rest = *packed;
            while !rest.is_empty() {
                wire::read_varint(&mut rest).map_err(|e| bad(what, e))?;
            }
            true
        }
        (Kind::Fixed64s, Value::Bytes(packed)) => packed.len() % 8 == 0,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(wire_type(what, field))
    }
}

/// An index as the wire holds it (`int32`: decoding keeps the low 32 bits
/// of the varint, a negative one sign-extended to 64), checked against its
/// table.
fn index(v: u64, len: usize, what: &str) -> Result<(), ConvertError> {
    let i = v as i32;
    match usize::try_from(i) {
        Ok(u) if u < len.max(1) => Ok(()),
        _ => Err(out_of_range(what, i, len.max(1))),
    }
}

/// Each value of a repeated varint field, packed or not.
fn varints(
    value: Value<'_>,
    mut each: impl FnMut(u64) -> Result<(), ConvertError>,
    what: &str,
    field: u32,
) -> Result<(), ConvertError> {
    match value {
        Value::Varint(v) => each(v),
        Value::Bytes(mut packed) => {
            while !packed.is_empty() {
                each(wire::read_varint(&mut packed).map_err(|e| bad(what, e))?)?;
            }
            Ok(())
        }
        _ => Err(wire_type(what, field)),
    }
}

fn varint(value: Value<'_>, what: &str, field: u32) -> Result<u64, ConvertError> {
    match value {
        Value::Varint(v) => Ok(v),
        _ => Err(wire_type(what, field)),
    }
}

fn message<'a>(value: Value<'a>, what: &str, field: u32) -> Result<&'a [u8], ConvertError> {
    match value {
        Value::Bytes(b) => Ok(b),
        _ => Err(wire_type(what, field)),
    }
}

/// True when the message decodes to its zero value (what entry 0 of each
/// table must be), as decoding sees it: unknown fields are dropped, the last
/// of a repeated singular field wins, any element of a repeated field makes
/// it non-empty, and an `AnyValue` is zero when it holds no value.
fn is_zero(schema: &[Kind], msg: &[u8]) -> Result<bool, ConvertError> {
    // Per known field: whether its value (the last one, for singular fields) is not zero.
    let mut set = [false; 8];
    let mut any_value: Option<AnyValue> = None;
    for f in wire::fields(msg) {
        let (n, v) = f.map_err(|e| bad("dictionary", e))?;
        known(schema, "dictionary", n, &v)?;
        let Some(&kind) = (n as usize).checked_sub(1).and_then(|i| schema.get(i)) else {
            continue;
        };
        let slot = &mut set[n as usize - 1];
        match (kind, v) {
            (Kind::Varint | Kind::Fixed64, Value::Varint(x) | Value::Fixed64(x)) => *slot = x != 0,
            (Kind::Bytes, Value::Bytes(b)) => *slot = !b.is_empty(),
            (Kind::AnyValue, Value::Bytes(b)) => merge_any_value(&mut any_value, b)?,
            (Kind::Varints | Kind::Fixed64s, Value::Bytes(b)) => *slot |= !b.is_empty(),
            _ => *slot = true,
        }
    }
    if any_value.is_some_and(|v| v.value.is_some()) {
        return Ok(false);
    }
    Ok(!set.contains(&true))
}

/// Merges one occurrence of an `AnyValue` field into `into`, as decoding
/// does: each occurrence is decoded by itself and merged into what came
/// before. (Reading the occurrences' bytes as one message is not the same:
/// a field cut at an occurrence's end reads as something else joined to the
/// next one; found by the otlp_wire fuzz target.)
fn merge_any_value(into: &mut Option<AnyValue>, part: &[u8]) -> Result<(), ConvertError> {
    into.get_or_insert_with(AnyValue::default)
        .merge(part)
        .map_err(|e| bad("an attribute value", e))
}

/// Checks a dictionary's bytes: the same rules as
/// [`super::check_dictionary`] and [`super::check_dictionary_references`].
pub fn check_dictionary_wire(bytes: &[u8]) -> Result<DictionaryIndex<'_>, ConvertError> {
    let mut d = DictionaryIndex::default();
    let zero = |what: &str| {
        ConvertError::new(format!(
            "entry 0 of the dictionary's {what} is not the zero value, as OTLP profiles 1.10 requires; is the sender on another version?"
        ))
    };
    // First walk: table sizes, strings, entry 0 of each table.
    for f in wire::fields(bytes) {
        let (field, v) = f.map_err(|e| bad("dictionary", e))?;
        let (count, name) = match field {
            1 => (&mut d.mappings, "mapping_table"),
            2 => (&mut d.locations, "location_table"),
            3 => (&mut d.functions, "function_table"),
            4 => (&mut d.links, "link_table"),
            5 => {
                let s = message(v, "dictionary string_table", field)?;
                let s = std::str::from_utf8(s)
                    .map_err(|_| ConvertError::new("a dictionary string is not valid UTF-8"))?;
                if d.strings.is_empty() && !s.is_empty() {
                    return Err(zero("string_table"));
                }
                d.strings.push(s);
                continue;
            }
            6 => {
                let a = message(v, "dictionary attribute_table", field)?;
                // The value may be an empty AnyValue (`{"value": {}}`, as the
                // collector writes entry 0): zero too.
                if d.attributes == 0 && !is_zero(ATTRIBUTE, a)? {
                    return Err(zero("attribute_table"));
                }
                d.attributes += 1;
                continue;
            }
            7 => (&mut d.stacks, "stack_table"),
            _ => continue,
        };
        let m = message(v, "dictionary", field)?;
        let schema = match field {
            1 => MAPPING,
            2 => LOCATION,
            3 => FUNCTION,
            4 => LINK,
            _ => STACK,
        };
        if *count == 0 && !is_zero(schema, m)? {
            return Err(zero(name));
        }
        *count += 1;
    }
    // Second walk: every reference inside the dictionary.
    let strings = d.strings.len();
    for f in wire::fields(bytes) {
        let (field, v) = f.map_err(|e| bad("dictionary", e))?;
        // Strings (5) are not messages; links (4) refer to nothing, but
        // their fields must still decode.
        let Value::Bytes(m) = v else { continue };
        let (schema, what) = match field {
            1 => (MAPPING, "mapping"),
            2 => (LOCATION, "location"),
            3 => (FUNCTION, "function"),
            4 => (LINK, "link"),
            6 => (ATTRIBUTE, "attribute"),
            7 => (STACK, "stack"),
            _ => continue,
        };
        // Singular fields: decoding keeps the last of each (by field
        // number), and merges the parts of a message field (the value).
        let mut last: [Option<u64>; 5] = [None; 5];
        let mut value: Option<AnyValue> = None;
        for g in wire::fields(m) {
            let (n, v) = g.map_err(|e| bad("dictionary", e))?;
            known(schema, what, n, &v)?;
            match (field, n) {
                // mapping: filename_strindex; location: mapping_index;
                // function: name, system name, filename; attribute: key, unit
                (1, 4) | (2, 1) | (3, 1..=3) | (6, 1) | (6, 3) => {
                    last[n as usize] = Some(varint(v, what, n)?);
                }
                // mapping, location: attribute_indices
                (1, 5) | (2, 4) => varints(
                    v,
                    |a| index(a, d.attributes, "attribute"),
                    "attribute_indices",
                    n,
                )?,
                // location: lines (each line's function_index, the last one)
                (2, 3) => {
                    let mut function = 0;
                    for h in wire::fields(message(v, "location line", n)?) {
                        let (k, v) = h.map_err(|e| bad("location line", e))?;
                        known(LINE, "line", k, &v)?;
                        if k == 1 {
                            function = varint(v, "line", k)?;
                        }
                    }
                    index(function, d.functions, "function")?;
                }
                (6, 2) => merge_any_value(&mut value, message(v, "attribute value", n)?)?,
                // stack: location_indices
                (7, 1) => varints(v, |l| index(l, d.locations, "location"), "stack", n)?,
                _ => {}
            }
        }
        for (n, v) in last.iter().enumerate() {
            let Some(&v) = v.as_ref() else { continue };
            match (field, n) {
                (2, 1) => index(v, d.mappings, "mapping")?,
                _ => index(v, strings, "string")?,
            }
        }
        if let Some(v) = &value {
            super::check::check_value(v, 0, strings.max(1))?;
        }
    }
    Ok(d)
}

/// A value type's `(type, unit)` merged into `into` (decoding merges the
/// parts of a message field that appears more than once); its indexes are
/// checked once the whole profile is read.
fn value_type(bytes: &[u8], into: Option<(i32, i32)>) -> Result<(i32, i32), ConvertError> {
    let (mut ty, mut unit) = into.unwrap_or_default();
    for f in wire::fields(bytes) {
        let (n, v) = f.map_err(|e| bad("value type", e))?;
        known(VALUE_TYPE, "value type", n, &v)?;
        if let Value::Varint(i) = v {
            match n {
                1 => ty = i as i32,
                2 => unit = i as i32,
                _ => {}
            }
        }
    }
    Ok((ty, unit))
}

/// Checks one profile's bytes against a checked dictionary: the same rules
/// as [`super::check_profile`]. Returns what the envelope needs of it.
pub fn check_profile_wire(
    d: &DictionaryIndex<'_>,
    bytes: &[u8],
) -> Result<ProfileFacts, ConvertError> {
    let mut facts = ProfileFacts::default();
    let mut n = 0usize;
    for f in wire::fields(bytes) {
        let (field, v) = f.map_err(|e| bad("profile", e))?;
        known(PROFILE, "profile", field, &v)?;
        match field {
            1 => {
                let into = facts.sample_type;
                facts.sample_type = Some(value_type(message(v, "profile", field)?, into)?);
            }
            2 => {
                check_sample(d, message(v, "profile", field)?, n)?;
                n += 1;
            }
            3 => match v {
                Value::Fixed64(t) => facts.time_unix_nano = t,
                _ => return Err(wire_type("profile", field)),
            },
            4 => facts.duration_nano = varint(v, "profile", field)?,
            5 => {
                let into = facts.period_type;
                facts.period_type = Some(value_type(message(v, "profile", field)?, into)?);
            }
            6 => facts.period = varint(v, "profile", field)? as i64,
            9 => {
                std::str::from_utf8(message(v, "profile", field)?)
                    .map_err(|_| ConvertError::new("original_payload_format is not valid UTF-8"))?;
            }
            11 => varints(
                v,
                |a| index(a, d.attributes, "attribute"),
                "profile attribute_indices",
                field,
            )?,
            _ => {}
        }
    }
    for (ty, unit) in facts.sample_type.iter().chain(&facts.period_type) {
        index(*ty as u64, d.strings.len(), "string")?;
        index(*unit as u64, d.strings.len(), "string")?;
    }
    Ok(facts)
}

fn check_sample(d: &DictionaryIndex<'_>, bytes: &[u8], n: usize) -> Result<(), ConvertError> {
    let (mut values, mut timestamps) = (0usize, 0usize);
    // Decoding keeps the last stack and link index.
    let (mut stack, mut link) = (0, 0);
    for f in wire::fields(bytes) {
        let (field, v) = f.map_err(|e| bad("sample", e))?;
        known(SAMPLE, "sample", field, &v)?;
        match field {
            1 => stack = varint(v, "sample", field)?,
            2 => varints(
                v,
                |a| index(a, d.attributes, "attribute"),
                "sample attribute_indices",
                field,
            )?,
            3 => link = varint(v, "sample", field)?,
            4 => match v {
                Value::Varint(_) => values += 1,
                Value::Bytes(packed) => values += wire::count_varints(packed),
                _ => return Err(wire_type("sample", field)),
            },
            5 => match v {
                Value::Fixed64(_) => timestamps += 1,
                Value::Bytes(packed) if packed.len() % 8 == 0 => timestamps += packed.len() / 8,
                _ => return Err(wire_type("sample", field)),
            },
            _ => {}
        }
    }
    index(stack, d.stacks, "stack")?;
    index(link, d.links, "link")?;
    match (values, timestamps) {
        (0, 0) => Err(ConvertError::new(format!(
            "sample {n} has neither values nor timestamps; {VERSION_HINT}"
        ))),
        (v, t) if v > 0 && t > 0 && v != t => Err(ConvertError::new(format!(
            "sample {n} has {v} values but {t} timestamps; OTLP profiles 1.10 requires as many of each"
        ))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::otlp::{check_dictionary, check_dictionary_references, check_profile, proto};
    use crate::testdata::otlp_request;

    fn parts() -> (proto::ProfilesDictionary, Vec<proto::Profile>) {
        let mut r = otlp_request(2, 40, 60);
        let d = r.dictionary.take().unwrap();
        let p = r
            .resource_profiles
            .into_iter()
            .flat_map(|rp| rp.scope_profiles)
            .flat_map(|sp| sp.profiles)
            .collect();
        (d, p)
    }

    /// The wire check and the decoded check agree.
    fn agree(d: &proto::ProfilesDictionary, p: &proto::Profile) -> Result<(), String> {
        let decoded = check_dictionary(d)
            .and_then(|()| check_dictionary_references(d))
            .and_then(|()| check_profile(d, p));
        let dbytes = d.encode_to_vec();
        let pbytes = p.encode_to_vec();
        let wire = check_dictionary_wire(&dbytes)
            .and_then(|i| check_profile_wire(&i, &pbytes).map(|_| ()));
        assert_eq!(
            decoded.is_ok(),
            wire.is_ok(),
            "decoded {decoded:?} wire {wire:?}"
        );
        wire.map_err(|e| e.0)
    }

    #[test]
    fn valid_profiles_pass_and_facts_are_read() {
        let (d, ps) = parts();
        let dbytes = d.encode_to_vec();
        let index = check_dictionary_wire(&dbytes).unwrap();
        assert_eq!(index.strings.len(), d.string_table.len());
        assert_eq!(index.stacks, d.stack_table.len());
        for p in &ps {
            agree(&d, p).unwrap();
            let f = check_profile_wire(&index, &p.encode_to_vec()).unwrap();
            let st = p.sample_type.unwrap();
            assert_eq!(f.sample_type, Some((st.type_strindex, st.unit_strindex)));
            assert_eq!(
                (f.period, f.time_unix_nano, f.duration_nano),
                (p.period, p.time_unix_nano, p.duration_nano)
            );
        }
    }

    /// Found by the `otlp_wire` fuzz target: an attribute value held as a
    /// string index past the string table was refused on the wire and
    /// taken decoded.
    #[test]
    fn an_attribute_value_string_index_is_checked_decoded_too() {
        let (d, ps) = parts();
        let mut bad = d.clone();
        bad.attribute_table.push(proto::KeyValueAndUnit {
            value: Some(super::super::common::AnyValue {
                value: Some(super::super::common::any_value::Value::StringValueStrindex(
                    114,
                )),
            }),
            ..Default::default()
        });
        let e = agree(&bad, &ps[0]).unwrap_err();
        assert!(e.contains("string index 114"), "{e}");
    }

    #[test]
    fn the_same_problems_are_refused() {
        let (d, ps) = parts();
        let p = &ps[0];
        let mut bad = d.clone();
        bad.stack_table[1].location_indices.push(9999);
        assert!(agree(&bad, p).unwrap_err().contains("location index 9999"));
        let mut bad = d.clone();
        bad.location_table[1].lines[0].function_index = -3;
        assert!(agree(&bad, p).unwrap_err().contains("function index -3"));
        let mut bad = d.clone();
        bad.string_table[0] = "x".into();
        assert!(agree(&bad, p).unwrap_err().contains("string_table"));
        let mut bad = d.clone();
        bad.function_table[0].name_strindex = 1;
        assert!(agree(&bad, p).unwrap_err().contains("function_table"));
        let mut q = p.clone();
        q.samples[0].stack_index = 7777;
        assert!(agree(&d, &q).unwrap_err().contains("stack index 7777"));
        let mut q = p.clone();
        q.samples[0].timestamps_unix_nano = vec![1, 2, 3];
        assert!(agree(&d, &q).unwrap_err().contains("timestamps"));
        let mut q = p.clone();
        q.samples[0].values.clear();
        assert!(agree(&d, &q).unwrap_err().contains("neither values"));
        let mut q = p.clone();
        q.sample_type = Some(proto::ValueType {
            type_strindex: 100_000,
            unit_strindex: 0,
        });
        assert!(agree(&d, &q).is_err());
    }

    #[test]
    fn a_1_9_sample_is_refused() {
        // OTLP profiles 1.9 put a sample's values in field 2 (1.10's
        // attribute_indices) and had no stack_index: the values become
        // attribute indexes out of range, or a sample without values.
        let (d, _) = parts();
        let mut sample = Vec::new();
        prost::encoding::int64::encode_packed(2, &[1_000_000, 2_000_000], &mut sample);
        let mut profile = Vec::new();
        prost::encoding::bytes::encode(2, &sample, &mut profile);
        let dbytes = d.encode_to_vec();
        let index = check_dictionary_wire(&dbytes).unwrap();
        let e = check_profile_wire(&index, &profile).unwrap_err().0;
        assert!(e.contains("1.10"), "{e}");
    }

    /// Found by the `otlp_proto` fuzz target: a known field with a wire
    /// type decoding refuses (`profile_id` as a fixed64, a link's
    /// `trace_id` as a varint) passed the wire check, so the receiver took a
    /// profile that no exporter could decode.
    #[test]
    fn known_fields_of_the_wrong_wire_type_are_refused() {
        let (d, ps) = parts();
        let dbytes = d.encode_to_vec();
        let index = check_dictionary_wire(&dbytes).unwrap();
        let mut p = ps[0].encode_to_vec();
        p.push(0x39); // field 7, fixed64
        p.extend_from_slice(&[0; 8]);
        assert!(proto::Profile::decode(p.as_slice()).is_err());
        let e = check_profile_wire(&index, &p).unwrap_err().0;
        assert!(e.contains("field 7 has the wrong wire type"), "{e}");

        // A zero link, then one whose trace_id (field 1) is a varint.
        let mut bad = dbytes.clone();
        bad.extend_from_slice(&[0x22, 0x00, 0x22, 0x02, 0x08, 0x01]);
        assert!(proto::ProfilesDictionary::decode(bad.as_slice()).is_err());
        let e = check_dictionary_wire(&bad).unwrap_err().0;
        assert!(e.contains("link: field 1 has the wrong wire type"), "{e}");
    }

    /// Found by the `otlp_wire` fuzz target: an attribute's value given in
    /// two parts was read as the two parts' bytes joined, while decoding
    /// decodes each part by itself; a key cut at the end of the first part
    /// joined the second into a valid field on the wire only.
    #[test]
    fn an_attribute_value_in_parts_is_read_part_by_part() {
        // value: [0x80] (a key cut short), then value: [0x08, 0x00].
        let entry = [0x12, 0x01, 0x80, 0x12, 0x02, 0x08, 0x00];
        // As attribute 0, and as attribute 1 after an empty attribute 0.
        let first = [&[0x32, 0x07][..], &entry].concat();
        let second = [&[0x32, 0x00, 0x32, 0x07][..], &entry].concat();
        for dictionary in [first, second] {
            assert!(proto::ProfilesDictionary::decode(dictionary.as_slice()).is_err());
            let e = check_dictionary_wire(&dictionary).unwrap_err().0;
            assert!(e.contains("attribute value"), "{e}");
        }
    }

    /// Found by the `otlp_wire` fuzz target: entry 0 was zero on the wire
    /// only if every field was, unknown ones included, while decoding drops
    /// unknown fields (and counts an empty element of a repeated field).
    #[test]
    fn entry_0_is_zero_as_decoding_sees_it() {
        let decoded_ok = |bytes: &[u8]| {
            proto::ProfilesDictionary::decode(bytes)
                .ok()
                .is_some_and(|d| check_dictionary(&d).is_ok())
        };
        // Strings [""], then stack 0 holding an unknown fixed32 field only.
        let unknown = [0x2a, 0x00, 0x3a, 0x05, 0x55, 1, 2, 3, 4];
        assert!(decoded_ok(&unknown));
        check_dictionary_wire(&unknown).unwrap();
        // Attribute 0 whose value holds only an unknown field: no value.
        let attribute = [0x2a, 0x00, 0x32, 0x04, 0x12, 0x02, 0x78, 0x01];
        assert!(decoded_ok(&attribute));
        check_dictionary_wire(&attribute).unwrap();
        // Location 0 with one empty line is not the zero location.
        let line = [0x2a, 0x00, 0x12, 0x02, 0x1a, 0x00];
        assert!(!decoded_ok(&line));
        assert!(check_dictionary_wire(&line).is_err());
        // Stack 0 with an unpacked index 0 holds one location: not zero.
        let index_0 = [0x2a, 0x00, 0x3a, 0x02, 0x08, 0x00];
        assert!(!decoded_ok(&index_0));
        assert!(check_dictionary_wire(&index_0).is_err());
    }

    /// Found by the `otlp_wire` fuzz target: a field given twice is read
    /// as decoding reads it (a message field's parts merged, the last of a
    /// singular field kept), so the wire check's facts and verdict are the
    /// decoded profile's: a period type in two parts read as its last part
    /// alone gave the envelope another period type than the profile's.
    #[test]
    fn fields_given_twice_are_read_as_decoding_reads_them() {
        let (d, ps) = parts();
        let dbytes = d.encode_to_vec();
        let index = check_dictionary_wire(&dbytes).unwrap();
        let mut p = ps[0].clone();
        p.period_type = None;
        let mut bytes = p.encode_to_vec();
        // period_type {type: 1}, then period_type {unit: 2}
        bytes.extend_from_slice(&[0x2a, 0x02, 0x08, 0x01, 0x2a, 0x02, 0x10, 0x02]);
        // a sample whose stack index is 9999, then 1; one value
        bytes.extend_from_slice(&[0x12, 0x07, 0x08, 0x8f, 0x4e, 0x08, 0x01, 0x20, 0x05]);
        let decoded = proto::Profile::decode(bytes.as_slice()).unwrap();
        check_profile(&d, &decoded).unwrap();
        let facts = check_profile_wire(&index, &bytes).unwrap();
        let pt = decoded.period_type.unwrap();
        assert_eq!(pt.type_strindex, 1);
        assert_eq!(pt.unit_strindex, 2);
        assert_eq!(facts.period_type, Some((1, 2)));
    }

    #[test]
    fn broken_framing_is_refused() {
        let (d, ps) = parts();
        let dbytes = d.encode_to_vec();
        assert!(check_dictionary_wire(&dbytes[..dbytes.len() - 1]).is_err());
        let index = check_dictionary_wire(&dbytes).unwrap();
        let p = ps[0].encode_to_vec();
        assert!(check_profile_wire(&index, &p[..p.len() - 1]).is_err());
        assert!(
            check_dictionary_wire(&[0x2a, 0x01, 0xff]).is_err(),
            "a string that is not UTF-8"
        );
    }

    proptest::proptest! {
        /// Whatever the bytes, the checks answer (no panic), and a mutated
        /// valid message either passes or is refused.
        #[test]
        fn any_bytes_are_answered(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..512), flip in 0usize..4096, to in proptest::num::u8::ANY) {
            let _ = check_dictionary_wire(&bytes);
            let (d, ps) = parts();
            let dbytes = d.encode_to_vec();
            let index = check_dictionary_wire(&dbytes).unwrap();
            let _ = check_profile_wire(&index, &bytes);
            let mut p = ps[0].encode_to_vec();
            let i = flip % p.len();
            p[i] = to;
            let _ = check_profile_wire(&index, &p);
            let mut dm = dbytes.clone();
            let j = flip % dm.len();
            dm[j] = to;
            let _ = check_dictionary_wire(&dm);
        }
    }
}
