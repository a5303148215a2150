//! Dictionaries merged on the wire (`otlp::WireMerge`, the OTLP exporter's
//! batches of requests that arrived as bytes): the input is two
//! dictionaries and a profile of the second (2-byte lengths between). When
//! the receiver's wire checks take all three, the merge must too, and its
//! dictionary and the re-indexed profile pass the checks made on decoded
//! messages and mean what the profile meant with its own dictionary: every
//! index resolved (strings, mappings, functions, locations, stacks,
//! attributes with their values' references at any depth, links), sample by
//! sample.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_model::otlp::{self, common, proto};
use prost::Message;

/// A profile with every index its dictionary resolves written out: the
/// strings, mappings, functions, locations, stacks, attributes (their
/// values' references at any depth) and links it means, sample by sample in
/// order. An index past its table reads as the table's zero value, as entry
/// 0 does.
fn resolved(d: &proto::ProfilesDictionary, p: &proto::Profile) -> String {
    fn at<T: Clone + Default>(table: &[T], i: i32) -> T {
        usize::try_from(i)
            .ok()
            .and_then(|i| table.get(i))
            .cloned()
            .unwrap_or_default()
    }
    let s = |i: i32| at(&d.string_table, i);
    fn value(d: &proto::ProfilesDictionary, v: &common::AnyValue) -> String {
        use common::any_value::Value;
        let s = |i: i32| at(&d.string_table, i);
        match &v.value {
            Some(Value::StringValueStrindex(i)) => format!("s:{}", s(*i)),
            Some(Value::StringValue(x)) => format!("s:{x}"),
            Some(Value::ArrayValue(a)) => format!(
                "[{}]",
                a.values
                    .iter()
                    .map(|x| value(d, x))
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            Some(Value::KvlistValue(l)) => format!(
                "{{{}}}",
                l.values
                    .iter()
                    .map(|kv| {
                        let key = if kv.key.is_empty() && kv.key_strindex != 0 {
                            s(kv.key_strindex)
                        } else {
                            kv.key.clone()
                        };
                        format!(
                            "{key}={}",
                            kv.value.as_ref().map_or("-".into(), |x| value(d, x))
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            other => format!("{other:?}"),
        }
    }
    let attributes = |v: &[i32]| -> Vec<String> {
        v.iter()
            .map(|&i| {
                let a: proto::KeyValueAndUnit = at(&d.attribute_table, i);
                format!(
                    "{}={}[{}]",
                    s(a.key_strindex),
                    a.value.as_ref().map_or("-".into(), |x| value(d, x)),
                    s(a.unit_strindex)
                )
            })
            .collect()
    };
    let location = |i: i32| {
        let l: proto::Location = at(&d.location_table, i);
        let m: proto::Mapping = at(&d.mapping_table, l.mapping_index);
        let lines: Vec<String> = l
            .lines
            .iter()
            .map(|line| {
                let f: proto::Function = at(&d.function_table, line.function_index);
                format!(
                    "{}/{}/{}:{} @{}:{}",
                    s(f.name_strindex),
                    s(f.system_name_strindex),
                    s(f.filename_strindex),
                    f.start_line,
                    line.line,
                    line.column
                )
            })
            .collect();
        format!(
            "{:x} in ({:x}-{:x}+{:x} {} {:?}) {lines:?} {:?}",
            l.address,
            m.memory_start,
            m.memory_limit,
            m.file_offset,
            s(m.filename_strindex),
            attributes(&m.attribute_indices),
            attributes(&l.attribute_indices)
        )
    };
    let value_type = |t: &Option<proto::ValueType>| {
        t.as_ref()
            .map(|t| format!("{}/{}", s(t.type_strindex), s(t.unit_strindex)))
    };
    let samples: Vec<String> = p
        .samples
        .iter()
        .map(|x| {
            let stack: proto::Stack = at(&d.stack_table, x.stack_index);
            let link: proto::Link = at(&d.link_table, x.link_index);
            format!(
                "{:?} {:?} {:?}/{:?} {:?} {:?}",
                stack
                    .location_indices
                    .iter()
                    .map(|&l| location(l))
                    .collect::<Vec<_>>(),
                attributes(&x.attribute_indices),
                link.trace_id,
                link.span_id,
                x.values,
                x.timestamps_unix_nano
            )
        })
        .collect();
    format!(
        "{:?} {:?} {samples:#?} {} {} {} {:?} {} {} {:?} {:?}",
        value_type(&p.sample_type),
        value_type(&p.period_type),
        p.time_unix_nano,
        p.duration_nano,
        p.period,
        p.profile_id,
        p.dropped_attributes_count,
        p.original_payload_format,
        p.original_payload,
        attributes(&p.attribute_indices)
    )
}

fuzz_target!(|data: &[u8]| {
    let Some((first, rest)) = proflow_fuzz::two_parts(data) else {
        return;
    };
    let Some((second, profile)) = proflow_fuzz::two_parts(rest) else {
        return;
    };
    let (Ok(_), Ok(index)) = (
        otlp::check_dictionary_wire(first),
        otlp::check_dictionary_wire(second),
    ) else {
        return;
    };
    if otlp::check_profile_wire(&index, profile).is_err() {
        return;
    }
    let mut merge = otlp::WireMerge::new();
    for d in [first, second] {
        merge
            .add_dictionary(d)
            .expect("a checked dictionary is merged");
    }
    let remap = merge
        .add_dictionary(second)
        .expect("the same dictionary again");
    let mut rewritten = Vec::new();
    merge
        .add_profile(profile, &remap, &mut rewritten)
        .expect("a checked profile is re-indexed");
    let merged = proto::ProfilesDictionary::decode(merge.finish().as_slice())
        .expect("the merged dictionary decodes");
    otlp::check_dictionary(&merged).expect("the merged dictionary passes the checks");
    otlp::check_dictionary_references(&merged).expect("its references are in range");
    let rewritten = proto::Profile::decode(rewritten.as_slice()).expect("the profile decodes");
    otlp::check_profile(&merged, &rewritten).expect("the re-indexed profile passes the checks");
    let (Ok(own), Ok(original)) = (
        proto::ProfilesDictionary::decode(second),
        proto::Profile::decode(profile),
    ) else {
        // The wire checks refuse groups that decoding skips; never the reverse.
        return;
    };
    assert_eq!(resolved(&merged, &rewritten), resolved(&own, &original));
});
