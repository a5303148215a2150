//! Profiles the tests push and what they add up to: a CPU profile with
//! known functions, push helpers, function totals.

use super::names::now_nanos;
use super::peers::PY_FUNCTIONS;
use super::process::Proflow;

/// Pyroscope's push messages as the Connect endpoint
/// `/push.v1.PusherService/Push` takes them: the pipeline's own definitions.
pub mod push {
    pub use proflow_model::push_v1::PushRequest;
    use proflow_model::push_v1::RawProfileSeries;

    /// One series with `labels` and one sample of `raw_profile`.
    pub fn request(labels: &[(&str, &str)], raw_profile: Vec<u8>) -> PushRequest {
        PushRequest {
            series: vec![RawProfileSeries::new(
                labels.iter().copied(),
                [raw_profile.into()],
            )],
        }
    }
}

/// Names of the functions in [`cpu_profile`].
pub const HOT_FUNCTION: &str = "e2e_hot_function";
pub const WARM_FUNCTION: &str = "e2e_warm_function";

/// A small CPU profile (plain protobuf bytes) of the last 10 s: `main` calls
/// [`HOT_FUNCTION`] (30 samples of 10 ms) and [`WARM_FUNCTION`] (10 samples).
pub fn cpu_profile() -> Vec<u8> {
    let mut b = proflow_model::pprof::ProfileBuilder::new();
    b.sample_type("cpu", "nanoseconds")
        .period("cpu", "nanoseconds", 10_000_000)
        .time(now_nanos() - 10_000_000_000, 10_000_000_000)
        .sample_root_first(["main", HOT_FUNCTION], vec![300_000_000])
        .sample_root_first(["main", WARM_FUNCTION], vec![100_000_000]);
    proflow_model::pprof::encode(&b.build()).to_vec()
}

/// Gzip-compresses `bytes`.
pub fn gzip(bytes: &[u8]) -> Vec<u8> {
    proflow_model::pprof::gzip(bytes).to_vec()
}

/// `/ingest` query for a push of `name` (e.g. `app{k=v}`, percent-encoded here)
/// in `format` covering the last 10 s, `from`/`until` in unix seconds.
pub fn ingest_query(name: &str, format: Option<&str>) -> String {
    let until = now_nanos() / 1_000_000_000;
    let mut q = format!(
        "/ingest?name={}&from={}&until={until}&spyName=e2e&sampleRate=100",
        percent_encode(name),
        until - 10
    );
    if let Some(f) = format {
        q.push_str("&format=");
        q.push_str(&percent_encode(f));
    }
    q
}

pub use proflow_net::url::percent_encode;

/// Standard base64 with padding (what protobuf JSON uses for bytes).
pub fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// A valid raw pprof push to `/ingest` for service `app`; panics unless 200.
pub fn push_valid(proflow: &Proflow, app: &str) {
    let reply = proflow.post(
        &ingest_query(app, Some("pprof")),
        &[("content-type", "application/octet-stream")],
        gzip(&cpu_profile()),
    );
    reply.expect_status(200, "valid pprof push");
}

// ---------------------------------------------------------- exporter tests

/// Per function (of [`PY_FUNCTIONS`] unless said otherwise), the sum of one
/// sample type's values of the samples whose stack contains it.
pub type Totals = std::collections::BTreeMap<String, i64>;

/// Adds one profile's [`Totals`] of [`PY_FUNCTIONS`] in its first sample type.
pub fn add_totals(totals: &mut Totals, profile: &proflow_model::pprof::Profile) {
    add_function_totals(totals, profile, &PY_FUNCTIONS, None);
}

/// Adds one profile's [`Totals`] of `functions` in the sample type named
/// `sample_type` (e.g. `cpu`; the first when `None`). Panics if the profile
/// has no such sample type.
pub fn add_function_totals(
    totals: &mut Totals,
    profile: &proflow_model::pprof::Profile,
    functions: &[&str],
    sample_type: Option<&str>,
) {
    let index = match sample_type {
        None => 0,
        Some(name) => profile
            .sample_type
            .iter()
            .position(|st| {
                profile
                    .string_table
                    .get(st.r#type as usize)
                    .is_some_and(|s| s == name)
            })
            .unwrap_or_else(|| panic!("the profile has no sample type {name}")),
    };
    for (frames, sample) in proflow_model::pprof::stacks_root_first(profile) {
        let value = sample.value.get(index).copied().unwrap_or(0);
        for f in functions {
            if frames.contains(f) {
                *totals.entry((*f).to_owned()).or_default() += value;
            }
        }
    }
}

/// The same functions, each total within 1%.
pub fn totals_close(got: &Totals, want: &Totals) -> bool {
    got.len() == want.len()
        && want.iter().all(|(f, w)| {
            got.get(f)
                .is_some_and(|g| (g - w).abs() as f64 <= (*w as f64).abs() * 0.01)
        })
}
