//! Reading JFR's values from a byte slice: big-endian fixed integers (the
//! chunk header), the "compressed" integers everything else uses (7 bits a
//! byte, least significant first, at most 9 bytes, the ninth giving all its 8
//! bits; writers pad sizes they patch later, so longer forms than needed are
//! taken), and strings (an encoding byte: 0 null, 1 empty, 2 a constant-pool
//! key, 3 UTF-8, 4 UTF-16 code units as compressed integers, 5 Latin-1).
//! A length is checked against the bytes left before anything is allocated,
//! so no value read from the input sizes an allocation on its own.

use super::{JfrError, Result};

/// A position in a JFR byte slice.
#[derive(Debug, Clone)]
pub struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

/// A string as JFR encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JfrString {
    Null,
    Text(String),
    /// A key into the `java.lang.String` constant pool.
    PoolKey(u64),
}

impl<'a> Cursor<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Cursor { bytes, at: 0 }
    }

    /// Where the next read starts.
    pub fn position(&self) -> usize {
        self.at
    }

    /// Bytes not read yet.
    pub fn remaining(&self) -> usize {
        self.bytes.len() - self.at
    }

    /// Moves to `at`, which must lie within the slice.
    pub fn seek(&mut self, at: usize) -> Result<()> {
        if at > self.bytes.len() {
            return Err(JfrError::Truncated {
                what: "a jump to an offset past the end",
                at: self.bytes.len(),
            });
        }
        self.at = at;
        Ok(())
    }

    /// The next `n` bytes, borrowed.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(JfrError::Truncated {
                what,
                at: self.bytes.len(),
            });
        }
        let slice = &self.bytes[self.at..self.at + n];
        self.at += n;
        Ok(slice)
    }

    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }

    pub fn be_u16(&mut self, what: &'static str) -> Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }

    pub fn be_u32(&mut self, what: &'static str) -> Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub fn be_i64(&mut self, what: &'static str) -> Result<i64> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(i64::from_be_bytes(a))
    }

    /// A compressed integer: up to 9 bytes, the ninth with all 8 bits.
    pub fn varint(&mut self, what: &'static str) -> Result<u64> {
        let mut value = 0u64;
        for i in 0..8 {
            let b = self.u8(what)?;
            value |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        let b = self.u8(what)?;
        Ok(value | (u64::from(b) << 56))
    }

    /// A compressed integer that counts or sizes something: it must fit in
    /// the bytes left when each item takes at least `least_bytes`, so a
    /// count read here can size an allocation.
    pub fn count(&mut self, least_bytes: usize, what: &'static str) -> Result<usize> {
        let at = self.at;
        let n = self.varint(what)?;
        let fits = usize::try_from(n)
            .ok()
            .filter(|&n| n.saturating_mul(least_bytes.max(1)) <= self.remaining());
        fits.ok_or_else(|| JfrError::Invalid {
            what: format!(
                "{what}: {n} is more than the {} bytes left can hold",
                self.remaining()
            ),
            at,
        })
    }

    /// Passes over a string in any of JFR's encodings, allocating nothing.
    pub fn skip_string(&mut self, what: &'static str) -> Result<()> {
        let at = self.at;
        match self.u8(what)? {
            0 | 1 => Ok(()),
            2 => self.varint(what).map(drop),
            3 | 5 => {
                let n = self.count(1, what)?;
                self.take(n, what).map(drop)
            }
            4 => {
                let n = self.count(1, what)?;
                for _ in 0..n {
                    self.varint(what)?;
                }
                Ok(())
            }
            other => Err(JfrError::Invalid {
                what: format!("{what}: unknown string encoding {other}"),
                at,
            }),
        }
    }

    /// A string in any of JFR's encodings.
    pub fn string(&mut self, what: &'static str) -> Result<JfrString> {
        let at = self.at;
        match self.u8(what)? {
            0 => Ok(JfrString::Null),
            1 => Ok(JfrString::Text(String::new())),
            2 => Ok(JfrString::PoolKey(self.varint(what)?)),
            3 => {
                let n = self.count(1, what)?;
                let bytes = self.take(n, what)?;
                Ok(JfrString::Text(String::from_utf8_lossy(bytes).into_owned()))
            }
            4 => {
                let n = self.count(1, what)?;
                let mut units = Vec::with_capacity(n);
                for _ in 0..n {
                    let unit = self.varint(what)?;
                    units.push(u16::try_from(unit).map_err(|_| JfrError::Invalid {
                        what: format!("{what}: UTF-16 code unit {unit} is over 0xFFFF"),
                        at,
                    })?);
                }
                Ok(JfrString::Text(String::from_utf16_lossy(&units)))
            }
            5 => {
                let n = self.count(1, what)?;
                let bytes = self.take(n, what)?;
                Ok(JfrString::Text(
                    bytes.iter().map(|&b| char::from(b)).collect(),
                ))
            }
            other => Err(JfrError::Invalid {
                what: format!("{what}: unknown string encoding {other}"),
                at,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_short_padded_and_nine_bytes() {
        assert_eq!(Cursor::new(&[0x05]).varint("v"), Ok(5));
        assert_eq!(Cursor::new(&[0x96, 0x01]).varint("v"), Ok(150));
        // A size the writer patched later: 95 in four bytes.
        assert_eq!(Cursor::new(&[0xdf, 0x80, 0x80, 0x00]).varint("v"), Ok(95));
        // Nine bytes: the last gives bits 56..63 whole.
        let minus_one = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff];
        assert_eq!(Cursor::new(&minus_one).varint("v"), Ok(u64::MAX));
        // And it ends there even with its high bit set: nothing more is read.
        let mut c = Cursor::new(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x80, 0x07]);
        c.varint("v").unwrap();
        assert_eq!(c.remaining(), 1);
        assert!(matches!(
            Cursor::new(&[0x80, 0x80]).varint("v"),
            Err(JfrError::Truncated { .. })
        ));
    }

    #[test]
    fn strings_in_every_encoding() {
        let read = |b: &[u8]| Cursor::new(b).string("s");
        assert_eq!(read(&[0]), Ok(JfrString::Null));
        assert_eq!(read(&[1]), Ok(JfrString::Text(String::new())));
        assert_eq!(read(&[2, 0x2a]), Ok(JfrString::PoolKey(42)));
        assert_eq!(read(&[3, 2, b'h', b'i']), Ok(JfrString::Text("hi".into())));
        assert_eq!(
            read(&[4, 2, 0xe9, 0x01, 0x41]),
            Ok(JfrString::Text("éA".into()))
        );
        assert_eq!(read(&[5, 1, 0xe9]), Ok(JfrString::Text("é".into())));
        assert!(matches!(read(&[9]), Err(JfrError::Invalid { .. })));
    }

    #[test]
    fn a_length_past_the_end_is_refused_before_allocating() {
        // Claims 2^62 bytes of UTF-8 in a four-byte input.
        let huge = [3, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x40];
        assert!(matches!(
            Cursor::new(&huge).string("s"),
            Err(JfrError::Invalid { .. })
        ));
        // A char array of 3 units with bytes for 2.
        assert!(matches!(
            Cursor::new(&[4, 3, 0x41, 0x42]).string("s"),
            Err(JfrError::Invalid { .. })
        ));
    }
}
