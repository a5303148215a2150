//! One target's scrape loop: every interval, at the target's own offset
//! within it, GET the profile, check it is pprof, turn a cumulative one into
//! a delta, and hand it to the pipeline.
//!
//! - **Offsets**: a target scrapes when Unix time modulo the interval equals
//!   its key modulo the interval, so 1,000 targets spread over the interval
//!   instead of firing together, and a target keeps its phase across
//!   restarts (Prometheus's rule).
//! - **Isolation**: each loop is its own task with its own timeout, so a
//!   slow or dead target never delays another. A loop that falls behind
//!   (a scrape longer than the interval) skips the ticks it missed.
//! - **Bounded**: a body is read up to `body_size_limit` and inflated up to
//!   the same limit; the collector's in-flight memory budget is taken for
//!   the body and its decoded form before either is used, waiting up to
//!   the scrape timeout.
//! - **Backpressure**: profiles go to the pipeline with
//!   [`Admission::Wait`]: a full `block` queue delays this target's next
//!   scrape instead of refusing what it scraped.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use proflow_core::component::{Admission, ConsumeError, Consumer};
use proflow_core::telemetry::ReceiverTelemetry;
use proflow_model::inflate::{self, InflateError};
use proflow_model::lost::LostSamples;
use proflow_model::memory::{MemoryBudget, MemoryGrant};
use proflow_model::model::{Batch, BatchMeta, Envelope, Payload};
use proflow_model::pprof::{self, DecodeError};

use super::telemetry::ScrapeTelemetry;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::client::{FetchError, HttpClient};
use super::delta::{Delta, DeltaError, DeltaOutcome, DeltaState, DeltaStore, has_cumulative};
use super::status::{TargetStatus, Transition};
use super::targets::{JobSpec, Target};

/// What every loop of one job shares.
pub struct JobShared {
    pub job: Arc<JobSpec>,
    pub client: HttpClient,
    pub consumer: Arc<dyn Consumer>,
    pub receiver: ReceiverTelemetry,
    pub scrape: ScrapeTelemetry,
    pub meta: Arc<BatchMeta>,
    pub memory: MemoryBudget,
    pub deltas: Arc<DeltaStore>,
}

/// Why a scrape gave no profile.
#[derive(Debug)]
pub enum ScrapeError {
    Fetch(FetchError),
    Timeout(Duration),
    /// The body is not a pprof profile.
    Invalid(String),
    /// The body or its inflated form is larger than `body_size_limit`.
    TooLarge(usize),
    /// The collector's in-flight memory is used up.
    Memory(String),
    /// The delta state is full.
    DeltaStateFull,
}

impl ScrapeError {
    /// The metric reason word.
    pub fn reason(&self) -> &'static str {
        match self {
            ScrapeError::Fetch(e) => e.reason(),
            ScrapeError::Timeout(_) => "timeout",
            ScrapeError::Invalid(_) => "invalid_profile",
            ScrapeError::TooLarge(_) => "too_large",
            ScrapeError::Memory(_) => "memory",
            ScrapeError::DeltaStateFull => "delta_state_full",
        }
    }
}

impl std::fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScrapeError::Fetch(e) => write!(f, "{e}"),
            ScrapeError::Timeout(d) => write!(
                f,
                "no complete answer within {:.1}s (scrape_timeout; CPU profiles get their seconds on top)",
                d.as_secs_f64()
            ),
            ScrapeError::Invalid(e) => write!(f, "the body is not a pprof profile: {e}"),
            ScrapeError::TooLarge(limit) => write!(
                f,
                "the profile is larger than body_size_limit ({limit} bytes) as sent or once inflated"
            ),
            ScrapeError::Memory(e) => write!(f, "{e}"),
            ScrapeError::DeltaStateFull => write!(
                f,
                "max_delta_state is used up: this cumulative profile cannot be turned into deltas (raise max_delta_state)"
            ),
        }
    }
}

/// The wait before a target's first scrape: until Unix time modulo
/// `interval` is `key` modulo `interval`.
pub fn first_wait(key: u64, interval: Duration, now: SystemTime) -> Duration {
    let interval_ms = interval.as_millis().max(1);
    let offset = u128::from(key) % interval_ms;
    let now_ms = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0);
    let phase = now_ms % interval_ms;
    let wait = (offset + interval_ms - phase) % interval_ms;
    Duration::from_millis(u64::try_from(wait).unwrap_or(0))
}

