use std::collections::BTreeMap;

use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::pprof;

/// A label in a model: text, or a number with a unit.
#[derive(Debug, Clone)]
enum ModelLabel {
    Text(String),
    Num(i64, &'static str),
}

/// mapping (0 = none, else 1-based), address, lines (function, line).
type ModelLocation = (usize, u64, Vec<(usize, i64)>);
/// locations, values (one per sample type), labels.
type ModelSample = (Vec<usize>, Vec<i64>, Vec<(String, ModelLabel)>);

/// A random pprof profile, described by value (ids are assigned when built).
#[derive(Debug, Clone)]
struct Model {
    types: Vec<(String, String)>,
    functions: Vec<(String, String, i64)>,
    /// filename, build id ("" = none), start address.
    mappings: Vec<(String, String, u64)>,
    locations: Vec<ModelLocation>,
    samples: Vec<ModelSample>,
}

fn model() -> impl Strategy<Value = Model> {
    let label = prop_oneof![
        "[a-z]{1,3}".prop_map(ModelLabel::Text),
        (0i64..100, prop_oneof![Just(""), Just("bytes")]).prop_map(|(n, u)| ModelLabel::Num(n, u)),
    ];
    (
        prop::collection::vec(("[a-z]{1,6}", "[a-z]{1,6}"), 1..=3),
        prop::collection::vec(("[a-z]{1,6}", "[a-z]{0,4}", 0i64..100), 1..6),
        prop::collection::vec(("[a-z]{1,5}", "[0-9a-f]{0,8}", 0u64..1000), 0..3),
        prop::collection::vec(
            (
                any::<usize>(),
                any::<u64>(),
                prop::collection::vec((any::<usize>(), 0i64..500), 1..3),
            ),
            1..8,
        ),
        prop::collection::vec(
            (
                prop::collection::vec(any::<usize>(), 1..5),
                prop::collection::vec(-1000i64..1000, 3),
                prop::collection::vec(("[a-z]{1,3}", label), 0..3),
            ),
            0..12,
        ),
    )
        .prop_map(|(types, functions, mappings, locations, samples)| {
            let locations = locations
                .into_iter()
                .map(|(m, addr, lines)| {
                    let mapping = m % (mappings.len() + 1);
                    let lines = lines
                        .into_iter()
                        .map(|(f, line)| (f % functions.len(), line))
                        .collect();
                    (mapping, addr, lines)
                })
                .collect::<Vec<_>>();
            let samples = samples
                .into_iter()
                .map(|(locs, values, labels)| {
                    let locs = locs.into_iter().map(|l| l % locations.len()).collect();
                    (locs, values[..types.len()].to_vec(), labels)
                })
                .collect();
            Model {
                types,
                functions,
                mappings,
                locations,
                samples,
            }
        })
}

fn build(m: &Model) -> pprof::Profile {
    let mut strings: Vec<String> = vec![String::new()];
    let mut s = |text: &str| -> i64 {
        match strings.iter().position(|x| x == text) {
            Some(i) => i as i64,
            None => {
                strings.push(text.to_owned());
                strings.len() as i64 - 1
            }
        }
    };
    let mut p = pprof::Profile {
        sample_type: m
            .types
            .iter()
            .map(|(t, u)| pprof::ValueType {
                r#type: s(t),
                unit: s(u),
            })
            .collect(),
        time_nanos: 1_700_000_000_000_000_000,
        duration_nanos: 10_000_000_000,
        period_type: Some(pprof::ValueType {
            r#type: s("cpu"),
            unit: s("nanoseconds"),
        }),
        period: 10_000_000,
        ..pprof::Profile::default()
    };
    for (i, (name, file, start)) in m.functions.iter().enumerate() {
        p.function.push(pprof::Function {
            id: i as u64 + 1,
            name: s(name),
            system_name: s(&format!("sys.{name}")),
            filename: s(&format!("{file}.go")),
            start_line: *start,
        });
    }
    for (i, (file, build_id, start)) in m.mappings.iter().enumerate() {
        p.mapping.push(pprof::Mapping {
            id: i as u64 + 1,
            memory_start: *start,
            memory_limit: start + 4096,
            file_offset: 0,
            filename: s(&format!("/bin/{file}")),
            build_id: if build_id.is_empty() { 0 } else { s(build_id) },
            ..pprof::Mapping::default()
        });
    }
    for (i, (mapping, address, lines)) in m.locations.iter().enumerate() {
        p.location.push(pprof::Location {
            id: i as u64 + 1,
            mapping_id: *mapping as u64,
            address: *address,
            line: lines
                .iter()
                .map(|(f, line)| pprof::Line {
                    function_id: *f as u64 + 1,
                    line: *line,
                    column: 0,
                })
                .collect(),
            is_folded: false,
        });
    }
    for (locs, values, labels) in &m.samples {
        p.sample.push(pprof::Sample {
            location_id: locs.iter().map(|l| *l as u64 + 1).collect(),
            value: values.clone(),
            label: labels
                .iter()
                .map(|(k, v)| match v {
                    ModelLabel::Text(t) => pprof::Label {
                        key: s(k),
                        str: s(t),
                        ..pprof::Label::default()
                    },
                    ModelLabel::Num(n, unit) => pprof::Label {
                        key: s(k),
                        num: *n,
                        num_unit: s(unit),
                        ..pprof::Label::default()
                    },
                })
                .collect(),
        });
    }
    p.string_table = strings;
    p
}

/// What must survive a round trip, independent of ids and table order: per
/// sample type, the total of every distinct (stack, labels), each frame by
/// its mapping, address and lines (function name, system name, file, start
/// line, line, column).
type Signature = BTreeMap<(String, String), BTreeMap<(Vec<String>, Vec<String>), i64>>;

fn signature(p: &pprof::Profile) -> Signature {
    let s = |i: i64| p.string_table[i as usize].clone();
    let frame = |id: u64| {
        let l = p.location.iter().find(|l| l.id == id).unwrap();
        let mapping = p
            .mapping
            .iter()
            .find(|m| m.id == l.mapping_id)
            .map(|m| {
                format!(
                    "{}@{:x}-{:x}+{:x} [{}]",
                    s(m.filename),
                    m.memory_start,
                    m.memory_limit,
                    m.file_offset,
                    s(m.build_id)
                )
            })
            .unwrap_or_default();
        let lines: Vec<String> = l
            .line
            .iter()
            .map(|line| {
                let f = p
                    .function
                    .iter()
                    .find(|f| f.id == line.function_id)
                    .unwrap();
                format!(
                    "{}|{}|{}|{}:{}:{}",
                    s(f.name),
                    s(f.system_name),
                    s(f.filename),
                    f.start_line,
                    line.line,
                    line.column
                )
            })
            .collect();
        format!("{mapping} {:x} {}", l.address, lines.join(";"))
    };
    let mut out = Signature::new();
    for (t, st) in p.sample_type.iter().enumerate() {
        let totals = out.entry((s(st.r#type), s(st.unit))).or_default();
        for sample in &p.sample {
            let stack = sample.location_id.iter().map(|&id| frame(id)).collect();
            let mut labels: Vec<String> = sample
                .label
                .iter()
                .map(|l| {
                    if l.str != 0 {
                        format!("{}={}", s(l.key), s(l.str))
                    } else {
                        format!("{}={}{}", s(l.key), l.num, s(l.num_unit))
                    }
                })
                .collect();
            labels.sort();
            *totals.entry((stack, labels)).or_default() += sample.value[t];
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn pprof_survives_otlp_and_back(m in model()) {
        let original = build(&m);
        let mut dict = DictionaryBuilder::new();
        let mut lost = Lost::default();
        let profiles = pprof_to_otlp(&original, &mut dict, &mut lost).unwrap();
        prop_assert_eq!(profiles.len(), original.sample_type.len(), "one OTLP profile per sample type");
        let dict = dict.finish();
        // It also survives the wire.
        let request = collector::ExportProfilesServiceRequest {
            resource_profiles: vec![proto::ResourceProfiles {
                scope_profiles: vec![proto::ScopeProfiles { profiles, ..Default::default() }],
                ..Default::default()
            }],
            dictionary: Some(dict),
        };
        let request = collector::ExportProfilesServiceRequest::decode(request.encode_to_vec().as_slice()).unwrap();
        let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
        // The checks on the bytes pass what the decoded checks pass.
        let dict_bytes = request.dictionary.as_ref().unwrap().encode_to_vec();
        let index = crate::otlp::check_dictionary_wire(&dict_bytes).unwrap();
        for p in profiles {
            prop_assert!(crate::otlp::check_profile_wire(&index, &p.encode_to_vec()).is_ok());
        }
        let back = otlp_to_pprof(request.dictionary.as_ref().unwrap(), profiles, &mut lost).unwrap();
        prop_assert!(lost.is_empty(), "nothing of a plain profile is lost: {:?}", lost);
        prop_assert_eq!(back.len(), 1, "sample types of one window merge back into one profile");
        let back = &back[0];
        prop_assert_eq!(signature(back), signature(&original));
        let s = |p: &pprof::Profile, i: i64| p.string_table[i as usize].clone();
        let types = |p: &pprof::Profile| p.sample_type.iter().map(|t| (s(p, t.r#type), s(p, t.unit))).collect::<Vec<_>>();
        prop_assert_eq!(types(back), types(&original));
        prop_assert_eq!((back.time_nanos, back.duration_nanos, back.period), (original.time_nanos, original.duration_nanos, original.period));
        // And pprof itself still reads it.
        let bytes = pprof::encode(back);
        prop_assert!(pprof::decode(&bytes, 64 << 20).is_ok());
    }
}

fn one_profile(
    dict: &proto::ProfilesDictionary,
    samples: Vec<proto::Sample>,
) -> Result<Vec<pprof::Profile>, ConvertError> {
    one_profile_losing(dict, samples, &mut Lost::default())
}

/// [`one_profile`], counting what the conversion loses in `lost`.
fn one_profile_losing(
    dict: &proto::ProfilesDictionary,
    samples: Vec<proto::Sample>,
    lost: &mut Lost,
) -> Result<Vec<pprof::Profile>, ConvertError> {
    let p = proto::Profile {
        sample_type: Some(proto::ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        samples,
        ..Default::default()
    };
    otlp_to_pprof(dict, &[p], lost)
}

fn small_dictionary() -> proto::ProfilesDictionary {
    let mut d = DictionaryBuilder::new();
    d.string("samples");
    d.string("count");
    let main = d.string("main");
    let f = d.function(proto::Function {
        name_strindex: main,
        ..Default::default()
    });
    let l = d.location(proto::Location {
        lines: vec![proto::Line {
            function_index: f,
            line: 3,
            column: 0,
        }],
        ..Default::default()
    });
    d.stack(vec![l]);
    d.link(vec![0xab; 16], vec![0xcd; 8]);
    d.finish()
}

#[test]
fn a_sample_from_an_older_sender_is_refused_naming_the_version() {
    // Proto 1.9 numbered Sample's values 2, which 1.10 reads as
    // attribute_indices: stack 1, "values" [5] decode as attribute 5, no values.
    let sample = proto::Sample::decode(&[0x08, 0x01, 0x12, 0x01, 0x05][..]).unwrap();
    assert!(sample.values.is_empty() && sample.attribute_indices == vec![5]);
    let err = one_profile(&small_dictionary(), vec![sample]).unwrap_err();
    assert!(
        err.0.contains("neither values nor timestamps") && err.0.contains("1.10"),
        "{err}"
    );
}

#[test]
fn indexes_out_of_range_are_refused() {
    let dict = small_dictionary();
    for (sample, what) in [
        (
            proto::Sample {
                stack_index: 9,
                values: vec![1],
                ..Default::default()
            },
            "stack index 9",
        ),
        (
            proto::Sample {
                stack_index: 1,
                attribute_indices: vec![7],
                values: vec![1],
                ..Default::default()
            },
            "attribute index 7",
        ),
        (
            proto::Sample {
                stack_index: 1,
                link_index: -1,
                values: vec![1],
                ..Default::default()
            },
            "link index -1",
        ),
    ] {
        let err = one_profile(&dict, vec![sample]).unwrap_err();
        assert!(
            err.0.contains(what) && err.0.contains("out of range"),
            "{what}: {err}"
        );
    }
    let mut bad = small_dictionary();
    bad.string_table[0] = "x".into();
    let err = one_profile(&bad, vec![]).unwrap_err();
    assert!(err.0.contains("string_table"), "{err}");
    // An empty value in entry 0 (how the collector writes it) is the zero value.
    let mut empty_value = small_dictionary();
    empty_value.attribute_table[0].value = Some(common::AnyValue { value: None });
    assert!(one_profile(&empty_value, vec![]).is_ok());
    empty_value.attribute_table[0].key_strindex = 1;
    assert!(
        one_profile(&empty_value, vec![])
            .unwrap_err()
            .0
            .contains("attribute_table")
    );
}

#[test]
fn timestamps_count_links_become_labels_and_samples_merge() {
    let dict = small_dictionary();
    let samples = vec![
        proto::Sample {
            stack_index: 1,
            timestamps_unix_nano: vec![1, 2, 3],
            ..Default::default()
        },
        proto::Sample {
            stack_index: 1,
            values: vec![4, 5],
            timestamps_unix_nano: vec![7, 8],
            ..Default::default()
        },
        proto::Sample {
            stack_index: 1,
            link_index: 1,
            values: vec![2],
            ..Default::default()
        },
    ];
    let out = one_profile(&dict, samples).unwrap();
    let p = &out[0];
    assert_eq!(p.sample.len(), 2, "same stack, attributes and link add up");
    assert_eq!(p.sample[0].value, vec![3 + 9]);
    let s = |i: i64| p.string_table[i as usize].as_str();
    let labels: Vec<(&str, &str)> = p.sample[1]
        .label
        .iter()
        .map(|l| (s(l.key), s(l.str)))
        .collect();
    assert_eq!(
        labels,
        vec![
            ("trace_id", "abababababababababababababababab"),
            ("span_id", "cdcdcdcdcdcdcdcd")
        ]
    );
    let err = one_profile(
        &dict,
        vec![proto::Sample {
            stack_index: 1,
            values: vec![1, 2],
            timestamps_unix_nano: vec![1],
            ..Default::default()
        }],
    )
    .unwrap_err();
    assert!(err.0.contains("2 values but 1 timestamps"), "{err}");

    // And back: those labels become the sample's link again, not attributes;
    // labels that are not valid ids stay attributes.
    let mut p = out.into_iter().next().unwrap();
    let mut odd = p.sample[1].clone();
    let key = p.sample[1].label[1].key;
    p.string_table.push("not-a-span".into());
    odd.label[1] = pprof::Label {
        key,
        str: p.string_table.len() as i64 - 1,
        ..Default::default()
    };
    p.sample.push(odd);
    let mut b = DictionaryBuilder::new();
    let profiles = pprof_to_otlp(&p, &mut b, &mut Lost::default()).unwrap();
    let d = b.finish();
    let samples = &profiles[0].samples;
    let link = &d.link_table[samples[1].link_index as usize];
    assert_eq!(
        (link.trace_id.as_slice(), link.span_id.as_slice()),
        (&[0xab; 16][..], &[0xcd; 8][..])
    );
    assert!(samples[1].attribute_indices.is_empty());
    assert_eq!(samples[2].link_index, 0);
    assert_eq!(samples[2].attribute_indices.len(), 2);
}

#[test]
fn profiles_of_different_windows_stay_apart_and_what_pprof_cannot_hold_is_counted() {
    let dict = small_dictionary();
    let sample = proto::Sample {
        stack_index: 1,
        values: vec![1],
        ..Default::default()
    };
    let at = |t: u64| proto::Profile {
        sample_type: Some(proto::ValueType {
            type_strindex: 1,
            unit_strindex: 2,
        }),
        samples: vec![sample.clone()],
        time_unix_nano: t,
        attribute_indices: vec![0],
        ..Default::default()
    };
    let mut lost = Lost::default();
    let out = otlp_to_pprof(&dict, &[at(1), at(2), at(1)], &mut lost).unwrap();
    assert_eq!(out.len(), 2);
    assert_eq!(out[0].sample_type.len(), 2, "the two profiles at t=1 merge");
    assert_eq!(out[0].sample[0].value, vec![1, 1]);
    assert_eq!(lost.counts.get("profile attributes"), Some(&3));

    let mut p = build(&Model {
        types: vec![("cpu".into(), "nanoseconds".into())],
        functions: vec![("f".into(), "a".into(), 1)],
        mappings: vec![],
        locations: vec![(0, 1, vec![(0, 1)])],
        samples: vec![(vec![0], vec![1], vec![])],
    });
    p.comment = vec![1];
    p.drop_frames = 1;
    let mut lost = Lost::default();
    pprof_to_otlp(&p, &mut DictionaryBuilder::new(), &mut lost).unwrap();
    assert_eq!(lost.counts.get("comments"), Some(&1));
    assert_eq!(lost.counts.get("drop_frames"), Some(&1));
}

#[test]
fn the_dictionary_holds_each_entry_once_with_zero_values_first() {
    let m = Model {
        types: vec![
            ("alloc".into(), "bytes".into()),
            ("inuse".into(), "bytes".into()),
        ],
        functions: vec![("f".into(), "a".into(), 1), ("g".into(), "a".into(), 2)],
        mappings: vec![("app".into(), "abcd".into(), 0)],
        locations: vec![(1, 16, vec![(0, 1)]), (1, 32, vec![(1, 2), (0, 9)])],
        samples: vec![
            (vec![0, 1], vec![1, 2], vec![]),
            (vec![0, 1], vec![3, 4], vec![]),
        ],
    };
    let mut dict = DictionaryBuilder::new();
    let profiles = pprof_to_otlp(&build(&m), &mut dict, &mut Lost::default()).unwrap();
    let d = dict.finish();
    assert_eq!(d.string_table[0], "");
    assert_eq!(d.function_table.len(), 3, "zero entry + f + g");
    assert_eq!(
        d.stack_table.len(),
        2,
        "zero entry + the one stack both samples share"
    );
    assert_eq!(d.mapping_table.len(), 2);
    let build_id = &d.attribute_table[d.mapping_table[1].attribute_indices[0] as usize];
    assert_eq!(d.string_table[build_id.key_strindex as usize], BUILD_ID_KEY);
    assert_eq!(profiles[1].samples[1].values, vec![4]);
    assert_eq!(
        d.stack_table[1].location_indices.len(),
        2,
        "leaf first, as in pprof"
    );
}

/// Found by the `otlp_wire` fuzz target: the checks take a table a sender
/// left empty as holding just its zero entry 0, so a profile that passed
/// them must convert; an empty dictionary and profile made conversion fail
/// on string 0.
#[test]
fn empty_tables_hold_their_zero_entry_when_converting() {
    let d = proto::ProfilesDictionary::default();
    let empty = proto::Profile::default();
    check_dictionary(&d).unwrap();
    check_dictionary_references(&d).unwrap();
    check_profile(&d, &empty).unwrap();
    let out = otlp_to_pprof(&d, &[empty], &mut Lost::default()).unwrap();
    assert_eq!(out.len(), 1);
    assert!(out[0].sample.is_empty());
    // Stack 0 and attribute 0 of empty tables: a sample with no frames and no label.
    let p = proto::Profile {
        samples: vec![proto::Sample {
            values: vec![5],
            attribute_indices: vec![0],
            ..Default::default()
        }],
        ..Default::default()
    };
    check_profile(&d, &p).unwrap();
    let out = otlp_to_pprof(&d, &[p], &mut Lost::default()).unwrap();
    assert_eq!(out[0].sample.len(), 1);
    assert_eq!(out[0].sample[0].value, [5]);
    assert!(out[0].sample[0].location_id.is_empty());
    assert!(out[0].sample[0].label.is_empty());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    #[test]
    fn otlp_json_round_trips_exactly(m in model(), link in any::<bool>(), trace in any::<[u8; 16]>()) {
        let mut dict = DictionaryBuilder::new();
        let mut profiles = pprof_to_otlp(&build(&m), &mut dict, &mut Lost::default()).unwrap();
        if link && !profiles.is_empty() && !profiles[0].samples.is_empty() {
            profiles[0].samples[0].link_index = dict.link(trace.to_vec(), trace[..8].to_vec());
            profiles[0].profile_id = trace.to_vec();
        }
        let request = collector::ExportProfilesServiceRequest {
            resource_profiles: vec![proto::ResourceProfiles {
                resource: Some(opentelemetry_proto::tonic::resource::v1::Resource {
                    attributes: vec![common::KeyValue {
                        key: "service.name".into(),
                        value: Some(common::AnyValue { value: Some(common::any_value::Value::StringValue("svc".into())) }),
                        key_strindex: 0,
                    }],
                    ..Default::default()
                }),
                scope_profiles: vec![proto::ScopeProfiles { profiles, ..Default::default() }],
                ..Default::default()
            }],
            dictionary: Some(dict.finish()),
        };
        let text = json::encode_request(&request);
        prop_assert_eq!(json::decode_request(&text).unwrap(), request);
    }
}

#[test]
fn otlp_json_follows_the_otlp_mapping() {
    let mut dict = DictionaryBuilder::new();
    let link = dict.link(vec![0xab; 16], vec![0x01; 8]);
    let profile = proto::Profile {
        samples: vec![proto::Sample {
            stack_index: 1,
            link_index: link,
            values: vec![-5, 1 << 40],
            ..Default::default()
        }],
        time_unix_nano: 1_700_000_000_000_000_000,
        ..Default::default()
    };
    let request = collector::ExportProfilesServiceRequest {
        resource_profiles: vec![proto::ResourceProfiles {
            scope_profiles: vec![proto::ScopeProfiles {
                profiles: vec![profile],
                ..Default::default()
            }],
            ..Default::default()
        }],
        dictionary: Some(dict.finish()),
    };
    let text = String::from_utf8(json::encode_request(&request)).unwrap();
    for expected in [
        r#""values":["-5","1099511627776"]"#,
        r#""timeUnixNano":"1700000000000000000""#,
        r#""traceId":"abababababababababababababababab""#,
        r#""spanId":"0101010101010101""#,
        r#""mappingTable":[{}]"#,
    ] {
        assert!(text.contains(expected), "{expected} in {text}");
    }
    assert!(
        !text.contains("durationNano"),
        "zero values are omitted: {text}"
    );
    // Numbers, snake_case names and nulls are read too; unknown fields ignored.
    let other = br#"{"resource_profiles":[{"scopeProfiles":[{"profiles":[{"samples":[{"stackIndex":1,"values":[3, "4"]}],"time_unix_nano":12,"period":null,"futureField":1}]}]}],"dictionary":{"stringTable":[""]}}"#;
    let r = json::decode_request(other).unwrap();
    let p = &r.resource_profiles[0].scope_profiles[0].profiles[0];
    assert_eq!(
        (p.samples[0].values.clone(), p.time_unix_nano),
        (vec![3, 4], 12)
    );
    let err = json::decode_request(br#"{"resourceProfiles":[{"scopeProfiles":[{"profiles":[{"samples":[{"values":["x"]}]}]}]}]}"#).unwrap_err();
    assert!(
        err.to_string()
            .contains("resourceProfiles[0].scopeProfiles[0].profiles[0].samples[0].values[0]"),
        "{err}"
    );
}

#[test]
fn the_times_of_samples_are_counted_as_lost_in_pprof() {
    let samples = vec![
        proto::Sample {
            stack_index: 1,
            timestamps_unix_nano: vec![1, 2, 3],
            ..Default::default()
        },
        proto::Sample {
            stack_index: 1,
            values: vec![4],
            ..Default::default()
        },
    ];
    let mut lost = Lost::default();
    let out = one_profile_losing(&small_dictionary(), samples, &mut lost).unwrap();
    assert_eq!(out[0].sample[0].value, vec![3 + 4]);
    assert_eq!(lost.counts.get("sample timestamps"), Some(&3));
}
