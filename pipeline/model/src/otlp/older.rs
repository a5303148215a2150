//! Requests of OTLP profiles 1.9 (and 1.8, whose samples are the same),
//! made 1.10 on the wire before they are checked.
//!
//! Between 1.9 and 1.10 only `Sample` changed: `values` moved from field 2
//! to 4, `attribute_indices` from 3 to 2 and `link_index` from 4 to 3
//! (`stack_index` 1 and `timestamps_unix_nano` 5 stayed). Nothing in a
//! request says which it is, and a 1.10 reader takes 1.9 bytes without an
//! error but with the values read as attribute indexes. Producers released
//! before the change (the OpenTelemetry eBPF profiler before v0.0.202613,
//! async-profiler before 4.5, the Collector's pdata before 1.54) send 1.9.
//!
//! A request is taken as 1.9 when one of its samples can only be 1.9
//! (field 3 length-delimited, or field 4 a varint: packed attributes and a
//! link index) or is invalid in 1.10 but not in 1.9 (field 2 with neither
//! field 4 nor field 5: attribute indexes and nothing to count), and none
//! can only be 1.10 (field 3 a varint, or field 4 length-delimited). It is
//! then rewritten tag by tag into a copy of the same length: every tag
//! keeps its wire type and its length in bytes, so no length around it
//! changes, and nothing is lost (1.10 can hold every 1.9 sample). A
//! request of samples that fit both (field 2 with timestamps, and nothing
//! else that tells) is read as 1.10.
//!
//! Profiles of 1.8 also numbered some `Profile` fields differently
//! (`comment_strindices` 7, the others one higher); those are not
//! converted: such a profile is refused by the 1.10 checks, naming the
//! field.

use bytes::Bytes;

use crate::wire::{Value, fields};

/// What a request's samples say about its version.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Signs {
    /// A sample only 1.9 can be (or that only 1.9 makes valid).
    older: bool,
    /// A sample only 1.10 can be.
    newer: bool,
}

/// Calls `f` with every sample of a request (a slice of it), in order,
/// until it returns `false`; nothing is allocated. `None` when the request
/// cannot be walked (the 1.10 checks then say why).
fn each_sample<'a>(body: &'a [u8], mut f: impl FnMut(&'a [u8]) -> bool) -> Option<()> {
    for resource in nested(body, 1) {
        for scope in nested(resource?, 2) {
            for profile in nested(scope?, 2) {
                for sample in nested(profile?, 2) {
                    if !f(sample?) {
                        return Some(());
                    }
                }
            }
        }
    }
    Some(())
}

/// What the samples of a request say about its version; `None` when it
/// cannot be walked. Stops at the first sample only 1.10 can be.
fn signs(body: &[u8]) -> Option<Signs> {
    let mut signs = Signs::default();
    let mut walked = true;
    each_sample(body, |sample| {
        let (mut two, mut four, mut five) = (false, false, false);
        for f in fields(sample) {
            let Ok(f) = f else {
                walked = false;
                return false;
            };
            match f {
                (2, _) => two = true,
                (3, Value::Bytes(_)) | (4, Value::Varint(_)) => signs.older = true,
                (3, Value::Varint(_)) | (4, Value::Bytes(_)) => signs.newer = true,
                (5, _) => five = true,
                _ => {}
            }
            four |= f.0 == 4;
        }
        if two && !four && !five {
            signs.older = true;
        }
        // A 1.10 request: the rest need not be walked.
        !signs.newer
    })?;
    walked.then_some(signs)
}

/// The length-delimited fields numbered `number` of `message`, each `None`
/// when the message stops being protobuf there.
fn nested(message: &[u8], number: u32) -> impl Iterator<Item = Option<&[u8]>> {
    fields(message).filter_map(move |f| match f {
        Ok((n, Value::Bytes(b))) if n == number => Some(Some(b)),
        Ok(_) => None,
        Err(_) => Some(None),
    })
}

/// The 1.10 number of a 1.9 sample field.
fn renumbered(number: u32) -> u32 {
    match number {
        2 => 4,
        3 => 2,
        4 => 3,
        n => n,
    }
}

/// Whether `body` is a 1.9 request, which [`upgrade_1_9`] copies (a body's
/// size more to hold while it is split): cheap for 1.10, whose first
/// sample with values says so.
pub fn is_1_9(body: &[u8]) -> bool {
    signs(body).is_some_and(|s| s.older && !s.newer)
}

/// `body` rewritten as 1.10 when it is a 1.9 request (see the module
/// docs); `None` when it is not (or cannot be walked).
pub fn upgrade_1_9(body: &Bytes) -> Option<Bytes> {
    let signs = signs(body)?;
    if !signs.older || signs.newer {
        return None;
    }
    let base = body.as_ptr() as usize;
    let mut out = body.to_vec();
    let mut rewritten = true;
    each_sample(body, |sample| {
        let start = sample.as_ptr() as usize - base;
        let mut walker = fields(sample);
        loop {
            let tag_at = start + (sample.len() - walker.rest().len());
            let Some(Ok((number, _))) = walker.next() else {
                break;
            };
            let new = renumbered(number);
            if new != number && rewrite_tag(&mut out[tag_at..], new).is_none() {
                rewritten = false;
                return false;
            }
        }
        true
    })?;
    rewritten.then(|| Bytes::from(out))
}

