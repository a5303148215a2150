//! Unwind sections that cannot be used in place ([`Copied`]): copied out of
//! a file a user may change, or inflated from a compressed section. They go
//! to a private unlinked file in the temporary directory (`$TMPDIR`, the
//! chart's `/tmp` volume), written a bounded buffer at a time and mapped
//! read-only: only the pages the unwinder reads are in this process's
//! memory, and the rest are the kernel's page cache, which it can write
//! back and drop where `$TMPDIR` is on a disk (on a tmpfs they are shared
//! memory, still out of the agent's RSS but not droppable). Where no such file can be made (no writable temporary
//! directory) they go to the heap as before. Either way they stay charged to
//! the state budget at their full size while kept ([`super::binary`]
//! charges them before anything is written).
//!
//! Nothing is written past the size the caller states: a stream that holds
//! more, or less, is an error, and the section is left out.

use std::fs::File;
use std::io::{Error, ErrorKind, Read, Write};
use std::os::unix::fs::FileExt;

use object::CompressionFormat;

use super::super::state_budget::Charge;

/// How much is read and written at once.
const BUFFER: usize = 64 << 10;
/// The largest zstd window taken beyond a section's size: zstd's own
/// levels use at most 8 MiB (window log 23) without `--long`.
const MAX_ZSTD_WINDOW: u64 = 8 << 20;

/// A copied or inflated section's bytes and their charge.
#[derive(Debug)]
pub struct Copied {
    bytes: Kept,
    _charge: Option<Charge>,
}

/// Where a [`Copied`] section's bytes are.
#[derive(Debug)]
enum Kept {
    /// In a private unlinked file, mapped read-only.
    File(memmap2::Mmap),
    Heap(Vec<u8>),
}

impl Copied {
    /// No bytes, charged nothing.
    pub(super) fn empty() -> Self {
        Copied {
            bytes: Kept::Heap(Vec::new()),
            _charge: None,
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match &self.bytes {
            Kept::File(map) => map,
            Kept::Heap(bytes) => bytes,
        }
    }

    /// Whether its bytes are in a file (not on the heap).
    #[cfg(test)]
    pub(super) fn in_file(&self) -> bool {
        matches!(self.bytes, Kept::File(_))
    }

    /// `len` bytes of `file` from `offset`, read with positioned reads (a
    /// file cut short meanwhile gives an error, never a shorter section).
    pub(super) fn copy(
        file: &File,
        offset: u64,
        len: u64,
        charge: Charge,
    ) -> std::io::Result<Self> {
        let mut from = ReadAt::new(file, offset, len);
        Self::keep(len, charge, |to| pump(&mut from, to))
    }

    /// The section compressed as `format` (zlib or zstd) in `compressed`
    /// bytes of `file` from `offset`, read a buffer at a time, inflated to
    /// exactly `len` bytes.
    pub(super) fn inflate(
        format: CompressionFormat,
        (file, offset, compressed): (&File, u64, u64),
        len: u64,
        charge: Charge,
    ) -> std::io::Result<Self> {
        let mut from = ReadAt::new(file, offset, compressed);
        Self::keep(len, charge, |to| match format {
            CompressionFormat::Zlib => {
                let mut z = flate2::read::ZlibDecoder::new_with_buf(from, vec![0; BUFFER]);
                pump(&mut z, to)
            }
            CompressionFormat::Zstandard => zstd_frames(&mut from, to),
            _ => Err(invalid("a compression other than zlib or zstd")),
        })
    }

    /// Runs `fill` into a file (or, failing that, the heap) that takes at
    /// most `len` bytes, and keeps the result if it is exactly `len` bytes.
    fn keep(
        len: u64,
        charge: Charge,
        fill: impl FnOnce(&mut Bounded<'_>) -> std::io::Result<()>,
    ) -> std::io::Result<Self> {
        let bytes = match tempfile::tempfile() {
            Ok(mut file) => {
                let mut to = Bounded {
                    to: &mut file,
                    left: len,
                };
                fill(&mut to)?;
                to.finished()?;
                if len == 0 {
                    Kept::Heap(Vec::new())
                } else {
                    // SAFETY: the file is unlinked and open only here: no
                    // one else can truncate or change it while it is mapped.
                    Kept::File(unsafe { memmap2::Mmap::map(&file) }?)
                }
            }
            Err(_) => {
                let mut heap = Vec::new();
                heap.try_reserve_exact(usize::try_from(len).map_err(|_| invalid("too large"))?)
                    .map_err(|_| Error::new(ErrorKind::OutOfMemory, "no memory for the section"))?;
                let mut to = Bounded {
                    to: &mut heap,
                    left: len,
                };
                fill(&mut to)?;
                to.finished()?;
                Kept::Heap(heap)
            }
        };
        Ok(Copied {
            bytes,
            _charge: Some(charge),
        })
    }
}

fn invalid(what: &str) -> Error {
    Error::new(ErrorKind::InvalidData, what.to_owned())
}

/// A writer that takes at most `left` more bytes.
struct Bounded<'w> {
    to: &'w mut dyn Write,
    left: u64,
}

impl Bounded<'_> {
    fn write_all(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let n = bytes.len() as u64;
        if n > self.left {
            return Err(invalid("longer than its header states"));
        }
        self.to.write_all(bytes)?;
        self.left -= n;
        Ok(())
    }

