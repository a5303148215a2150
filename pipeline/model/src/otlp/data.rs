//! OTLP profiles and dictionaries as they arrived: the protobuf bytes, kept
//! and written on as they are, or a decoded message (for what came as JSON or
//! was made by a conversion). Either is decoded only when something needs the
//! decoded form (a conversion to pprof, merging dictionaries, OTLP JSON), and
//! that decoded copy is made afresh each time and dropped after use.

use std::borrow::Cow;

use bytes::{BufMut, Bytes};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};

use super::{ConvertError, dictionary_heap_size, profile_heap_size, proto};

/// A request's dictionary, shared (`Arc`) by every profile of the request.
#[derive(Debug, Clone, PartialEq)]
pub struct SharedDictionary {
    form: Form<proto::ProfilesDictionary>,
    /// Strings plus locations: how much re-indexing it would take.
    entries: usize,
}

/// One OTLP profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ProfileData(Form<proto::Profile>);

#[derive(Debug, Clone, PartialEq)]
enum Form<T> {
    /// The message's protobuf bytes, as they arrived.
    Raw(Bytes),
    Decoded(T),
}

impl<T: Message + Default + Clone> Form<T> {
    fn decoded(&self, what: &str) -> Result<Cow<'_, T>, ConvertError> {
        match self {
            Form::Decoded(m) => Ok(Cow::Borrowed(m)),
            // Checked when it arrived: a failure here is a bug, reported as
            // a conversion error rather than a panic.
            Form::Raw(b) => T::decode(b.as_ref()).map(Cow::Owned).map_err(|e| {
                ConvertError::new(format!(
                    "the {what} that arrived does not decode again: {e}"
                ))
            }),
        }
    }

    fn body_len(&self) -> usize {
        match self {
            Form::Raw(b) => b.len(),
            Form::Decoded(m) => m.encoded_len(),
        }
    }

    fn encoded_len(&self, tag: u32) -> usize {
        let len = self.body_len();
        key_len(tag) + encoded_len_varint(len as u64) + len
    }

    fn encode(&self, tag: u32, buf: &mut Vec<u8>) {
        encode_key(tag, WireType::LengthDelimited, buf);
        encode_varint(self.body_len() as u64, buf);
        match self {
            Form::Raw(b) => buf.put_slice(b),
            Form::Decoded(m) => {
                // Encoding into a Vec cannot run out of room.
                let _ = m.encode(buf);
            }
        }
    }
}

impl SharedDictionary {
    pub fn from_decoded(d: proto::ProfilesDictionary) -> Self {
        let entries = d.string_table.len() + d.location_table.len();
        SharedDictionary {
            form: Form::Decoded(d),
            entries,
        }
    }

    /// The dictionary's bytes as they arrived; `decoded` is the same
    /// dictionary, decoded to check it (only its table sizes are kept).
    pub fn from_raw(bytes: Bytes, decoded: &proto::ProfilesDictionary) -> Self {
        SharedDictionary {
            form: Form::Raw(bytes),
            entries: decoded.string_table.len() + decoded.location_table.len(),
        }
    }

    /// The dictionary's bytes as they arrived, checked on the wire;
    /// `entries` is its strings plus locations.
    pub fn from_raw_entries(bytes: Bytes, entries: usize) -> Self {
        SharedDictionary {
            form: Form::Raw(bytes),
            entries,
        }
    }

    /// The decoded dictionary (decoded now if it is held as bytes).
    pub fn decoded(&self) -> Result<Cow<'_, proto::ProfilesDictionary>, ConvertError> {
        self.form.decoded("dictionary")
    }

    /// Strings plus locations.
    pub fn entries(&self) -> usize {
        self.entries
    }

    /// True when held as the bytes that arrived.
    pub fn is_raw(&self) -> bool {
        matches!(self.form, Form::Raw(_))
    }

    /// The bytes that arrived, when held so.
    pub fn raw(&self) -> Option<&Bytes> {
        match &self.form {
            Form::Raw(b) => Some(b),
            Form::Decoded(_) => None,
        }
    }

    /// Memory it keeps alive: its bytes, or an estimate of the decoded heap.
    pub fn heap_size(&self) -> usize {
        match &self.form {
            Form::Raw(b) => b.len(),
            Form::Decoded(d) => dictionary_heap_size(d),
        }
    }

    pub(crate) fn encoded_len(&self, tag: u32) -> usize {
        self.form.encoded_len(tag)
    }

    pub(crate) fn encode(&self, tag: u32, buf: &mut Vec<u8>) {
        self.form.encode(tag, buf)
    }
}

impl From<proto::ProfilesDictionary> for SharedDictionary {
    fn from(d: proto::ProfilesDictionary) -> Self {
        SharedDictionary::from_decoded(d)
    }
}

impl ProfileData {
    pub fn from_decoded(p: proto::Profile) -> Self {
        ProfileData(Form::Decoded(p))
    }

    /// A profile's bytes as they arrived (checked by the receiver).
    pub fn from_raw(bytes: Bytes) -> Self {
        ProfileData(Form::Raw(bytes))
    }

    /// The decoded profile (decoded now if it is held as bytes).
    pub fn decoded(&self) -> Result<Cow<'_, proto::Profile>, ConvertError> {
        self.0.decoded("profile")
    }

    /// True when held as the bytes that arrived.
    pub fn is_raw(&self) -> bool {
        matches!(self.0, Form::Raw(_))
    }

    /// The bytes that arrived, when held so.
    pub fn raw(&self) -> Option<&Bytes> {
        match &self.0 {
            Form::Raw(b) => Some(b),
            Form::Decoded(_) => None,
        }
    }

    /// Memory it keeps alive: its bytes, or an estimate of the decoded heap.
    pub fn heap_size(&self) -> usize {
        match &self.0 {
            Form::Raw(b) => b.len(),
            Form::Decoded(p) => profile_heap_size(p),
        }
    }

    pub(crate) fn encoded_len(&self, tag: u32) -> usize {
        self.0.encoded_len(tag)
    }

    pub(crate) fn encode(&self, tag: u32, buf: &mut Vec<u8>) {
        self.0.encode(tag, buf)
    }
}

impl From<proto::Profile> for ProfileData {
    fn from(p: proto::Profile) -> Self {
        ProfileData::from_decoded(p)
    }
}

/// Decoded copies of profiles (for a conversion).
pub fn decode_all(profiles: &[ProfileData]) -> Result<Vec<proto::Profile>, ConvertError> {
    profiles
        .iter()
        .map(|p| p.decoded().map(Cow::into_owned))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_and_decoded_forms_encode_alike() {
        let p = proto::Profile {
            samples: vec![proto::Sample {
                stack_index: 1,
                values: vec![7],
                ..Default::default()
            }],
            period: 10,
            ..Default::default()
        };
        let raw = ProfileData::from_raw(Bytes::from(p.encode_to_vec()));
        let dec = ProfileData::from_decoded(p.clone());
        let (mut a, mut b) = (Vec::new(), Vec::new());
        raw.encode(2, &mut a);
        dec.encode(2, &mut b);
        assert_eq!(a, b);
        assert_eq!(raw.encoded_len(2), a.len());
        assert_eq!(*raw.decoded().unwrap(), p);
        assert!(raw.is_raw() && !dec.is_raw());
        let bad = ProfileData::from_raw(Bytes::from_static(&[0xff]));
        assert!(bad.decoded().is_err());
    }
}
