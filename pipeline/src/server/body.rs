//! Reading a request body into memory granted as its bytes arrive: a
//! client that declares a large `Content-Length` and then sends nothing
//! holds nothing, and one that trickles holds what it sent, until
//! `read_timeout` ends it. The declared length refuses a body larger than
//! the limit, or one the in-flight budget has no room for (after waiting a
//! moment), before anything is read (a client sending `Expect:
//! 100-continue` is not asked for the body); it also caps how far the
//! buffer grows ahead of what arrived, so an honest one ends at exactly its
//! size. A body refused for memory half-way is read to its end and thrown
//! away (no memory held), so the client gets to read its 429 instead of a
//! broken connection.
//!
//! What may depend on this: receivers that read whole bodies (`pprof_push`,
//! the `otlp` receiver's HTTP side).

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use crate::memory::{self, MemoryGrant, OverBudget};

/// The smallest step the buffer grows by.
const MIN_STEP: usize = 16 << 10;

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
}

/// Reads `body` whole within `read_timeout` and `limit` bytes, growing
/// `grant` before every allocation of the buffer, by what arrived (at most
/// doubling, never past `declared` while the body keeps to it).
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
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Unreadable(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            let len = buf.len() + data.len();
            if len > limit {
                return Err(BodyError::TooLarge { limit });
            }
            if len > buf.capacity() {
                let want = next_capacity(buf.capacity(), len, declared, limit);
                if let Err(e) = grant
                    .grow(want - buf.capacity(), memory::DEFAULT_WAIT)
                    .await
                {
                    drop(buf);
                    grant.shrink(grant.held());
                    discard(&mut body, limit.saturating_sub(len)).await;
                    return Err(e.into());
                }
                buf.reserve_exact(want - buf.len());
            }
            buf.extend_from_slice(&data);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::MemoryBudget;
    use http_body_util::{Full, StreamBody};

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

    #[tokio::test(start_paused = true)]
    async fn a_promised_body_that_never_comes_holds_nothing_and_times_out() {
        let budget = MemoryBudget::new(64 << 20);
        let (_tx, rx) = tokio::sync::mpsc::channel::<
            Result<hyper::body::Frame<Bytes>, std::convert::Infallible>,
        >(1);
        let body = StreamBody::new(tokio_stream_from(rx));
        let reading = tokio::spawn({
            let budget = budget.clone();
            async move {
                let mut grant = budget.grant();
                let r = read_body(
                    body,
                    Some(16 << 20),
                    16 << 20,
                    &mut grant,
                    Duration::from_secs(30),
                )
                .await;
                (r, grant.held())
            }
        });
        tokio::time::sleep(Duration::from_secs(29)).await;
        assert_eq!(budget.in_flight(), 0, "a declared length takes nothing");
        let (r, held) = reading.await.unwrap();
        assert_eq!(r.unwrap_err(), BodyError::TimedOut(Duration::from_secs(30)));
        assert_eq!(held, 0);
    }

    /// The receiving half of a channel as a stream of frames.
    fn tokio_stream_from<T: Send + 'static>(
        mut rx: tokio::sync::mpsc::Receiver<T>,
    ) -> impl futures_util::Stream<Item = T> + Unpin {
        Box::pin(futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx)))
    }
}
