//! The decompression budget of one request: everything a request inflates
//! (its gzip transport encoding and every gzipped profile or text body inside
//! it) shares one `max_decompressed_size`, so a request of 256 gzipped
//! profiles, or a gzipped body of gzipped profiles, cannot inflate more than a
//! single limit's worth of memory.
//!
//! The budget also holds the request's grant of the collector-wide in-flight
//! memory budget (`service.limits.max_in_flight_bytes`): [`DecompressBudget::inflate`]
//! grows the grant before every allocation it makes, so the sum over all
//! concurrent requests stays bounded too, not just each one.

use bytes::Bytes;
use proflow_model::inflate::{self, InflateError};
use proflow_model::memory::{MemoryBudget, MemoryGrant};
use proflow_model::pprof::{self, DecodeError, Metadata};
use proflow_net::server::{ProfileLimits, ProfileSource};

use super::error::IngestError;

/// Most plain profile bytes one request keeps for the pipeline (see
/// [`DecompressBudget::scan`]): a typical push keeps all of its profiles',
/// a request of hundreds of large ones does not hold them all at once.
pub(crate) const KEPT_PLAIN_BYTES: usize = 4 << 20;

/// What one request may still decompress.
#[derive(Debug)]
pub(crate) struct DecompressBudget {
    /// `max_decompressed_size`, the whole budget.
    setting: usize,
    /// Bytes this request has already inflated.
    used: usize,
    /// Capacity of the plain profiles [`DecompressBudget::scan`] kept.
    kept: usize,
    /// Whether [`DecompressBudget::scan`] keeps plain bytes at all (only
    /// when something behind the receiver reads them).
    keep_plain: bool,
    /// The request's share of the in-flight memory budget.
    grant: MemoryGrant,
    /// The tenant's profile limits (none by default) and how the
    /// request's profiles came (see `profile_limits.rs`).
    profile_limits: ProfileLimits,
    source: ProfileSource,
    /// Frames cut from stacks deeper than the depth limit.
    truncated_frames: u64,
}

impl DecompressBudget {
    /// A fresh budget of `max_decompressed_size` bytes, whose allocations
    /// grow `grant`.
    pub fn with_grant(max_decompressed: usize, grant: MemoryGrant) -> Self {
        DecompressBudget {
            setting: max_decompressed,
            used: 0,
            kept: 0,
            keep_plain: true,
            grant,
            profile_limits: ProfileLimits::default(),
            source: ProfileSource::Converted,
            truncated_frames: 0,
        }
    }

    /// Checks the request's profiles against the tenant's `limits` (see
    /// `profile_limits.rs`), naming a size refusal as Pyroscope does for
    /// profiles that came as `source`.
    pub fn limit_profiles(&mut self, limits: ProfileLimits, source: ProfileSource) {
        self.profile_limits = limits;
        self.source = source;
    }

    /// The tenant's profile limits and how the profiles came.
    pub fn profile_limits(&self) -> (&ProfileLimits, ProfileSource) {
        (&self.profile_limits, self.source)
    }

    /// Counts `frames` cut from stacks deeper than the depth limit.
    pub fn add_truncated_frames(&mut self, frames: u64) {
        self.truncated_frames = self.truncated_frames.saturating_add(frames);
    }

    /// Adds the frames cut from stacks deeper than the depth limit to what
    /// the request lost.
    pub fn count_truncated(&self, lost: &mut proflow_model::lost::LostSamples) {
        lost.add_part(
            "frame",
            "max_profile_stacktrace_depth",
            self.truncated_frames,
        );
    }

    /// A budget with an in-flight grant of its own, large enough for
    /// everything it may decompress (fuzzing, tests).
    pub fn new(max_decompressed: usize) -> Self {
        let memory = MemoryBudget::new(max_decompressed.saturating_mul(4).max(1 << 20));
        DecompressBudget::with_grant(max_decompressed, memory.grant())
    }

    /// Inflates gzipped `compressed` within what the request may still
    /// decompress, growing the memory grant by every byte the output buffer
    /// allocates. Refuses `what()` past `max_decompressed_size` (413) or when
    /// the collector's in-flight budget has no room (429).
    pub fn inflate(
        &mut self,
        what: impl Fn() -> String,
        compressed: &[u8],
    ) -> Result<Vec<u8>, IngestError> {
        let out =
            inflate::inflate(compressed, self.remaining(), &mut self.grant).map_err(
                |e| match e {
                    InflateError::Corrupt(detail) => {
                        self.decode_error(&what(), DecodeError::Gzip(detail))
                    }
                    InflateError::TooLarge { .. } => self.too_large(&what()),
                    InflateError::OverBudget(e) => match IngestError::from_memory(e) {
                        IngestError::MemoryLimit(m) => {
                            IngestError::MemoryLimit(format!("{}: {m}", what()))
                        }
                        other => other,
                    },
                },
            )?;
        self.used += out.len();
        Ok(out)
    }

