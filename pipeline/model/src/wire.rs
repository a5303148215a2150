//! The protobuf wire format, read without decoding: [`fields`] walks the
//! fields of one message and checks its framing as it goes, so callers can
//! count and bound what a message holds before prost allocates anything for
//! it (the pprof scan, the push.v1 receiver).
//!
//! What is refused, as every conforming parser refuses it: field number 0 and
//! field numbers past 2^29 - 1, wire types 6 and 7, groups (wire types 3 and
//! 4, deprecated and used by none of the formats proflow reads), varints that
//! are truncated or overflow 64 bits, and fixed-size or length-delimited
//! fields that run past the end of the message.
//!
//! Depends on nothing but `std` and `thiserror`; anything may use it.

/// One field's value as the wire carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    /// Wire type 0: int32/64, uint32/64, sint32/64, bool, enum.
    Varint(u64),
    /// Wire type 1: fixed64, sfixed64, double.
    Fixed64(u64),
    /// Wire type 2: string, bytes, a message or a packed repeated scalar.
    Bytes(&'a [u8]),
    /// Wire type 5: fixed32, sfixed32, float.
    Fixed32(u32),
}

/// Why bytes are not a well-formed protobuf message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("truncated varint")]
    TruncatedVarint,
    #[error("varint overflows 64 bits")]
    VarintOverflow,
    #[error("field number 0 is invalid")]
    FieldZero,
    #[error("field key {key} is out of range (field numbers end at 2^29 - 1)")]
    KeyOutOfRange { key: u64 },
    #[error("field {field} is a group (wire type {wire}); groups are not supported")]
    Group { field: u32, wire: u8 },
    #[error("invalid wire type {wire} for field {field}")]
    InvalidWireType { field: u32, wire: u8 },
    #[error("truncated fixed-size field {field}")]
    TruncatedFixed { field: u32 },
    #[error("field {field} length runs past the end of the message")]
    LengthPastEnd { field: u32 },
}

/// The most bytes a varint may take (64 bits in 7-bit groups).
pub const MAX_VARINT_LEN: usize = 10;

/// Reads one varint from the front of `buf` and advances past it.
#[inline]
pub fn read_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    // Most varints of a profile (keys, small ids, lengths) are one byte.
    if let Some((&byte, rest)) = buf.split_first()
        && byte < 0x80
    {
        *buf = rest;
        return Ok(u64::from(byte));
    }
    read_long_varint(buf)
}

#[cold]
fn read_long_varint(buf: &mut &[u8]) -> Result<u64, WireError> {
    let mut value = 0u64;
    for (i, &byte) in buf.iter().enumerate().take(MAX_VARINT_LEN) {
        // The tenth byte holds only bit 63: anything above 1 overflows.
        if i == MAX_VARINT_LEN - 1 && byte > 1 {
            return Err(WireError::VarintOverflow);
        }
        value |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *buf = &buf[i + 1..];
            return Ok(value);
        }
    }
    // Fewer than ten bytes, all with the continuation bit set.
    Err(WireError::TruncatedVarint)
}

/// How many varints a packed repeated field holds: every varint ends in the
/// one byte of it whose high bit is clear. A trailing unfinished varint is not
/// counted (prost refuses it when decoding). Never more than `packed.len()`.
pub fn count_varints(packed: &[u8]) -> usize {
    packed.iter().filter(|&&b| b < 0x80).count()
}

/// The fields of one message, in wire order: `(field number, value)`.
/// Nested messages are not entered; walk a [`Value::Bytes`] again for that.
/// Stops after the first error.
pub fn fields(message: &[u8]) -> Fields<'_> {
    Fields {
        rest: message,
        failed: false,
    }
}

/// The iterator of [`fields`].
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    rest: &'a [u8],
    failed: bool,
}

