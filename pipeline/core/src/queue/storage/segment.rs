//! Segment files: the framing of records on disk, the acknowledgement files
//! beside them, and the scan that finds what is left after a restart.
//!
//! A segment `NNNNNNNNNNNNNNNNNNNN.seg` starts with the 8 bytes
//! `PFLWSEG1` and a random 64-bit salt, then frames, each:
//!
//! ```text
//! u32 magic "PFRC" · u32 length · u32 CRC32C of (salt ‖ length bytes ‖ record) · record
//! ```
//!
//! The checksum covers the length too, so a damaged length is caught like a
//! damaged record. After damage the scan looks for the next magic whose frame
//! checks out, so every intact record after a damaged one is still found. The
//! salt keeps a frame that a client wrote inside its own profile bytes from
//! ever passing as a record: it cannot know the salt. (A segment whose first
//! 16 bytes are damaged has no salt to check against, and is lost whole.)
//!
//! Its acknowledgements, `NNNNNNNNNNNNNNNNNNNN.ack`, are 12-byte entries: the
//! byte offset of a finished record (`u64`) and a CRC32C of that offset and
//! the segment number (`u32`). An entry that does not check out is ignored:
//! at worst its record is sent once more, never lost.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// The first bytes of every segment.
pub const SEGMENT_MAGIC: &[u8; 8] = b"PFLWSEG1";
/// Bytes of a segment's header: the magic and the salt.
pub const SEGMENT_HEADER: usize = 16;
/// The first bytes of every frame.
const FRAME_MAGIC: &[u8; 4] = b"PFRC";
/// Bytes of a frame before its record.
pub const FRAME_HEADER: usize = 12;
/// Bytes of one acknowledgement entry.
pub const ACK_ENTRY: usize = 12;

/// The segment file of number `n` in `dir`.
pub fn segment_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:020}.seg"))
}

/// The acknowledgement file of segment `n` in `dir`.
pub fn ack_path(dir: &Path, n: u64) -> PathBuf {
    dir.join(format!("{n:020}.ack"))
}

/// The numbers of the segments in `dir`, in order.
pub fn list(dir: &Path) -> std::io::Result<Vec<u64>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let Some(name) = name.to_str() else { continue };
        if let Some(n) = name.strip_suffix(".seg").and_then(|n| n.parse().ok()) {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

fn crc(salt: u64, length: u32, record: &[u8]) -> u32 {
    let c = crc32c::crc32c(&salt.to_le_bytes());
    crc32c::crc32c_append(crc32c::crc32c_append(c, &length.to_le_bytes()), record)
}

/// The header of a new segment with `salt`.
pub fn segment_header(salt: u64) -> [u8; SEGMENT_HEADER] {
    let mut h = [0u8; SEGMENT_HEADER];
    h[..8].copy_from_slice(SEGMENT_MAGIC);
    h[8..].copy_from_slice(&salt.to_le_bytes());
    h
}

/// The frame header of `record` in a segment with `salt`.
pub fn frame_header(salt: u64, record: &[u8]) -> [u8; FRAME_HEADER] {
    let len = u32::try_from(record.len()).unwrap_or(u32::MAX);
    let mut h = [0u8; FRAME_HEADER];
    h[..4].copy_from_slice(FRAME_MAGIC);
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h[8..].copy_from_slice(&crc(salt, len, record).to_le_bytes());
    h
}

/// The acknowledgement entry of the record at `offset` in segment `segment`.
pub fn ack_entry(segment: u64, offset: u64) -> [u8; ACK_ENTRY] {
    let mut e = [0u8; ACK_ENTRY];
    e[..8].copy_from_slice(&offset.to_le_bytes());
    let check = crc32c::crc32c_append(
        crc32c::crc32c(&offset.to_le_bytes()),
        &segment.to_le_bytes(),
    );
    e[8..].copy_from_slice(&check.to_le_bytes());
    e
}

/// The offsets an acknowledgement file names (entries that do not check out
/// are skipped).
pub fn read_acks(dir: &Path, segment: u64) -> std::collections::HashSet<u64> {
    let bytes = std::fs::read(ack_path(dir, segment)).unwrap_or_default();
    acks_in(&bytes, segment)
}

/// The offsets the bytes of segment `segment`'s acknowledgement file name.
fn acks_in(bytes: &[u8], segment: u64) -> std::collections::HashSet<u64> {
    bytes
        .chunks_exact(ACK_ENTRY)
        .filter(|c| {
            let entry: [u8; ACK_ENTRY] = (*c).try_into().unwrap_or([0; ACK_ENTRY]);
            let offset = u64::from_le_bytes(entry[..8].try_into().unwrap_or([0; 8]));
            ack_entry(segment, offset) == entry
        })
        .map(|c| u64::from_le_bytes(c[..8].try_into().unwrap_or([0; 8])))
        .collect()
}

/// A record found by the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Offset of its frame in the segment.
    pub offset: u64,
    /// Length of the record (without the frame header).
    pub len: u32,
}

