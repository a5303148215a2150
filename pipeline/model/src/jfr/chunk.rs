//! A chunk's fixed header: 68 big-endian bytes at the chunk's start, with
//! the chunk's size, where its last constant pool and its metadata are,
//! its start in wall time and in ticks, and the ticks per second that turn
//! event times and durations into nanoseconds. A file is chunks back to
//! back; every offset in a chunk counts from the chunk's start.

use super::cursor::Cursor;
use super::{JfrError, Result};

/// The four bytes every chunk starts with.
pub const MAGIC: [u8; 4] = *b"FLR\0";
/// The header's length.
pub const HEADER_LEN: usize = 68;

/// The header of one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkHeader {
    pub major: u16,
    pub minor: u16,
    /// The chunk's whole length, header included.
    pub size: usize,
    /// Where the last constant-pool event starts, from the chunk's start.
    pub constant_pool_offset: usize,
    /// Where the metadata event starts, from the chunk's start.
    pub metadata_offset: usize,
    pub start_nanos: i64,
    pub duration_nanos: i64,
    pub start_ticks: i64,
    pub ticks_per_second: i64,
    /// Bit 0: integers are compressed; bit 1: the recording's last chunk.
    pub features: u32,
}

impl ChunkHeader {
    /// Reads the header of the chunk that starts where `c` stands; `c` is
    /// left after it. Offsets and the size must lie within the bytes the
    /// cursor has from the chunk's start.
    pub fn read(c: &mut Cursor<'_>) -> Result<ChunkHeader> {
        let start = c.position();
        let available = c.remaining();
        let magic = c.take(4, "the chunk magic")?;
        if magic != MAGIC {
            return Err(JfrError::Invalid {
                what: format!("not a JFR chunk: it starts with {magic:02x?}, not \"FLR\\0\""),
                at: start,
            });
        }
        let major = c.be_u16("the major version")?;
        let minor = c.be_u16("the minor version")?;
        if !(1..=2).contains(&major) {
            return Err(JfrError::Invalid {
                what: format!("JFR version {major}.{minor} is not 1.x or 2.x"),
                at: start + 4,
            });
        }
        let offset = |c: &mut Cursor<'_>, what: &'static str| -> Result<usize> {
            let at = c.position();
            let v = c.be_i64(what)?;
            usize::try_from(v)
                .ok()
                .filter(|&v| v <= available)
                .ok_or_else(|| JfrError::Invalid {
                    what: format!("{what} {v} is outside the {available} bytes at hand"),
                    at,
                })
        };
        let size = offset(c, "the chunk size")?;
        if size < HEADER_LEN {
            return Err(JfrError::Invalid {
                what: format!("a chunk of {size} bytes is smaller than its header"),
                at: start + 8,
            });
        }
        let constant_pool_offset = offset(c, "the constant pool offset")?;
        let metadata_offset = offset(c, "the metadata offset")?;
        for (what, o) in [
            ("the constant pool offset", constant_pool_offset),
            ("the metadata offset", metadata_offset),
        ] {
            if o != 0 && !(HEADER_LEN..size).contains(&o) {
                return Err(JfrError::Invalid {
                    what: format!("{what} {o} is not inside the chunk of {size} bytes"),
                    at: start,
                });
            }
        }
        let header = ChunkHeader {
            major,
            minor,
            size,
            constant_pool_offset,
            metadata_offset,
            start_nanos: c.be_i64("the start time")?,
            duration_nanos: c.be_i64("the duration")?,
            start_ticks: c.be_i64("the start ticks")?,
            ticks_per_second: c.be_i64("the ticks per second")?,
            features: c.be_u32("the features")?,
        };
        if header.ticks_per_second <= 0 {
            return Err(JfrError::Invalid {
                what: format!("{} ticks per second", header.ticks_per_second),
                at: start + 56,
            });
        }
        Ok(header)
    }

    /// Whether the writer compressed its integers (every HotSpot and
    /// async-profiler file does; readers decode them so either way).
    pub fn compressed_integers(&self) -> bool {
        self.features & 1 != 0
    }

    /// Nanoseconds for a span of `ticks`.
    pub fn ticks_to_nanos(&self, ticks: i64) -> i64 {
        let nanos = i128::from(ticks) * 1_000_000_000 / i128::from(self.ticks_per_second);
        i64::try_from(nanos).unwrap_or(if nanos < 0 { i64::MIN } else { i64::MAX })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header_bytes(size: i64, cp: i64, meta: i64, ticks_per_second: i64) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend(2u16.to_be_bytes());
        b.extend(0u16.to_be_bytes());
        for v in [
            size,
            cp,
            meta,
            1_700_000_000_000_000_000,
            10_000_000_000,
            5,
            ticks_per_second,
        ] {
            b.extend(v.to_be_bytes());
        }
        b.extend(1u32.to_be_bytes());
        b
    }

    #[test]
    fn reads_a_header_and_converts_ticks() {
        let mut bytes = header_bytes(100, 80, 68, 1_000_000);
        bytes.resize(100, 0);
        let h = ChunkHeader::read(&mut Cursor::new(&bytes)).unwrap();
        assert_eq!((h.major, h.minor, h.size), (2, 0, 100));
        assert_eq!((h.constant_pool_offset, h.metadata_offset), (80, 68));
        assert!(h.compressed_integers());
        assert_eq!(h.ticks_to_nanos(1_500), 1_500_000);
    }

    #[test]
    fn refuses_what_cannot_be_a_chunk() {
        let read = |b: Vec<u8>| ChunkHeader::read(&mut Cursor::new(&b));
        let mut gz = header_bytes(100, 80, 68, 1);
        gz[..4].copy_from_slice(&[0x1f, 0x8b, 8, 0]);
        gz.resize(100, 0);
        assert!(
            read(gz)
                .unwrap_err()
                .to_string()
                .contains("not a JFR chunk")
        );
        // A size past the bytes at hand, and offsets outside the chunk.
        assert!(read(header_bytes(1 << 40, 80, 68, 1)).is_err());
        let mut outside = header_bytes(100, 120, 68, 1);
        outside.resize(200, 0);
        assert!(read(outside).is_err());
        let mut no_ticks = header_bytes(100, 80, 68, 0);
        no_ticks.resize(100, 0);
        assert!(read(no_ticks).is_err());
        assert!(read(MAGIC.to_vec()).is_err());
    }
}
