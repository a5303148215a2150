//! The merge, through decoded profiles and off the wire alike: every test
//! runs both ways and both must give the same profile.

use super::super::{ProfileBuilder, decode, encode};
use super::*;
use crate::testdata::folded_totals;

/// Folded stacks (root first, `;`-separated) with their values, as a
/// CPU profile starting at `time` seconds.
fn cpu(time: i64, stacks: &[(&str, i64)]) -> Profile {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(time * 1_000_000_000, 1_000_000_000);
    for (stack, v) in stacks {
        b.sample_root_first(stack.split(';'), vec![*v]);
    }
    b.build()
}

/// `profiles` merged, read as decoded profiles and read off their bytes:
/// both must agree. Returns the merged profile and what each add grew by.
fn merge(profiles: &[Profile]) -> (Profile, Vec<usize>) {
    let decoded = {
        let mut m = Merger::new(&ProfileParts::of(&profiles[0])).unwrap();
        let grew: Vec<usize> = profiles[1..]
            .iter()
            .map(|p| m.add(&ProfileParts::of(p)).unwrap())
            .collect();
        (m.finish(), grew)
    };
    let bytes: Vec<bytes::Bytes> = profiles.iter().map(encode).collect();
    let wire = {
        let mut m = Merger::new(&ProfileParts::read(&bytes[0]).unwrap()).unwrap();
        for b in &bytes[1..] {
            m.add(&ProfileParts::read(b).unwrap()).unwrap();
        }
        m.finish()
    };
    assert_eq!(decoded.0, wire, "off the wire and decoded merge alike");
    decoded
}

#[test]
fn equal_stacks_add_up_and_new_ones_join() {
    // The second profile numbers its frames in another order.
    let a = cpu(100, &[("main;work", 30), ("main;idle", 10)]);
    let b = cpu(101, &[("main;gc", 5), ("main;work", 20)]);
    let (merged, grew) = merge(&[a, b]);
    assert!(grew[0] > 0);
    let want: std::collections::BTreeMap<String, i64> = [
        ("main;gc".to_owned(), 5),
        ("main;idle".to_owned(), 10),
        ("main;work".to_owned(), 50),
    ]
    .into();
    assert_eq!(folded_totals(&merged), want);
    // One sample per stack, one function per name.
    assert_eq!(merged.sample.len(), 3);
    assert_eq!(merged.function.len(), 4);
    // From the first start to the last end.
    assert_eq!(merged.time_nanos, 100_000_000_000);
    assert_eq!(merged.duration_nanos, 2_000_000_000);
    assert_eq!(merged.period, 10_000_000);
    // What a reader decodes is what was merged.
    assert_eq!(decode(&encode(&merged), 1 << 20).expect("decodes"), merged);
}

#[test]
fn merging_a_profile_again_holds_nothing_more() {
    let a = cpu(1, &[("a;b;c", 1), ("a;b", 2)]);
    let mut m = Merger::new(&ProfileParts::of(&a)).unwrap();
    let held = m.held_bytes();
    assert!(held > 0);
    assert_eq!(m.add(&ProfileParts::of(&a)).unwrap(), 0);
    assert_eq!(m.held_bytes(), held);
    assert_eq!(m.merged(), 2);
    assert_eq!(folded_totals(&m.finish()).get("a;b;c"), Some(&2));
}

#[test]
fn what_a_profile_adds_is_within_its_bound() {
    let a = cpu(1, &[("main;work", 30), ("main;idle", 10)]);
    let b = cpu(2, &[("main;gc;mark;scan", 5), ("other;x", 20)]);
    let mut labelled = ProfileBuilder::new();
    labelled.sample_type("cpu", "nanoseconds");
    let f = labelled.frame("f");
    labelled.sample_with_labels(vec![f, f, f], vec![1], &[("span_id", "1"), ("x", "y")]);
    let c = labelled.build();
    let m0 = Merger::new(&ProfileParts::of(&a)).unwrap();
    assert!(m0.held_bytes() <= Merger::bound(&ProfileParts::of(&a)));
    let mut m = m0;
    for p in [&b, &c] {
        for bytes in [None, Some(encode(p))] {
            let parts = match &bytes {
                None => ProfileParts::of(p),
                Some(b) => ProfileParts::read(b).unwrap(),
            };
            let mut fresh = Merger::new(&ProfileParts::of(&a)).unwrap();
            let grew = fresh.add(&parts).unwrap();
            assert!(grew > 0 && grew <= Merger::bound(&parts), "{grew}");
        }
        m.add(&ProfileParts::of(p)).unwrap();
    }
}