    /// Whether [`DecompressBudget::scan`] keeps the plain bytes it inflated
    /// for the pipeline (it does unless told otherwise).
    pub fn keep_plain(&mut self, keep: bool) {
        self.keep_plain = keep;
    }

    /// Grants `bytes` more of in-flight memory for a copy the request is
    /// about to make (429 when the collector has no room).
    pub fn reserve(&mut self, bytes: usize) -> Result<(), IngestError> {
        self.grant.try_grow(bytes).map_err(IngestError::from_memory)
    }

    /// Gives back the memory of a buffer [`DecompressBudget::inflate`] made
    /// that the request no longer holds (what it decompressed stays spent).
    pub fn release(&mut self, buffer: Vec<u8>) {
        self.grant.shrink(buffer.capacity());
    }

    /// Grows the request's grant by `bytes` now, or says why not.
    pub fn charge(&mut self, bytes: usize) -> Result<(), proflow_model::memory::OverBudget> {
        self.grant.try_grow(bytes)
    }

    /// `max_decompressed_size`.
    pub fn setting(&self) -> usize {
        self.setting
    }

    /// Bytes the request may still inflate.
    pub fn remaining(&self) -> usize {
        self.setting.saturating_sub(self.used)
    }

    /// `bytes` decompressed if gzipped (held by the request from now on),
    /// else as they are.
    pub fn decompress(
        &mut self,
        what: impl Fn() -> String,
        bytes: Bytes,
    ) -> Result<Bytes, IngestError> {
        if pprof::is_gzip(&bytes) {
            self.inflate(what, &bytes).map(Bytes::from)
        } else {
            Ok(bytes)
        }
    }

    /// Reads a pprof profile's metadata. A gzipped one is inflated within
    /// the budget; the plain bytes are returned too (see
    /// [`DecompressBudget::keep_plain`]), held by the request (their grant
    /// stays until it is answered) so the pipeline's processors need not
    /// inflate them again, while the request holds at most
    /// [`KEPT_PLAIN_BYTES`] of them; past that they are given back once read.
    pub fn scan(
        &mut self,
        what: impl Fn() -> String,
        profile: &[u8],
    ) -> Result<(Metadata, Option<Bytes>), IngestError> {
        if !pprof::is_gzip(profile) {
            // Plain bytes already sit in the request's memory: the setting
            // alone bounds them (a body that passed the request limits never
            // exceeds it).
            return pprof::scan_metadata(profile, self.setting)
                .map(|m| (m, None))
                .map_err(|e| self.decode_error(&what(), e));
        }
        let mut plain = self.inflate(&what, profile)?;
        let scanned = pprof::scan_metadata(&plain, plain.len());
        // A profile whose stacks the depth limit cuts is decoded next: its
        // plain bytes are kept for that whatever their size.
        let to_cut = |m: &Metadata| {
            self.profile_limits.max_depth > 0 && m.deepest_stack > self.profile_limits.max_depth
        };
        let kept = match scanned {
            Ok(ref m)
                if (self.keep_plain && self.kept + plain.len() <= KEPT_PLAIN_BYTES)
                    || to_cut(m) =>
            {
                // Kept at its length: the request holds no spare capacity.
                let before = plain.capacity();
                plain.shrink_to_fit();
                self.grant.shrink(before.saturating_sub(plain.capacity()));
                self.kept += plain.capacity();
                Some(Bytes::from(plain))
            }
            _ => {
                self.release(plain);
                None
            }
        };
        scanned
            .map(|m| (m, kept))
            .map_err(|e| self.decode_error(&what(), e))
    }

    /// Maps a failure to decompress or read `what` under this budget: running
    /// out of budget names `max_decompressed_size` and its configured value,
    /// not the remainder the call was given.
    pub fn decode_error(&self, what: &str, e: DecodeError) -> IngestError {
        match e {
            DecodeError::TooLarge { .. } => self.too_large(what),
            e => IngestError::from_decode(what, e),
        }
    }

