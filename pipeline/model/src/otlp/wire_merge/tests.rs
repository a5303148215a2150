use std::sync::Arc;

use prost::Message;

use super::*;
use crate::model::Labels;
use crate::otlp::common::{AnyValue, ArrayValue, KeyValue, KeyValueList, any_value};
use crate::otlp::{
    DictionaryBuilder, Lost, OtlpProfiles, ProfileData, RequestBuilder, SharedDictionary,
    check_dictionary, check_dictionary_references, check_dictionary_wire, check_profile,
    check_profile_wire, collector, otlp_to_pprof, pprof_to_otlp, proto,
};
use crate::pprof::{self, ProfileBuilder};

/// A pprof profile: `stacks` (root first) with values, and one label per
/// sample when `label` is given.
fn pprof_of(stacks: &[(&[&str], i64)], label: Option<(&str, &str)>) -> pprof::Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    b.period("cpu", "nanoseconds", 10_000_000);
    for (frames, value) in stacks {
        let ids: Vec<u64> = frames.iter().rev().map(|f| b.frame(f)).collect();
        let labels: Vec<(&str, &str)> = label.into_iter().collect();
        b.sample_with_labels(ids, vec![*value], &labels);
    }
    b.build()
}

/// The OTLP form of `profile`, decoded and as bytes (as a receiver keeps it).
fn both_forms(profile: &pprof::Profile) -> (OtlpProfiles, OtlpProfiles) {
    let mut dict = DictionaryBuilder::new();
    let profiles = pprof_to_otlp(profile, &mut dict, &mut Lost::default()).unwrap();
    let dict = dict.finish();
    let raw_dict = bytes::Bytes::from(dict.encode_to_vec());
    let index = check_dictionary_wire(&raw_dict).unwrap();
    let raw_profiles: Vec<ProfileData> = profiles
        .iter()
        .map(|p| {
            let b = bytes::Bytes::from(p.encode_to_vec());
            check_profile_wire(&index, &b).unwrap();
            ProfileData::from_raw(b)
        })
        .collect();
    let entries = dict.string_table.len() + dict.location_table.len();
    let raw = OtlpProfiles::new(
        Arc::new(SharedDictionary::from_raw_entries(
            raw_dict.clone(),
            entries,
        )),
        None,
        raw_profiles,
        0,
    );
    (OtlpProfiles::decoded(dict, profiles), raw)
}

/// Each profile of a request, as sorted (stack, values, labels) rows.
type Rows = Vec<(Vec<String>, Vec<i64>, Vec<(String, String)>)>;

fn rows_of(bytes: &[u8]) -> Vec<Rows> {
    let msg = collector::ExportProfilesServiceRequest::decode(bytes).unwrap();
    let dict = msg.dictionary.unwrap();
    check_dictionary(&dict).unwrap();
    check_dictionary_references(&dict).unwrap();
    let mut out = Vec::new();
    for r in &msg.resource_profiles {
        for s in &r.scope_profiles {
            for p in &s.profiles {
                check_profile(&dict, p).unwrap();
                for pp in
                    otlp_to_pprof(&dict, std::slice::from_ref(p), &mut Lost::default()).unwrap()
                {
                    let mut rows: Rows = pprof::stacks_root_first(&pp)
                        .map(|(frames, sample)| {
                            let labels = sample
                                .label
                                .iter()
                                .map(|l| (pp.string(l.key).to_owned(), pp.string(l.str).to_owned()))
                                .collect();
                            (
                                frames.iter().map(|f| f.to_string()).collect(),
                                sample.value.clone(),
                                labels,
                            )
                        })
                        .collect();
                    rows.sort();
                    out.push(rows);
                }
            }
        }
    }
    out
}

fn request(items: &[&OtlpProfiles]) -> Vec<u8> {
    let labels = Labels::from_pairs([("service_name", "x")]);
    let mut rb = RequestBuilder::new();
    for o in items {
        rb.push(&labels, o);
    }
    rb.build().unwrap().encode()
}

fn dictionary_of(bytes: &[u8]) -> proto::ProfilesDictionary {
    collector::ExportProfilesServiceRequest::decode(bytes)
        .unwrap()
        .dictionary
        .unwrap()
}