/// Runs `status.target`'s loop until `cancel`.
pub async fn run(shared: Arc<JobShared>, status: Arc<TargetStatus>, cancel: CancellationToken) {
    let job = shared.job.clone();
    let start = tokio::time::Instant::now()
        + first_wait(status.target.key, job.interval, SystemTime::now());
    let mut ticker = tokio::time::interval_at(start, job.interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut delta = status
        .target
        .profile
        .cumulative
        .then(|| DeltaState::new(shared.deltas.clone()));
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let wall = SystemTime::now();
        let started = Instant::now();
        let outcome = tokio::select! {
            _ = cancel.cancelled() => return,
            r = scrape_once(&shared, &status, delta.as_mut()) => r,
        };
        let took = started.elapsed();
        shared.scrape.scraped(&job.name, took.as_secs_f64());
        shared
            .scrape
            .delta_state(shared.deltas.used_bytes(), shared.deltas.series());
        let recorded = match outcome {
            Ok(None) => Ok(()),
            Ok(Some((envelope, _grant))) => {
                let bytes = envelope.size_bytes() as u64;
                let batch = Batch::new(vec![envelope], shared.meta.clone());
                let consumed = tokio::select! {
                    _ = cancel.cancelled() => return,
                    r = shared.consumer.consume(batch, Admission::Wait) => r,
                };
                match consumed {
                    Ok(()) => {
                        shared.receiver.accepted(1, bytes);
                        Ok(())
                    }
                    // A queue closes under a running target only when a
                    // reload retires its exporter: not a reason to stop.
                    Err(ConsumeError::ShuttingDown) if cancel.is_cancelled() => return,
                    Err(e) => {
                        shared.receiver.refused("backpressure", 1);
                        Err(("backpressure", e.to_string()))
                    }
                }
            }
            Err(e) => {
                shared.scrape.failed(&job.name, e.reason());
                if matches!(e, ScrapeError::Invalid(_) | ScrapeError::TooLarge(_)) {
                    shared.receiver.refused(e.reason(), 1);
                }
                Err((e.reason(), e.to_string()))
            }
        };
        let error = recorded.as_ref().err().map(|(_, m)| m.clone());
        if let Some(e) = &error {
            shared
                .receiver
                .error(&format!("scraping {}: {e}", status.target.shown_url()));
        }
        match status.record(wall, took, recorded) {
            Transition::Same => {}
            Transition::Failing => tracing::warn!(
                job = %job.name,
                url = %status.target.shown_url(),
                error = error.as_deref().unwrap_or(""),
                "scrape failed; logged again when the reason changes or the target recovers (every failure is counted in proflow_scrape_failures_total and shown on /targets)"
            ),
            Transition::Recovered => tracing::info!(
                job = %job.name,
                url = %status.target.shown_url(),
                "scrape target recovered"
            ),
        }
    }
}

/// One scrape: the envelope to send (with the memory it holds), `None`
/// when a cumulative profile only primed its delta state.
async fn scrape_once(
    shared: &JobShared,
    status: &TargetStatus,
    delta: Option<&mut DeltaState>,
) -> Result<Option<(Envelope, MemoryGrant)>, ScrapeError> {
    let job = &shared.job;
    let target = &status.target;
    let limit = job.body_limit;
    let timeout = if target.profile.seconds {
        Duration::from_secs(job.profile_seconds()) + job.timeout
    } else {
        job.timeout
    };
    let deadline = tokio::time::Instant::now() + timeout;
    // Every byte of the answer is granted as it arrives, and all that is
    // made from it before it is made.
    let mut grant = shared.memory.grant();
    let body = fetch_body(shared, target, timeout, deadline, &mut grant).await?;
    let (data, meta) = scan_body(&body, limit, delta.is_some(), &mut grant)?;
    if meta.sample_types.is_empty() {
        return Err(ScrapeError::Invalid(
            "the profile has no sample types".to_owned(),
        ));
    }
    let delta = match delta {
        Some(delta) if has_cumulative(&meta.sample_types) => delta,
        other => {
            // As it arrived: no re-encode. A profile that is not cumulative
            // leaves no state behind (a target may change what it serves).
            if let Some(delta) = other {
                delta.clear();
            }
            return Ok(Some(as_arrived(target, body, data, meta, grant, limit)));
        }
    };
    let wait = deadline.saturating_duration_since(tokio::time::Instant::now());
    let outcome = difference(delta, body, data, meta.decoded_size, &mut grant, wait).await?;
    match delta_of(outcome, &job.name, target)? {
        // Nothing happened in the interval (no allocation, no contention):
        // an empty profile says nothing a backend could show.
        None => Ok(None),
        Some(d) if d.samples == 0 => Ok(None),
        Some(d) => Ok(Some(delta_envelope(shared, target, d, meta, grant, limit))),
    }
}