    fn too_large(&self, what: &str) -> IngestError {
        let what = if self.used == 0 {
            what.to_owned()
        } else {
            format!(
                "{what}, with the {} bytes this request already decompressed,",
                self.used
            )
        };
        IngestError::DecompressedTooLarge {
            what,
            limit: self.setting,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gzipped_data_shares_one_budget() {
        let mut budget = DecompressBudget::new(100);
        let gz = pprof::gzip(&[1u8; 60]);
        assert_eq!(budget.inflate(|| "first".into(), &gz).unwrap().len(), 60);
        assert_eq!(budget.remaining(), 40);
        // Plain bytes inflate nothing and cost nothing.
        let plain = budget
            .decompress(|| "plain".into(), Bytes::from_static(b"plain"))
            .unwrap();
        assert_eq!(&plain[..], b"plain");
        assert_eq!(budget.remaining(), 40);
        let err = budget.inflate(|| "second".into(), &gz).unwrap_err();
        assert_eq!(
            err,
            IngestError::DecompressedTooLarge {
                what: "second, with the 60 bytes this request already decompressed,".into(),
                limit: 100
            }
        );
        assert!(
            err.to_string()
                .contains("max_decompressed_size (100 bytes)")
        );
        let err = budget.decode_error("third", DecodeError::TooLarge { limit: 40 });
        assert!(err.to_string().contains("(100 bytes)"), "{err}");
        let err = budget
            .inflate(|| "corrupt".into(), &[0x1f, 0x8b, 1, 2, 3])
            .unwrap_err();
        assert_eq!(err.reason(), "bad_request", "{err}");
    }

    #[tokio::test]
    async fn inflating_grows_the_memory_grant_and_is_refused_past_it() {
        let memory = MemoryBudget::new(1 << 20);
        let mut budget = DecompressBudget::with_grant(64 << 20, memory.grant());
        let small = pprof::gzip(&vec![7u8; 100 << 10]);
        let out = budget.inflate(|| "small".into(), &small).unwrap();
        assert_eq!(out.len(), 100 << 10);
        assert!(
            memory.in_flight() >= out.capacity(),
            "the buffer is counted: {} < {}",
            memory.in_flight(),
            out.capacity()
        );
        budget.release(out);
        assert_eq!(memory.in_flight(), 0);
        // 4 MiB of zeros gzip to a few KiB but can never fit a 1 MiB
        // budget: refused with 413 (sending it again cannot help), and
        // nothing stays held.
        let bomb = pprof::gzip(&vec![0u8; 4 << 20]);
        let err = budget.inflate(|| "the bomb".into(), &bomb).unwrap_err();
        assert_eq!(err.reason(), "too_large", "{err}");
        assert!(err.to_string().contains("max_in_flight_bytes"), "{err}");
        assert_eq!(memory.in_flight(), 0);
        // What fits but is held elsewhere now: 429, retry later.
        let hog = memory
            .acquire(900 << 10, proflow_model::memory::DEFAULT_WAIT)
            .await
            .unwrap();
        let some = pprof::gzip(&vec![0u8; 200 << 10]);
        let err = budget.inflate(|| "some".into(), &some).unwrap_err();
        assert_eq!(err.reason(), "memory_limit", "{err}");
        drop(hog);
        assert_eq!(memory.in_flight(), 0);
        drop(budget);
    }

    #[test]
    fn scanning_keeps_plain_bytes_for_the_pipeline_up_to_a_bound() {
        let mut b = pprof::ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds");
        // About 700 KB plain: a handful fit the bound, not ten.
        for i in 0..20_000 {
            b.sample_root_first(
                ["main", &format!("function_number_{i:08}_of_many")],
                vec![5],
            );
        }
        let plain = pprof::encode(&b.build());
        let gz = pprof::gzip(&plain);
        let memory = MemoryBudget::new(64 << 20);
        let mut budget = DecompressBudget::with_grant(64 << 20, memory.grant());
        let (meta, kept) = budget.scan(|| "p".into(), &gz).unwrap();
        assert_eq!(meta.sample_types.len(), 1);
        let kept = kept.expect("the first profile's plain bytes are kept");
        assert_eq!(kept, plain, "they are the profile, inflated");
        assert_eq!(
            memory.in_flight(),
            kept.len(),
            "the request's grant holds them, and no spare capacity"
        );
        let mut given_back = 0;
        for _ in 0..10 {
            let before = memory.in_flight();
            let (_, kept) = budget.scan(|| "p".into(), &gz).unwrap();
            if kept.is_none() {
                given_back += 1;
                assert_eq!(
                    memory.in_flight(),
                    before,
                    "a buffer not kept is given back"
                );
            }
        }
        assert!(given_back > 0, "past the bound nothing more is kept");
        assert!(memory.in_flight() <= KEPT_PLAIN_BYTES);
        // Plain input is not copied.
        let (_, kept) = budget.scan(|| "p".into(), &plain).unwrap();
        assert!(kept.is_none());
        drop(budget);
        assert_eq!(
            memory.in_flight(),
            0,
            "answering the request gives all back"
        );
        // Nothing behind the receiver reads them: nothing is kept.
        let mut budget = DecompressBudget::with_grant(64 << 20, memory.grant());
        budget.keep_plain(false);
        let (_, kept) = budget.scan(|| "p".into(), &gz).unwrap();
        assert!(kept.is_none());
        assert_eq!(memory.in_flight(), 0);
    }
}
