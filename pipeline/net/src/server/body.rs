//! Reading a request body into memory granted as its bytes arrive: a
//! client that declares a large `Content-Length` and then sends nothing
//! holds nothing, and one that trickles holds what it sent, until
//! `read_timeout` ends it. The declared length refuses a body larger than
//! the limit, or one the in-flight budget has no room for (after waiting a
//! moment), before anything is read (a client sending `Expect:
//! 100-continue` is not asked for the body); it also caps how far the
//! buffer grows ahead of what arrived, so an honest one ends at exactly its
//! size. A body refused half-way (for memory, or too large) is read on and
//! thrown away for a bounded while (no memory held), so the client gets to
//! read its 429 or 413 instead of a broken connection. A body that comes
//! slower than [`MIN_RATE`] bytes a second, after [`RATE_GRACE`], ends in
//! [`BodyError::TooSlow`] (408), so a crowd of trickling clients cannot
//! hold every connection for all of `read_timeout`.
//!
//! What may depend on this: receivers that read whole bodies (`pprof_push`,
//! the `otlp` receiver's HTTP side).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use proflow_config::{ByteSize, FieldError};
use proflow_model::memory::{self, MemoryGrant, OverBudget};

/// The smallest step the buffer grows by.
const MIN_STEP: usize = 16 << 10;

/// The least average rate a body must keep once [`RATE_GRACE`] has passed
/// (as Kestrel's `MinRequestBodyDataRate`): a client trickling a body holds
/// its connection and grant for seconds, not for all of `read_timeout`.
pub const MIN_RATE: usize = 240;
/// How long a body may arrive slower than [`MIN_RATE`] at first.
pub const RATE_GRACE: Duration = Duration::from_secs(5);
/// How often a body that sends nothing is looked at.
const RATE_CHECK_EVERY: Duration = Duration::from_secs(1);
/// Most bytes read and thrown away after a refusal, so the client can read it.
const DISCARD_MAX: usize = 16 << 20;

/// Whether `received` bytes in `elapsed` are below the least rate, past the grace.
fn too_slow(received: usize, elapsed: Duration) -> bool {
    elapsed > RATE_GRACE && (received as u128) < (MIN_RATE as u128) * elapsed.as_millis() / 1000
}

/// Why a body could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Declared or found larger than the limit.
    #[error("the request body is larger than {limit} bytes")]
    TooLarge { limit: usize },
    /// The in-flight memory budget had no room for the next bytes.
    #[error(transparent)]
    OverBudget(#[from] OverBudget),
    /// The connection failed while the body arrived.
    #[error("could not read the request body ({0}); send it again")]
    Unreadable(String),
    /// The body did not arrive within the read timeout.
    #[error("the request body did not arrive within {0:?}")]
    TimedOut(Duration),
    /// The body came slower than [`MIN_RATE`] bytes a second on average
    /// (after [`RATE_GRACE`]).
    #[error("the request body came slower than {MIN_RATE} bytes a second; send it faster")]
    TooSlow,
}

