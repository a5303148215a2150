//! The `pprof_push` receiver: accepts profiles the way Grafana Pyroscope does, so
//! Pyroscope clients (pyroscope-go, @pyroscope/nodejs, pyroscope-rs and the
//! agents built on it) can point at proflow unchanged.
//!
//! Endpoints:
//! - `POST /ingest` and `POST /pyroscope/ingest`: the original Pyroscope API.
//!   Query `name=app{k=v,...}`, `from`/`until`, `sampleRate`, `spyName`,
//!   `units`, `aggregationType`, `format`. Bodies: raw pprof (plain or gzip),
//!   `multipart/form-data` with a `profile` part (pyroscope-go, newer nodejs),
//!   folded text (`format=folded`, the default) and `format=lines`.
//! - `POST /push.v1.PusherService/Push`: Connect unary, binary
//!   (`application/proto`) or JSON (`application/json`), optionally gzipped.
//!
//! Each pprof profile becomes one [`Envelope`](proflow_model::model::Envelope)
//! whose payload keeps the bytes as they arrived; only the metadata is scanned.
//! All profiles of one request go to the pipeline as one batch, and the client
//! hears success only once the pipeline took it.
//!
//! Module map: `config` (the receiver's config, its checks and its build),
//! `server` (listener, routes, responses), `ingest` and `push`
//! (one per API), `name`, `timestamp`, `folded`, `multipart`, `labels` and
//! `profile_type` (the parsers and Pyroscope's labelling rules), `budget` (the
//! per-request decompression budget), `error`.

mod budget;
mod config;
mod error;
mod folded;
mod ingest;
mod jfr;
mod labels;
mod multipart;
mod name;
mod profile_limits;
mod profile_type;
mod push;
mod server;
mod speedscope;
mod timestamp;
mod tree;

pub use config::PprofPushConfig;
pub use error::IngestError;
pub use server::{LocalAddr, PprofPushReceiver};

