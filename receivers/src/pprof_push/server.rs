//! The running `pprof_push` receiver: the listener, the routes and the path of
//! every request: check method and headers, read the body within
//! `max_request_body_size`, decode on a blocking thread (gunzip and protobuf
//! scans are CPU work that must not stall the async workers) within one
//! `max_decompressed_size` budget for the whole request, hand the batch to the
//! pipeline once, answer.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::any;
use bytes::Bytes;
use proflow_core::component::{self, BuildError, Consumer, Receiver, ReceiverContext, ServeFuture};
use proflow_model::lost::LostSamples;
use proflow_model::memory::{MemoryBudget, MemoryGrant};
use proflow_model::model::{BatchMeta, Envelope, now_unix_nanos};
use proflow_net::server::body::{declared_length, read_body};
use proflow_net::server::{
    HttpListenerSettings, ProfileLimits, ProfileSource, Secured, TenantBound, TenantLimiter,
    accept_loop,
};
use tower::Service;

use proflow_core::telemetry::ReceiverTelemetry;

use super::budget::DecompressBudget;
use super::error::{IngestError, Refused};
use super::folded::TextLimits;
use super::ingest::{self, BodyKind};
use super::multipart::{IngestForm, PartLimit, read_form};
use super::profile_limits;
use super::push::{self, Codec};

mod convert;

use convert::IngestBody;

/// Size limits of one receiver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub max_request_body: usize,
    pub max_decompressed: usize,
    /// What a folded or lines body may convert to.
    pub text: TextLimits,
    /// How long a client may take to send a request's body (the
    /// listener's `read_timeout`).
    pub read_timeout: Duration,
}

/// The address a receiver listens on, known once [`Receiver::start`] has
/// bound it (which is when `start` returns `Ok`).
///
/// It exists because `start` consumes the receiver and the pipeline only sees
/// `Box<dyn Receiver>`: whoever builds the concrete [`PprofPushReceiver`] takes
/// this handle first and reads the real port afterwards, which is what tests
/// with `endpoint: 127.0.0.1:0` need. The address is also logged at start.
#[derive(Debug, Clone, Default)]
pub struct LocalAddr(Arc<OnceLock<SocketAddr>>);

impl LocalAddr {
    /// The bound address, or `None` before the receiver started.
    pub fn get(&self) -> Option<SocketAddr> {
        self.0.get().copied()
    }
}

/// A built, not yet started `pprof_push` receiver.
#[derive(Debug)]
pub struct PprofPushReceiver {
    endpoint: SocketAddr,
    listener: HttpListenerSettings,
    limits: Limits,
    tenant_limits: Option<Arc<TenantLimiter>>,
    local_addr: LocalAddr,
}

impl PprofPushReceiver {
    pub(crate) fn new(
        endpoint: SocketAddr,
        listener: HttpListenerSettings,
        limits: Limits,
        tenant_limits: Option<Arc<TenantLimiter>>,
    ) -> Self {
        PprofPushReceiver {
            endpoint,
            listener,
            limits,
            tenant_limits,
            local_addr: LocalAddr::default(),
        }
    }

    /// A handle to the address this receiver will be bound to.
    pub fn local_addr(&self) -> LocalAddr {
        self.local_addr.clone()
    }
}