/// Fetches a target's answer under `grant`, within `deadline`; an empty
/// body is refused.
async fn fetch_body(
    shared: &JobShared,
    target: &Target,
    timeout: Duration,
    deadline: tokio::time::Instant,
    grant: &mut MemoryGrant,
) -> Result<Bytes, ScrapeError> {
    let body: Bytes = tokio::time::timeout_at(
        deadline,
        shared
            .client
            .get_granted(target.url.clone(), shared.job.body_limit, grant),
    )
    .await
    .map_err(|_| ScrapeError::Timeout(timeout))?
    .map_err(|e| match e {
        FetchError::Memory(m) => ScrapeError::Memory(m),
        e => ScrapeError::Fetch(e),
    })?;
    if body.is_empty() {
        return Err(ScrapeError::Invalid("the body is empty".to_owned()));
    }
    Ok(body)
}

/// Why a body that does not decode is refused.
fn refused(limit: usize, e: DecodeError) -> ScrapeError {
    match e {
        DecodeError::TooLarge { .. } => ScrapeError::TooLarge(limit),
        other => ScrapeError::Invalid(other.to_string()),
    }
}

/// Why a body that does not inflate is refused.
fn inflate_refused(limit: usize, e: InflateError) -> ScrapeError {
    match e {
        InflateError::TooLarge { .. } => ScrapeError::TooLarge(limit),
        InflateError::OverBudget(e) => ScrapeError::Memory(e.to_string()),
        InflateError::Corrupt(detail) => refused(limit, DecodeError::Gzip(detail)),
    }
}

/// The bytes to difference (plain, when `cumulative`; else the body as
/// sent) and the profile's metadata, scanned under `grant`.
fn scan_body(
    body: &Bytes,
    limit: usize,
    cumulative: bool,
    grant: &mut MemoryGrant,
) -> Result<(Bytes, pprof::Metadata), ScrapeError> {
    // A cumulative profile is differenced below from its plain bytes:
    // inflate it once, here (up to `limit`, as the scan would), under the
    // grant, and scan and difference the plain bytes. Others are scanned
    // from a plain copy let go at once.
    if cumulative {
        let data = if pprof::is_gzip(body) {
            Bytes::from(
                inflate::inflate(body, limit, grant).map_err(|e| inflate_refused(limit, e))?,
            )
        } else {
            body.clone()
        };
        let meta = pprof::scan_metadata(&data, limit).map_err(|e| refused(limit, e))?;
        Ok((data, meta))
    } else {
        let meta = inflate::read_plain(body, limit, grant, |plain| {
            pprof::scan_metadata(plain, limit)
        })
        .map_err(|e| inflate_refused(limit, e))?
        .map_err(|e| refused(limit, e))?;
        Ok((body.clone(), meta))
    }
}

/// Now, in nanoseconds since the Unix epoch (0 before it).
fn now_nanos() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The envelope of a profile of `target`.
fn envelope(
    target: &Target,
    mut meta: pprof::Metadata,
    start: i64,
    end: i64,
    payload: Payload,
) -> Envelope {
    let (sample_types, period_type) = meta.take_value_types();
    Envelope {
        labels: target.labels.clone(),
        start_unix_nanos: start,
        end_unix_nanos: end,
        sample_types,
        period_type,
        period: meta.period,
        payload,
    }
}

/// The envelope of a profile sent on as it arrived, with the grant shrunk
/// to what it holds.
fn as_arrived(
    target: &Target,
    body: Bytes,
    data: Bytes,
    meta: pprof::Metadata,
    mut grant: MemoryGrant,
    limit: usize,
) -> (Envelope, MemoryGrant) {
    if data.as_ptr() != body.as_ptr() {
        grant.shrink(data.len());
    }
    drop(data);
    let start = if meta.time_nanos > 0 {
        meta.time_nanos
    } else {
        now_nanos()
    };
    let end = start.saturating_add(meta.duration_nanos.max(0));
    let payload = Payload::from_bytes(body, limit);
    (envelope(target, meta, start, end, payload), grant)
}