/// Damage the scan stepped over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Damage {
    /// Where the damaged bytes start.
    pub offset: u64,
    /// How many bytes were skipped.
    pub skipped: u64,
}

/// What a segment holds: its intact records in order, and the damage
/// between them (a torn tail is damage too).
#[derive(Debug, Default)]
pub struct Scan {
    pub records: Vec<Found>,
    pub damage: Vec<Damage>,
    /// The file's length.
    pub len: u64,
    /// The segment's salt (`None`: its header is damaged).
    pub salt: Option<u64>,
}

/// Reads a whole segment and checks every frame. `max_record` bounds a frame's
/// claimed length (a longer one is damage).
pub fn scan(path: &Path, max_record: u32) -> std::io::Result<Scan> {
    let bytes = std::fs::read(path)?;
    Ok(scan_bytes(&bytes, max_record))
}

fn scan_bytes(bytes: &[u8], max_record: u32) -> Scan {
    let mut out = Scan {
        len: bytes.len() as u64,
        ..Scan::default()
    };
    let salt = match bytes.get(..SEGMENT_HEADER) {
        Some(h) if h.starts_with(SEGMENT_MAGIC) => {
            u64::from_le_bytes(h[8..].try_into().unwrap_or([0; 8]))
        }
        _ => {
            // A damaged or torn header: no salt, so no frame can be trusted.
            if !bytes.is_empty() {
                out.damage.push(Damage {
                    offset: 0,
                    skipped: bytes.len() as u64,
                });
            }
            return out;
        }
    };
    out.salt = Some(salt);
    let mut at = SEGMENT_HEADER;
    let mut damaged_from: Option<usize> = None;
    while at < bytes.len() {
        match frame_at(bytes, at, max_record, salt) {
            Some(len) => {
                if let Some(from) = damaged_from.take() {
                    out.damage.push(Damage {
                        offset: from as u64,
                        skipped: (at - from) as u64,
                    });
                }
                out.records.push(Found {
                    offset: at as u64,
                    len,
                });
                at += FRAME_HEADER + len as usize;
            }
            None => {
                damaged_from.get_or_insert(at);
                // The next place a frame could start.
                at = match find(&bytes[at + 1..], FRAME_MAGIC) {
                    Some(i) => at + 1 + i,
                    None => bytes.len(),
                };
            }
        }
    }
    if let Some(from) = damaged_from {
        out.damage.push(Damage {
            offset: from as u64,
            skipped: (bytes.len() - from) as u64,
        });
    }
    out
}

/// The record length of an intact frame at `at`, if there is one.
fn frame_at(bytes: &[u8], at: usize, max_record: u32, salt: u64) -> Option<u32> {
    let header = bytes.get(at..at.checked_add(FRAME_HEADER)?)?;
    if &header[..4] != FRAME_MAGIC {
        return None;
    }
    let len = u32::from_le_bytes(header[4..8].try_into().ok()?);
    if len > max_record {
        return None;
    }
    let record = bytes.get(at + FRAME_HEADER..(at + FRAME_HEADER).checked_add(len as usize)?)?;
    let want = u32::from_le_bytes(header[8..12].try_into().ok()?);
    (crc(salt, len, record) == want).then_some(len)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Reads the record of the frame at `offset` (`len` bytes) and checks it.
pub fn read_record(file: &mut File, offset: u64, len: u32, salt: u64) -> std::io::Result<Vec<u8>> {
    let mut frame = vec![0u8; FRAME_HEADER + len as usize];
    file.seek(SeekFrom::Start(offset))?;
    file.read_exact(&mut frame)?;
    match frame_at(&frame, 0, len, salt) {
        Some(l) if l == len => {
            frame.drain(..FRAME_HEADER);
            Ok(frame)
        }
        _ => Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("the record at offset {offset} no longer matches its checksum"),
        )),
    }
}

