//! What goes on the wire to Pyroscope: each profile's series labels
//! ([`series_labels`]), the requests of one export ([`plan`]), a push
//! request's bytes ([`encode_push`]) and an `/ingest` URL's query
//! ([`ingest_query`]). Pure functions, tested without a peer.
//!
//! The pprof bytes go into `RawSample.raw_profile` as they arrived (gzipped
//! or not; Pyroscope takes both), never decoded or encoded again.

use std::collections::BTreeMap;
use std::ops::Range;

use bytes::Bytes;
use proflow_model::model::{BatchMeta, Envelope, Labels};
use proflow_model::push_v1::{LabelPair, PushRequest, RawProfileSeries, RawSample};
use proflow_net::url::percent_encode;
use prost::Message;

/// The profile type label Pyroscope requires.
pub(crate) const NAME_LABEL: &str = "__name__";
/// Kept so Pyroscope v1 storage does not compute deltas of delta profiles.
pub(crate) const DELTA_LABEL: &str = "__delta__";
pub(crate) const SERVICE_NAME_LABEL: &str = "service_name";

/// The labels a profile is sent with, sorted by name: its own labels without
/// internal `__*` ones (but `__name__` and `__delta__`), the
/// `external_labels` it lacks (as Prometheus, a profile's own label wins),
/// and `service_name` = `default_service_name` when it has none.
pub(crate) fn series_labels(
    labels: &Labels,
    external: &BTreeMap<String, String>,
    default_service_name: &str,
) -> Vec<(String, String)> {
    let kept = labels.without_internal(&[NAME_LABEL, DELTA_LABEL]);
    let mut out: BTreeMap<String, String> = kept
        .iter()
        .map(|l| (l.name.clone(), l.value.clone()))
        .collect();
    for (name, value) in external {
        out.entry(name.clone()).or_insert_with(|| value.clone());
    }
    if out.get(SERVICE_NAME_LABEL).is_none_or(|v| v.is_empty()) {
        out.insert(
            SERVICE_NAME_LABEL.to_owned(),
            default_service_name.to_owned(),
        );
    }
    out.into_iter().collect()
}

/// One request of an export: the batch indexes it carries and its tenant
/// (`None`: only the configured headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Planned {
    pub tenant: Option<String>,
    pub indexes: Range<usize>,
}

/// The requests of one export, in batch order: consecutive profiles of one
/// tenant share a request until their bytes would pass `max_batch_bytes`
/// (a single larger profile goes alone). With a configured `tenant_id`
/// (`tenant_configured`) the batch's own tenants are not used.
/// `one_per_request`: the `/ingest` API, which takes one profile a request.
pub(crate) fn plan<'a>(
    sources: impl Iterator<Item = (&'a BatchMeta, &'a [Envelope])>,
    max_batch_bytes: usize,
    tenant_configured: bool,
    one_per_request: bool,
) -> Vec<Planned> {
    let mut planned: Vec<Planned> = Vec::new();
    let mut bytes_in_last = 0usize;
    let mut at = 0;
    for (meta, envelopes) in sources {
        for e in envelopes {
            let tenant = if tenant_configured {
                None
            } else {
                meta.tenant_of(&e.labels).map(str::to_owned)
            };
            let size = e.payload.size_bytes();
            match planned.last_mut() {
                Some(last)
                    if !one_per_request
                        && last.tenant == tenant
                        && bytes_in_last.saturating_add(size) <= max_batch_bytes =>
                {
                    last.indexes.end = at + 1;
                    bytes_in_last += size;
                }
                _ => {
                    planned.push(Planned {
                        tenant: tenant.clone(),
                        indexes: at..at + 1,
                    });
                    bytes_in_last = size;
                }
            }
            at += 1;
        }
    }
    planned
}

/// A `PushRequest` of `profiles` (series labels and pprof bytes): profiles
/// with equal labels share one series, in order of first appearance.
pub(crate) fn push_request(profiles: Vec<(Vec<(String, String)>, Bytes)>) -> PushRequest {
    let mut series: Vec<RawProfileSeries> = Vec::new();
    let mut index: BTreeMap<Vec<(String, String)>, usize> = BTreeMap::new();
    for (labels, raw_profile) in profiles {
        let sample = RawSample {
            raw_profile,
            id: String::new(),
        };
        match index.get(&labels) {
            Some(&i) => series[i].samples.push(sample),
            None => {
                index.insert(labels.clone(), series.len());
                series.push(RawProfileSeries {
                    labels: labels
                        .into_iter()
                        .map(|(n, v)| LabelPair::new(n, v))
                        .collect(),
                    samples: vec![sample],
                });
            }
        }
    }
    PushRequest { series }
}

/// The binary protobuf of `request`, gzipped when `gzip`.
pub(crate) fn encode_push(request: &PushRequest, gzip: bool) -> Bytes {
    let bytes = request.encode_to_vec();
    if gzip {
        gzip_bytes(&bytes)
    } else {
        Bytes::from(bytes)
    }
}

/// `bytes` gzipped at the fast level (most of a push body is pprof that
/// arrived gzipped and does not shrink again; the level buys nothing).
/// One call of libdeflate, its compressor kept per thread.
pub(crate) fn gzip_bytes(bytes: &[u8]) -> Bytes {
    proflow_model::pprof::gzip(bytes)
}

/// Why a profile cannot be sent to `/ingest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum IngestNameError {
    #[error(
        "service_name {0:?} cannot be an /ingest application name (letters, digits and _ . - / only); use `api: push`"
    )]
    App(String),
    #[error(
        "label {0}={1:?} cannot be written in an /ingest name (no `,`, `{{`, `}}`, `=` in values, names of letters, digits, _ and .); use `api: push`"
    )]
    Label(String, String),
}

/// The query of `POST /ingest` for one profile: `name=<service_name>{k=v,...}`
/// (`__name__` and `__delta__` are left out: Pyroscope names pprof profiles
/// from their sample types and marks `/ingest` ones as deltas itself),
/// `from`/`until` in unix seconds, `format=pprof`.
pub(crate) fn ingest_query(
    labels: &[(String, String)],
    start_unix_nanos: i64,
    end_unix_nanos: i64,
) -> Result<String, IngestNameError> {
    let app = labels
        .iter()
        .find(|(n, _)| n == SERVICE_NAME_LABEL)
        .map(|(_, v)| v.as_str())
        .unwrap_or_default();
    let app_ok = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-' | '/');
    if app.is_empty() || !app.chars().all(app_ok) {
        return Err(IngestNameError::App(app.to_owned()));
    }
    let mut name = String::from(app);
    let mut tags = Vec::new();
    for (n, v) in labels {
        if n == SERVICE_NAME_LABEL || n == NAME_LABEL || n == DELTA_LABEL {
            continue;
        }
        let name_ok = n
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
        let value_ok = !v.chars().any(|c| matches!(c, ',' | '{' | '}' | '=')) && v.trim() == v;
        if !name_ok || !value_ok {
            return Err(IngestNameError::Label(n.clone(), v.clone()));
        }
        tags.push(format!("{n}={v}"));
    }
    name.push('{');
    name.push_str(&tags.join(","));
    name.push('}');
    let from = start_unix_nanos.div_euclid(1_000_000_000);
    // The end rounded up, so the interval is never empty.
    let until = (end_unix_nanos.saturating_add(999_999_999))
        .div_euclid(1_000_000_000)
        .max(from);
    Ok(format!(
        "name={}&from={from}&until={until}&format=pprof",
        percent_encode(&name)
    ))
}
