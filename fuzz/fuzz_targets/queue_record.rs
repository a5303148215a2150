//! Records of a persistent exporter queue as a restart reads them from
//! disk (they passed their checksum, but are still input): the quick count
//! agrees with the full decode, and what decodes is written again to bytes
//! that decode to the same profiles (labels, times, types, pprof bytes).
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use proflow_core::queue::storage::record;
use proflow_model::model::Format;

fuzz_target!(|data: &[u8]| {
    let counted = record::profiles(data);
    let Ok((envelopes, meta)) = record::decode(&Bytes::copy_from_slice(data)) else {
        return;
    };
    assert_eq!(counted, Ok(envelopes.len()), "the quick count disagrees");
    envelopes.iter().for_each(proflow_fuzz::check_envelope);
    let Ok(written) = record::encode(&envelopes, &meta) else {
        // Only a profile that arrived as OTLP and no longer makes a request
        // may fail to be written; those were checked when stored.
        return;
    };
    let (again, meta_again) =
        record::decode(&Bytes::from(written)).expect("a record written does not decode");
    assert_eq!(*meta_again, *meta, "the batch meta changed");
    assert_eq!(again.len(), envelopes.len());
    for (a, b) in again.iter().zip(&envelopes) {
        assert_eq!(a.labels, b.labels);
        assert_eq!(
            (a.start_unix_nanos, a.end_unix_nanos),
            (b.start_unix_nanos, b.end_unix_nanos)
        );
        assert_eq!(a.sample_types, b.sample_types);
        assert_eq!(a.period_type, b.period_type);
        assert_eq!(a.period, b.period);
        assert_eq!(a.payload.decode_limit(), b.payload.decode_limit());
        assert_eq!(
            a.payload.arrived_as(),
            b.payload.arrived_as(),
            "the payload changed form"
        );
        if b.payload.has(Format::Pprof) {
            let (x, y) = (a.payload.encoded(), b.payload.encoded());
            let (x, y) = (x.expect("stored pprof lost"), y.expect("stored pprof lost"));
            assert_eq!(
                (x.bytes, x.gzipped),
                (y.bytes, y.gzipped),
                "pprof bytes changed"
            );
        }
    }
    // Written again, it reads the same once more (an OTLP profile's
    // attributes may be reordered on the way, but nothing else changes).
    let twice = record::encode(&again, &meta_again).expect("a record read back cannot be written");
    let (third, _) =
        record::decode(&Bytes::from(twice)).expect("a record written twice does not decode");
    assert_eq!(
        third.iter().map(|e| &e.labels).collect::<Vec<_>>(),
        again.iter().map(|e| &e.labels).collect::<Vec<_>>()
    );
});
