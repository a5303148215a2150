//! Unwind sections that cannot be used in place ([`Copied`]): copied out of
//! a file a user may change, or inflated from a compressed section. They go
//! to a private unlinked file in the temporary directory (`$TMPDIR`, the
//! chart's `/tmp` volume), written a bounded buffer at a time and mapped
//! read-only: their pages are the kernel's page cache, which it can write
//! back and drop, and only the pages the unwinder reads are in this
//! process's memory. Where no such file can be made (no writable temporary
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
        let mut from = ReadAt {
            file,
            at: offset,
            end: offset.saturating_add(len),
        };
        Self::keep(len, charge, |to| pump(&mut from, to))
    }

    /// The section `data` compressed as `format` (zlib or zstd), inflated to
    /// exactly `len` bytes.
    pub(super) fn inflate(
        format: CompressionFormat,
        data: &[u8],
        len: u64,
        charge: Charge,
    ) -> std::io::Result<Self> {
        Self::keep(len, charge, |to| match format {
            CompressionFormat::Zlib => pump(&mut flate2::read::ZlibDecoder::new(data), to),
            CompressionFormat::Zstandard => zstd_frames(data, to),
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
    loop {
        match from.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => to.write_all(&buf[..n])?,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Inflates the zstd frames of `data` one after another (skippable frames
/// passed over), as a section compressed with zstd may hold several.
fn zstd_frames(mut data: &[u8], to: &mut Bounded<'_>) -> std::io::Result<()> {
    use ruzstd::decoding::StreamingDecoder;
    use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
    while !data.is_empty() {
        match StreamingDecoder::new(&mut data) {
            Ok(mut frame) => pump(&mut frame, to)?,
            Err(FrameDecoderError::ReadFrameHeaderError(ReadFrameHeaderError::SkipFrame {
                length,
                ..
            })) => {
                data = usize::try_from(length)
                    .ok()
                    .and_then(|l| data.get(l..))
                    .ok_or_else(|| invalid("a skippable zstd frame past the section's end"))?;
            }
            Err(e) => return Err(invalid(&format!("zstd: {e}"))),
        }
    }
    Ok(())
}

/// Reads a file's range `at..end` with positioned reads.
struct ReadAt<'f> {
    file: &'f File,
    at: u64,
    end: u64,
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
        let c = Copied::inflate(
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
            let e = Copied::inflate(CompressionFormat::Zlib, &z, stated, charge(&budget, stated))
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
        }
        // Not zlib at all.
        assert!(
            Copied::inflate(CompressionFormat::Zlib, b"garbage", 7, charge(&budget, 7)).is_err()
        );
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
        let c = Copied::inflate(
            CompressionFormat::Zstandard,
            &z,
            120_000,
            charge(&budget, 120_000),
        )
        .unwrap();
        assert_eq!(&c.bytes()[..70_000], &a[..]);
        assert_eq!(&c.bytes()[70_000..], &b[..]);
        assert!(
            Copied::inflate(
                CompressionFormat::Zstandard,
                &z,
                119_999,
                charge(&budget, 1)
            )
            .is_err()
        );
    }
}
