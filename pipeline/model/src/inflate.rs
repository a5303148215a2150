//! Gzip inflation under a memory grant: the output buffer grows only by
//! what the in-flight budget grants first, and never past a limit, so a
//! decompression bomb costs at most the limit and only memory somebody
//! counted. Every receiver that inflates what a sender sent uses this one.
//!
//! What may depend on this: receivers.

use std::io::Read;

use crate::memory::{MemoryGrant, OverBudget};

/// The gzip magic bytes.
pub const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// True when `bytes` start with the gzip magic.
pub fn is_gzip(bytes: &[u8]) -> bool {
    bytes.len() >= 2 && bytes[..2] == GZIP_MAGIC
}

/// How much is inflated at a time.
const STEP: usize = 32 << 10;

thread_local! {
    /// Each thread's step buffer, made once (a fresh one was 32 KiB zeroed
    /// for every profile).
    static STEP_BUF: std::cell::RefCell<Box<[u8]>> =
        std::cell::RefCell::new(vec![0u8; STEP].into_boxed_slice());
}

/// Why inflating failed; nothing stays granted for the output then.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InflateError {
    /// Not a gzip stream, or a damaged one.
    #[error("corrupt gzip data ({0})")]
    Corrupt(String),
    /// The output would pass `limit` bytes.
    #[error("inflates to more than {limit} bytes")]
    TooLarge { limit: usize },
    /// The in-flight budget had no room for the next step.
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
}

/// The plain size gzip's trailer states (of the last member, modulo 4 GiB).
pub(crate) fn stated_size(compressed: &[u8]) -> Option<usize> {
    // The smallest gzip member is 18 bytes (10 of header, 8 of trailer).
    let trailer = compressed
        .len()
        .checked_sub(4)
        .filter(|_| compressed.len() >= 18)?;
    let bytes: [u8; 4] = compressed[trailer..].try_into().ok()?;
    usize::try_from(u32::from_le_bytes(bytes)).ok()
}

/// Inflates (every member of) gzip `compressed` to at most `limit` bytes,
/// growing `grant` before every allocation of the output. The trailer's
/// stated size sizes the output at once (one allocation for an honest
/// single-member stream); a stream that states more than `limit` is too
/// large (the whole stream is at least its last member) or has a damaged
/// trailer, and is refused without keeping anything it inflates. Past the
/// stated size, the output doubles, never past `limit`. On
/// success the grant holds the output's capacity; on failure it holds
/// nothing more than before.
pub fn inflate(
    compressed: &[u8],
    limit: usize,
    grant: &mut MemoryGrant,
) -> Result<Vec<u8>, InflateError> {
    inflate_after(&[], compressed, limit, grant)
}

/// [`inflate`], with the output starting with `prefix` (a frame's header,
/// so the inflated bytes need not be copied behind it); `limit` bounds
/// what is inflated, the prefix aside.
pub fn inflate_after(
    prefix: &[u8],
    compressed: &[u8],
    limit: usize,
    grant: &mut MemoryGrant,
) -> Result<Vec<u8>, InflateError> {
    STEP_BUF.with(|step| match step.try_borrow_mut() {
        Ok(mut step) => inflate_through(prefix, compressed, limit, grant, &mut step[..]),
        // Re-entered on this thread (never done): a buffer of its own.
        Err(_) => inflate_through(prefix, compressed, limit, grant, &mut vec![0u8; STEP]),
    })
}