    /// An error unless exactly the stated size was written.
    fn finished(self) -> std::io::Result<()> {
        if self.left != 0 {
            return Err(invalid("shorter than its header states"));
        }
        self.to.flush()
    }
}

/// Copies all of `from` into `to`, a buffer at a time.
fn pump(from: &mut dyn Read, to: &mut Bounded<'_>) -> std::io::Result<()> {
    let mut buf = vec![0; BUFFER];
    pump_with(from, to, &mut buf)
}

fn pump_with(from: &mut dyn Read, to: &mut Bounded<'_>, buf: &mut [u8]) -> std::io::Result<()> {
    loop {
        match from.read(buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(&buf[..n])?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Inflates the zstd frames of `from` one after another (skippable frames
/// passed over), as a section compressed with zstd may hold several. A
/// frame's decoder holds up to its window in memory before it gives out a
/// byte, and the window is what the frame's header says: a frame whose
/// window is larger than what may still be written (and than
/// [`MAX_ZSTD_WINDOW`], which encoders' own windows stay within) is refused
/// before it is decoded: what the decoder holds is within the section's
/// charge, or that much.
fn zstd_frames(from: &mut ReadAt<'_>, to: &mut Bounded<'_>) -> std::io::Result<()> {
    use ruzstd::decoding::StreamingDecoder;
    use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
    let mut buf = vec![0; BUFFER];
    while from.at < from.end {
        let mut header = [0u8; 18];
        let n = from.peek(&mut header)?;
        if let Some(window) = zstd_window(&header[..n])
            && window > to.left.max(MAX_ZSTD_WINDOW)
        {
            return Err(invalid(
                "a zstd frame whose window is larger than the section",
            ));
        }
        match StreamingDecoder::new(&mut *from) {
            Ok(mut frame) => pump_with(&mut frame, to, &mut buf)?,
            Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                length,
                ..
            })) => {
                from.at = from
                    .at
                    .checked_add(u64::from(length))
                    .filter(|&at| at <= from.end)
                    .ok_or_else(|| invalid("a skippable zstd frame past the section's end"))?;
            }
            Err(e) => return Err(invalid(&format!("zstd: {e}"))),
        }
    }
    Ok(())
}

/// The window of the zstd frame whose header starts `b` (its magic, the
/// frame header descriptor, then the window descriptor, or with a single
/// segment the content size after the dictionary id); `None` for anything
/// else (a skippable frame, garbage: the decoder says what it is).
fn zstd_window(b: &[u8]) -> Option<u64> {
    if b.get(..4)? != [0x28, 0xb5, 0x2f, 0xfd] {
        return None;
    }
    let descriptor = *b.get(4)?;
    if descriptor & 0x20 == 0 {
        let w = *b.get(5)?;
        let log = 10 + u32::from(w >> 3);
        let base = 1u64 << log;
        return Some(base + (base / 8) * u64::from(w & 7));
    }
    let dictionary = [0, 1, 2, 4][usize::from(descriptor & 3)];
    let size = [1, 2, 4, 8][usize::from(descriptor >> 6)];
    let at = 5 + dictionary;
    let mut v = [0u8; 8];
    v[..size].copy_from_slice(b.get(at..at + size)?);
    let content = u64::from_le_bytes(v);
    Some(if size == 2 { content + 256 } else { content })
}

/// Reads a file's range `at..end` with positioned reads.
struct ReadAt<'f> {
    file: &'f File,
    at: u64,
    end: u64,
}

impl<'f> ReadAt<'f> {
    /// `len` bytes of `file` from `offset`.
    fn new(file: &'f File, offset: u64, len: u64) -> Self {
        ReadAt {
            file,
            at: offset,
            end: offset.saturating_add(len),
        }
    }