#[async_trait]
impl Receiver for PprofPushReceiver {
    async fn start(self: Box<Self>, ctx: ReceiverContext) -> Result<ServeFuture, BuildError> {
        let secured = Secured::start(
            self.listener.listener.tls.as_ref(),
            self.listener.listener.auth.as_ref(),
            &ctx.id,
            &ctx.shutdown,
        )
        .map_err(|e| BuildError::new(format!("receiver `{}`: {e}", ctx.id)))?;
        let listener = ctx.listeners.bind(self.endpoint).map_err(|e| {
            BuildError::new(format!(
                "receiver `{}`: cannot listen on {}: {e}",
                ctx.id, self.endpoint
            ))
        })?;
        let addr = listener.local_addr().map_err(|e| {
            BuildError::new(format!(
                "receiver `{}`: cannot read the address bound for {}: {e}",
                ctx.id, self.endpoint
            ))
        })?;
        let _ = self.local_addr.0.set(addr);
        tracing::info!(receiver = %ctx.id, %addr, "pprof_push receiver listening");
        let telemetry = ctx.telemetry.clone();
        let shared = Arc::new(Shared {
            id: ctx.id.clone(),
            receiver: Arc::from(ctx.id.as_str()),
            limits: self.limits,
            consumer: ctx.consumer,
            telemetry: ctx.telemetry,
            memory: ctx.memory,
            tenant_limits: self.tenant_limits.clone(),
        });
        let app = router(shared);
        let listen = self.listener.listen(secured.tls.clone());
        let id = ctx.id.clone();
        let shutdown = ctx.shutdown.clone();
        Ok(Box::pin(async move {
            accept_loop(
                listener,
                listen,
                shutdown,
                id.clone(),
                move |mut req, peer| {
                    let mut app = app.clone();
                    let (secured, telemetry) = (secured.clone(), telemetry.clone());
                    req.extensions_mut().insert(ClientAddr(peer));
                    async move {
                        // Credentials first: a request without them is refused unread.
                        if let Err(why) = secured.authenticate(&mut req).await {
                            let error = IngestError::Unauthenticated(why.to_string());
                            telemetry.refused(error.reason(), 0);
                            let mut response = error.into_response();
                            response.headers_mut().insert(
                                axum::http::header::WWW_AUTHENTICATE,
                                axum::http::HeaderValue::from_static(
                                    "Bearer, Basic realm=\"proflow\"",
                                ),
                            );
                            return response;
                        }
                        match app.call(req.map(Body::new)).await {
                            Ok(response) => response,
                            Err(never) => match never {},
                        }
                    }
                },
            )
            .await;
            tracing::info!(receiver = %id, "pprof_push receiver stopped");
        }))
    }
}

/// The client's address, put into each request's extensions by [`serve`].
#[derive(Debug, Clone, Copy)]
struct ClientAddr(SocketAddr);

/// The header Pyroscope (and Grafana's multi-tenant servers) read the tenant from.
static TENANT_HEADER: header::HeaderName = header::HeaderName::from_static("x-scope-orgid");

/// What every request handler shares.
struct Shared {
    id: String,
    /// The id again, shared by every batch's metadata.
    receiver: Arc<str>,
    limits: Limits,
    consumer: Arc<dyn Consumer>,
    telemetry: ReceiverTelemetry,
    memory: MemoryBudget,
    /// `limits`: per-tenant ingestion rates, when set.
    tenant_limits: Option<Arc<TenantLimiter>>,
}

fn router(shared: Arc<Shared>) -> Router {
    // `any` rather than `post`: a wrong method gets our JSON 405 and is counted.
    Router::new()
        .route("/ingest", any(ingest_handler))
        .route("/pyroscope/ingest", any(ingest_handler))
        .route("/push.v1.PusherService/Push", any(push_handler))
        .fallback(not_found_handler)
        .with_state(shared)
}

async fn ingest_handler(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let outcome = shared.ingest(req).await;
    shared.answer(outcome)
}

async fn push_handler(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let outcome = shared.push(req).await;
    shared.answer(outcome)
}

async fn not_found_handler(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let path = req.uri().path().to_owned();
    shared.answer(Err(IngestError::NotFound { path }.into()))
}

/// The request's `Content-Encoding`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContentEncoding {
    Identity,
    Gzip,
}

impl ContentEncoding {
    fn from_headers(headers: &HeaderMap) -> Result<Self, IngestError> {
        let Some(value) = headers.get(header::CONTENT_ENCODING) else {
            return Ok(ContentEncoding::Identity);
        };
        let value = value
            .to_str()
            .map_err(|_| {
                IngestError::UnsupportedMediaType(
                    "the Content-Encoding header is not ASCII text: send gzip or uncompressed (identity) bodies".to_owned(),
                )
            })?
            .trim()
            .to_ascii_lowercase();
        match value.as_str() {
            "" | "identity" => Ok(ContentEncoding::Identity),
            "gzip" | "x-gzip" => Ok(ContentEncoding::Gzip),
            other => Err(IngestError::UnsupportedMediaType(format!(
                "unsupported Content-Encoding {other:?}: send gzip or uncompressed (identity) bodies"
            ))),
        }
    }