#[test]
fn profiles_merged_on_the_wire_read_as_the_decoded_merge_reads_them() {
    // Enough functions that indexes past 127 take two bytes once shifted,
    // and the stacks' lengths cross one byte too.
    let many: Vec<String> = (0..300).map(|i| format!("fn_{i}")).collect();
    let deep: Vec<&str> = many.iter().map(String::as_str).collect();
    let a = pprof_of(
        &[(&["main", "a", "shared"], 3), (&deep[..150], 5)],
        Some(("thread", "one")),
    );
    let b = pprof_of(
        &[(&["main", "b", "shared"], 7), (&deep[100..], 11)],
        Some(("thread", "two")),
    );
    let c = pprof_of(&[(&["other", "shared"], 13)], None);
    let (da, ra) = both_forms(&a);
    let (db, rb) = both_forms(&b);
    let (dc, rc) = both_forms(&c);
    let on_wire = request(&[&ra, &rb, &rc]);
    let decoded = request(&[&da, &db, &dc]);
    assert_eq!(rows_of(&on_wire), rows_of(&decoded));
    assert_eq!(rows_of(&on_wire).len(), 3);
    // Deduplicated: each name once in the merged strings.
    let d = dictionary_of(&on_wire);
    for name in ["main", "shared", "fn_120", "thread"] {
        assert_eq!(
            d.string_table.iter().filter(|s| *s == name).count(),
            1,
            "{name}"
        );
    }
    assert_eq!(d.string_table[0], "");
}

#[test]
fn the_same_dictionary_twice_adds_nothing_the_second_time() {
    let p = pprof_of(&[(&["main", "a"], 1), (&["main", "b"], 2)], None);
    let (_, one) = both_forms(&p);
    let (_, two) = both_forms(&p);
    assert!(!Arc::ptr_eq(&one.dictionary, &two.dictionary));
    let alone = dictionary_of(&request(&[&one]));
    let merged = dictionary_of(&request(&[&one, &two]));
    let sizes = |d: &proto::ProfilesDictionary| {
        [
            d.string_table.len(),
            d.function_table.len(),
            d.location_table.len(),
            d.stack_table.len(),
            d.mapping_table.len(),
        ]
    };
    assert_eq!(sizes(&merged), sizes(&alone));
    assert_eq!(
        rows_of(&request(&[&one, &two])),
        [rows_of(&request(&[&one])), rows_of(&request(&[&two]))].concat()
    );
}

/// A dictionary whose attribute refers to strings from inside its value
/// (an array of one `string_value_strindex`, a list of one `key_strindex`).
fn nested_strings_dictionary(padding: usize, word: &str) -> proto::ProfilesDictionary {
    let mut strings: Vec<String> = vec![String::new()];
    strings.extend((0..padding).map(|i| format!("pad_{word}_{i}")));
    strings.push("labels".into());
    strings.push(word.into());
    let key = (strings.len() - 2) as i32;
    let value = (strings.len() - 1) as i32;
    let by_ref = AnyValue {
        value: Some(any_value::Value::StringValueStrindex(value)),
    };
    proto::ProfilesDictionary {
        string_table: strings,
        attribute_table: vec![
            proto::KeyValueAndUnit::default(),
            proto::KeyValueAndUnit {
                key_strindex: key,
                value: Some(AnyValue {
                    value: Some(any_value::Value::ArrayValue(ArrayValue {
                        values: vec![
                            by_ref.clone(),
                            AnyValue {
                                value: Some(any_value::Value::KvlistValue(KeyValueList {
                                    values: vec![KeyValue {
                                        key: String::new(),
                                        value: Some(by_ref),
                                        key_strindex: value,
                                    }],
                                })),
                            },
                        ],
                    })),
                }),
                unit_strindex: 0,
            },
        ],
        ..Default::default()
    }
}

