//! What the fuzz targets share: splitting one input into parts, and the
//! checks every decoded thing must pass whatever the input was.

use bytes::Bytes;
use proflow_model::model::{Envelope, Labels};
use proflow_model::otlp;
use proflow_model::pprof::{self, Profile};

/// Most bytes a gzip input may inflate to in the targets (the limit every
/// decoder is given here, as a receiver's `max_decompressed_size`).
pub const LIMIT: usize = 1 << 20;

/// `data` cut in two: the first two bytes (little-endian) say how long the
/// first part is (cut short at the end of `data`), the rest is the second.
pub fn two_parts(data: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = data.split_first_chunk::<2>()?;
    let n = usize::from(u16::from_le_bytes(*len)).min(rest.len());
    Some(rest.split_at(n))
}

/// The input [`two_parts`] cuts into `first` and `second`.
pub fn join_parts(first: &[u8], second: &[u8]) -> Vec<u8> {
    let len = u16::try_from(first.len()).unwrap_or(u16::MAX);
    let mut out = len.to_le_bytes().to_vec();
    out.extend_from_slice(first);
    out.extend_from_slice(second);
    out
}

/// Labels are sorted by name, each name once: every constructor keeps that.
pub fn check_labels(labels: &Labels) {
    let names: Vec<&str> = labels.iter().map(|l| l.name.as_str()).collect();
    assert!(
        names.windows(2).all(|w| w[0] < w[1]),
        "labels not sorted or not unique: {names:?}"
    );
}

/// What every envelope a decoder made must be: labels as [`Labels`] keeps
/// them, and its value types named.
pub fn check_envelope(e: &Envelope) {
    check_labels(&e.labels);
    assert!(
        e.sample_types.len() <= pprof::MAX_SAMPLE_TYPES,
        "more sample types than a profile may have"
    );
}

/// A pprof profile encodes, and its bytes decode back to it.
pub fn check_pprof_roundtrip(p: &Profile) {
    let bytes = pprof::encode(p);
    let limit = bytes.len().max(1);
    match pprof::decode(&bytes, limit) {
        Ok(back) => assert!(back == *p, "a profile did not decode back to itself"),
        // The decoded-size estimate may refuse a shape decoding would take;
        // only a protobuf error would be a broken encoder.
        Err(pprof::DecodeError::Protobuf(e)) => panic!("an encoded profile does not decode: {e}"),
        Err(_) => {}
    }
}

/// The heap a decoded pprof profile holds: every `Vec`'s and string's
/// capacity (what [`pprof::Metadata::decoded_size`] bounds).
pub fn pprof_heap(p: &Profile) -> usize {
    // The capacity is the point, so a `&Vec`, not a slice.
    #[allow(clippy::ptr_arg)]
    fn cap<T>(v: &Vec<T>) -> usize {
        v.capacity() * size_of::<T>()
    }
    let mut heap = cap(&p.sample_type)
        + cap(&p.sample)
        + cap(&p.mapping)
        + cap(&p.location)
        + cap(&p.function)
        + cap(&p.string_table)
        + cap(&p.comment);
    for s in &p.sample {
        heap += cap(&s.location_id) + cap(&s.value) + cap(&s.label);
    }
    for l in &p.location {
        heap += cap(&l.line);
    }
    for s in &p.string_table {
        heap += s.capacity();
    }
    heap
}

/// What the envelopes of an OTLP request must be once the receiver took
/// them: each holds one profile that decodes, converts to pprof (what every
/// pprof exporter does with it) and is written again as a request (what the
/// OTLP and Kafka exporters do) that the receiver takes back whole.
pub fn check_otlp_split(split: &otlp::Split) {
    assert_eq!(
        split.rejected == 0,
        split.error_message.is_empty(),
        "a refusal without its reason, or a reason without a refusal"
    );
    for e in &split.envelopes {
        check_envelope(e);
        let form = e.payload.otlp().expect("an OTLP envelope has no OTLP form");
        assert_eq!(
            form.profiles.len(),
            1,
            "an envelope of a request holds one profile"
        );
        form.dictionary
            .decoded()
            .expect("a checked dictionary does not decode");
        otlp::decode_all(&form.profiles).expect("a checked profile does not decode");
        let encoded = e
            .payload
            .encoded()
            .expect("a checked profile does not convert to pprof");
        let bytes = if encoded.gzipped {
            pprof::decompress(&encoded.bytes, usize::MAX).expect("its own gzip is broken")
        } else {
            encoded.bytes.clone()
        };
        let p = pprof::decode(&bytes, bytes.len().max(1)).expect("converted pprof does not decode");
        assert_eq!(p.sample_type.len(), 1, "one OTLP profile, one sample type");

        let mut builder = otlp::RequestBuilder::new();
        builder.push(&e.labels, &form);
        let request = builder
            .build()
            .expect("an accepted profile cannot be written again");
        let again = otlp::split_raw(
            &Bytes::from(request.encode()),
            &otlp::AttributeLabels::default(),
        )
        .expect("a request written of an accepted profile is refused");
        assert_eq!(again.rejected, 0, "{}", again.error_message);
        assert_eq!(
            again.envelopes.len(),
            1,
            "one profile written, other than one read"
        );
        assert_eq!(again.envelopes[0].sample_types, e.sample_types);
        assert_eq!(again.envelopes[0].period, e.period);
    }
}
