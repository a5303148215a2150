//! `POST /ingest` (and `/pyroscope/ingest`): the original Pyroscope API.
//!
//! The query says who sent what (`name`, `from`, `until`, `sampleRate`,
//! `spyName`, `units`, `aggregationType`, `format`); the body is one profile:
//! raw pprof, a multipart form holding pprof, a JFR recording (raw or in a
//! multipart form, see [`super::jfr`]), or folded text. Which one follows
//! Pyroscope: an explicit `format` first (`jfr`, `pprof`, `lines`, ...), then a
//! multipart `Content-Type`, else folded text. We also read a multipart body
//! sent with `format=pprof`, since its Content-Type leaves no doubt.

use axum::http::Uri;
use bytes::Bytes;
use proflow_model::lost::LostSamples;
use proflow_model::model::{Envelope, Payload, ValueType};

use super::budget::DecompressBudget;
use super::error::{IngestError, Refused};
use super::folded::{self, Charge, FoldedError, Stacks, TextFormat, TextLimits};
use super::labels::{ingest_folded_labels, ingest_pprof_labels};
use super::multipart::is_multipart;
use super::name::{AppName, parse_name};
use super::profile_limits;
use super::profile_type::{SampleTypeConfigs, profile_name_from_sample_types, split_folded_app};
use super::speedscope;
use super::timestamp::parse_unix_timestamp;
use super::tree;

/// Pyroscope's default sample rate (Hz) when `sampleRate` is absent.
const DEFAULT_SAMPLE_RATE: u32 = 100;
/// Highest `sampleRate` (Hz) accepted: one sample per nanosecond. Above it
/// the sampling period, 1e9 / rate nanoseconds, would round to 0.
const MAX_SAMPLE_RATE: u32 = 1_000_000_000;
/// Pyroscope's `spyName` when the client sends none.
const DEFAULT_SPY_NAME: &str = "unknown";

/// What the query of an ingest request says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IngestParams {
    pub name: AppName,
    pub start_nanos: i64,
    pub end_nanos: i64,
    pub sample_rate: u32,
    pub spy_name: String,
    /// The `format` value as sent ("" when absent); see [`body_kind`].
    pub format: String,
    /// Read for completeness; like Pyroscope v2, nothing depends on them: the
    /// profile type of text formats comes from the name's suffix.
    pub units: Option<String>,
    pub aggregation_type: Option<String>,
}

/// How the body is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyKind {
    /// The body is a pprof profile (plain or gzip).
    Pprof,
    /// A multipart form with a `profile` part.
    Multipart,
    /// A JFR recording: raw, or a multipart form with `jfr` and `labels`.
    Jfr {
        multipart: bool,
    },
    /// A speedscope JSON file.
    Speedscope,
    Text(TextFormat),
}

impl BodyKind {
    /// The format's name, as `format=` names it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            BodyKind::Pprof | BodyKind::Multipart => "pprof",
            BodyKind::Jfr { .. } => "jfr",
            BodyKind::Speedscope => "speedscope",
            BodyKind::Text(TextFormat::Folded) => "folded",
            BodyKind::Text(TextFormat::Lines) => "lines",
            BodyKind::Text(TextFormat::Tree) => "tree",
            BodyKind::Text(TextFormat::Trie) => "trie",
        }
    }
}

fn first<'a>(pairs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    // Go's url.Values.Get returns the first value; so do we.
    pairs
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// Reads the stacks of a text body in any of Pyroscope's text formats.
pub(crate) fn parse_text<'a>(
    body: &'a [u8],
    format: TextFormat,
    limits: TextLimits,
    charge: &mut Charge<'_>,
) -> Result<Stacks<'a>, FoldedError> {
    match format {
        TextFormat::Tree => tree::parse_tree(body, limits, charge),
        TextFormat::Trie => tree::parse_trie(body, limits, charge),
        TextFormat::Folded | TextFormat::Lines => {
            folded::parse_stacks(body, format, limits, charge)
        }
    }
}

