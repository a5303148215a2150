//! Two plain pprof profiles (2-byte length between) merged as the
//! `aggregate` processor merges them (`pprof::Merger`, reading each off its
//! bytes with `ProfileParts::read`): what prost refuses is refused when
//! read, so a merge never stops half-way; when both decode and fit, the merge off the bytes
//! is the merge of the decoded profiles, it decodes after encoding, and
//! every resolved stack (locations, mappings, functions and lines as
//! strings, with its sample labels) carries the sum of what the two
//! profiles gave it.
#![no_main]
use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use proflow_model::pprof::{self, Merger, Profile, ProfileParts};
use prost::Message;

/// Each sample's stack and labels written out, with its values summed
/// position by position. Ids a profile does not define are left out (the
/// last definition of an id wins), as the merge drops them.
fn resolved(p: &Profile) -> BTreeMap<String, Vec<i64>> {
    let s = |i: i64| p.string(i).to_owned();
    let last = |id: u64, ids: &mut dyn Iterator<Item = (u64, usize)>| {
        ids.filter(|(x, _)| *x == id).map(|(_, i)| i).last()
    };
    let mapping = |id: u64| {
        last(
            id,
            &mut p.mapping.iter().enumerate().map(|(i, m)| (m.id, i)),
        )
        .map(|i| {
            let m = &p.mapping[i];
            format!(
                "{:x}-{:x}+{:x} {} {} {}{}{}{}",
                m.memory_start,
                m.memory_limit,
                m.file_offset,
                s(m.filename),
                s(m.build_id),
                m.has_functions as u8,
                m.has_filenames as u8,
                m.has_line_numbers as u8,
                m.has_inline_frames as u8
            )
        })
    };
    let function = |id: u64| {
        last(
            id,
            &mut p.function.iter().enumerate().map(|(i, f)| (f.id, i)),
        )
        .map(|i| {
            let f = &p.function[i];
            format!(
                "{}/{}/{}:{}",
                s(f.name),
                s(f.system_name),
                s(f.filename),
                f.start_line
            )
        })
    };
    let location = |id: u64| {
        last(
            id,
            &mut p.location.iter().enumerate().map(|(i, l)| (l.id, i)),
        )
        .map(|i| {
            let l = &p.location[i];
            let lines: Vec<String> = l
                .line
                .iter()
                .filter_map(|x| {
                    Some(format!(
                        "{}@{}:{}",
                        function(x.function_id)?,
                        x.line,
                        x.column
                    ))
                })
                .collect();
            format!(
                "{:x} in {:?} {lines:?} {}",
                l.address,
                mapping(l.mapping_id),
                l.is_folded
            )
        })
    };
    let mut out: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for sample in &p.sample {
        let stack: Vec<String> = sample
            .location_id
            .iter()
            .filter_map(|id| location(*id))
            .collect();
        let labels: Vec<String> = sample
            .label
            .iter()
            .map(|l| format!("{}={}/{}[{}]", s(l.key), s(l.str), l.num, s(l.num_unit)))
            .collect();
        let values = out.entry(format!("{stack:?} {labels:?}")).or_default();
        for (j, v) in sample.value.iter().enumerate() {
            match values.get_mut(j) {
                Some(m) => *m = m.saturating_add(*v),
                None => values.push(*v),
            }
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    let Some((first, second)) = proflow_fuzz::two_parts(data) else {
        return;
    };
    let parts = (ProfileParts::read(first), ProfileParts::read(second));
    let decoded = (Profile::decode(first), Profile::decode(second));
    // What prost refuses is refused when read, samples and all.
    for (p, d) in [(&parts.0, &decoded.0), (&parts.1, &decoded.1)] {
        assert!(
            d.is_ok() || p.is_err(),
            "read a profile prost refuses: {d:?}"
        );
    }
    // (Groups, which prost skips, are refused when read: nothing more to say.)
    let (Ok(a), Ok(b), Ok(pa), Ok(pb)) = (&parts.0, &parts.1, decoded.0, decoded.1) else {
        return;
    };
    let merger = Merger::new(a);
    let mut merger = merger.expect("a profile prost decodes is merged");
    if !merger.fits(b) {
        return;
    }
    assert!(Merger::bound(a) >= merger.held_bytes());
    let held = merger.held_bytes();
    let grew = merger.add(b).expect("a profile prost decodes is merged");
    assert_eq!(merger.held_bytes(), held + grew);
    assert!(
        grew <= Merger::bound(b),
        "grew {grew} past its bound {}",
        Merger::bound(b)
    );
    let merged = merger.finish();
    // The same merge from the decoded profiles.
    let mut again = Merger::new(&ProfileParts::of(&pa)).expect("decoded parts merge");
    again
        .add(&ProfileParts::of(&pb))
        .expect("decoded parts merge");
    assert_eq!(
        again.finish(),
        merged,
        "off the bytes and decoded merge alike"
    );
    let bytes = pprof::encode(&merged);
    assert_eq!(
        Profile::decode(bytes).expect("the merged profile decodes"),
        merged
    );
    // Every stack carries the sum of both.
    let mut want = resolved(&pa);
    for (k, v) in resolved(&pb) {
        let values = want.entry(k).or_default();
        for (j, x) in v.iter().enumerate() {
            match values.get_mut(j) {
                Some(m) => *m = m.saturating_add(*x),
                None => values.push(*x),
            }
        }
    }
    assert_eq!(resolved(&merged), want);
});