/// The body length a request's `Content-Length` declares, if it declares one
/// that parses ([`read_body`] refuses it at once when over the limit).
pub fn declared_length(headers: &hyper::HeaderMap) -> Option<u64> {
    headers
        .get(hyper::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
}

/// Reads `body` whole within `read_timeout` and `limit` bytes, growing
/// `grant` before every allocation of the buffer, by what arrived (at most
/// doubling, never past `declared` while the body keeps to it; the old and
/// the new buffer both granted while one is copied into the other). A body
/// slower than [`MIN_RATE`] past [`RATE_GRACE`] ends early.
pub async fn read_body<B>(
    body: B,
    declared: Option<u64>,
    limit: usize,
    grant: &mut MemoryGrant,
    read_timeout: Duration,
) -> Result<Bytes, BodyError>
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(BodyError::TooLarge { limit });
    }
    let declared = declared.map_or(0, |d| d as usize);
    let read = async {
        if declared > 0 {
            grant
                .budget()
                .room_for(declared, memory::DEFAULT_WAIT)
                .await?;
        }
        let mut body = body;
        let mut buf: Vec<u8> = Vec::new();
        let started = tokio::time::Instant::now();
        loop {
            // Looked at every second: a body that keeps below the least
            // rate past the grace ends now, not at read_timeout.
            let Ok(frame) = tokio::time::timeout(RATE_CHECK_EVERY, body.frame()).await else {
                if too_slow(buf.len(), started.elapsed()) {
                    return Err(BodyError::TooSlow);
                }
                continue;
            };
            let Some(frame) = frame else { break };
            let frame = frame.map_err(|e| BodyError::Unreadable(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let len = buf.len() + data.len();
            if len > limit {
                // Read on (thrown away, a bounded while) so the client gets
                // to read the refusal.
                drop(buf);
                grant.shrink(grant.held());
                discard(&mut body, limit.min(DISCARD_MAX)).await;
                return Err(BodyError::TooLarge { limit });
            }
            if len > buf.capacity() {
                let old = buf.capacity();
                let want = next_capacity(old, len, declared, limit);
                // Growing copies into a new buffer while the old one is
                // still there: both are granted for that moment.
                if let Err(e) = grant.grow(want, memory::DEFAULT_WAIT).await {
                    drop(buf);
                    grant.shrink(grant.held());
                    discard(&mut body, limit.saturating_sub(len).min(DISCARD_MAX)).await;
                    return Err(e.into());
                }
                buf.reserve_exact(want - buf.len());
                grant.shrink(old);
            }
            buf.extend_from_slice(&data);
            if too_slow(buf.len(), started.elapsed()) {
                return Err(BodyError::TooSlow);
            }
        }
        Ok(Bytes::from(buf))
    };
    match tokio::time::timeout(read_timeout, read).await {
        Ok(body) => body,
        Err(_) => Err(BodyError::TimedOut(read_timeout)),
    }
}

/// Reads and drops what is left of `body`, at most `left` more bytes.
async fn discard<B>(body: &mut B, mut left: usize)
where
    B: hyper::body::Body<Data = Bytes> + Unpin,
{
    while let Some(Ok(frame)) = body.frame().await {
        let n = frame.data_ref().map_or(0, Bytes::len);
        if n > left {
            return;
        }
        left -= n;
    }
}

/// The capacity to grow to for `len` bytes: double (at least [`MIN_STEP`]),
/// but not past the declared length when the body is within it, nor `limit`.
fn next_capacity(capacity: usize, len: usize, declared: usize, limit: usize) -> usize {
    let doubled = capacity.saturating_mul(2).max(MIN_STEP);
    let ahead = if len <= declared {
        doubled.min(declared)
    } else {
        doubled
    };
    ahead.max(len).min(limit)
}

/// The checks of a receiver's `max_request_body_size` and
/// `max_decompressed_size` (under `prefix`, empty at a component's top):
/// both more than 0 (the messages suggest the receiver's defaults, `examples`), and
/// the second at least the first, or an uncompressed
/// body that fits the request limit would be refused as too large once
/// "decompressed".
pub fn body_size_problems(
    prefix: &str,
    max_request_body_size: ByteSize,
    max_decompressed_size: ByteSize,
    examples: (&str, &str),
) -> Vec<FieldError> {
    let path = |field: &str| {
        if prefix.is_empty() {
            field.to_owned()
        } else {
            format!("{prefix}.{field}")
        }
    };
    let mut problems = Vec::new();
    if max_request_body_size.bytes() == 0 {
        problems.push(FieldError::new(
            path("max_request_body_size"),
            format!("must be more than 0, such as {}", examples.0),
        ));
    }
    if max_decompressed_size.bytes() == 0 {
        problems.push(FieldError::new(
            path("max_decompressed_size"),
            format!("must be more than 0, such as {}", examples.1),
        ));
    } else if max_decompressed_size < max_request_body_size {
        problems.push(FieldError::new(
            path("max_decompressed_size"),
            format!(
                "must be at least max_request_body_size ({max_request_body_size}); raise it or lower max_request_body_size"
            ),
        ));
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{Full, StreamBody};
    use proflow_model::memory::MemoryBudget;

    #[test]
    fn the_buffer_grows_with_what_arrived_up_to_the_declared_length() {
        // An honest 1 MiB body ends at exactly 1 MiB.
        let mut cap = 0;
        let mut steps = 0;
        for len in (1..=64).map(|i| i * (16 << 10)) {
            if len > cap {
                cap = next_capacity(cap, len, 1 << 20, 16 << 20);
                steps += 1;
            }
        }
        assert_eq!(cap, 1 << 20);
        assert!(steps <= 8, "{steps}");
        // A body longer than declared goes on doubling, within the limit.
        assert_eq!(
            next_capacity(1 << 20, (1 << 20) + 1, 1 << 20, 16 << 20),
            2 << 20
        );
        assert_eq!(next_capacity(8 << 20, (8 << 20) + 1, 0, 10 << 20), 10 << 20);
        // Nothing declared: doubling from 16 KiB.
        assert_eq!(next_capacity(0, 10, 0, 1 << 20), MIN_STEP);
    }

    #[tokio::test]
    async fn a_body_is_read_and_granted() {
        let budget = MemoryBudget::new(64 << 20);
        let mut grant = budget.grant();
        let data = vec![7u8; 100_000];
        let body = Full::new(Bytes::from(data.clone()));
        let got = read_body(
            body,
            Some(100_000),
            1 << 20,
            &mut grant,
            Duration::from_secs(5),
        )
        .await
        .unwrap();
        assert_eq!(got, data);
        assert_eq!(grant.held(), 100_000, "an honest length is held exactly");
        let err = read_body(
            Full::new(Bytes::from(data)),
            Some(100_000),
            50_000,
            &mut budget.grant(),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
        assert_eq!(err, BodyError::TooLarge { limit: 50_000 });
    }

    /// A body fed by the test: `send` bytes every `every`, `times` times.
    fn trickle(
        send: usize,
        every: Duration,
        times: usize,
    ) -> StreamBody<
        impl futures_util::Stream<Item = Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>
        + Unpin,
    > {
        let (tx, rx) = tokio::sync::mpsc::channel(1);
        tokio::spawn(async move {
            for _ in 0..times {
                tokio::time::sleep(every).await;
                let frame = hyper::body::Frame::data(Bytes::from(vec![1u8; send]));
                if tx.send(Ok(frame)).await.is_err() {
                    return;
                }
            }
            // Then nothing more, and the sender kept: the body never ends.
            std::future::pending::<()>().await;
        });
        StreamBody::new(tokio_stream_from(rx))
    }

    #[tokio::test(start_paused = true)]
    async fn a_promised_body_that_never_comes_holds_nothing_and_ends_early() {
        let budget = MemoryBudget::new(64 << 20);
        let reading = tokio::spawn({
            let budget = budget.clone();
            async move {
                let mut grant = budget.grant();
                let started = tokio::time::Instant::now();
                let r = read_body(
                    trickle(0, Duration::from_secs(1), 0),
                    Some(16 << 20),
                    16 << 20,
                    &mut grant,
                    Duration::from_secs(30),
                )
                .await;
                (r, grant.held(), started.elapsed())
            }
        });
        tokio::time::sleep(RATE_GRACE).await;
        assert_eq!(budget.in_flight(), 0, "a declared length takes nothing");
        let (r, held, took) = reading.await.unwrap();
        assert_eq!(r.unwrap_err(), BodyError::TooSlow);
        assert_eq!(held, 0);
        assert!(took <= RATE_GRACE + 2 * RATE_CHECK_EVERY, "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_body_is_cut_below_the_least_rate_and_at_read_timeout_above_it() {
        let budget = MemoryBudget::new(64 << 20);
        let read = |body, timeout| {
            let budget = budget.clone();
            async move { read_body(body, None, 16 << 20, &mut budget.grant(), timeout).await }
        };
        // Under the rate: ended once the grace is over.
        let err = read(
            trickle(MIN_RATE / 2, Duration::from_secs(1), 100),
            Duration::from_secs(60),
        )
        .await
        .unwrap_err();
        assert_eq!(err, BodyError::TooSlow);
        // Above it, but not done within read_timeout: 408 all the same.
        let err = read(
            trickle(2 * MIN_RATE, Duration::from_secs(1), 100),
            Duration::from_secs(20),
        )
        .await
        .unwrap_err();
        assert_eq!(err, BodyError::TimedOut(Duration::from_secs(20)));
    }

    /// The receiving half of a channel as a stream of frames.
    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