/// Reads the query of an ingest request.
pub(crate) fn parse_params(uri: &Uri, now_nanos: i64) -> Result<IngestParams, IngestError> {
    let axum::extract::Query(pairs) =
        axum::extract::Query::<Vec<(String, String)>>::try_from_uri(uri)
            .map_err(|e| IngestError::bad_request(format!("unreadable query string ({e})")))?;
    let name = parse_name(first(&pairs, "name").unwrap_or(""))
        .map_err(|e| IngestError::bad_request(format!("name: {e}")))?;
    let time = |key: &str| -> Result<Option<i64>, IngestError> {
        first(&pairs, key)
            .filter(|v| !v.is_empty())
            .map(|v| parse_unix_timestamp(v, now_nanos))
            .transpose()
            .map_err(|e| IngestError::bad_request(format!("{key}: {e}")))
    };
    let (from, until) = (time("from")?, time("until")?);
    // A missing bound defaults to now, without ever putting from after until.
    let (start_nanos, end_nanos) = match (from, until) {
        (Some(f), Some(u)) => (f, u),
        (Some(f), None) => (f, now_nanos.max(f)),
        (None, Some(u)) => (now_nanos.min(u), u),
        (None, None) => (now_nanos, now_nanos),
    };
    if end_nanos < start_nanos {
        return Err(IngestError::bad_request(
            "until is before from: send the start of the profiled interval as from and its end as until",
        ));
    }
    let sample_rate = match first(&pairs, "sampleRate").filter(|v| !v.is_empty()) {
        None => DEFAULT_SAMPLE_RATE,
        Some(v) => {
            let rate = v.trim().parse::<u32>().map_err(|_| {
                IngestError::bad_request(format!(
                    "sampleRate: {v:?} is not a whole number of samples per second, such as 100"
                ))
            })?;
            if rate > MAX_SAMPLE_RATE {
                return Err(IngestError::bad_request(format!(
                    "sampleRate: {rate} is above {MAX_SAMPLE_RATE} samples per second (one per nanosecond); send the real sampling frequency, such as 100"
                )));
            }
            rate
        }
    };
    let spy_name = first(&pairs, "spyName")
        .filter(|v| !v.is_empty())
        .unwrap_or(DEFAULT_SPY_NAME)
        .to_owned();
    Ok(IngestParams {
        name,
        start_nanos,
        end_nanos,
        sample_rate,
        spy_name,
        format: first(&pairs, "format").unwrap_or("").to_owned(),
        units: first(&pairs, "units").map(str::to_owned),
        aggregation_type: first(&pairs, "aggregationType").map(str::to_owned),
    })
}

/// How to read the body, from `format` and `Content-Type`; an unknown
/// format gets 400.
pub(crate) fn body_kind(format: &str, content_type: Option<&str>) -> Result<BodyKind, IngestError> {
    let binary = content_type.map(|c| c.trim().to_ascii_lowercase());
    // Pyroscope's order: the trie and tree formats (by name or content
    // type), lines, JFR, pprof, speedscope, any multipart form, then folded.
    if format == "trie" || binary.as_deref() == Some("binary/octet-stream+trie") {
        return Ok(BodyKind::Text(TextFormat::Trie));
    }
    if format == "tree" || binary.as_deref() == Some("binary/octet-stream+tree") {
        return Ok(BodyKind::Text(TextFormat::Tree));
    }
    let multipart = is_multipart(content_type);
    match format {
        "lines" => Ok(BodyKind::Text(TextFormat::Lines)),
        "jfr" => Ok(BodyKind::Jfr { multipart }),
        // A form sent as pprof is still a form: its Content-Type says so.
        "pprof" if multipart => Ok(BodyKind::Multipart),
        "pprof" => Ok(BodyKind::Pprof),
        "speedscope" => Ok(BodyKind::Speedscope),
        _ if multipart => Ok(BodyKind::Multipart),
        "" | "folded" | "groups" => Ok(BodyKind::Text(TextFormat::Folded)),
        other => Err(IngestError::bad_request(format!(
            "unknown format {other:?}: use pprof, jfr, folded, lines, tree, trie or speedscope"
        ))),
    }
}