/// Writes the tag of field `number` over the tag at the start of `bytes`,
/// keeping its wire type and its length in bytes (continuation bytes pad
/// it when the old one was longer than needed).
fn rewrite_tag(bytes: &mut [u8], number: u32) -> Option<()> {
    let len = bytes.iter().position(|b| b & 0x80 == 0)? + 1;
    let wire_type = u64::from(bytes[0] & 7);
    let mut key = (u64::from(number) << 3) | wire_type;
    for (i, b) in bytes[..len].iter_mut().enumerate() {
        let more = if i + 1 < len { 0x80 } else { 0 };
        *b = (key & 0x7f) as u8 | more;
        key >>= 7;
    }
    (key == 0).then_some(())
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;
    use crate::otlp::{collector, proto};

    /// A request of one profile whose samples are `samples` (each already
    /// encoded as the bytes of a Sample message).
    fn request(samples: &[Vec<u8>]) -> Bytes {
        let mut profile = Vec::new();
        for s in samples {
            prost::encoding::bytes::encode(2, s, &mut profile);
        }
        let mut scope = Vec::new();
        prost::encoding::bytes::encode(2, &profile, &mut scope);
        let mut resource = Vec::new();
        prost::encoding::bytes::encode(2, &scope, &mut resource);
        let mut body = Vec::new();
        prost::encoding::bytes::encode(1, &resource, &mut body);
        Bytes::from(body)
    }

    /// A 1.9 sample: stack 1, values, attribute indexes, a link, timestamps.
    fn sample_1_9(values: &[i64], attributes: &[i32], link: i32, timestamps: &[u64]) -> Vec<u8> {
        let mut s = Vec::new();
        prost::encoding::int32::encode(1, &1, &mut s);
        if !values.is_empty() {
            prost::encoding::int64::encode_packed(2, values, &mut s);
        }
        if !attributes.is_empty() {
            prost::encoding::int32::encode_packed(3, attributes, &mut s);
        }
        if link != 0 {
            prost::encoding::int32::encode(4, &link, &mut s);
        }
        if !timestamps.is_empty() {
            prost::encoding::fixed64::encode_packed(5, timestamps, &mut s);
        }
        s
    }

    fn samples_of(body: &Bytes) -> Vec<proto::Sample> {
        collector::ExportProfilesServiceRequest::decode(&body[..])
            .unwrap()
            .resource_profiles[0]
            .scope_profiles[0]
            .profiles[0]
            .samples
            .clone()
    }

    #[test]
    fn a_1_9_request_reads_as_1_10_with_nothing_lost() {
        let body = request(&[
            sample_1_9(&[10_000_000, 3], &[1, 2], 1, &[]),
            sample_1_9(&[7], &[], 0, &[]),
            sample_1_9(&[1], &[3], 0, &[42]),
        ]);
        assert!(is_1_9(&body));
        let upgraded = upgrade_1_9(&body).expect("a 1.9 request");
        assert_eq!(upgraded.len(), body.len());
        assert!(!is_1_9(&upgraded));
        let got = samples_of(&upgraded);
        assert_eq!(got[0].values, vec![10_000_000, 3]);
        assert_eq!(got[0].attribute_indices, vec![1, 2]);
        assert_eq!(got[0].link_index, 1);
        assert_eq!(got[1].values, vec![7]);
        assert_eq!(got[2].values, vec![1]);
        assert_eq!(got[2].attribute_indices, vec![3]);
        assert_eq!(got[2].timestamps_unix_nano, vec![42]);
        assert_eq!(
            got.iter().map(|s| s.stack_index).collect::<Vec<_>>(),
            vec![1, 1, 1]
        );
    }

    #[test]
    fn values_alone_are_1_9_since_1_10_would_have_nothing_to_count() {
        let body = request(&[sample_1_9(&[5], &[], 0, &[])]);
        let upgraded = upgrade_1_9(&body).expect("values without timestamps");
        assert_eq!(samples_of(&upgraded)[0].values, vec![5]);
    }

    #[test]
    fn a_1_10_request_and_an_undecided_one_are_left_alone() {
        let sample = proto::Sample {
            stack_index: 1,
            attribute_indices: vec![1],
            link_index: 2,
            values: vec![9],
            timestamps_unix_nano: vec![],
        };
        let body = request(&[sample.encode_to_vec()]);
        assert_eq!(upgrade_1_9(&body), None);
        assert!(!is_1_9(&body));
        // Field 2 with timestamps fits both: read as 1.10.
        let body = request(&[sample_1_9(&[5], &[], 0, &[77])]);
        assert_eq!(upgrade_1_9(&body), None);
        // One 1.10 sample makes the request 1.10 however the others look.
        let body = request(&[sample.encode_to_vec(), sample_1_9(&[5], &[2], 0, &[])]);
        assert_eq!(upgrade_1_9(&body), None);
        assert!(!is_1_9(&body));
        // Not protobuf: nothing to say.
        assert_eq!(upgrade_1_9(&Bytes::from_static(b"\xff\xff")), None);
    }

    #[test]
    fn a_long_tag_keeps_its_length() {
        // Field 2, wire type 2, written in two bytes (0x92 0x00).
        let mut s = vec![0x08, 0x01, 0x92, 0x00, 0x01, 0x05];
        let body = request(&[std::mem::take(&mut s)]);
        let upgraded = upgrade_1_9(&body).expect("values alone");
        assert_eq!(upgraded.len(), body.len());
        assert_eq!(samples_of(&upgraded)[0].values, vec![5]);
    }
}
