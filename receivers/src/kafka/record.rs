//! One Kafka record into envelopes: the encoding from proflow's header, the
//! receiver's `encoding`, or a sniff of the value; labels, time range and
//! tenant from proflow's headers where the record has them
//! ([`proflow_kafka`]), else from the profile itself.
//!
//! Everything decoding allocates is granted from the in-flight memory
//! budget first: a gzip value inflates under the grant, an OTLP JSON value
//! is granted what its shape says decoding takes
//! ([`otlp::json::decode_cost`]). A grant the budget cannot give now is
//! [`RecordError::Memory`]: the receiver waits for room and decodes the
//! record again, it does not skip it.

use bytes::Bytes;
use proflow_kafka::{Encoding, RecordHeaders, sniff_encoding};
use proflow_model::model::{
    Envelope, Labels, Payload, SERVICE_NAME_LABEL, TENANT_LABEL, now_unix_nanos,
};
use proflow_model::otlp::{self, AttributeLabels};
use proflow_model::pprof;
use proflow_model::profile_type::profile_name_from_sample_types;

use proflow_model::inflate::{self, InflateError};
use proflow_model::memory::{MemoryGrant, OverBudget};
use proflow_model::model::UNKNOWN_SERVICE;

/// Why a record was not decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RecordError {
    /// The record itself is broken or too large: skip it (counted).
    Invalid(String),
    /// The memory budget has no room for it now: try again once it has.
    Memory(OverBudget),
}

impl From<String> for RecordError {
    fn from(why: String) -> Self {
        RecordError::Invalid(why)
    }
}

/// The profiles of one record.
#[derive(Debug, Default)]
pub struct Decoded {
    pub envelopes: Vec<Envelope>,
    /// Profiles of an OTLP request refused alone.
    pub rejected: u64,
    /// Why, when `rejected > 0`.
    pub rejected_message: String,
    pub tenant: Option<String>,
    /// An OTLP profiles 1.9 value, made 1.10 first.
    pub from_1_9: bool,
    /// Attributes of an OTLP value that became no label, by reason.
    pub lost_labels: proflow_model::lost::LostSamples,
}

/// How records are read.
#[derive(Debug, Clone)]
pub(crate) struct Reading {
    /// `None`: proflow's header, else a sniff of the value.
    pub encoding: Option<Encoding>,
    /// Most bytes a pprof value may inflate to, or an OTLP JSON value take
    /// once decoded.
    pub max_decompressed: usize,
    pub mapping: AttributeLabels,
}

/// The envelopes of one record, or why the whole record is refused; what
/// decoding allocates is granted from `grant` first.
pub(crate) fn decode(
    value: Bytes,
    headers: RecordHeaders,
    reading: &Reading,
    grant: &mut MemoryGrant,
) -> Result<Decoded, RecordError> {
    if value.is_empty() {
        return Err(RecordError::Invalid("the record has no value".to_owned()));
    }
    let encoding = reading
        .encoding
        .or(headers.encoding)
        .unwrap_or_else(|| sniff_encoding(&value));
    let mut decoded = match encoding {
        Encoding::Pprof => pprof_record(value, &headers, reading.max_decompressed, grant)?,
        Encoding::OtlpProto | Encoding::OtlpJson => {
            let split = if encoding == Encoding::OtlpProto {
                otlp::split_raw(&value, &reading.mapping)
            } else {
                let estimate = otlp::json::decode_cost(&value);
                if estimate > reading.max_decompressed {
                    return Err(RecordError::Invalid(format!(
                        "the OTLP JSON value would take up to {estimate} bytes once decoded, more than max_decompressed_size ({} bytes)",
                        reading.max_decompressed
                    )));
                }
                grant.try_grow(estimate).map_err(RecordError::Memory)?;
                let request = otlp::json::decode_request(&value)
                    .map_err(|e| format!("the value is not OTLP JSON: {e}"))?;
                otlp::split_decoded(request, &reading.mapping)
            }
            .map_err(|e| e.message)?;
            let mut envelopes = split.envelopes;
            // A record proflow wrote holds one profile and its exact labels.
            if envelopes.len() == 1 && !headers.labels.is_empty() {
                envelopes[0].labels = headers.labels.clone();
                // The record's tenant header is its tenant.
                envelopes[0].labels.remove(TENANT_LABEL);
            }
            Decoded {
                envelopes,
                rejected: split.rejected,
                rejected_message: split.error_message,
                tenant: None,
                from_1_9: split.from_1_9,
                lost_labels: split.lost_labels,
            }
        }
    };
    decoded.tenant = headers.tenant;
    Ok(decoded)
}

