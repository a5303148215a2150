//! Kafka records as the `kafka` receiver reads them. The first byte is the
//! receiver's `encoding` setting (0 none: the header's or a sniff; 1 pprof;
//! 2 otlp_proto; 3 otlp_json); then up to the first NUL the record's
//! headers, one per line (`name=value`, or `name` for a header without a
//! value); the rest is the value. proflow's headers read back from what
//! they would be written as; a record's profiles are checked as the `otlp`
//! receiver's are, and carry the record's tenant and labels.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proflow_kafka::{Encoding, RecordHeaders};
use proflow_model::otlp::Split;
use proflow_receivers::kafka_record::fuzzing;

fuzz_target!(|data: &[u8]| {
    let Some((&setting, rest)) = data.split_first() else {
        return;
    };
    let encoding = match setting {
        1 => Some(Encoding::Pprof),
        2 => Some(Encoding::OtlpProto),
        3 => Some(Encoding::OtlpJson),
        _ => None,
    };
    let split = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    let value = rest.get(split + 1..).unwrap_or(&[]);
    let text = String::from_utf8_lossy(&rest[..split]);
    let headers: Vec<(&str, Option<&[u8]>)> = text
        .split('\n')
        .filter(|line| !line.is_empty())
        .map(|line| match line.split_once('=') {
            Some((name, value)) => (name, Some(value.as_bytes())),
            None => (line, None),
        })
        .collect();
    let Ok((read, decoded)) = fuzzing::decode(headers, value, encoding) else {
        return;
    };
    let pairs = read.to_pairs();
    let again =
        RecordHeaders::from_pairs(pairs.iter().map(|(n, v)| (n.as_str(), Some(v.as_bytes()))))
            .expect("proflow's headers as written do not read");
    assert_eq!(again, read, "headers changed through writing");
    assert_eq!(
        decoded.tenant, read.tenant,
        "the record's tenant was not kept"
    );
    let used = encoding
        .or(read.encoding)
        .unwrap_or_else(|| proflow_kafka::sniff_encoding(value));
    if used == Encoding::Pprof {
        assert_eq!(decoded.envelopes.len(), 1, "a pprof record is one profile");
        let e = &decoded.envelopes[0];
        proflow_fuzz::check_envelope(e);
        assert!(
            e.labels.get("__name__").is_some(),
            "a profile without a type"
        );
        for l in read.labels.iter() {
            if l.name != "__name__" {
                assert_eq!(
                    e.labels.get(&l.name),
                    Some(l.value.as_str()),
                    "a header label was lost"
                );
            }
        }
        return;
    }
    if decoded.envelopes.len() == 1 && !read.labels.is_empty() {
        assert_eq!(
            decoded.envelopes[0].labels, read.labels,
            "a record's labels were not kept"
        );
    }
    proflow_fuzz::check_otlp_split(&Split {
        envelopes: decoded.envelopes,
        from_1_9: decoded.from_1_9,
        rejected: decoded.rejected,
        error_message: decoded.rejected_message,
        lost_labels: decoded.lost_labels,
    });
});
