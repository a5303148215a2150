//! The OTLP checks made on the wire (`check_dictionary_wire`,
//! `check_profile_wire`) against the same checks on decoded messages: the
//! input is a dictionary's bytes and a profile's (cut by a 2-byte length).
//! Both must agree either way, since a receiver keeps the bytes and an
//! exporter decodes them later; a profile both take converts to pprof.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_model::otlp::{self, Lost, proto};
use prost::Message;

/// The one known difference: the wire walker refuses protobuf groups
/// (wire types 3 and 4, deprecated since proto2; no OTLP sender writes
/// them), where decoding skips a group in an unknown field. Stricter, so
/// nothing is taken that decoding would refuse.
fn is_group_refusal(e: &impl ToString) -> bool {
    e.to_string().contains("groups are not supported")
}

fuzz_target!(|data: &[u8]| {
    let Some((dict_bytes, profile_bytes)) = proflow_fuzz::two_parts(data) else {
        return;
    };
    let wire = otlp::check_dictionary_wire(dict_bytes);
    let decoded = proto::ProfilesDictionary::decode(dict_bytes)
        .map_err(|e| e.to_string())
        .and_then(|d| {
            otlp::check_dictionary(&d)
                .and_then(|()| otlp::check_dictionary_references(&d))
                .map_err(|e| e.to_string())?;
            Ok(d)
        });
    let (index, dict) = match (wire, decoded) {
        (Ok(index), Ok(dict)) => (index, dict),
        (Err(_), Err(_)) => return,
        (Ok(_), Err(e)) => panic!("the wire check took a dictionary decoding refuses: {e}"),
        (Err(e), Ok(_)) if is_group_refusal(&e) => return,
        (Err(e), Ok(_)) => panic!("the wire check refused a dictionary decoding takes: {e}"),
    };
    assert_eq!(index.strings, dict.string_table, "string tables differ");
    assert_eq!(
        [
            index.mappings,
            index.locations,
            index.functions,
            index.links,
            index.attributes,
            index.stacks
        ],
        [
            dict.mapping_table.len(),
            dict.location_table.len(),
            dict.function_table.len(),
            dict.link_table.len(),
            dict.attribute_table.len(),
            dict.stack_table.len(),
        ],
        "table sizes differ"
    );

    let wire = otlp::check_profile_wire(&index, profile_bytes);
    let decoded = proto::Profile::decode(profile_bytes)
        .map_err(|e| e.to_string())
        .and_then(|p| {
            otlp::check_profile(&dict, &p).map_err(|e| e.to_string())?;
            Ok(p)
        });
    let (facts, profile) = match (wire, decoded) {
        (Ok(facts), Ok(profile)) => (facts, profile),
        (Err(_), Err(_)) => return,
        (Ok(_), Err(e)) => panic!("the wire check took a profile decoding refuses: {e}"),
        (Err(e), Ok(_)) if is_group_refusal(&e) => return,
        (Err(e), Ok(_)) => panic!("the wire check refused a profile decoding takes: {e}"),
    };
    let pair = |t: &proto::ValueType| (t.type_strindex, t.unit_strindex);
    assert_eq!(facts.sample_type, profile.sample_type.as_ref().map(pair));
    assert_eq!(facts.period_type, profile.period_type.as_ref().map(pair));
    assert_eq!(
        (facts.period, facts.time_unix_nano, facts.duration_nano),
        (
            profile.period,
            profile.time_unix_nano,
            profile.duration_nano
        )
    );
    let pprofs = otlp::otlp_to_pprof(&dict, std::slice::from_ref(&profile), &mut Lost::default())
        .expect("a checked profile does not convert to pprof");
    assert_eq!(pprofs.len(), 1);
    proflow_fuzz::check_pprof_roundtrip(&pprofs[0]);
});