#[test]
fn strings_referred_to_inside_attribute_values_are_reindexed_at_any_depth() {
    let mut merge = WireMerge::new();
    let first = nested_strings_dictionary(0, "alpha").encode_to_vec();
    let second = nested_strings_dictionary(5, "beta").encode_to_vec();
    merge.add_dictionary(&first).unwrap();
    let remap = merge.add_dictionary(&second).unwrap();
    let merged = proto::ProfilesDictionary::decode(merge.finish().as_slice()).unwrap();
    check_dictionary(&merged).unwrap();
    // The second dictionary's attribute (its entry 1) in the merged table.
    let a = &merged.attribute_table[remap.tables[ATTRIBUTE][1] as usize];
    assert_eq!(merged.string_table[a.key_strindex as usize], "labels");
    let Some(any_value::Value::ArrayValue(array)) = a.value.as_ref().and_then(|v| v.value.clone())
    else {
        panic!("{a:?}");
    };
    let Some(any_value::Value::StringValueStrindex(s)) = array.values[0].value.clone() else {
        panic!("{array:?}");
    };
    assert_eq!(merged.string_table[s as usize], "beta");
    let Some(any_value::Value::KvlistValue(list)) = array.values[1].value.clone() else {
        panic!("{array:?}");
    };
    assert_eq!(
        merged.string_table[list.values[0].key_strindex as usize],
        "beta"
    );
    // Both attributes kept: they differ.
    assert_eq!(merged.attribute_table.len(), 3);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let p = pprof_of(&[(&["main", "a"], 1)], None);
    let (_, raw) = both_forms(&p);
    let mut merge = WireMerge::new();
    let remap = merge.add_dictionary(raw.dictionary.raw().unwrap()).unwrap();
    // A sample whose attribute index is past the dictionary's attributes.
    let profile = proto::Profile {
        samples: vec![proto::Sample {
            attribute_indices: vec![99],
            values: vec![1],
            ..Default::default()
        }],
        ..Default::default()
    };
    let mut out = Vec::new();
    let e = merge
        .add_profile(&profile.encode_to_vec(), &remap, &mut out)
        .unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
    // A negative one (sign-extended on the wire).
    let negative = proto::Profile {
        attribute_indices: vec![-1],
        ..Default::default()
    };
    assert!(
        merge
            .add_profile(&negative.encode_to_vec(), &remap, &mut Vec::new())
            .is_err()
    );
    // A sample given as a varint, and bytes that end inside a field.
    assert!(
        merge
            .add_profile(&[0x10, 0x01], &remap, &mut Vec::new())
            .is_err()
    );
    assert!(
        merge
            .add_profile(&[0x12, 0x05, 0x08], &remap, &mut Vec::new())
            .is_err()
    );
    // A dictionary whose table entry is a varint.
    assert!(WireMerge::new().add_dictionary(&[0x08, 0x01]).is_err());
}

/// A dictionary with one attribute whose value holds `levels` levels of
/// messages below itself: arrays (two levels each) and, for an odd count,
/// one key-value list (three).
fn nested_dictionary(levels: usize) -> proto::ProfilesDictionary {
    let mut value = AnyValue {
        value: Some(any_value::Value::IntValue(1)),
    };
    let mut left = levels;
    if left % 2 == 1 {
        value = AnyValue {
            value: Some(any_value::Value::KvlistValue(KeyValueList {
                values: vec![KeyValue {
                    key: "k".into(),
                    value: Some(value),
                    key_strindex: 0,
                }],
            })),
        };
        left -= 3;
    }
    for _ in 0..left / 2 {
        value = AnyValue {
            value: Some(any_value::Value::ArrayValue(ArrayValue {
                values: vec![value],
            })),
        };
    }
    proto::ProfilesDictionary {
        string_table: vec![String::new(), "k".into()],
        attribute_table: vec![
            proto::KeyValueAndUnit::default(),
            proto::KeyValueAndUnit {
                key_strindex: 1,
                value: Some(value),
                unit_strindex: 0,
            },
        ],
        ..Default::default()
    }
}

