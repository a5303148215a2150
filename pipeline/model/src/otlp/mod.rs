//! OTLP profiles (proto 1.10, `v1development`): the messages, through the
//! `opentelemetry-proto` crate, and the conversions between them and pprof.
//!
//! - [`DictionaryBuilder`] builds the deduplicated dictionary one OTLP
//!   request shares across all its profiles (every table's entry 0 is the
//!   zero value, as the spec requires).
//! - [`pprof_to_otlp`]: one OTLP profile per pprof sample type, all sharing
//!   the dictionary; sample labels become attributes (numeric ones keep their
//!   unit), but a `trace_id` and `span_id` pair of valid ids becomes the
//!   sample's link; a mapping's build id becomes `process.executable.build_id.gnu`.
//! - [`otlp_to_pprof`]: profiles of one time window and period merge into one
//!   pprof with a sample type per profile (samples with the same stack,
//!   attributes and link add up); links become `trace_id`/`span_id` labels.
//!   Indexes are checked against their tables first: a request from a sender
//!   on an older OTLP profiles version decodes into nonsense without any
//!   protobuf error, and must be refused, not converted.
//!
//! - [`OtlpProfiles`]: the OTLP form of a payload, and the one mapping
//!   between attributes and series labels ([`AttributeLabels`]).
//! - [`check_dictionary`], [`check_dictionary_references`], [`check_profile`]:
//!   the structural checks a receiver makes before accepting a profile.
//! - [`RequestBuilder`]: one request from many payloads' OTLP forms, sharing
//!   one deduplicated dictionary (written by reference when they share one).
//! - [`check_dictionary_wire`], [`check_profile_wire`]: the same checks on
//!   the protobuf bytes, without decoding them.
//! - [`json`]: OTLP JSON for requests (the crate's serde is not OTLP JSON).
//!
//! Whatever one form cannot carry is counted in [`Lost`], never dropped
//! silently. What may depend on this: receivers, processors and exporters.

mod check;
mod data;
mod dictionary;
mod form;
mod from_pprof;
pub mod json;
mod older;
mod request;
mod split;
#[cfg(test)]
mod tests;
mod to_pprof;
mod wire_check;
mod wire_merge;

use std::collections::BTreeMap;

pub use opentelemetry_proto::tonic::collector::profiles::v1development as collector;
pub use opentelemetry_proto::tonic::common::v1 as common;
pub use opentelemetry_proto::tonic::profiles::v1development as proto;
pub use opentelemetry_proto::tonic::resource::v1::Resource;

pub use check::{MAX_VALUE_NESTING, check_dictionary, check_dictionary_references, check_profile};
pub use data::{ProfileData, SharedDictionary, decode_all};
pub use dictionary::DictionaryBuilder;
pub use form::{
    AttributeLabels, OtlpContext, OtlpProfiles, SEMCONV_KEYS, SERVICE_NAME_KEY, attribute_key,
    context_heap_size, dictionary_heap_size, inline_attributes, inline_attributes_with, label_name,
    profile_heap_size,
};
pub use from_pprof::{SPAN_ID_LABEL, TRACE_ID_LABEL, pprof_to_otlp};
pub use older::{is_1_9, upgrade_1_9};
pub use request::{Request, RequestBuilder};
pub use split::{Split, SplitError, split_decoded, split_raw};
pub use to_pprof::{otlp_to_pprof, otlp_to_pprof_checked};
pub use wire_check::{DictionaryIndex, ProfileFacts, check_dictionary_wire, check_profile_wire};
pub use wire_merge::{Remap, WireMerge};

/// The attribute a mapping's build id is written under (Go's pprof writer
/// records the ELF GNU build id).
pub const BUILD_ID_KEY: &str = "process.executable.build_id.gnu";

/// Every build id attribute read back into a pprof mapping, preferred first.
pub const BUILD_ID_KEYS: [&str; 4] = [
    BUILD_ID_KEY,
    "process.executable.build_id.go",
    "process.executable.build_id.htlhash",
    "process.executable.build_id.profiling",
];

/// Why a profile cannot be converted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConvertError(pub String);

impl ConvertError {
    fn new(message: impl Into<String>) -> Self {
        ConvertError(message.into())
    }
}

/// What a conversion could not carry over, counted by what it was.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lost {
    pub counts: BTreeMap<&'static str, usize>,
}

impl Lost {
    pub(crate) fn add(&mut self, what: &'static str, n: usize) {
        if n > 0 {
            *self.counts.entry(what).or_default() += n;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }
}

/// Lower-case hex, as OTLP writes trace, span and profile ids.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 15)]));
    }
    s
}

/// An id of exactly `N` bytes from `2 * N` hex digits (either case); `None`
/// for anything else (no sign, no spaces, no other length).
pub fn id_from_hex<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = [0u8; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = (nibble(digits[2 * i])? << 4) | nibble(digits[2 * i + 1])?;
    }
    Some(out)
}

/// A table index as OTLP writes it; tables are bounded far below `i32::MAX`
/// by the element caps every decoder applies first.
fn index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}