/// One pprof profile from /ingest as an envelope (or none for an empty body
/// or a profile of no sample, which Pyroscope accepts as "nothing to
/// store"). A gzipped profile is
/// inflated within what is left of the request's decompression `budget`.
pub(crate) fn pprof_batch(
    params: &IngestParams,
    profile: Bytes,
    sample_type_config: Option<&[u8]>,
    budget: &mut DecompressBudget,
) -> Result<Vec<Envelope>, Refused> {
    if profile.is_empty() {
        return Ok(Vec::new());
    }
    let refuse = |error: IngestError| Refused { error, profiles: 1 };
    let configs: Option<SampleTypeConfigs> = sample_type_config
        .filter(|c| !c.is_empty())
        .map(serde_json::from_slice)
        .transpose()
        .map_err(|e| {
            refuse(IngestError::bad_request(format!(
                "sample_type_config is not a JSON object of sample types ({e}); send {{\"<sample type>\": {{\"display-name\": \"...\"}}}}"
            )))
        })?;
    let (mut meta, plain) = budget
        .scan(|| "the profile".to_owned(), &profile)
        .map_err(refuse)?;
    let profile_name = profile_name_from_sample_types(
        meta.sample_types.iter().map(|(t, _)| t.as_str()),
        configs.as_ref(),
    )
    .ok_or_else(|| {
        refuse(IngestError::bad_request(
            "the profile has no named sample types; send a pprof profile with at least one sample type",
        ))
    })?;
    let labels = ingest_pprof_labels(
        &params.name.app,
        &params.name.tags,
        &params.spy_name,
        &profile_name,
    )
    .map_err(|e| refuse(IngestError::bad_request(format!("name: {e}"))))?;
    if meta.sample_count == 0 {
        // A valid profile with nothing to store (Pyroscope stores nothing
        // of it either): the caller counts the request as empty.
        return Ok(Vec::new());
    }
    let period = meta.period;
    let shape = profile_limits::shape_of_scan(&meta);
    let (sample_types, period_type) = meta.take_value_types();
    let envelope = Envelope {
        labels,
        start_unix_nanos: params.start_nanos,
        end_unix_nanos: params.end_nanos,
        sample_types,
        period_type,
        period,
        payload: with_plain(Payload::from_bytes(profile, budget.setting()), plain),
    };
    let envelope = profile_limits::limit_scanned(budget, shape, meta.decoded_size, envelope)
        .map_err(refuse)?;
    Ok(vec![envelope])
}

/// `payload` carrying the plain bytes its scan inflated, if it kept them.
pub(crate) fn with_plain(payload: Payload, plain: Option<Bytes>) -> Payload {
    match plain {
        Some(p) => payload.with_plain(p),
        None => payload,
    }
}

/// A folded, lines, tree or trie body converted to one pprof profile (or
/// none when it holds no stacks). A gzipped body is inflated within what is
/// left of the request's decompression `budget`; the conversion's memory is
/// granted from it as it grows, within `limits`. The samples the profile
/// cannot carry are added to `lost`.
pub(crate) fn text_batch(
    params: &IngestParams,
    format: TextFormat,
    body: Bytes,
    limits: TextLimits,
    budget: &mut DecompressBudget,
    lost: &mut LostSamples,
) -> Result<Vec<Envelope>, Refused> {
    let refuse = |error: IngestError| Refused { error, profiles: 1 };
    // The name is checked before the body is read.
    split_folded_app(&params.name.app)
        .map_err(|e| refuse(IngestError::bad_request(format!("name: {e}"))))?;
    let text = budget
        .decompress(|| "the text body".to_owned(), body)
        .map_err(refuse)?;
    let mut charge = |bytes: usize| budget.charge(bytes);
    let stacks = parse_text(&text, format, limits, &mut charge)
        .map_err(|e| refuse(IngestError::from_text(e)))?;
    lost.merge(&stacks.lost);
    stacks_envelope(
        params,
        &params.name.app,
        &stacks,
        params.sample_rate,
        None,
        limits,
        &mut charge,
        lost,
    )
    .map(|e| e.into_iter().collect())
}

