//! The decompression budget of one request: everything a request inflates
//! (its gzip transport encoding and every gzipped profile or text body inside
//! it) shares one `max_decompressed_size`, so a request of 256 gzipped
//! profiles, or a gzipped body of gzipped profiles, cannot inflate more than a
//! single limit's worth of memory.

use proflow_pipeline::pprof::{self, DecodeError};

use super::error::IngestError;

/// What one request may still decompress.
#[derive(Debug)]
pub(crate) struct DecompressBudget {
    /// `max_decompressed_size`, the whole budget.
    setting: usize,
    /// Bytes this request has already inflated.
    used: usize,
}

impl DecompressBudget {
    /// A fresh budget of `max_decompressed_size` bytes.
    pub fn new(max_decompressed: usize) -> Self {
        DecompressBudget {
            setting: max_decompressed,
            used: 0,
        }
    }

    /// `max_decompressed_size`.
    pub fn setting(&self) -> usize {
        self.setting
    }

    /// Bytes the request may still inflate.
    pub fn remaining(&self) -> usize {
        self.setting.saturating_sub(self.used)
    }

    /// The limit to decompress `bytes` with: the remaining budget when they are
    /// gzipped. Plain bytes already sit in the request's memory and inflate
    /// nothing, so they are held only to the setting itself (which a body that
    /// passed the request limits never exceeds).
    pub fn limit_for(&self, bytes: &[u8]) -> usize {
        if pprof::is_gzip(bytes) {
            self.remaining()
        } else {
            self.setting
        }
    }

    /// Records that `compressed` was inflated to `inflated` bytes (nothing when
    /// it was not gzipped); refuses `what()` when that passes the budget.
    pub fn charge(
        &mut self,
        what: impl FnOnce() -> String,
        compressed: &[u8],
        inflated: usize,
    ) -> Result<(), IngestError> {
        if !pprof::is_gzip(compressed) {
            return Ok(());
        }
        self.charge_inflated(what, inflated)
    }

    /// Records `inflated` bytes of decompressed data; refuses `what()` past
    /// the budget.
    pub fn charge_inflated(
        &mut self,
        what: impl FnOnce() -> String,
        inflated: usize,
    ) -> Result<(), IngestError> {
        if inflated > self.remaining() {
            return Err(self.too_large(&what()));
        }
        self.used += inflated;
        Ok(())
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
        assert_eq!(budget.limit_for(&gz), 100);
        budget.charge(|| "first".into(), &gz, 60).unwrap();
        assert_eq!(budget.limit_for(&gz), 40);
        // Plain bytes inflate nothing and cost nothing.
        assert_eq!(budget.limit_for(b"plain"), 100);
        budget.charge(|| "plain".into(), b"plain", 5).unwrap();
        assert_eq!(budget.remaining(), 40);
        let err = budget.charge(|| "second".into(), &gz, 60).unwrap_err();
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
    }
}