#[test]
fn values_nested_as_deep_as_a_request_can_hold_are_checked_merged_and_sent() {
    use crate::otlp::MAX_VALUE_NESTING;
    let deepest = nested_dictionary(MAX_VALUE_NESTING).encode_to_vec();
    check_dictionary_wire(&deepest).unwrap();
    let mut merge = WireMerge::new();
    merge.add_dictionary(&deepest).unwrap();
    merge.add_dictionary(&deepest).unwrap();
    // The merged dictionary, in a request, decodes (prost's 100 levels).
    let request = collector::ExportProfilesServiceRequest {
        dictionary: Some(proto::ProfilesDictionary::decode(merge.finish().as_slice()).unwrap()),
        ..Default::default()
    };
    let again = collector::ExportProfilesServiceRequest::decode(request.encode_to_vec().as_slice())
        .unwrap();
    check_dictionary_references(again.dictionary.as_ref().unwrap()).unwrap();

    // One level more: refused by both checks, so never merged.
    let deeper = nested_dictionary(MAX_VALUE_NESTING + 1);
    let e = check_dictionary_wire(&deeper.encode_to_vec()).unwrap_err();
    assert!(e.to_string().contains("levels deep"), "{e}");
    let e = check_dictionary_references(&deeper).unwrap_err();
    assert!(e.to_string().contains("levels deep"), "{e}");
    // The merge refuses what is deeper than the checks let through.
    let e = WireMerge::new()
        .add_dictionary(&nested_dictionary(MAX_VALUE_NESTING + 2).encode_to_vec())
        .unwrap_err();
    assert!(e.to_string().contains("nested deeper"), "{e}");
}

#[test]
fn strings_referred_to_inside_values_are_checked() {
    let mut d = nested_strings_dictionary(0, "alpha");
    check_dictionary_references(&d).unwrap();
    check_dictionary_wire(&d.encode_to_vec()).unwrap();
    // The list's key refers past the strings.
    let Some(any_value::Value::ArrayValue(a)) = d.attribute_table[1]
        .value
        .as_mut()
        .and_then(|v| v.value.as_mut())
    else {
        unreachable!()
    };
    let Some(any_value::Value::KvlistValue(l)) = a.values[1].value.as_mut() else {
        unreachable!()
    };
    l.values[0].key_strindex = 50;
    assert!(check_dictionary_references(&d).is_err());
    let e = check_dictionary_wire(&d.encode_to_vec()).unwrap_err();
    assert!(e.to_string().contains("out of range"), "{e}");
}

#[test]
fn the_decoded_merge_writes_strings_inside_values_inline() {
    // Two dictionaries (decoded) with an attribute whose value refers to
    // strings from inside an array and a list, merged by decoding.
    let one = nested_strings_dictionary(0, "alpha");
    let two = nested_strings_dictionary(5, "beta");
    let labels = Labels::from_pairs([("service_name", "x")]);
    let profile = |attr: i32| proto::Profile {
        samples: vec![proto::Sample {
            values: vec![1],
            ..Default::default()
        }],
        attribute_indices: vec![attr],
        ..Default::default()
    };
    let a = OtlpProfiles::decoded(one, vec![profile(1)]);
    let b = OtlpProfiles::decoded(two, vec![profile(1)]);
    let mut rb = RequestBuilder::new();
    rb.push(&labels, &a);
    rb.push(&labels, &b);
    let msg =
        collector::ExportProfilesServiceRequest::decode(rb.build().unwrap().encode().as_slice())
            .unwrap();
    let d = msg.dictionary.unwrap();
    check_dictionary_references(&d).unwrap();
    let words: Vec<String> = msg.resource_profiles[0].scope_profiles[0]
        .profiles
        .iter()
        .map(|p| {
            let attr = &d.attribute_table[p.attribute_indices[0] as usize];
            let Some(any_value::Value::ArrayValue(a)) =
                attr.value.as_ref().and_then(|v| v.value.clone())
            else {
                panic!("{attr:?}")
            };
            let Some(any_value::Value::KvlistValue(l)) = a.values[1].value.clone() else {
                panic!("{a:?}")
            };
            let Some(any_value::Value::StringValue(w)) = a.values[0].value.clone() else {
                panic!("{a:?}")
            };
            assert_eq!(l.values[0].key, w);
            w
        })
        .collect();
    assert_eq!(words, ["alpha", "beta"]);
}