/// Entry points for the fuzz targets in `fuzz/`: every decoder of untrusted
/// bytes, run the way a request runs them. Not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use bytes::Bytes;

    use futures_util::FutureExt;
    use proflow_model::model::Envelope;
    use proflow_model::pprof::Profile;

    use super::budget::DecompressBudget;
    use super::folded::{self, TextFormat};
    use super::ingest::{self, BodyKind};
    use super::jfr;
    use super::multipart::{self, PartLimit};
    use super::profile_type::folded_type;
    use super::push::{self, Codec};

    /// An `/ingest` request: query string and body (multipart is [`multipart`]).
    /// `Err` is the refusal's message.
    pub fn ingest(query: &str, body: &[u8]) -> Result<Vec<Envelope>, String> {
        let uri = format!("/ingest?{query}")
            .parse::<axum::http::Uri>()
            .map_err(|e| e.to_string())?;
        let params =
            ingest::parse_params(&uri, 1_700_000_000_000_000_000).map_err(|e| e.to_string())?;
        let body = Bytes::copy_from_slice(body);
        let mut budget = DecompressBudget::new(1 << 20);
        match ingest::body_kind(&params.format, None).map_err(|e| e.to_string())? {
            BodyKind::Pprof | BodyKind::Multipart => {
                ingest::pprof_batch(&params, body, None, &mut budget)
            }
            BodyKind::Text(format) => ingest::text_batch(
                &params,
                format,
                body,
                Default::default(),
                &mut budget,
                &mut Default::default(),
            ),
            BodyKind::Jfr { .. } => {
                jfr::jfr_batch(&params, body, None, &mut budget, &mut Default::default())
            }
            BodyKind::Speedscope => ingest::speedscope_batch(
                &params,
                body,
                Default::default(),
                &mut budget,
                &mut Default::default(),
            ),
        }
        .map_err(|r| r.error.to_string())
    }

    /// A JFR upload as `/ingest?format=jfr` converts it: the recording and
    /// the agent's labels (empty: none), plain or gzip, within a request's
    /// budget (1 MiB to decompress, 4 MiB of memory). `Err` is the
    /// refusal's message.
    pub fn jfr(recording: &[u8], labels: &[u8]) -> Result<Vec<Envelope>, String> {
        let params = ingest::parse_params(
            &"/ingest?name=fuzz&format=jfr".parse().expect("a valid uri"),
            1_700_000_000_000_000_000,
        )
        .map_err(|e| e.to_string())?;
        let mut budget = DecompressBudget::new(1 << 20);
        let labels = (!labels.is_empty()).then(|| Bytes::copy_from_slice(labels));
        super::jfr::jfr_batch(
            &params,
            Bytes::copy_from_slice(recording),
            labels,
            &mut budget,
            &mut Default::default(),
        )
        .map_err(|r| r.error.to_string())
    }

    /// A speedscope body read as `/ingest?format=speedscope&sampleRate=..`
    /// reads it: per profile its sample rate and its stacks (`;`-joined,
    /// root first) with their values, and what was counted as lost.
    #[allow(clippy::type_complexity)]
    pub fn speedscope(
        body: &[u8],
        sample_rate: u32,
    ) -> Result<
        (
            Vec<(u32, Vec<(String, i64)>)>,
            proflow_model::lost::LostSamples,
        ),
        String,
    > {
        let mut free = |_: usize| -> Result<(), proflow_model::memory::OverBudget> { Ok(()) };
        let profiles =
            super::speedscope::parse(body, sample_rate, folded::TextLimits::default(), &mut free)
                .map_err(|e| e.to_string())?;
        let mut lost = proflow_model::lost::LostSamples::default();
        let out = profiles
            .into_iter()
            .map(|p| {
                lost.merge(&p.stacks.lost);
                let stacks = p
                    .stacks
                    .stacks
                    .into_iter()
                    .map(|(k, v)| (k.into_owned(), v))
                    .collect();
                (p.sample_rate, stacks)
            })
            .collect();
        Ok((out, lost))
    }

    /// A folded (`lines`: lines) text body as a CPU profile sampled at
    /// `sample_rate`, converted as `/ingest` converts it: the stacks read,
    /// the profile made of them, and the samples counted as lost. Every
    /// stack read counts more than zero.
    pub fn folded(
        body: &[u8],
        lines: bool,
        sample_rate: u32,
    ) -> Result<(Profile, proflow_model::lost::LostSamples), String> {
        let format = if lines {
            TextFormat::Lines
        } else {
            TextFormat::Folded
        };
        // What the conversion charges, checked against what it made.
        let charged = std::cell::Cell::new(0usize);
        let mut charge = |n: usize| -> Result<(), proflow_model::memory::OverBudget> {
            charged.set(charged.get() + n);
            Ok(())
        };
        let limits = folded::TextLimits::default();
        let stacks =
            ingest::parse_text(body, format, limits, &mut charge).map_err(|e| e.to_string())?;
        assert!(
            stacks.stacks.iter().all(|(_, count)| *count > 0),
            "a stack read with no samples"
        );
        let ty = folded_type("cpu").ok_or("no cpu type")?;
        let conv = folded::conversion(ty, sample_rate);
        let mut lost = stacks.lost.clone();
        let profile = folded::to_profile(&stacks, &conv, 1, 1, limits, &mut charge, &mut lost)
            .map_err(|e| e.to_string())?;
        // Every frame's name is held twice (the string table and the
        // builder's index); the sample and period type names are not
        // charged (a few constant words).
        let names: usize = profile
            .function
            .iter()
            .map(|f| profile.string(f.name).len())
            .sum();
        assert!(
            charged.get() >= 2 * names,
            "the conversion charged {} bytes for {names} bytes of frame names",
            charged.get()
        );
        Ok((profile, lost))
    }

    /// A `multipart/form-data` body read as `/ingest` reads it, each part at
    /// most `part_limit` bytes: the `profile` and `sample_type_config` parts.
    /// The body is all in memory, so reading never waits.
    pub fn multipart(
        content_type: &str,
        body: &[u8],
        part_limit: usize,
    ) -> Result<(Option<Bytes>, Option<Bytes>), String> {
        let read = multipart::read_form(
            content_type,
            Bytes::copy_from_slice(body),
            PartLimit::RequestBody(part_limit),
        );
        let form = read
            .now_or_never()
            .expect("reading a body in memory waited")
            .map_err(|e| e.to_string())?;
        Ok((form.profile, form.sample_type_config))
    }

    /// A Connect Push body, binary protobuf or JSON. `Err` is the refusal's message.
    pub fn push(json: bool, body: &[u8]) -> Result<Vec<Envelope>, String> {
        let codec = if json { Codec::Json } else { Codec::Proto };
        let request =
            push::decode_request(codec, Bytes::copy_from_slice(body)).map_err(|e| e.to_string())?;
        let mut budget = DecompressBudget::new(1 << 20);
        push::to_batch(request, &mut budget, 1_700_000_000_000_000_000)
            .map_err(|r| r.error.to_string())
    }
}
