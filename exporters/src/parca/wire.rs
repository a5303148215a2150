//! Parca's `WriteRawRequest` and its parts, written from their field numbers
//! (`parca.profilestore.v1alpha1`), and how an export batch becomes one
//! request: envelopes grouped by their label set into series, the pprof
//! bytes of each as they arrived.

use std::collections::HashMap;

use bytes::Bytes;
use proflow_model::model::Envelope;

/// `WriteRawRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WriteRawRequest {
    /// Deprecated by Parca; never set.
    #[prost(string, tag = "1")]
    pub tenant: String,
    #[prost(message, repeated, tag = "2")]
    pub series: Vec<RawProfileSeries>,
    #[prost(bool, tag = "3")]
    pub normalized: bool,
}

/// `RawProfileSeries`: one label set and its profiles.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    #[prost(message, optional, tag = "1")]
    pub labels: Option<LabelSet>,
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// `LabelSet`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LabelSet {
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<Label>,
}

/// `Label`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Label {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `RawSample`: one pprof profile, gzipped or not (`executable_info`, field
/// 2, is for agents that upload debuginfo; not sent).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    #[prost(bytes = "bytes", tag = "1")]
    pub raw_profile: Bytes,
}

/// One export's request and the batch indexes whose bytes could not be had
/// (with why).
#[derive(Debug)]
pub(crate) struct Built {
    pub request: WriteRawRequest,
    pub refused: Vec<(usize, String)>,
}

/// The request of one export batch: envelopes with the same label set (as
/// [`series_labels`] makes it) share a series, in first-seen order; each
/// envelope's pprof bytes go as they arrived (no decode, no re-encode).
pub(crate) fn build_request(
    envelopes: &[Envelope],
    external_labels: &[(String, String)],
    normalized: bool,
) -> Built {
    let mut series: Vec<RawProfileSeries> = Vec::new();
    let mut by_labels: HashMap<Vec<(String, String)>, usize> = HashMap::new();
    let mut refused = Vec::new();
    for (i, e) in envelopes.iter().enumerate() {
        let bytes = match e.payload.encoded() {
            Ok(encoded) => encoded.bytes,
            Err(why) => {
                refused.push((i, why.to_string()));
                continue;
            }
        };
        let labels = series_labels(e, external_labels);
        let at = *by_labels.entry(labels.clone()).or_insert_with(|| {
            series.push(RawProfileSeries {
                labels: Some(LabelSet {
                    labels: labels
                        .into_iter()
                        .map(|(name, value)| Label { name, value })
                        .collect(),
                }),
                samples: Vec::new(),
            });
            series.len() - 1
        });
        series[at].samples.push(RawSample { raw_profile: bytes });
    }
    Built {
        request: WriteRawRequest {
            tenant: String::new(),
            series,
            normalized,
        },
        refused,
    }
}

/// The labels Parca gets for an envelope, sorted by name: its own labels but
/// those starting with `__` (except `__name__`) and empty ones, `__name__`
/// from [`profile_name`] when it has none, then `external_labels` it does
/// not have already.
pub(crate) fn series_labels(
    e: &Envelope,
    external_labels: &[(String, String)],
) -> Vec<(String, String)> {
    let mut labels: Vec<(String, String)> = e
        .labels
        .iter()
        .filter(|l| !l.value.is_empty())
        .filter(|l| l.name == "__name__" || !l.name.starts_with("__"))
        .map(|l| (l.name.to_string(), l.value.to_string()))
        .collect();
    if !labels.iter().any(|(n, _)| n == "__name__") {
        labels.push(("__name__".to_owned(), profile_name(e)));
    }
    for (name, value) in external_labels {
        if !labels.iter().any(|(n, _)| n == name) {
            labels.push((name.clone(), value.clone()));
        }
    }
    labels.sort();
    labels
}

/// The profile name of an envelope without `__name__`, the names Parca's
/// scraper gives the Go runtime's profiles: `process_cpu` when the period or
/// a sample type is `cpu`, `memory` for `alloc_*` / `inuse_*` sample types,
/// `goroutine` for `goroutine(s)`; otherwise the first sample type's name
/// made a Prometheus name (other characters become `_`), or `unknown`
/// without sample types.
pub(crate) fn profile_name(e: &Envelope) -> String {
    let types = || e.sample_types.iter().map(|t| t.r#type.as_str());
    if e.period_type.as_ref().is_some_and(|p| p.r#type == "cpu") || types().any(|t| t == "cpu") {
        return "process_cpu".to_owned();
    }
    if types().any(|t| t.starts_with("alloc_") || t.starts_with("inuse_")) {
        return "memory".to_owned();
    }
    if types().any(|t| t == "goroutine" || t == "goroutines") {
        return "goroutine".to_owned();
    }
    match types().next().filter(|t| !t.is_empty()) {
        Some(first) => {
            let mut name: String = first
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect();
            if name.starts_with(|c: char| c.is_ascii_digit()) {
                name.insert(0, '_');
            }
            name
        }
        None => "unknown".to_owned(),
    }
}