    /// Reads what is at `at` into `buf` without moving on; the bytes read.
    fn peek(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = usize::try_from(self.end - self.at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        self.file.read_at(&mut buf[..want], self.at)
    }
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let want = usize::try_from(self.end - self.at)
            .unwrap_or(usize::MAX)
            .min(buf.len());
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::Arc;

    use super::super::super::state_budget::{StateBudget, Use};
    use super::*;

    /// [`Copied::inflate`] of `data`, put in a file first.
    fn inflate(
        format: CompressionFormat,
        data: &[u8],
        len: u64,
        charge: Charge,
    ) -> std::io::Result<Copied> {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(data).unwrap();
        Copied::inflate(format, (&f, 0, data.len() as u64), len, charge)
    }

    fn charge(budget: &Arc<StateBudget>, n: u64) -> Charge {
        Charge::take(budget, Use::UnwindSection, n as usize).expect("room")
    }

    #[test]
    fn a_range_of_a_file_is_copied_into_a_mapped_private_file() {
        let budget = StateBudget::new(1 << 20);
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        f.write_all(&data).unwrap();
        let c = Copied::copy(&f, 1000, 150_000, charge(&budget, 150_000)).unwrap();
        assert!(c.in_file());
        assert_eq!(c.bytes(), &data[1000..151_000]);
        assert_eq!(budget.used_bytes(), 150_000);
        drop(c);
        assert_eq!(budget.used_bytes(), 0, "the charge goes with it");
        // Past the file's end (a file cut short): an error, nothing kept.
        assert!(Copied::copy(&f, 100_000, 150_000, charge(&budget, 150_000)).is_err());
        assert_eq!(budget.used_bytes(), 0);
    }

    #[test]
    fn a_stream_is_kept_only_at_exactly_its_stated_size() {
        let budget = StateBudget::new(4 << 20);
        let zeros = vec![0u8; 3 << 20];
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        z.write_all(&zeros).unwrap();
        let z = z.finish().unwrap();
        let c = inflate(
            CompressionFormat::Zlib,
            &z,
            3 << 20,
            charge(&budget, 3 << 20),
        )
        .unwrap();
        assert!(c.in_file());
        assert_eq!(c.bytes().len(), 3 << 20);
        assert!(c.bytes().iter().all(|&b| b == 0));
        drop(c);
        // States less than it holds: refused before more than stated is
        // written; states more: refused at its end.
        for stated in [1 << 20, 4 << 20] {
            let e =
                inflate(CompressionFormat::Zlib, &z, stated, charge(&budget, stated)).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
        }
        // Not zlib at all.
        assert!(inflate(CompressionFormat::Zlib, b"garbage", 7, charge(&budget, 7)).is_err());
        assert_eq!(budget.used_bytes(), 0);
    }

    #[test]
    fn zstd_frames_are_inflated_one_after_another() {
        let budget = StateBudget::new(1 << 20);
        let level = ruzstd::encoding::CompressionLevel::Fastest;
        let a: Vec<u8> = (0..70_000u32).map(|i| (i % 7) as u8).collect();
        let b = vec![9u8; 50_000];
        // A skippable frame (magic 0x184D2A50, then its length) between them.
        let mut z = ruzstd::encoding::compress_to_vec(&a[..], level);
        z.extend_from_slice(&[0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3]);
        z.extend(ruzstd::encoding::compress_to_vec(&b[..], level));
        let c = inflate(
            CompressionFormat::Zstandard,
            &z,
            120_000,
            charge(&budget, 120_000),
        )
        .unwrap();
        assert_eq!(&c.bytes()[..70_000], &a[..]);
        assert_eq!(&c.bytes()[70_000..], &b[..]);
        assert!(
            inflate(
                CompressionFormat::Zstandard,
                &z,
                119_999,
                charge(&budget, 1)
            )
            .is_err()
        );
    }

    #[test]
    fn a_zstd_frame_whose_window_is_larger_than_the_section_is_not_decoded() {
        let budget = StateBudget::new(1 << 20);
        // A window of 2 TiB (descriptor 0xf8), then a raw block of one byte.
        let huge = [0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8, 0x09, 0x00, 0x00, 0x7a];
        assert_eq!(zstd_window(&huge), Some(1 << 41));
        // One segment of 2^40 bytes (an 8-byte content size).
        let mut single = vec![0x28, 0xb5, 0x2f, 0xfd, 0xe0];
        single.extend_from_slice(&(1u64 << 40).to_le_bytes());
        assert_eq!(zstd_window(&single), Some(1 << 40));
        for frame in [&huge[..], &single[..]] {
            let e = inflate(
                CompressionFormat::Zstandard,
                frame,
                1000,
                charge(&budget, 1000),
            )
            .unwrap_err();
            assert!(e.to_string().contains("window"), "{e}");
        }
        // A frame as ruzstd writes it: its window within the section.
        let z = ruzstd::encoding::compress_to_vec(
            &[5u8; 1000][..],
            ruzstd::encoding::CompressionLevel::Fastest,
        );
        assert!(zstd_window(&z).is_some_and(|w| w <= 1 << 20));
        assert!(
            inflate(
                CompressionFormat::Zstandard,
                &z,
                1000,
                charge(&budget, 1000)
            )
            .is_ok()
        );
    }
}
