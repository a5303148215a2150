//! Dictionaries merged on the wire (`otlp::WireMerge`, the OTLP exporter's
//! batches of requests that arrived as bytes): the input is two
//! dictionaries and a profile of the second (2-byte lengths between). When
//! the receiver's wire checks take all three, the merge must too, and its
//! dictionary and the re-indexed profile pass the checks made on decoded
//! messages and convert to the same pprof samples (stacks, values, labels)
//! as the profile with its own dictionary.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_pipeline::otlp::{self, Lost, proto};
use proflow_pipeline::pprof;
use prost::Message;

type Rows = Vec<(Vec<String>, Vec<i64>, Vec<(String, String, i64)>)>;

/// The samples of the one pprof profile `profile` converts to, sorted.
fn rows(dict: &proto::ProfilesDictionary, profile: &proto::Profile) -> Rows {
    let pprofs = otlp::otlp_to_pprof(dict, std::slice::from_ref(profile), &mut Lost::default())
        .expect("a checked profile converts to pprof");
    let mut rows: Rows = pprofs
        .iter()
        .flat_map(|p| {
            pprof::stacks_root_first(p).map(move |(frames, s)| {
                let labels = s
                    .label
                    .iter()
                    .map(|l| {
                        (
                            p.string(l.key).to_owned(),
                            p.string(l.str).to_owned(),
                            l.num,
                        )
                    })
                    .collect();
                (
                    frames.iter().map(|f| f.to_string()).collect(),
                    s.value.clone(),
                    labels,
                )
            })
        })
        .collect();
    rows.sort();
    rows
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
        if let Err(e) = merge.add_dictionary(d) {
            // Attribute values nested past the merge's limit: refused, as
            // prost refuses deeper ones.
            assert!(e.to_string().contains("nested deeper"), "{e}");
            return;
        }
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
    assert_eq!(rows(&merged, &rewritten), rows(&own, &original));
});