/// Why a stream whose trailer states more than `limit` fails: it is too
/// large, or (a damaged trailer) corrupt. Told apart by inflating it into
/// nothing, at most `limit + 1` bytes: no memory, bounded work.
fn oversized(compressed: &[u8], limit: usize, step: &mut [u8]) -> InflateError {
    let mut decoder = flate2::bufread::MultiGzDecoder::new(compressed);
    let mut total = 0usize;
    loop {
        match decoder.read(step) {
            Ok(0) => {
                return InflateError::Corrupt(
                    "the trailer states more than the stream holds".into(),
                );
            }
            Ok(n) => {
                total += n;
                if total > limit {
                    return InflateError::TooLarge { limit };
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return InflateError::Corrupt(e.to_string()),
        }
    }
}

/// Runs `read` on the plain bytes of `bytes`: `bytes` themselves, or, when
/// they are gzip, their inflation under `grant` (at most `limit` bytes),
/// given back once `read` returned. For a check that needs the plain bytes
/// only for a moment (a scan).
pub fn read_plain<T>(
    bytes: &[u8],
    limit: usize,
    grant: &mut MemoryGrant,
    read: impl FnOnce(&[u8]) -> T,
) -> Result<T, InflateError> {
    if !is_gzip(bytes) {
        return Ok(read(bytes));
    }
    let plain = inflate(bytes, limit, grant)?;
    let out = read(&plain);
    grant.shrink(plain.capacity());
    Ok(out)
}

/// What [`inflate_whole`] did.
pub(crate) enum Whole {
    /// The stream was one member of the stated size, inflated and checked.
    Done,
    /// It is not (more members, reserved header flags or a header CRC, or
    /// more bytes than stated): inflate it as a stream instead.
    Stream,
}

/// libdeflate's decompressor (its tables, about 10 KiB): one per thread,
/// made at the thread's first stream, never per request.
struct Decompressor(std::ptr::NonNull<libdeflate_sys::libdeflate_decompressor>);

impl Drop for Decompressor {
    fn drop(&mut self) {
        // SAFETY: made by libdeflate_alloc_decompressor, freed once, here.
        unsafe { libdeflate_sys::libdeflate_free_decompressor(self.0.as_ptr()) }
    }
}

thread_local! {
    static WHOLE: std::cell::RefCell<Option<Decompressor>> =
        const { std::cell::RefCell::new(None) };
}

/// Inflates a single-member stream in one call (libdeflate) into `out`'s
/// spare capacity, which the caller sized to the trailer's stated size: no
/// step buffer, no copy, no state allocated. libdeflate checks the header,
/// the trailer's CRC-32 and size. The plain bytes start at `out[start..]`.
pub(crate) fn inflate_whole(
    compressed: &[u8],
    out: &mut Vec<u8>,
    start: usize,
) -> Result<Whole, InflateError> {
    // Reserved header flags, or a header CRC (FHCRC, which libdeflate skips
    // unchecked and Go's reader checks): the stream path's reader decides.
    const FHCRC: u8 = 2;
    if compressed.len() < 18 || compressed[3] & (0xe0 | FHCRC) != 0 {
        return Ok(Whole::Stream);
    }
    WHOLE.with(|cell| {
        // Re-entered on this thread (never done): the stream path.
        let Ok(mut cell) = cell.try_borrow_mut() else {
            return Ok(Whole::Stream);
        };
        let decompressor = match &*cell {
            Some(d) => d.0,
            None => {
                // SAFETY: allocates a decompressor; null when out of memory.
                let made = unsafe { libdeflate_sys::libdeflate_alloc_decompressor() };
                let Some(d) = std::ptr::NonNull::new(made) else {
                    return Ok(Whole::Stream);
                };
                *cell = Some(Decompressor(d));
                d
            }
        };
        let spare = out.spare_capacity_mut();
        let (mut used, mut made) = (0usize, 0usize);
        // SAFETY: the decompressor is this thread's alone; the input is
        // `compressed.len()` readable bytes; the output is `spare.len()`
        // writable bytes (uninitialised memory libdeflate only writes).
        let result = unsafe {
            libdeflate_sys::libdeflate_gzip_decompress_ex(
                decompressor.as_ptr(),
                compressed.as_ptr().cast(),
                compressed.len(),
                spare.as_mut_ptr().cast(),
                spare.len(),
                &mut used,
                &mut made,
            )
        };
        match result {
            libdeflate_sys::libdeflate_result_LIBDEFLATE_SUCCESS if made <= spare.len() => {
                // SAFETY: libdeflate wrote `made` bytes at the start of the
                // spare capacity, and `made` fits in it.
                unsafe { out.set_len(out.len() + made) };
                if used == compressed.len() {
                    return Ok(Whole::Done);
                }
                // Another member follows (or bytes that are not one, which
                // the stream path reports).
                out.truncate(start);
                Ok(Whole::Stream)
            }
            libdeflate_sys::libdeflate_result_LIBDEFLATE_BAD_DATA => Err(InflateError::Corrupt(
                "bad deflate data, header, CRC-32 or size".into(),
            )),
            // More than the trailer states (another member after this one,
            // or a lie the stream path bounds).
            _ => Ok(Whole::Stream),
        }
    })
}

fn inflate_through(
    prefix: &[u8],
    compressed: &[u8],
    limit: usize,
    grant: &mut MemoryGrant,
    step: &mut [u8],
) -> Result<Vec<u8>, InflateError> {
    // The output may reach the limit plus the prefix.
    let cap = limit.saturating_add(prefix.len());
    let stated = stated_size(compressed);
    if stated.is_some_and(|s| s > limit) {
        return Err(oversized(compressed, limit, step));
    }
    let mut out: Vec<u8> = Vec::new();
    let first = stated.unwrap_or(0).saturating_add(prefix.len());
    if first > 0 {
        grant.try_grow(first)?;
        out.reserve_exact(first);
    }
    out.extend_from_slice(prefix);
    if stated.is_some() {
        match inflate_whole(compressed, &mut out, prefix.len()) {
            Ok(Whole::Done) => return Ok(out),
            Ok(Whole::Stream) => out.truncate(prefix.len()),
            Err(e) => {
                grant.shrink(out.capacity());
                return Err(e);
            }
        }
    }
    let mut decoder = flate2::bufread::MultiGzDecoder::new(compressed);
    let give_back = |grant: &mut MemoryGrant, out: &Vec<u8>| grant.shrink(out.capacity());
    loop {
        let n = match decoder.read(step) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                give_back(grant, &out);
                return Err(InflateError::Corrupt(e.to_string()));
            }
        };
        let len = out.len() + n;
        if len > cap {
            give_back(grant, &out);
            return Err(InflateError::TooLarge { limit });
        }
        if len > out.capacity() {
            let old = out.capacity();
            let want = (old * 2)
                .max(compressed.len().saturating_mul(4))
                .max(len)
                .min(cap);
            // The old and the new buffer are both held while one is copied
            // into the other: both granted for that moment.
            if let Err(e) = grant.try_grow(want) {
                give_back(grant, &out);
                return Err(e.into());
            }
            out.reserve_exact(want - out.len());
            grant.shrink(old);
        }
        out.extend_from_slice(&step[..n]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBudget;

    fn gzip(data: &[u8]) -> Vec<u8> {
        crate::pprof::gzip(data).to_vec()
    }

    #[test]
    fn inflates_within_the_grant_and_the_limit() {
        let budget = MemoryBudget::new(8 << 20);
        let mut grant = budget.grant();
        let data = vec![5u8; 300_000];
        let out = inflate(&gzip(&data), 1 << 20, &mut grant).unwrap();
        assert_eq!(out, data);
        assert!(
            grant.held() >= out.capacity(),
            "{} < {}",
            grant.held(),
            out.capacity()
        );
        // Two members are one stream.
        let mut two = gzip(b"ab");
        two.extend(gzip(b"cd"));
        assert_eq!(inflate(&two, 10, &mut budget.grant()).unwrap(), b"abcd");
    }

    #[test]
    fn the_stated_size_sizes_the_output_and_refuses_a_bomb_at_once() {
        let budget = MemoryBudget::new(64 << 20);
        let mut grant = budget.grant();
        let data = vec![3u8; 1_000_003];
        let out = inflate(&gzip(&data), 2 << 20, &mut grant).unwrap();
        assert_eq!(
            out.capacity(),
            data.len(),
            "one allocation, of the stated size"
        );
        assert_eq!(grant.held(), data.len());
        drop((out, grant));
        // A bomb states its size: refused before a byte is inflated.
        let bomb = gzip(&vec![0u8; 4 << 20]);
        let mut grant = budget.grant();
        assert_eq!(
            inflate(&bomb, 2 << 20, &mut grant),
            Err(InflateError::TooLarge { limit: 2 << 20 })
        );
        assert_eq!(grant.held(), 0);
        // A trailer that understates (here: a second member) still works.
        let mut two = gzip(&vec![1u8; 100_000]);
        two.extend(gzip(b"x"));
        assert_eq!(inflate(&two, 1 << 20, &mut grant).unwrap().len(), 100_001);
        // One that lies is corrupt (the check at the end of the member).
        let mut lying = gzip(&data);
        let n = lying.len();
        lying[n - 4..].copy_from_slice(&10u32.to_le_bytes());
        assert!(matches!(
            inflate(&lying, 2 << 20, &mut budget.grant()),
            Err(InflateError::Corrupt(_))
        ));
        drop(grant);
        assert_eq!(budget.in_flight(), 0);
    }

    /// A single member of the stated size is inflated in one call, whatever
    /// optional header fields it carries; anything else goes to the stream.
    #[test]
    fn one_member_is_inflated_in_one_call_and_checked() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 7) as u8).collect();
        let plain = gzip(&data);
        // The same member with FEXTRA, FNAME and FCOMMENT set.
        let mut flagged = plain[..10].to_vec();
        flagged[3] = 4 | 8 | 16;
        flagged.extend_from_slice(&[3, 0, b'a', b'b', b'c']);
        flagged.extend_from_slice(b"profile.pb\0a comment\0");
        flagged.extend_from_slice(&plain[10..]);
        for gz in [&plain[..], &flagged[..]] {
            let mut out = b"head".to_vec();
            out.reserve_exact(data.len());
            assert!(matches!(inflate_whole(gz, &mut out, 4), Ok(Whole::Done)));
            assert_eq!(&out[..4], b"head");
            assert_eq!(&out[4..], &data[..]);
            let budget = MemoryBudget::new(8 << 20);
            assert_eq!(inflate(gz, 1 << 20, &mut budget.grant()).unwrap(), data);
        }
        // A header CRC goes to the stream path, whose reader checks it: a
        // wrong one is corrupt, as Go's reader says too.
        let mut with_crc = flagged.clone();
        with_crc[3] |= 2;
        let at = 10 + 5 + b"profile.pb\0a comment\0".len();
        with_crc.splice(at..at, [0x12, 0x34]);
        let mut out = Vec::with_capacity(data.len());
        assert!(matches!(
            inflate_whole(&with_crc, &mut out, 0),
            Ok(Whole::Stream)
        ));
        let budget = MemoryBudget::new(8 << 20);
        assert!(matches!(
            inflate(&with_crc, 1 << 20, &mut budget.grant()),
            Err(InflateError::Corrupt(_))
        ));
        // Two members: the first fits, and the stream path takes over.
        let mut two = gzip(b"ab");
        two.extend(gzip(b"cd"));
        let mut out = Vec::with_capacity(2);
        assert!(matches!(
            inflate_whole(&two, &mut out, 0),
            Ok(Whole::Stream)
        ));
        // A damaged CRC, a cut stream and damaged deflate data are corrupt.
        let mut bad_crc = plain.to_vec();
        let n = bad_crc.len();
        bad_crc[n - 8] ^= 1;
        let cut = &plain[..plain.len() / 2];
        let mut bad_data = plain.to_vec();
        bad_data[12] ^= 0xff;
        // A size one more than the data, with the CRC right: the output has
        // room, so only the size check can tell.
        let mut bad_size = plain.to_vec();
        let n = bad_size.len();
        bad_size[n - 4..].copy_from_slice(&(data.len() as u32 + 1).to_le_bytes());
        for (gz, what) in [
            (&bad_crc[..], "CRC"),
            (cut, "cut"),
            (&bad_data[..], "damaged"),
            (&bad_size[..], "size"),
        ] {
            let budget = MemoryBudget::new(8 << 20);
            let mut grant = budget.grant();
            assert!(
                matches!(
                    inflate(gz, 1 << 20, &mut grant),
                    Err(InflateError::Corrupt(_))
                ),
                "{what}"
            );
            assert_eq!(grant.held(), 0, "{what}");
        }
    }

    #[test]
    fn failures_hold_nothing() {
        let budget = MemoryBudget::new(1 << 20);
        let bomb = gzip(&vec![0u8; 4 << 20]);
        let mut grant = budget.grant();
        assert!(matches!(
            inflate(&bomb, 8 << 20, &mut grant),
            Err(InflateError::OverBudget(OverBudget { limit, .. })) if limit == 1 << 20
        ));
        assert_eq!(budget.in_flight(), 0);
        let big = MemoryBudget::new(64 << 20);
        let mut grant = big.grant();
        assert_eq!(
            inflate(&bomb, 1 << 20, &mut grant),
            Err(InflateError::TooLarge { limit: 1 << 20 })
        );
        // A trailer that understates a bomb: refused once past the limit.
        let mut hidden = bomb.clone();
        let n = hidden.len();
        hidden[n - 4..].copy_from_slice(&16u32.to_le_bytes());
        assert_eq!(
            inflate(&hidden, 1 << 20, &mut grant),
            Err(InflateError::TooLarge { limit: 1 << 20 })
        );
        assert!(matches!(
            inflate(&[0x1f, 0x8b, 8, 0, 1, 2], 100, &mut grant),
            Err(InflateError::Corrupt(_))
        ));
        assert_eq!(big.in_flight(), 0);
    }
}