    /// Undoes the encoding; gzip inflates within the request's budget and
    /// spends what it produced.
    fn decode(self, body: Bytes, budget: &mut DecompressBudget) -> Result<Bytes, IngestError> {
        const WHAT: &str = "the gzip request body";
        match self {
            ContentEncoding::Identity => Ok(body),
            ContentEncoding::Gzip => budget.inflate(|| WHAT.to_owned(), &body).map(Bytes::from),
        }
    }
}

fn header_text(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn require_post(req: &Request) -> Result<(), IngestError> {
    if req.method() == Method::POST {
        Ok(())
    } else {
        Err(IngestError::MethodNotAllowed {
            method: req.method().to_string(),
            path: req.uri().path().to_owned(),
        })
    }
}

/// Bodies up to this size may be decoded on the async worker itself. Handing a
/// typical 4-10 KB profile to the blocking pool costs two thread switches,
/// more than the ~20 µs the decode takes (measured: it halved throughput on
/// one core).
const DECODE_INLINE_MAX: usize = 16 << 10;

/// Whether a request's decoding may run on the async worker: only when the
/// body has no Content-Encoding (identity), is at most [`DECODE_INLINE_MAX`]
/// bytes and is not itself gzip (a body the formats find gzipped by its
/// magic bytes is inflated whatever the header says: a few KB of it may be
/// megabytes of text to parse). Then the only inflation left is of gzipped
/// profiles inside those 16 KiB, which deflate's ~1000:1 ratio bounds to about
/// 16 MiB in all. A gzip body (which may hold gzipped profiles, ~1000 × 1000)
/// or a larger body always goes to the blocking pool.
fn decode_inline(encoding: ContentEncoding, body: &[u8]) -> bool {
    encoding == ContentEncoding::Identity
        && body.len() <= DECODE_INLINE_MAX
        && !proflow_model::pprof::is_gzip(body)
}

/// Whether the parts of a form read from a body that [`decode_inline`]
/// allowed (`inline`) may still be decoded inline: not when one of them is
/// gzip, which may inflate to a thousand times its bytes.
fn parts_inline(inline: bool, parts: &[Option<&Bytes>]) -> bool {
    inline
        && !parts
            .iter()
            .flatten()
            .any(|p| proflow_model::pprof::is_gzip(p))
}

/// Runs CPU-bound decoding: inline when [`decode_inline`] allows it, on the
/// blocking pool otherwise so large bodies never stall the async workers.
async fn blocking<T: Send + 'static>(
    inline: bool,
    work: impl FnOnce() -> Result<T, Refused> + Send + 'static,
) -> Result<T, Refused> {
    if inline {
        return work();
    }
    tokio::task::spawn_blocking(work).await.map_err(|e| {
        Refused::from(IngestError::Internal(format!(
            "the decoding task failed: {e}"
        )))
    })?
}

/// Reads a multipart body's parts: decoded first if it has a
/// Content-Encoding (on the blocking pool), each part's copy granted.
async fn read_multipart(
    encoding: ContentEncoding,
    body: Bytes,
    content_type: Option<&str>,
    mut budget: DecompressBudget,
) -> Result<(IngestForm, DecompressBudget), Refused> {
    let (body, part_limit, mut budget) = match encoding {
        ContentEncoding::Identity => {
            let limit = PartLimit::RequestBody(body.len());
            (body, limit, budget)
        }
        encoding => {
            blocking(false, move || {
                let body = encoding.decode(body, &mut budget)?;
                // A part is a slice of the body already decoded (and
                // charged); copying it decompresses nothing, so it may be
                // as large as the setting allows.
                let limit = PartLimit::Decompressed {
                    remaining: budget.setting(),
                    setting: budget.setting(),
                };
                Ok((body, limit, budget))
            })
            .await?
        }
    };
    // The parts are copied out of the body: grant their memory.
    budget.reserve(body.len())?;
    let form = read_form(content_type.unwrap_or_default(), body, part_limit).await?;
    Ok((form, budget))
}