impl<'a> Fields<'a> {
    /// The bytes not yet walked: the next field starts here.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    #[inline]
    fn next_field(&mut self) -> Result<(u32, Value<'a>), WireError> {
        let key = read_varint(&mut self.rest)?;
        let key = u32::try_from(key).map_err(|_| WireError::KeyOutOfRange { key })?;
        let field = key >> 3;
        // At most 7, so the cast is exact.
        let wire = (key & 7) as u8;
        if field == 0 {
            return Err(WireError::FieldZero);
        }
        let value = match wire {
            0 => Value::Varint(read_varint(&mut self.rest)?),
            1 => Value::Fixed64(u64::from_le_bytes(self.take_fixed(field)?)),
            2 => {
                let len = read_varint(&mut self.rest)?;
                let len = usize::try_from(len)
                    .ok()
                    .filter(|&len| len <= self.rest.len())
                    .ok_or(WireError::LengthPastEnd { field })?;
                let (bytes, rest) = self.rest.split_at(len);
                self.rest = rest;
                Value::Bytes(bytes)
            }
            3 | 4 => return Err(WireError::Group { field, wire }),
            5 => Value::Fixed32(u32::from_le_bytes(self.take_fixed(field)?)),
            _ => return Err(WireError::InvalidWireType { field, wire }),
        };
        Ok((field, value))
    }

    fn take_fixed<const N: usize>(&mut self, field: u32) -> Result<[u8; N], WireError> {
        let (bytes, rest) = self
            .rest
            .split_first_chunk::<N>()
            .ok_or(WireError::TruncatedFixed { field })?;
        self.rest = rest;
        Ok(*bytes)
    }
}