/// Entry points for the fuzz targets in `fuzz/`: the readers of a segment's
/// and an acknowledgement file's bytes, as a restart runs them. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    /// The scan of a segment file's bytes.
    pub fn scan(bytes: &[u8], max_record: u32) -> super::Scan {
        super::scan_bytes(bytes, max_record)
    }

    /// The offsets an acknowledgement file's bytes name.
    pub fn acks(bytes: &[u8], segment: u64) -> std::collections::HashSet<u64> {
        super::acks_in(bytes, segment)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SALT: u64 = 0x5eed;

    fn segment(records: &[&[u8]]) -> (Vec<u8>, Vec<u64>) {
        let mut out = segment_header(SALT).to_vec();
        let mut offsets = Vec::new();
        for r in records {
            offsets.push(out.len() as u64);
            out.extend_from_slice(&frame_header(SALT, r));
            out.extend_from_slice(r);
        }
        (out, offsets)
    }

    #[test]
    fn intact_segments_scan_clean() {
        let (bytes, offsets) = segment(&[b"one", b"", b"three"]);
        let s = scan_bytes(&bytes, 1 << 20);
        assert!(s.damage.is_empty());
        assert_eq!(
            s.records.iter().map(|f| f.offset).collect::<Vec<_>>(),
            offsets
        );
        assert_eq!(
            s.records.iter().map(|f| f.len).collect::<Vec<_>>(),
            [3, 0, 5]
        );
    }

    #[test]
    fn a_torn_tail_is_damage_and_the_rest_is_kept() {
        let (bytes, _) = segment(&[b"one", b"two", b"three"]);
        for cut in 0..bytes.len() {
            let s = scan_bytes(&bytes[..cut], 1 << 20);
            let whole = s.records.len();
            // Every record wholly before the cut is found.
            let expect = [16 + 15, 16 + 30, 16 + 47]
                .iter()
                .filter(|&&end| end <= cut)
                .count();
            assert_eq!(whole, expect, "cut at {cut}");
        }
    }

    #[test]
    fn damage_in_a_length_or_a_record_loses_only_that_record() {
        let records: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i; 40 + i as usize]).collect();
        let refs: Vec<&[u8]> = records.iter().map(Vec::as_slice).collect();
        let (bytes, offsets) = segment(&refs);
        for (i, &off) in offsets.iter().enumerate() {
            for delta in [0usize, 5, 10, 20] {
                let mut damaged = bytes.clone();
                damaged[off as usize + delta] ^= 0x5a;
                let s = scan_bytes(&damaged, 1 << 20);
                let found: Vec<u64> = s.records.iter().map(|f| f.offset).collect();
                let mut expect = offsets.clone();
                expect.remove(i);
                assert_eq!(found, expect, "record {i} damaged at +{delta}");
                assert_eq!(s.damage.len(), 1);
                assert_eq!(s.damage[0].offset, off);
            }
        }
    }

    #[test]
    fn a_frame_forged_inside_a_record_never_passes() {
        // A client's profile bytes that hold a well-formed frame (with any
        // salt but the segment's): after damage to the real frame around it,
        // the scan finds the forged magic and must refuse it.
        let forged_inner = b"forged record".to_vec();
        let mut payload = vec![7u8; 20];
        for guess in [0u64, 1, SALT + 1] {
            payload.extend_from_slice(&frame_header(guess, &forged_inner));
            payload.extend_from_slice(&forged_inner);
        }
        let (mut bytes, offsets) = segment(&[&payload, b"after"]);
        bytes[offsets[0] as usize + 5] ^= 0xff; // the real frame's length
        let s = scan_bytes(&bytes, 1 << 20);
        assert_eq!(
            s.records.iter().map(|f| f.offset).collect::<Vec<_>>(),
            [offsets[1]],
            "only the intact record after the damage"
        );
    }

    #[test]
    fn a_damaged_header_loses_the_segment_as_counted_damage() {
        let (mut bytes, _) = segment(&[b"one"]);
        bytes[2] ^= 1;
        let s = scan_bytes(&bytes, 1 << 20);
        assert!(s.records.is_empty() && s.salt.is_none());
        assert_eq!(s.damage.len(), 1);
    }

    #[test]
    fn ack_entries_check_their_segment() {
        let e = ack_entry(7, 1234);
        assert_eq!(e, ack_entry(7, 1234));
        assert_ne!(e, ack_entry(8, 1234));
        let dir = std::env::temp_dir().join(format!("proflow-acks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = e.to_vec();
        bytes.extend_from_slice(&ack_entry(8, 99)); // another segment's: ignored
        bytes.extend_from_slice(&ack_entry(7, 50));
        bytes.extend_from_slice(&[1, 2, 3]); // torn
        std::fs::write(ack_path(&dir, 7), bytes).unwrap();
        let acks = read_acks(&dir, 7);
        assert_eq!(acks, [1234, 50].into_iter().collect());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