impl Shared {
    /// Reads the whole body within `read_timeout` and
    /// `max_request_body_size` (a larger declared `Content-Length` is
    /// refused before anything is read), every byte of the buffer granted
    /// from the in-flight memory budget as it arrives; the grant comes back
    /// with the body and is held until the request's profiles are queued.
    async fn read_body(
        &self,
        headers: &HeaderMap,
        body: Body,
    ) -> Result<(Bytes, MemoryGrant), IngestError> {
        // A tenant's grant: held to its share when memory is contended.
        let tenant =
            proflow_net::server::request_tenant(headers).map_err(IngestError::bad_request)?;
        let mut grant = self.memory.grant_for(tenant);
        let body = read_body(
            body,
            declared_length(headers),
            self.limits.max_request_body,
            &mut grant,
            self.limits.read_timeout,
        )
        .await
        .map_err(IngestError::from_body)?;
        Ok((body, grant))
    }

    /// Handles `/ingest`: reads, converts and queues one request's profiles.
    async fn ingest(&self, req: Request) -> Result<Response, Refused> {
        require_post(&req)?;
        let now = now_unix_nanos();
        let (parts, body) = req.into_parts();
        let content_type = header_text(&parts.headers, header::CONTENT_TYPE);
        // Everything the query and headers can refuse is refused before the
        // body is read.
        let params = ingest::parse_params(&parts.uri, now)?;
        let kind = ingest::body_kind(&params.format, content_type.as_deref())?;
        let encoding = ContentEncoding::from_headers(&parts.headers)?;
        let (body, grant) = self.read_body(&parts.headers, body).await?;
        self.admit_tenant(&parts, body.len())?;
        let inline = decode_inline(encoding, &body);
        let body_bytes = body.len();
        // One budget for everything this request inflates.
        let mut budget = DecompressBudget::with_grant(self.limits.max_decompressed, grant);
        budget.keep_plain(self.consumer.reads_profiles());
        let source = match kind {
            BodyKind::Multipart | BodyKind::Pprof => ProfileSource::IngestPprof,
            _ => ProfileSource::Converted,
        };
        budget.limit_profiles(self.profile_limits(&parts), source);
        let request = IngestBody {
            encoding,
            body,
            content_type,
            params,
            inline,
        };
        let (batch, budget, lost) =
            convert::convert_body(kind, request, &self.limits.text, budget).await?;
        self.check_labels(&parts, &batch).map_err(|error| Refused {
            error,
            profiles: batch.len() as u64,
        })?;
        let sender = parts.extensions.get::<ClientAddr>().map(|c| c.0.ip());
        let format = kind.name();
        let mut lost = lost;
        budget.count_truncated(&mut lost);
        if !lost.is_empty() {
            self.telemetry.lost(format, sender, &lost);
        }
        if batch.is_empty() && body_bytes > 0 {
            // Answered 200 as Pyroscope answers it (clients keep working),
            // but not silently.
            self.telemetry.empty_request(format, sender, body_bytes);
        }
        self.deliver(&parts, batch).await?;
        // The profiles are queued (and counted there): the request's memory
        // grant goes back.
        drop(budget);
        Ok(StatusCode::OK.into_response())
    }