/// A gzip (or plain) pprof value: scanned, never decoded; its bytes are the
/// payload as they arrived. A gzip one is inflated under `grant` for the
/// scan, and the plain bytes let go after it.
fn pprof_record(
    value: Bytes,
    headers: &RecordHeaders,
    limit: usize,
    grant: &mut MemoryGrant,
) -> Result<Decoded, RecordError> {
    let not_pprof =
        |e: String| format!("the value is not a pprof profile within max_decompressed_size: {e}");
    let scanned = inflate::read_plain(&value, limit, grant, |plain| {
        pprof::scan_metadata(plain, limit)
    })
    .map_err(|e| match e {
        InflateError::OverBudget(e) => RecordError::Memory(e),
        e => RecordError::Invalid(not_pprof(e.to_string())),
    })?;
    let mut meta = scanned.map_err(|e| not_pprof(e.to_string()))?;
    let mut labels = if headers.labels.is_empty() {
        Labels::from_pairs([(SERVICE_NAME_LABEL, UNKNOWN_SERVICE)])
    } else {
        headers.labels.clone()
    };
    // The record's tenant header is its tenant.
    labels.remove(TENANT_LABEL);
    if labels.get("__name__").is_none() {
        match profile_name_from_sample_types(
            meta.sample_types.iter().map(|(t, _)| t.as_str()),
            None,
        ) {
            Some(name) => labels.set("__name__", name),
            None => {
                return Err(RecordError::Invalid(
                    "the pprof profile has no named sample types and the record names no profile type (proflow.label.__name__)"
                        .to_owned(),
                ));
            }
        }
    }
    let start = headers.start_unix_nanos.unwrap_or(match meta.time_nanos {
        0 => now_unix_nanos(),
        t => t,
    });
    let end = headers
        .end_unix_nanos
        .unwrap_or_else(|| start.saturating_add(meta.duration_nanos.max(0)));
    let (sample_types, period_type) = meta.take_value_types();
    Ok(Decoded {
        envelopes: vec![Envelope {
            labels,
            start_unix_nanos: start,
            end_unix_nanos: end,
            sample_types,
            period_type,
            period: meta.period,
            payload: Payload::from_bytes(value, limit),
        }],
        ..Decoded::default()
    })
}

/// Entry points for the fuzz targets in `fuzz/` (feature `kafka-record`,
/// which compiles this file alone as `kafka_record`): one record's headers
/// and value, read as the receiver reads them. Not a stable API.
#[cfg(all(feature = "kafka-record", not(feature = "kafka")))]
pub mod fuzzing {
    use bytes::Bytes;
    use proflow_kafka::{Encoding, RecordHeaders};
    use proflow_model::memory::MemoryBudget;
    use proflow_model::otlp::AttributeLabels;

    pub use super::Decoded;

    /// Most bytes a value may inflate to (or OTLP JSON take) here.
    pub const MAX_DECOMPRESSED: usize = 1 << 20;