#[test]
fn equal_entries_become_one_and_samples_keep_their_order() {
    // Found by the fuzz target's first oracle: a dictionary with two empty
    // stacks, a profile with a sample on each. Merged, both are stack 0;
    // the samples stay two, in order.
    let mut merge = WireMerge::new();
    merge.add_dictionary(&[]).unwrap();
    let remap = merge.add_dictionary(&[0x3a, 0x00, 0x3a, 0x00]).unwrap();
    let profile = [0x12, 0x02, 0x20, 0x01, 0x12, 0x04, 0x08, 0x01, 0x20, 0x02];
    let mut out = Vec::new();
    merge.add_profile(&profile, &remap, &mut out).unwrap();
    let p = proto::Profile::decode(out.as_slice()).unwrap();
    let stacks: Vec<(i32, Vec<i64>)> = p
        .samples
        .iter()
        .map(|s| (s.stack_index, s.values.clone()))
        .collect();
    assert_eq!(stacks, [(0, vec![1]), (0, vec![2])]);
}

#[test]
fn lengths_that_grow_past_one_byte_are_written_whole() {
    // A stack of 100 locations whose indexes all move past 127: its body
    // grows from 100 bytes to 200, its length from one byte to two.
    let mut strings = vec![String::new()];
    strings.extend((0..200).map(|i| format!("s{i}")));
    let first = proto::ProfilesDictionary {
        string_table: strings,
        ..Default::default()
    };
    let locations: Vec<proto::Location> = std::iter::once(proto::Location::default())
        .chain((1..=100).map(|i| proto::Location {
            address: i,
            ..Default::default()
        }))
        .collect();
    let second = proto::ProfilesDictionary {
        location_table: locations.clone(),
        stack_table: vec![
            proto::Stack::default(),
            proto::Stack {
                location_indices: (1..=100).collect(),
            },
        ],
        string_table: vec![String::new()],
        ..Default::default()
    };
    let mut merge = WireMerge::new();
    merge.add_dictionary(&first.encode_to_vec()).unwrap();
    // Shift the second dictionary's locations past 127 with locations of a
    // dictionary in between.
    let between = proto::ProfilesDictionary {
        location_table: std::iter::once(proto::Location::default())
            .chain((1000..1200).map(|i| proto::Location {
                address: i,
                ..Default::default()
            }))
            .collect(),
        ..Default::default()
    };
    merge.add_dictionary(&between.encode_to_vec()).unwrap();
    let remap = merge.add_dictionary(&second.encode_to_vec()).unwrap();
    let merged = proto::ProfilesDictionary::decode(merge.finish().as_slice()).unwrap();
    check_dictionary_references(&merged).unwrap();
    let stack = &merged.stack_table[remap.tables[STACK][1] as usize];
    let addresses: Vec<u64> = stack
        .location_indices
        .iter()
        .map(|&l| merged.location_table[l as usize].address)
        .collect();
    assert_eq!(addresses, (1..=100).collect::<Vec<u64>>());
    assert!(stack.location_indices.iter().all(|&l| l > 127));
}

#[test]
fn a_singular_index_given_twice_keeps_the_last_as_decoding_does() {
    let p = pprof_of(&[(&["main", "a"], 1)], None);
    let (_, raw) = both_forms(&p);
    let dict = raw.dictionary.raw().unwrap();
    let index = check_dictionary_wire(dict).unwrap();
    let mut merge = WireMerge::new();
    let remap = merge.add_dictionary(dict).unwrap();
    // A sample with stack_index 99 (out of range), then 1: decoding keeps
    // 1, and so do the checks; the first is written as 0.
    let sample = [0x08, 99, 0x08, 1, 0x20, 5];
    let profile = [&[0x12, sample.len() as u8][..], &sample].concat();
    check_profile_wire(&index, &profile).unwrap();
    let mut out = Vec::new();
    merge.add_profile(&profile, &remap, &mut out).unwrap();
    let merged = proto::ProfilesDictionary::decode(merge.finish().as_slice()).unwrap();
    let written = proto::Profile::decode(out.as_slice()).unwrap();
    check_profile(&merged, &written).unwrap();
    assert_eq!(
        written.samples[0].stack_index as u32,
        remap.tables[STACK][1]
    );
    assert_eq!(out[2..4], [0x08, 0], "{out:?}");
}