    async fn push(&self, req: Request) -> Result<Response, Refused> {
        require_post(&req)?;
        let (parts, body) = req.into_parts();
        let codec =
            Codec::from_content_type(header_text(&parts.headers, header::CONTENT_TYPE).as_deref())?;
        let encoding = ContentEncoding::from_headers(&parts.headers)?;
        let (body, grant) = self.read_body(&parts.headers, body).await?;
        self.admit_tenant(&parts, body.len())?;
        let body_bytes = body.len();
        let inline = decode_inline(encoding, &body);
        // One budget for the body and every profile in it.
        let mut budget = DecompressBudget::with_grant(self.limits.max_decompressed, grant);
        budget.keep_plain(self.consumer.reads_profiles());
        budget.limit_profiles(self.profile_limits(&parts), ProfileSource::Push);
        let now = now_unix_nanos();
        let (batch, budget) = blocking(inline, move || {
            let plain = encoding.decode(body, &mut budget)?;
            budget.reserve(push::decode_cost(codec, &plain))?;
            let request = push::decode_request(codec, plain)?;
            let batch = push::to_batch(request, &mut budget, now)?;
            Ok((batch, budget))
        })
        .await?;
        self.check_labels(&parts, &batch).map_err(|error| Refused {
            error,
            profiles: batch.len() as u64,
        })?;
        let sender = parts.extensions.get::<ClientAddr>().map(|c| c.0.ip());
        let mut lost = LostSamples::default();
        budget.count_truncated(&mut lost);
        if !lost.is_empty() {
            self.telemetry.lost("push", sender, &lost);
        }
        if batch.is_empty() {
            // Every profile was valid and held no sample: answered as
            // Pyroscope answers it, but not silently.
            self.telemetry.empty_request("push", sender, body_bytes);
        }
        self.deliver(&parts, batch).await?;
        drop(budget);
        Ok((
            [(header::CONTENT_TYPE, codec.content_type())],
            codec.empty_response(),
        )
            .into_response())
    }

    /// The request's tenant takes `bytes` from its `limits` bucket, or the
    /// request is refused (429, `Retry-After`), nothing decoded.
    fn admit_tenant(&self, parts: &Parts, bytes: usize) -> Result<(), IngestError> {
        let Some(limiter) = &self.tenant_limits else {
            return Ok(());
        };
        let tenant = header_text(&parts.headers, TENANT_HEADER.clone());
        limiter
            .admit(tenant.as_deref(), bytes)
            .map_err(IngestError::RateLimited)
    }

    /// The profile `limits` of the request's tenant (none without `limits`).
    fn profile_limits(&self, parts: &Parts) -> ProfileLimits {
        let Some(limiter) = &self.tenant_limits else {
            return ProfileLimits::default();
        };
        limiter.profile_limits(header_text(&parts.headers, TENANT_HEADER.clone()).as_deref())
    }

    /// Every profile's series within its tenant's label and series
    /// `limits`, or the request is refused (Pyroscope's status, reason and
    /// words).
    fn check_labels(&self, parts: &Parts, batch: &[Envelope]) -> Result<(), IngestError> {
        let Some(limiter) = &self.tenant_limits else {
            return Ok(());
        };
        let tenant = header_text(&parts.headers, TENANT_HEADER.clone());
        limiter
            .check_series(tenant.as_deref(), batch)
            .map_err(IngestError::Limit)
    }

    /// Hands one request's profiles to the pipeline, once.
    async fn deliver(&self, parts: &Parts, envelopes: Vec<Envelope>) -> Result<(), Refused> {
        if envelopes.is_empty() {
            return Ok(());
        }
        // Profiles cut out of one request buffer (Push with several series)
        // would each keep the whole buffer alive while queued: give each its
        // own bytes, so queue `max_bytes` counts what is really held.
        let envelopes = if envelopes.len() > 1 {
            envelopes
                .into_iter()
                .map(|mut e| {
                    e.payload = e.payload.detach();
                    e
                })
                .collect()
        } else {
            envelopes
        };
        let profiles = envelopes.len() as u64;
        let meta = BatchMeta {
            receiver: self.receiver.clone(),
            tenant: header_text(&parts.headers, TENANT_HEADER.clone()).filter(|t| !t.is_empty()),
            tenant_bound: parts.extensions.get::<TenantBound>().is_some(),
            client: parts.extensions.get::<ClientAddr>().map(|c| c.0),
            this_host: false,
        };
        component::hand_over(&*self.consumer, &self.telemetry, envelopes, meta)
            .await
            .map_err(|refusal| Refused {
                error: refusal.into(),
                profiles,
            })
    }