#[test]
fn other_types_do_not_fit() {
    let a = cpu(1, &[("a", 1)]);
    let mut alloc = ProfileBuilder::new();
    alloc.sample_type("alloc_space", "bytes");
    alloc.sample_root_first(["a"], vec![1]);
    let m = Merger::new(&ProfileParts::of(&a)).unwrap();
    assert!(!m.fits(&ProfileParts::of(&alloc.build())));
    let mut wall = ProfileBuilder::new();
    wall.sample_type("cpu", "nanoseconds")
        .period("wall", "nanoseconds", 1);
    let wall = encode(&wall.build());
    assert!(!m.fits(&ProfileParts::read(&wall).unwrap()));
    assert!(m.fits(&ProfileParts::read(&encode(&a)).unwrap()));
}

#[test]
fn labels_addresses_and_inlined_lines_keep_samples_apart() {
    let mut b = ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds");
    let f = b.frame("f");
    b.sample_with_labels(vec![f], vec![1], &[("span_id", "1")]);
    b.sample_with_labels(vec![f], vec![2], &[("span_id", "2")]);
    b.sample_with_labels(vec![f], vec![4], &[("span_id", "1")]);
    let mut p = b.build();
    // A second location of `f` at another address in a mapping, with a
    // frame inlined into it; ids far apart, as some writers number them.
    p.mapping.push(Mapping {
        id: 7,
        memory_start: 0x1000,
        memory_limit: 0x2000,
        filename: 0,
        has_functions: true,
        ..Mapping::default()
    });
    let mut at = p.location[0].clone();
    at.id = 900_000;
    at.mapping_id = 7;
    at.address = 0x1234;
    at.line.insert(
        0,
        Line {
            function_id: 1,
            line: 42,
            column: 3,
        },
    );
    p.location.push(at);
    p.sample.push(Sample {
        location_id: vec![900_000],
        value: vec![8],
        label: vec![],
    });
    // A stack naming a location the profile does not define loses that frame.
    p.sample.push(Sample {
        location_id: vec![404],
        value: vec![16],
        label: vec![Label {
            key: 1,
            num: -5,
            ..Label::default()
        }],
    });
    let (merged, _) = merge(&[p.clone(), p]);
    let values: Vec<i64> = merged.sample.iter().map(|s| s.value[0]).collect();
    assert_eq!(values, vec![10, 4, 16, 32]);
    assert_eq!(merged.location.len(), 2);
    assert_eq!(merged.mapping.len(), 1);
    assert_eq!(merged.location[1].address, 0x1234);
    assert_eq!(merged.location[1].line.len(), 2);
    assert!(merged.sample[3].location_id.is_empty());
    assert_eq!(merged.sample[3].label[0].num, -5);
}

#[test]
fn bytes_prost_refuses_are_refused() {
    let good = encode(&cpu(1, &[("a;b", 1)]));
    assert!(ProfileParts::read(&good).is_ok());
    // A string that is not UTF-8 (field 6, length 2).
    let mut bad = good.to_vec();
    bad.extend([0x32, 0x02, 0xff, 0xfe]);
    assert!(ProfileParts::read(&bad).is_err());
    // A sample (field 2) given as a varint.
    assert!(ProfileParts::read(&[0x10, 0x01]).is_err());
    // A truncated message.
    assert!(ProfileParts::read(&good[..good.len() - 1]).is_err());
    // A sample whose location ids are cut short: the profile is refused
    // whole when read, before anything of it is merged.
    let broken = [0x12, 0x02, 0x0a, 0x80];
    assert!(ProfileParts::read(&broken).is_err());
    // And a bad label inside a sample.
    assert!(ProfileParts::read(&[0x12, 0x02, 0x1a, 0x00, 0x12, 0x02, 0x1a, 0x08]).is_err());
    // Each is what prost says too.
    for b in [&bad[..], &[0x10, 0x01], &good[..good.len() - 1], &broken] {
        assert!(<Profile as prost::Message>::decode(b).is_err(), "{b:02x?}");
    }
}