/// A speedscope body converted to one pprof profile per profile in it (see
/// [`super::speedscope`]); its decoding is granted from its shape first.
/// The samples the profiles cannot carry are added to `lost`.
pub(crate) fn speedscope_batch(
    params: &IngestParams,
    body: Bytes,
    limits: TextLimits,
    budget: &mut DecompressBudget,
    lost: &mut LostSamples,
) -> Result<Vec<Envelope>, Refused> {
    let refuse = |error: IngestError| Refused { error, profiles: 1 };
    let text = budget
        .decompress(|| "the speedscope body".to_owned(), body)
        .map_err(refuse)?;
    budget
        .reserve(speedscope::decode_bound(&text))
        .map_err(refuse)?;
    let mut charge = |bytes: usize| budget.charge(bytes);
    let profiles = speedscope::parse(&text, params.sample_rate, limits, &mut charge)
        .map_err(|e| refuse(IngestError::from_text(e)))?;
    let many = profiles.len() > 1;
    let mut out = Vec::with_capacity(profiles.len());
    for p in &profiles {
        // With several profiles each is typed by its unit, as Pyroscope does.
        let app = if many {
            format!("{}.{}", params.name.app, p.unit)
        } else {
            params.name.app.clone()
        };
        let name = Some(("profile_name", p.name.as_str())).filter(|(_, n)| !n.is_empty());
        lost.merge(&p.stacks.lost);
        out.extend(stacks_envelope(
            params,
            &app,
            &p.stacks,
            p.sample_rate,
            name,
            limits,
            &mut charge,
            lost,
        )?);
    }
    Ok(out)
}

