use super::*;

fn sample_profile() -> Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(1_700_000_000_000_000_000, 10_000_000_000);
    b.sample_root_first(["main", "work", "hot"], vec![30]);
    b.sample_root_first(["main", "idle"], vec![10]);
    b.build()
}

#[test]
fn scan_reads_metadata_of_plain_and_gzip() {
    let p = sample_profile();
    let plain = encode(&p);
    for bytes in [plain.clone(), gzip(&plain)] {
        let m = scan_metadata(&bytes, 1 << 20).unwrap();
        assert_eq!(
            m.sample_types,
            vec![("cpu".to_string(), "nanoseconds".to_string())]
        );
        assert_eq!(m.period_type, Some(("cpu".into(), "nanoseconds".into())));
        assert_eq!(m.period, 10_000_000);
        assert_eq!(m.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(m.duration_nanos, 10_000_000_000);
        assert_eq!(m.sample_count, 2);
        assert_eq!(m.deepest_stack, 3);
        assert_eq!(m.most_sample_labels, 0);
        assert_eq!(m.plain_size, plain.len());
    }
}

#[test]
fn decode_roundtrips() {
    let p = sample_profile();
    let back = decode(&gzip(&encode(&p)), 1 << 20).unwrap();
    assert_eq!(back, p);
    let stacks: Vec<Vec<&str>> = stacks_root_first(&back).map(|(s, _)| s).collect();
    assert_eq!(
        stacks,
        vec![vec!["main", "work", "hot"], vec!["main", "idle"]]
    );
}

#[test]
fn decompression_bomb_is_refused_at_the_limit() {
    let zeros = vec![0u8; 10 << 20];
    let bomb = gzip(&zeros);
    assert!(bomb.len() < 100 << 10);
    assert_eq!(
        scan_metadata(&bomb, 1 << 20),
        Err(DecodeError::TooLarge { limit: 1 << 20 })
    );
    assert_eq!(
        decode(&bomb, 1 << 20),
        Err(DecodeError::TooLarge { limit: 1 << 20 })
    );
}

#[test]
fn corrupt_input_is_an_error_not_a_panic() {
    assert!(matches!(
        scan_metadata(&[0x1f, 0x8b, 1, 2, 3], 1024),
        Err(DecodeError::Gzip(_))
    ));
    assert!(matches!(
        scan_metadata(&[0x0a, 0xff, 0xff, 0xff, 0x0f], 1024),
        Err(DecodeError::Protobuf(_))
    ));
    assert!(matches!(
        scan_metadata(b"hello world", 1024),
        Err(DecodeError::Protobuf(_))
    ));
}

#[test]
fn element_counts_are_capped_before_decoding() {
    // 2-byte empty samples: tiny on the wire, 72 bytes each once decoded.
    let many = [0x12u8, 0x00].repeat(MAX_PROFILE_ELEMENTS + 1);
    let expected = DecodeError::TooManyElements {
        what: "samples, locations, functions, mappings and strings",
        limit: MAX_PROFILE_ELEMENTS,
    };
    assert_eq!(scan_metadata(&many, 64 << 20), Err(expected.clone()));
    assert_eq!(decode(&Bytes::from(many), 64 << 20), Err(expected));
    let types = [0x0au8, 0x00].repeat(MAX_SAMPLE_TYPES + 1);
    assert!(matches!(
        scan_metadata(&types, 1 << 20),
        Err(DecodeError::TooManyElements {
            what: "sample types",
            ..
        })
    ));
    assert!(
        matches!(
            scan_metadata(&[0x00, 0x00], 1 << 20),
            Err(DecodeError::Protobuf(_))
        ),
        "field number 0"
    );
}

/// A profile holding only `samples`, each `sample` bytes long.
fn profile_of_samples(samples: usize, sample: &[u8]) -> Vec<u8> {
    let mut one = vec![0x12];
    prost::encoding::encode_varint(sample.len() as u64, &mut one);
    one.extend_from_slice(sample);
    one.repeat(samples)
}

/// A length-delimited field `tag` holding `body`.
fn field(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![tag << 3 | 2];
    prost::encoding::encode_varint(body.len() as u64, &mut out);
    out.extend_from_slice(body);
    out
}

fn assert_over_budget(plain: Vec<u8>, limit: usize) {
    let budget = decoded_budget(plain.len());
    let refused = |e: Result<_, DecodeError>| match e {
        Err(e @ DecodeError::DecodedTooLarge { estimate, limit }) => {
            assert_eq!(limit, budget);
            assert!(estimate > limit);
            let message = e.to_string();
            assert!(
                message.contains(&format!("limit of {budget} bytes")),
                "{message}"
            );
            assert!(message.contains("once decoded"), "{message}");
        }
        other => panic!("expected DecodedTooLarge, got {other:?}"),
    };
    refused(scan_metadata(&plain, limit).map(|_| ()));
    refused(decode(&Bytes::from(plain), limit).map(|_| ()));
}

#[test]
fn amplifying_shapes_are_refused_by_the_ratio() {
    // Samples with one empty label each: 4 bytes become 72 + 4 × 32.
    let plain = profile_of_samples(500_000, &[0x1a, 0x00]);
    assert_over_budget(plain, 64 << 20);
    // Locations with one empty line each: 4 bytes become 56 + 4 × 24.
    assert_over_budget(field(4, &[0x22, 0x00]).repeat(500_000), 64 << 20);
    // Empty samples: 2 bytes become 72 (96 with slack at 700,000).
    assert_over_budget([0x12, 0x00].repeat(700_000), 64 << 20);
}

#[test]
fn millions_of_nested_elements_are_refused_by_the_cap() {
    // One sample with 2^24 + 1 empty labels: 32 MiB on the wire, a Vec of
    // 2^25 Labels (1 GiB) once decoded.
    let labels = [0x1au8, 0x00].repeat((1 << 24) + 1);
    let plain = field(2, &labels);
    drop(labels);
    assert_eq!(decoded_budget(plain.len()), MAX_DECODED_SIZE);
    assert_over_budget(plain, 128 << 20);
    // One sample whose packed location_id holds 2^26 + 1 one-byte
    // varints: 64 MiB on the wire, a Vec<u64> of 1 GiB once decoded.
    let ids = vec![1u8; (1 << 26) + 1];
    assert_over_budget(field(2, &field(1, &ids)), 128 << 20);
    // The same as packed comments at the top level.
    assert_over_budget(field(13, &ids), 128 << 20);
}

/// Sample and period types named by string table entries past the ones the
/// one pass keeps read the same as early ones, through the second walk; an
/// index past the table is refused either way, and so is a named entry that
/// is not UTF-8.
#[test]
fn scan_reads_type_strings_anywhere_in_the_table() {
    for filler in [0, EARLY_STRINGS - 3, EARLY_STRINGS, 3 * EARLY_STRINGS] {
        let mut p = sample_profile();
        p.string_table
            .extend((0..filler).map(|i| format!("filler {i}")));
        let at = p.string_table.len() as i64;
        p.string_table.extend([
            "alloc_space".to_owned(),
            "bytes".to_owned(),
            "space".to_owned(),
        ]);
        p.sample_type[0] = ValueType {
            r#type: at,
            unit: at + 1,
        };
        p.period_type = Some(ValueType {
            r#type: at + 2,
            unit: at + 1,
        });
        let meta = scan_metadata(&encode(&p), 1 << 20).unwrap();
        assert_eq!(
            meta.sample_types,
            vec![("alloc_space".into(), "bytes".into())],
            "{filler} fillers"
        );
        assert_eq!(
            meta.period_type,
            Some(("space".into(), "bytes".into())),
            "{filler} fillers"
        );

        p.period_type = Some(ValueType {
            r#type: at + 3,
            unit: at + 1,
        });
        assert_eq!(
            scan_metadata(&encode(&p), 1 << 20),
            Err(DecodeError::Protobuf("string index out of range".into())),
            "{filler} fillers"
        );
    }
    // A named entry that is not UTF-8, early and far.
    for filler in [0, 2 * EARLY_STRINGS] {
        let mut bytes = encode(&sample_profile()).to_vec();
        // Append the fillers and a bad entry, and point the sample type at it.
        let strings = sample_profile().string_table.len() + filler;
        for i in 0..filler {
            bytes.extend(field(6, format!("f{i}").as_bytes()));
        }
        bytes.extend(field(6, &[0xff, 0xfe]));
        bytes.extend(field(
            1,
            &[
                0x08,
                strings as u8 & 0x7f | 0x80,
                (strings >> 7) as u8,
                0x10,
                0,
            ],
        ));
        assert_eq!(
            scan_metadata(&bytes, 1 << 20).map(|m| m.sample_types.len()),
            Err(DecodeError::Protobuf(
                "string table entry is not UTF-8".into()
            )),
            "{filler} fillers"
        );
    }
}

#[test]
fn ordinary_profiles_fit_their_budget() {
    let p = crate::testdata::cpu_profile(2_000, 300);
    let plain = encode(&p);
    let meta = scan_metadata(&plain, 64 << 20).unwrap();
    assert!(meta.decoded_size > plain.len());
    assert!(meta.decoded_size < decoded_budget(plain.len()) / 4);
    // One-frame stacks with 1-byte ids and values, the shape that
    // amplifies most among real ones, stay under the ratio.
    let plain = profile_of_samples(600_000, &[0x0a, 1, 1, 0x12, 1, 1]);
    let meta = scan_metadata(&plain, 64 << 20).unwrap();
    assert!(meta.decoded_size <= decoded_budget(plain.len()));
}

#[test]
fn budget_is_clamped() {
    assert_eq!(decoded_budget(0), MIN_DECODED_BUDGET);
    assert_eq!(decoded_budget(1 << 20), 32 << 20);
    assert_eq!(decoded_budget(usize::MAX), MAX_DECODED_SIZE);
    assert_eq!(vec_heap(0, 8), 0);
    assert_eq!(vec_heap(1, 8), 32);
    assert_eq!(vec_heap(5, 8), 64);
    assert_eq!(vec_heap(3, 1), 8);
    assert_eq!(vec_heap(usize::MAX, 8), usize::MAX);
}

proptest::proptest! {
    #[test]
    fn scan_never_panics(data in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
        let _ = scan_metadata(&data, 4096);
        let _ = decode(&Bytes::from(data), 4096);
    }
}

/// proflow's gzip (libdeflate, level 1) reads back with zlib's reader and
/// is no larger than zlib's fastest level on profiles, typical and large.
#[test]
fn gzip_reads_back_and_is_no_larger_than_zlibs_fastest() {
    for (samples, functions) in [(60, 100), (20_000, 5_000)] {
        let plain = encode(&crate::testdata::cpu_profile(samples, functions));
        let ours = gzip(&plain);
        let mut back = Vec::new();
        flate2::read::MultiGzDecoder::new(&ours[..])
            .read_to_end(&mut back)
            .unwrap();
        assert_eq!(back, plain[..]);
        let zlib = crate::testdata::cpu_profile_gzip(samples, functions);
        assert!(
            ours.len() <= zlib.len(),
            "{samples} samples: {} bytes, zlib's fastest {}",
            ours.len(),
            zlib.len()
        );
    }
    assert_eq!(gunzip(&gzip(b"")), b"");
}

fn gunzip(gz: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    gunzip_into(gz, 1 << 20, &mut out).unwrap();
    out
}

#[test]
fn truncated_stacks_keep_their_root_side() {
    let mut p = sample_profile();
    assert_eq!(truncate_stacks(&mut p, 2), 1);
    let stacks: Vec<Vec<&str>> = stacks_root_first(&p).map(|(s, _)| s).collect();
    assert_eq!(stacks, vec![vec!["main", "work"], vec!["main", "idle"]]);
    assert_eq!(truncate_stacks(&mut p, 2), 0);
}