    /// The response for an outcome; refusals are counted and logged.
    fn answer(&self, outcome: Result<Response, Refused>) -> Response {
        match outcome {
            Ok(response) => response,
            Err(Refused { error, profiles }) => {
                self.telemetry.refused(error.reason(), profiles);
                match &error {
                    IngestError::RateLimited(r) => {
                        self.telemetry
                            .tenant_refused(Some(&r.tenant), error.reason());
                    }
                    IngestError::Limit(r) => {
                        self.telemetry
                            .tenant_refused(Some(&r.tenant), error.reason());
                    }
                    _ => {}
                }
                if matches!(error, IngestError::Internal(_)) {
                    tracing::error!(receiver = %self.id, error = %error, "request failed");
                } else {
                    tracing::debug!(
                        receiver = %self.id,
                        status = error.status().as_u16(),
                        reason = error.reason(),
                        error = %error,
                        "request refused"
                    );
                }
                error.into_response()
            }
        }
    }
}

/// The profiles of a converted body within the tenant's profile limits
/// (the request refused whole when one is past them).
fn converted_within_limits(
    budget: &mut DecompressBudget,
    batch: Vec<Envelope>,
) -> Result<Vec<Envelope>, Refused> {
    let profiles = batch.len() as u64;
    profile_limits::limit_converted(budget, batch).map_err(|error| Refused { error, profiles })
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;
    use proflow_model::pprof;

    fn encoding(value: HeaderValue) -> Result<ContentEncoding, IngestError> {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_ENCODING, value);
        ContentEncoding::from_headers(&headers)
    }

    #[test]
    fn content_encodings() {
        assert_eq!(
            ContentEncoding::from_headers(&HeaderMap::new()),
            Ok(ContentEncoding::Identity)
        );
        assert_eq!(
            encoding(HeaderValue::from_static(" GZIP ")),
            Ok(ContentEncoding::Gzip)
        );
        for bad in [
            HeaderValue::from_static("br"),
            HeaderValue::from_bytes(b"gzip\xff").unwrap(),
        ] {
            let err = encoding(bad).unwrap_err();
            assert_eq!(err.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{err}");
        }
    }

    #[test]
    fn only_small_identity_bodies_that_are_not_gzip_decode_inline() {
        let text = vec![b'a'; DECODE_INLINE_MAX];
        assert!(decode_inline(ContentEncoding::Identity, &text));
        assert!(!decode_inline(
            ContentEncoding::Identity,
            &vec![b'a'; DECODE_INLINE_MAX + 1]
        ));
        assert!(!decode_inline(ContentEncoding::Gzip, &text[..100]));
        // Gzip found by its magic bytes, with no Content-Encoding.
        let sniffed = pprof::gzip(&vec![b'{'; 1 << 20]);
        assert!(sniffed.len() < 16 << 10);
        assert!(!decode_inline(ContentEncoding::Identity, &sniffed));
    }

    #[test]
    fn a_gzipped_part_of_a_small_form_is_not_decoded_inline() {
        let plain = Bytes::from_static(b"\x0a\x02\x08\x01");
        let gzipped = pprof::gzip(&vec![0u8; 1 << 20]);
        assert!(parts_inline(true, &[Some(&plain), None]));
        assert!(!parts_inline(true, &[Some(&plain), Some(&gzipped)]));
        assert!(!parts_inline(true, &[Some(&gzipped)]));
        assert!(!parts_inline(false, &[Some(&plain)]));
    }

    #[test]
    fn the_transport_decode_spends_the_budget() {
        let body = pprof::gzip(&[0u8; 1000]);
        let mut budget = DecompressBudget::new(1500);
        let plain = ContentEncoding::Gzip
            .decode(body.clone(), &mut budget)
            .unwrap();
        assert_eq!((plain.len(), budget.remaining()), (1000, 500));
        let err = ContentEncoding::Gzip.decode(body, &mut budget).unwrap_err();
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
        assert!(
            err.to_string()
                .contains("max_decompressed_size (1500 bytes)"),
            "{err}"
        );
    }
}