/// The profile of `stacks` sent as application `app` (whose suffix says its
/// type), at `sample_rate`, with one `extra` label; none when it holds no
/// stacks.
#[allow(clippy::too_many_arguments)]
fn stacks_envelope(
    params: &IngestParams,
    app: &str,
    stacks: &folded::Stacks<'_>,
    sample_rate: u32,
    extra: Option<(&str, &str)>,
    limits: TextLimits,
    charge: &mut folded::Charge<'_>,
    lost: &mut LostSamples,
) -> Result<Option<Envelope>, Refused> {
    let refuse = |error: IngestError| Refused { error, profiles: 1 };
    if stacks.is_empty() {
        return Ok(None);
    }
    let (app, ty) = split_folded_app(app)
        .map_err(|e| refuse(IngestError::bad_request(format!("name: {e}"))))?;
    let mut labels =
        ingest_folded_labels(app, &params.name.tags, &params.spy_name, ty.profile_name)
            .map_err(|e| refuse(IngestError::bad_request(format!("name: {e}"))))?;
    if let Some((k, v)) = extra {
        labels.set(k, v);
    }
    let conv = folded::conversion(ty, sample_rate);
    let profile = folded::to_profile(
        stacks,
        &conv,
        params.start_nanos,
        params.end_nanos - params.start_nanos,
        limits,
        charge,
        lost,
    )
    .map_err(|e| refuse(IngestError::from_text(e)))?;
    Ok(Some(Envelope {
        labels,
        start_unix_nanos: params.start_nanos,
        end_unix_nanos: params.end_nanos,
        sample_types: vec![ValueType::new(&conv.sample_type.0, &conv.sample_type.1)],
        period_type: conv
            .period
            .as_ref()
            .map(|((t, u), _)| ValueType::new(t.as_str(), u.as_str())),
        period: conv.period.as_ref().map_or(0, |(_, p)| *p),
        payload: Payload::from_profile(profile),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proflow_model::pprof::{self, ProfileBuilder};

    const NOW: i64 = 1_800_000_000_000_000_000;

    fn params(query: &str) -> Result<IngestParams, IngestError> {
        parse_params(&format!("/ingest?{query}").parse().unwrap(), NOW)
    }

    fn kind(query: &str, ct: Option<&str>) -> Result<BodyKind, IngestError> {
        body_kind(&params(&format!("name=a&{query}")).unwrap().format, ct)
    }

    #[test]
    fn query_like_the_clients_send_it() {
        // @pyroscope/nodejs: seconds; pyroscope-go: nanoseconds.
        let p = params("name=app%7Benv%3Dprod%7D&from=1700000000&until=1700000010&spyName=nodespy&sampleRate=97").unwrap();
        assert_eq!(p.name.app, "app");
        assert_eq!(p.name.tags, vec![("env".to_string(), "prod".to_string())]);
        assert_eq!(p.start_nanos, 1_700_000_000_000_000_000);
        assert_eq!(p.end_nanos, 1_700_000_010_000_000_000);
        assert_eq!(p.sample_rate, 97);
        assert_eq!(p.spy_name, "nodespy");
        let p = params("name=a&from=1700000000000000000&until=1700000010000000000&units=samples&aggregationType=sum").unwrap();
        assert_eq!(p.end_nanos - p.start_nanos, 10_000_000_000);
        assert_eq!(p.units.as_deref(), Some("samples"));
        // Defaults.
        let p = params("name=a").unwrap();
        assert_eq!((p.start_nanos, p.end_nanos), (NOW, NOW));
        assert_eq!(p.sample_rate, 100);
        assert_eq!(p.spy_name, "unknown");
        let p = params("name=a&from=1700000000").unwrap();
        assert_eq!(p.end_nanos, NOW);
        // Repeated keys: the first wins, as in Go.
        assert_eq!(params("name=a&name=b").unwrap().name.app, "a");
    }

    #[test]
    fn bad_queries() {
        for (q, needle) in [
            ("", "name"),
            ("name=a%7Bx", "name"),
            ("name=a&from=yesterday", "from"),
            ("name=a&from=1700000010&until=1700000000", "until"),
            ("name=a&sampleRate=-1", "sampleRate"),
            ("name=a&sampleRate=1000000001", "1000000000"),
        ] {
            let err = params(q).unwrap_err();
            assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
            assert!(err.to_string().contains(needle), "{q}: {err}");
        }
    }

    #[test]
    fn limits_on_the_query() {
        assert_eq!(
            params("name=a&sampleRate=1000000000").unwrap().sample_rate,
            MAX_SAMPLE_RATE
        );
        let tags = |n: usize| {
            let body: Vec<String> = (0..n).map(|i| format!("k{i}%3Dv")).collect();
            format!("name=a%7B{}%7D", body.join("%2C"))
        };
        assert_eq!(params(&tags(128)).unwrap().name.tags.len(), 128);
        let err = params(&tags(129)).unwrap_err();
        assert_eq!(err.status(), axum::http::StatusCode::BAD_REQUEST);
        assert!(err.to_string().contains("more than 128 tags"), "{err}");
    }

    #[test]
    fn gzipped_bodies_spend_the_request_budget() {
        let p = params("name=a.cpu").unwrap();
        let raw = node_wall_profile();
        let plain_size = pprof::scan_metadata(&raw, 1 << 20).unwrap().plain_size;
        let mut budget = DecompressBudget::new(1 << 20);
        pprof_batch(&p, raw.clone(), None, &mut budget).unwrap();
        assert_eq!(budget.remaining(), (1 << 20) - plain_size);
        // What the transport encoding used is gone for the profile.
        let mut budget = DecompressBudget::new(plain_size + 10);
        budget
            .inflate(|| "body".into(), &pprof::gzip(&[0u8; 11]))
            .unwrap();
        let err = pprof_batch(&p, raw.clone(), None, &mut budget).unwrap_err();
        assert_eq!(
            err.error.status(),
            axum::http::StatusCode::PAYLOAD_TOO_LARGE
        );
        assert!(
            err.error.to_string().contains(&format!(
                "max_decompressed_size ({} bytes)",
                plain_size + 10
            )),
            "{}",
            err.error
        );
        // Plain bodies inflate nothing.
        let mut budget = DecompressBudget::new(64);
        let text = Bytes::from_static(b"a;b 1\n");
        text_batch(
            &p,
            TextFormat::Folded,
            text,
            TextLimits::default(),
            &mut budget,
            &mut LostSamples::default(),
        )
        .unwrap();
        assert_eq!(budget.remaining(), 64);
        let gz = pprof::gzip(&[b'x'; 100]);
        let err = text_batch(
            &p,
            TextFormat::Folded,
            gz,
            TextLimits::default(),
            &mut budget,
            &mut LostSamples::default(),
        )
        .unwrap_err();
        assert_eq!(
            err.error.status(),
            axum::http::StatusCode::PAYLOAD_TOO_LARGE
        );
    }

    #[test]
    fn formats() {
        assert_eq!(kind("format=pprof", None), Ok(BodyKind::Pprof));
        assert_eq!(
            kind("", Some("multipart/form-data; boundary=x")),
            Ok(BodyKind::Multipart)
        );
        assert_eq!(
            kind("format=pprof", Some("multipart/form-data; boundary=x")),
            Ok(BodyKind::Multipart)
        );
        assert_eq!(kind("", None), Ok(BodyKind::Text(TextFormat::Folded)));
        assert_eq!(
            kind("format=folded", None),
            Ok(BodyKind::Text(TextFormat::Folded))
        );
        assert_eq!(
            kind("format=lines", None),
            Ok(BodyKind::Text(TextFormat::Lines))
        );
        // The Java agent's multipart upload, and a raw recording.
        assert_eq!(
            kind("format=jfr", Some("multipart/form-data; boundary=x")),
            Ok(BodyKind::Jfr { multipart: true })
        );
        assert_eq!(
            kind("format=jfr", Some("application/octet-stream")),
            Ok(BodyKind::Jfr { multipart: false })
        );
        // The binary formats of older agents, by name or content type.
        assert_eq!(
            kind("", Some("binary/octet-stream+trie")),
            Ok(BodyKind::Text(TextFormat::Trie))
        );
        assert_eq!(
            kind("format=pprof", Some("binary/octet-stream+tree")),
            Ok(BodyKind::Text(TextFormat::Tree))
        );
        assert_eq!(
            kind("format=tree", None),
            Ok(BodyKind::Text(TextFormat::Tree))
        );
        assert_eq!(kind("format=speedscope", None), Ok(BodyKind::Speedscope));
        assert_eq!(
            kind("format=xml", None).unwrap_err().status(),
            axum::http::StatusCode::BAD_REQUEST
        );
    }

    fn node_wall_profile() -> Bytes {
        let mut b = ProfileBuilder::new();
        b.sample_type("samples", "count")
            .sample_type("wall", "microseconds")
            .period("wall", "microseconds", 10_000);
        b.sample_root_first(["(program)"], vec![3, 30_000]);
        pprof::gzip(&pprof::encode(&b.build()))
    }

    #[test]
    fn pprof_body_becomes_one_envelope() {
        let p =
            params("name=web%7Bregion%3Deu%7D&from=1700000000&until=1700000010&spyName=nodespy")
                .unwrap();
        let raw = node_wall_profile();
        let batch =
            pprof_batch(&p, raw.clone(), None, &mut DecompressBudget::new(1 << 20)).unwrap();
        assert_eq!(batch.len(), 1);
        let e = &batch[0];
        assert_eq!(
            e.labels.to_selector_string(),
            r#"{__delta__="false", __name__="wall", pyroscope_spy="nodespy", region="eu", service_name="web"}"#
        );
        assert_eq!(e.start_unix_nanos, 1_700_000_000_000_000_000);
        assert_eq!(e.sample_types[1], ValueType::new("wall", "microseconds"));
        assert_eq!(e.period, 10_000);
        assert_eq!(e.payload.encoded().unwrap().bytes, raw);
        assert!(!e.payload.is_decoded());
        // The plain bytes the check inflated go along for the processors.
        assert!(e.payload.has_plain());
        assert_eq!(
            e.payload.plain().unwrap(),
            pprof::decompress(&raw, 1 << 20).unwrap()
        );
        assert!(
            pprof_batch(&p, Bytes::new(), None, &mut DecompressBudget::new(1 << 20))
                .unwrap()
                .is_empty()
        );
        // A profile of no sample: nothing to store.
        let mut b = ProfileBuilder::new();
        b.sample_type("samples", "count");
        let empty = pprof::encode(&b.build());
        assert!(
            pprof_batch(&p, empty, None, &mut DecompressBudget::new(1 << 20))
                .unwrap()
                .is_empty()
        );
        let err = pprof_batch(
            &p,
            raw.clone(),
            Some(b"[1,2]"),
            &mut DecompressBudget::new(1 << 20),
        )
        .unwrap_err();
        assert!(err.error.to_string().contains("sample_type_config"));
        let err = pprof_batch(
            &p,
            Bytes::from_static(b"not pprof"),
            None,
            &mut DecompressBudget::new(1 << 20),
        )
        .unwrap_err();
        assert_eq!(err.error.status(), axum::http::StatusCode::BAD_REQUEST);
        assert_eq!(err.profiles, 1);
    }

    #[test]
    fn folded_body_becomes_a_pprof_profile() {
        let p = params("name=rb.app.cpu%7Benv%3Dstaging%7D&from=1700000000&until=1700000010&spyName=rbspy&sampleRate=100").unwrap();
        let batch = text_batch(
            &p,
            TextFormat::Folded,
            Bytes::from_static(b"main;work 3\nmain;idle 1\n"),
            TextLimits::default(),
            &mut DecompressBudget::new(1 << 20),
            &mut LostSamples::default(),
        )
        .unwrap();
        let e = &batch[0];
        assert_eq!(
            e.labels.to_selector_string(),
            r#"{__delta__="false", __name__="process_cpu", env="staging", pyroscope_spy="rbspy", service_name="rb.app"}"#
        );
        assert_eq!(e.sample_types, vec![ValueType::new("cpu", "nanoseconds")]);
        assert_eq!(e.period_type, Some(ValueType::new("cpu", "nanoseconds")));
        assert_eq!(e.period, 10_000_000);
        let profile = e.payload.decoded().unwrap();
        assert_eq!(profile.sample[0].value, vec![30_000_000]);
        assert_eq!(profile.duration_nanos, 10_000_000_000);
        // Gzipped text is read too; an unknown suffix is refused.
        let gz = pprof::gzip(b"a;b 1\n");
        assert_eq!(
            text_batch(
                &p,
                TextFormat::Folded,
                gz,
                TextLimits::default(),
                &mut DecompressBudget::new(1 << 20),
                &mut LostSamples::default()
            )
            .unwrap()
            .len(),
            1
        );
        let bad = params("name=my.app").unwrap();
        let err = text_batch(
            &bad,
            TextFormat::Folded,
            Bytes::from_static(b"a 1"),
            TextLimits::default(),
            &mut DecompressBudget::new(1 << 20),
            &mut LostSamples::default(),
        )
        .unwrap_err();
        assert!(err.error.to_string().contains(".app"), "{}", err.error);
        let err = text_batch(
            &p,
            TextFormat::Folded,
            Bytes::from_static(b"a x"),
            TextLimits::default(),
            &mut DecompressBudget::new(1 << 20),
            &mut LostSamples::default(),
        )
        .unwrap_err();
        assert!(err.error.to_string().contains("line 1"), "{}", err.error);
        assert!(
            text_batch(
                &p,
                TextFormat::Folded,
                Bytes::new(),
                TextLimits::default(),
                &mut DecompressBudget::new(1 << 20),
                &mut LostSamples::default()
            )
            .unwrap()
            .is_empty()
        );
    }

    proptest::proptest! {
        #[test]
        fn decoders_never_panic(body in proptest::collection::vec(proptest::num::u8::ANY, 0..512)) {
            let p = params("name=a.cpu&sampleRate=100").unwrap();
            let body = Bytes::from(body);
            let _ = pprof_batch(&p, body.clone(), None, &mut DecompressBudget::new(4096));
            let _ = pprof_batch(&p, body.clone(), Some(&body), &mut DecompressBudget::new(4096));
            let _ = text_batch(&p, TextFormat::Folded, body.clone(), TextLimits::default(), &mut DecompressBudget::new(4096), &mut LostSamples::default());
            let _ = text_batch(&p, TextFormat::Lines, body, TextLimits::default(), &mut DecompressBudget::new(4096), &mut LostSamples::default());
        }

        #[test]
        fn query_never_panics(q in "[a-zA-Z=&%{}0-9,._-]{0,60}") {
            if let Ok(uri) = format!("/ingest?{q}").parse::<Uri>()
                && let Ok(p) = parse_params(&uri, NOW)
            {
                let _ = body_kind(&p.format, None);
            }
        }
    }
}