impl<'a> Iterator for Fields<'a> {
    type Item = Result<(u32, Value<'a>), WireError>;

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.rest.is_empty() {
            return None;
        }
        let result = self.next_field();
        self.failed = result.is_err();
        Some(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn walk(message: &[u8]) -> Result<Vec<(u32, Value<'_>)>, WireError> {
        fields(message).collect()
    }

    fn varint(value: u64) -> Vec<u8> {
        let mut out = Vec::new();
        prost::encoding::encode_varint(value, &mut out);
        out
    }

    #[test]
    fn every_wire_type_is_read() {
        let mut msg = vec![0x08, 0x96, 0x01]; // 1: varint 150
        msg.extend([0x11, 1, 0, 0, 0, 0, 0, 0, 0x80]); // 2: fixed64
        msg.extend([0x1a, 0x03, b'a', b'b', b'c']); // 3: bytes "abc"
        msg.extend([0x25, 0x78, 0x56, 0x34, 0x12]); // 4: fixed32
        msg.extend([0x2a, 0x00]); // 5: empty bytes
        assert_eq!(
            walk(&msg).unwrap(),
            vec![
                (1, Value::Varint(150)),
                (2, Value::Fixed64(0x8000_0000_0000_0001)),
                (3, Value::Bytes(b"abc")),
                (4, Value::Fixed32(0x1234_5678)),
                (5, Value::Bytes(b"")),
            ]
        );
        assert_eq!(walk(&[]).unwrap(), vec![]);
        // The largest field number there is.
        let mut big = varint(((1 << 29) - 1) << 3);
        big.push(0x01);
        assert_eq!(walk(&big).unwrap(), vec![((1 << 29) - 1, Value::Varint(1))]);
    }

    #[test]
    fn malformed_framing_is_refused() {
        let cases: [(&[u8], WireError); 10] = [
            (&[0x00, 0x00], WireError::FieldZero),
            (&[0x02, 0x00], WireError::FieldZero),
            (&[0x0b], WireError::Group { field: 1, wire: 3 }),
            (&[0x0c], WireError::Group { field: 1, wire: 4 }),
            (&[0x0e], WireError::InvalidWireType { field: 1, wire: 6 }),
            (&[0x0f], WireError::InvalidWireType { field: 1, wire: 7 }),
            (&[0x11, 0, 0, 0], WireError::TruncatedFixed { field: 2 }),
            (&[0x15, 0, 0, 0], WireError::TruncatedFixed { field: 2 }),
            (&[0x0a, 0x05, 0x01], WireError::LengthPastEnd { field: 1 }),
            (&[0x08, 0x80], WireError::TruncatedVarint),
        ];
        for (msg, want) in cases {
            assert_eq!(walk(msg), Err(want), "{msg:02x?}");
        }
        // A key past u32 (field number 2^29 and above).
        let mut msg = varint(1 << 32);
        msg.push(0);
        assert_eq!(walk(&msg), Err(WireError::KeyOutOfRange { key: 1 << 32 }));
        // A length too large for the message, and one too large for usize on 32-bit.
        let mut msg = vec![0x0a];
        msg.extend(varint(u64::MAX));
        assert_eq!(walk(&msg), Err(WireError::LengthPastEnd { field: 1 }));
        // Good fields before the bad one are returned, then the iterator stops.
        let mut it = fields(&[0x08, 0x01, 0x00, 0x08, 0x01]);
        assert_eq!(it.next(), Some(Ok((1, Value::Varint(1)))));
        assert_eq!(it.next(), Some(Err(WireError::FieldZero)));
        assert_eq!(it.next(), None);
    }

    #[test]
    fn varints_at_their_limits() {
        for value in [
            0,
            1,
            127,
            128,
            300,
            u64::from(u32::MAX),
            u64::MAX - 1,
            u64::MAX,
        ] {
            let bytes = varint(value);
            let mut buf = &bytes[..];
            assert_eq!(read_varint(&mut buf), Ok(value));
            assert!(buf.is_empty());
        }
        assert_eq!(varint(u64::MAX).len(), MAX_VARINT_LEN);
        // Ten bytes whose last carries more than bit 63.
        let mut over = vec![0xff; 9];
        over.push(0x02);
        assert_eq!(read_varint(&mut &over[..]), Err(WireError::VarintOverflow));
        // Eleven bytes: never a varint.
        assert_eq!(
            read_varint(&mut &[0x80; 11][..]),
            Err(WireError::VarintOverflow)
        );
        assert_eq!(
            read_varint(&mut &[0x80; 3][..]),
            Err(WireError::TruncatedVarint)
        );
        assert_eq!(read_varint(&mut &[][..]), Err(WireError::TruncatedVarint));
        // Non-minimal encodings are legal: 0 in two bytes.
        assert_eq!(read_varint(&mut &[0x80, 0x00][..]), Ok(0));
    }

    #[test]
    fn packed_varints_are_counted_by_their_last_byte() {
        let mut packed = Vec::new();
        for v in [0, 1, 300, u64::MAX] {
            packed.extend(varint(v));
        }
        assert_eq!(count_varints(&packed), 4);
        assert_eq!(count_varints(&[]), 0);
        assert_eq!(count_varints(&[0x80, 0x80]), 0, "an unfinished varint");
    }

    /// A message prost reads while skipping every field.
    #[derive(Clone, PartialEq, prost::Message)]
    struct Nothing {}

    proptest! {
        #[test]
        fn varints_roundtrip(value in any::<u64>(), tail in proptest::collection::vec(any::<u8>(), 0..4)) {
            let mut bytes = varint(value);
            let len = bytes.len();
            bytes.extend(&tail);
            let mut buf = &bytes[..];
            prop_assert_eq!(read_varint(&mut buf), Ok(value));
            prop_assert_eq!(buf.len(), bytes.len() - len);
        }

        /// On any bytes without groups, the walk accepts exactly what prost accepts.
        #[test]
        fn agrees_with_prost(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let walked: Result<Vec<_>, _> = fields(&bytes).collect();
            let prost_ok = <Nothing as prost::Message>::decode(&bytes[..]).is_ok();
            match walked {
                Err(WireError::Group { .. }) => {}
                Err(e) => prop_assert!(!prost_ok, "we refuse ({e}), prost accepts"),
                Ok(_) => prop_assert!(prost_ok, "we accept, prost refuses"),
            }
        }

        /// Fields written by prost come back in order with their values.
        #[test]
        fn reads_what_prost_writes(
            n in any::<u64>(),
            text in "[a-z]{0,20}",
            f64v in any::<u64>(),
            f32v in any::<u32>(),
            field in 1u32..(1 << 29),
        ) {
            use prost::encoding::{bytes, fixed32, fixed64, uint64};
            let mut msg = Vec::new();
            uint64::encode(field, &n, &mut msg);
            bytes::encode(1, &text.as_bytes().to_vec(), &mut msg);
            fixed64::encode(2, &f64v, &mut msg);
            fixed32::encode(3, &f32v, &mut msg);
            prop_assert_eq!(
                walk(&msg).unwrap(),
                vec![
                    (field, Value::Varint(n)),
                    (1, Value::Bytes(text.as_bytes())),
                    (2, Value::Fixed64(f64v)),
                    (3, Value::Fixed32(f32v)),
                ]
            );
        }
    }
}