/// Differences a cumulative profile's plain bytes `data` against its
/// state, once the memory that takes is granted (waiting up to `wait`).
async fn difference(
    delta: &mut DeltaState,
    body: Bytes,
    data: Bytes,
    decoded_size: usize,
    grant: &mut MemoryGrant,
    wait: Duration,
) -> Result<DeltaOutcome, ScrapeError> {
    // What differencing takes and makes: its scratch, less than decoding
    // would take (`decoded_size`), and the delta, the size of the plain
    // bytes but for a few (Go's profiles: 11 at most, the duration). The
    // plain bytes themselves are granted already.
    let work = decoded_size.saturating_add(data.len());
    grant
        .grow(work, wait)
        .await
        .map_err(|e| ScrapeError::Memory(e.to_string()))?;
    drop(body);
    let outcome = delta.next(&data, work).map_err(|e| match e {
        DeltaError::Malformed(_) => ScrapeError::Invalid(e.to_string()),
        DeltaError::OverBudget { .. } => ScrapeError::Memory(e.to_string()),
    })?;
    drop(data);
    Ok(outcome)
}

/// The delta profile to send of a differencing's outcome, if any (a reset
/// logged).
fn delta_of(
    outcome: DeltaOutcome,
    job: &str,
    target: &Target,
) -> Result<Option<Delta>, ScrapeError> {
    match outcome {
        DeltaOutcome::Primed(instant) => Ok(instant),
        DeltaOutcome::Reset(instant) => {
            tracing::info!(
                job = %job,
                url = %target.shown_url(),
                "a cumulative profile went down (the target restarted): its deltas start again from this scrape"
            );
            Ok(instant)
        }
        DeltaOutcome::StateFull => Err(ScrapeError::DeltaStateFull),
        // The scan saw a cumulative type by name; differencing found none
        // (the same names, so never): as if it were not cumulative.
        DeltaOutcome::Unchanged => Err(ScrapeError::Invalid(
            "the profile's cumulative sample types could not be read".to_owned(),
        )),
        DeltaOutcome::Delta(d) => Ok(Some(d)),
    }
}

/// The envelope of a delta profile (its negative deltas counted), with
/// the grant shrunk to what it holds.
fn delta_envelope(
    shared: &JobShared,
    target: &Target,
    d: Delta,
    meta: pprof::Metadata,
    mut grant: MemoryGrant,
    limit: usize,
) -> (Envelope, MemoryGrant) {
    if d.went_down > 0 {
        // An estimate (Go's alloc_objects) that went down: its delta
        // is 0, not a negative value, nor a restart.
        let mut lost = LostSamples::default();
        lost.add("negative_delta", d.went_down as u64);
        shared.receiver.lost("pprof", None, &lost);
    }
    let end = if d.time_nanos > 0 {
        d.time_nanos
    } else {
        now_nanos()
    };
    let start = end.saturating_sub(d.duration_nanos.max(0));
    // The grant keeps what the envelope holds: the delta's bytes.
    grant.shrink(grant.held().saturating_sub(d.bytes.len()));
    let payload = Payload::from_bytes(Bytes::from(d.bytes), limit);
    (envelope(target, meta, start, end, payload), grant)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_spread_targets_and_hold_their_phase() {
        let interval = Duration::from_secs(15);
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        // Key 4000 scrapes at 4 s into each 15 s period.
        assert_eq!(first_wait(4000, interval, at(0)), Duration::from_secs(4));
        assert_eq!(first_wait(4000, interval, at(3000)), Duration::from_secs(1));
        assert_eq!(first_wait(4000, interval, at(4000)), Duration::ZERO);
        assert_eq!(
            first_wait(4000, interval, at(5000)),
            Duration::from_secs(14)
        );
        assert_eq!(
            first_wait(15_000 * 7 + 4000, interval, at(5000)),
            Duration::from_secs(14)
        );
        // Many keys fill the interval rather than one instant.
        let waits: std::collections::BTreeSet<u64> = (0..1000u64)
            .map(|k| first_wait(k.wrapping_mul(0x9e37_79b9_7f4a_7c15), interval, at(0)).as_secs())
            .collect();
        assert_eq!(waits.len(), 15);
    }
}