    /// The headers (Kafka's: a name and maybe a value each) and value of one
    /// record, read with the receiver's `encoding` (`None`: the header's, else
    /// a sniff). `Err` is why the record is refused.
    pub fn decode<'a>(
        headers: impl IntoIterator<Item = (&'a str, Option<&'a [u8]>)>,
        value: &[u8],
        encoding: Option<Encoding>,
    ) -> Result<(RecordHeaders, Decoded), String> {
        let headers = RecordHeaders::from_pairs(headers)?;
        let reading = super::Reading {
            encoding,
            max_decompressed: MAX_DECOMPRESSED,
            mapping: AttributeLabels::default(),
        };
        // A budget with room for anything a record may take here, so a
        // refusal is the record's, and what decoding holds is checked.
        let budget = MemoryBudget::new(16 * MAX_DECOMPRESSED);
        let mut grant = budget.grant();
        let decoded = super::decode(
            Bytes::copy_from_slice(value),
            headers.clone(),
            &reading,
            &mut grant,
        )
        .map_err(|e| match e {
            super::RecordError::Invalid(why) => why,
            super::RecordError::Memory(e) => panic!("a record wanted more than it may: {e}"),
        })?;
        Ok((headers, decoded))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_model::memory::MemoryBudget;
    use proflow_model::pprof::ProfileBuilder;

    /// Decodes under a grant of a budget with room to spare; a refusal as
    /// its message.
    fn decode(value: Bytes, headers: RecordHeaders, reading: &Reading) -> Result<Decoded, String> {
        let budget = MemoryBudget::new(256 << 20);
        match super::decode(value, headers, reading, &mut budget.grant()) {
            Ok(d) => Ok(d),
            Err(RecordError::Invalid(why)) => Err(why),
            Err(RecordError::Memory(e)) => panic!("no room in a budget of 256 MiB: {e}"),
        }
    }

    fn reading(encoding: Option<Encoding>) -> Reading {
        Reading {
            encoding,
            max_decompressed: 1 << 20,
            mapping: AttributeLabels::default(),
        }
    }

    fn gz_profile() -> Bytes {
        let mut b = ProfileBuilder::new();
        b.sample_type("cpu", "nanoseconds")
            .period("cpu", "nanoseconds", 10_000_000)
            .time(1_700_000_000_000_000_000, 10_000_000_000)
            .sample_root_first(["main", "hot"], vec![30_000_000]);
        pprof::gzip(&pprof::encode(&b.build()))
    }

    #[test]
    fn a_proflow_pprof_record_keeps_labels_times_tenant_and_bytes() {
        let value = gz_profile();
        let headers = RecordHeaders {
            encoding: Some(Encoding::Pprof),
            start_unix_nanos: Some(5),
            end_unix_nanos: Some(9),
            tenant: Some("t1".into()),
            labels: Labels::from_pairs([("__name__", "process_cpu"), ("service_name", "shop")]),
        };
        let d = decode(value.clone(), headers.clone(), &reading(None)).unwrap();
        assert_eq!(d.tenant.as_deref(), Some("t1"));
        let e = &d.envelopes[0];
        assert_eq!(e.labels, headers.labels);
        assert_eq!((e.start_unix_nanos, e.end_unix_nanos), (5, 9));
        assert_eq!(
            e.sample_types,
            [proflow_model::model::ValueType::new("cpu", "nanoseconds")]
        );
        assert_eq!(e.period, 10_000_000);
        assert_eq!(e.payload.gzipped().unwrap(), value, "bytes as they arrived");
        assert!(!e.payload.is_decoded());
    }

    #[test]
    fn a_bare_pprof_value_is_sniffed_and_labelled_from_itself() {
        let d = decode(gz_profile(), RecordHeaders::default(), &reading(None)).unwrap();
        let e = &d.envelopes[0];
        assert_eq!(e.labels.get("service_name"), Some("unknown_service"));
        assert_eq!(e.labels.get("__name__"), Some("process_cpu"));
        assert_eq!(e.start_unix_nanos, 1_700_000_000_000_000_000);
        assert_eq!(e.end_unix_nanos, 1_700_000_010_000_000_000);
    }

    #[test]
    fn an_otlp_request_record_becomes_its_profiles() {
        // Three services, two profiles (samples and cpu) each.
        let request = proflow_model::testdata::otlp_request(3, 20, 10);
        let value = Bytes::from(prost::Message::encode_to_vec(&request));
        let d = decode(value, RecordHeaders::default(), &reading(None)).unwrap();
        assert_eq!(d.envelopes.len(), 6);
        assert!(
            d.envelopes
                .iter()
                .all(|e| e.payload.has(proflow_model::model::Format::Otlp))
        );
        let json = Bytes::from(otlp::json::encode_request(&request));
        let d = decode(json, RecordHeaders::default(), &reading(None)).unwrap();
        assert_eq!(d.envelopes.len(), 6);
    }

    #[test]
    fn broken_records_are_refused_with_a_reason() {
        let cases: [(&[u8], Option<Encoding>, &str); 4] = [
            (b"", None, "no value"),
            (&[0x1f, 0x8b, 1, 2, 3], None, "not a pprof profile"),
            (b"{not json", None, "not OTLP JSON"),
            (
                &[0xff, 0xff, 0xff],
                Some(Encoding::OtlpProto),
                "not an OTLP",
            ),
        ];
        for (value, encoding, says) in cases {
            let e = decode(
                Bytes::copy_from_slice(value),
                RecordHeaders::default(),
                &reading(encoding),
            )
            .unwrap_err();
            assert!(e.contains(says), "{says}: {e}");
        }
        // A value that inflates past the limit is refused, not inflated.
        let mut small = reading(None);
        small.max_decompressed = 16;
        let e = decode(gz_profile(), RecordHeaders::default(), &small).unwrap_err();
        assert!(e.contains("max_decompressed_size"), "{e}");
    }

    #[test]
    fn decoding_grants_what_it_allocates_and_waits_when_the_budget_is_full() {
        // A gzip value inflates under the grant, and lets its plain bytes go.
        let budget = MemoryBudget::new(1 << 20);
        let mut grant = budget.grant();
        let d = super::decode(
            gz_profile(),
            RecordHeaders::default(),
            &reading(None),
            &mut grant,
        )
        .unwrap();
        assert_eq!(d.envelopes.len(), 1);
        assert_eq!(
            grant.held(),
            0,
            "the plain bytes were given back after the scan"
        );
        // OTLP JSON is granted what its shape says decoding takes.
        let json = proflow_model::otlp::json::encode_request(
            &proflow_model::testdata::otlp_request(1, 20, 10),
        );
        let cost = proflow_model::otlp::json::decode_cost(&json);
        let value = Bytes::from(json);
        let d = super::decode(
            value.clone(),
            RecordHeaders::default(),
            &reading(None),
            &mut grant,
        )
        .unwrap();
        assert_eq!(d.envelopes.len(), 2);
        assert_eq!(grant.held(), cost);
        drop(grant);
        // With the budget held elsewhere, the record waits for memory: it is
        // not refused as invalid.
        let hog = budget.grant();
        let mut hog = hog;
        hog.try_grow(budget.limit() - 1000).unwrap();
        let mut grant = budget.grant();
        let err =
            super::decode(value, RecordHeaders::default(), &reading(None), &mut grant).unwrap_err();
        assert!(matches!(err, RecordError::Memory(_)), "{err:?}");
        let err = super::decode(
            pprof::gzip(&vec![0u8; 200_000]),
            RecordHeaders::default(),
            &reading(Some(Encoding::Pprof)),
            &mut grant,
        )
        .unwrap_err();
        assert!(matches!(err, RecordError::Memory(_)), "{err:?}");
        assert_eq!(grant.held(), 0);
    }
}
