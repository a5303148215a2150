//! pprof bytes, decoded, through the conversion to OTLP (what an OTLP or
//! Kafka exporter sends of a pprof profile) and back: the OTLP it makes
//! passes the receiver's own checks, and converts back to one pprof
//! profile with the same sample types.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use proflow_fuzz::{LIMIT, check_pprof_roundtrip};
use proflow_model::otlp::{self, DictionaryBuilder, Lost};
use proflow_model::pprof;

fuzz_target!(|data: &[u8]| {
    let Ok(p) = pprof::decode(&Bytes::copy_from_slice(data), LIMIT) else {
        return;
    };
    let mut dict = DictionaryBuilder::new();
    let mut lost = Lost::default();
    let Ok(profiles) = otlp::pprof_to_otlp(&p, &mut dict, &mut lost) else {
        return;
    };
    assert_eq!(
        profiles.len(),
        p.sample_type.len(),
        "one OTLP profile per sample type"
    );
    let dict = dict.finish();
    otlp::check_dictionary(&dict).expect("the dictionary made from pprof is invalid");
    otlp::check_dictionary_references(&dict)
        .expect("the dictionary made from pprof refers out of range");
    for profile in &profiles {
        otlp::check_profile(&dict, profile).expect("a profile made from pprof is invalid");
    }
    if profiles.is_empty() {
        return;
    }
    let back = otlp::otlp_to_pprof(&dict, &profiles, &mut lost)
        .expect("OTLP made from one pprof profile does not convert back");
    assert_eq!(
        back.len(),
        1,
        "one pprof profile's OTLP made {} profiles",
        back.len()
    );
    let back = &back[0];
    let types = |q: &pprof::Profile| -> Vec<(String, String)> {
        q.sample_type
            .iter()
            .map(|t| (q.string(t.r#type).to_owned(), q.string(t.unit).to_owned()))
            .collect()
    };
    assert_eq!(types(back), types(&p), "sample types changed on the way");
    assert!(
        back.sample.len() <= p.sample.len(),
        "samples were added on the way"
    );
    check_pprof_roundtrip(back);
});
