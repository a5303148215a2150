//! OTLP/gRPC: `ProfilesService/Export` through tonic's server machinery
//! (framing, gzip, status trailers) with a codec of our own that hands the
//! handler the raw message bytes, so the request is decoded under the memory
//! budget by [`Handler::export`], not by tonic before anyone counted it.
//!
//! The request body is read here first, within `read_timeout` and
//! `max_recv_msg_size_mib` (plus the 5-byte message header), every byte
//! granted from the memory budget as it arrives, so a stream that stalls
//! holds only what it sent and tonic never buffers anything uncounted: a
//! gzip message is inflated here, under the grant (within
//! `max_recv_msg_size_mib`), and handed to tonic uncompressed; tonic's copy
//! of the body is granted before tonic gets it (a message in another
//! compression tonic inflates, and the codec grants it). tonic then bounds
//! the message. A refusal tonic makes itself (a message
//! too large, a corrupt frame) is counted here; tonic's `OUT_OF_RANGE` for
//! an oversized message is answered as gRPC-Go and the collector answer it,
//! `RESOURCE_EXHAUSTED`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::{Request, Response};
use proflow_model::inflate::{self, InflateError};
use proflow_model::memory::{self, MemoryGrant};
use proflow_model::otlp::collector::ExportProfilesServiceResponse;
use prost::Message;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::codec::{Codec, CompressionEncoding, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Code, Status};

use super::error::{OtlpError, Refused};
use super::export::{Encoding, Handler, Origin};
use super::http::TENANT_HEADER;
use proflow_net::server::body::read_body;
use proflow_net::server::{ListenerSettings, Secured, TenantBound, accept_loop};

/// The profiles method.
pub(crate) const EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export";
/// The traces method (for a receiver in a traces pipeline).
pub(crate) const TRACES_EXPORT_PATH: &str =
    "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// The gRPC protocol's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Settings {
    /// The listener's endpoint, parsed.
    pub endpoint: SocketAddr,
    /// `max_recv_msg_size_mib` in bytes.
    pub max_message: usize,
    pub listener: ListenerSettings,
}

struct Grpc {
    settings: Settings,
    handler: Arc<Handler>,
    secured: Secured,
}

/// Serves OTLP/gRPC on `listener` until `shutdown`.
pub(crate) async fn serve(
    listener: TcpListener,
    settings: Settings,
    secured: Secured,
    handler: Arc<Handler>,
    shutdown: CancellationToken,
) {
    let id = handler.id.clone();
    let listen = settings.listener.listen_grpc(secured.tls.clone());
    let grpc = Arc::new(Grpc {
        settings,
        handler,
        secured,
    });
    accept_loop(listener, listen, shutdown, id, move |req, peer| {
        let grpc = grpc.clone();
        async move { grpc.handle(req, peer).await }
    })
    .await;
}

/// What became of a request before the handler saw it: set once, by the
/// codec (refused for memory) or the handler (which counts its own
/// refusals).
type Outcome = Arc<OnceLock<Stage>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    Handled,
    MemoryLimit,
}

/// The gRPC message header: a compressed flag and a 4-byte length.
const MESSAGE_HEADER: usize = 5;

impl Grpc {
    async fn handle(
        &self,
        mut req: Request<Incoming>,
        peer: SocketAddr,
    ) -> Response<tonic::body::Body> {
        // Credentials first: a request without them is refused unread.
        if let Err(why) = self.secured.authenticate(&mut req).await {
            let error = OtlpError::Unauthenticated(why.to_string());
            let status = error.to_grpc();
            self.handler.refused(&Refused::from(error));
            return status.into_http();
        }
        let traces = match req.uri().path() {
            EXPORT_PATH => false,
            TRACES_EXPORT_PATH => true,
            other => {
                let error = OtlpError::NotFound(other.to_owned());
                self.handler.refused(&Refused::from(error));
                return Status::unimplemented(format!(
                    "unknown method {other}; this server serves {EXPORT_PATH} (and {TRACES_EXPORT_PATH} when in a traces pipeline)"
                ))
                .into_http();
            }
        };
        // A signal this receiver has no pipeline for is refused before the
        // message is read.
        let served = if traces {
            self.handler.span_consumer().map(|_| ())
        } else {
            self.handler.takes_profiles()
        };
        if let Err(error) = served {
            let status = error.to_grpc();
            self.handler.refused(&Refused::from(error));
            return status.into_http();
        }
        let (req, grant, compressed) = match self.read_request(req).await {
            Ok(read) => read,
            Err(error) => {
                let status = error.to_grpc();
                self.handler.refused(&Refused::from(error));
                return status.into_http();
            }
        };
        let outcome: Outcome = Arc::new(OnceLock::new());
        let granted = Granted::new(grant, compressed);
        let response = if traces {
            let codec = RawCodec::<TraceResponse>::new(&granted, &outcome);
            let service = TraceExportService {
                handler: self.handler.clone(),
                outcome: outcome.clone(),
            };
            self.server(codec).unary(service, req).await
        } else {
            let codec = RawCodec::<ExportProfilesServiceResponse>::new(&granted, &outcome);
            let service = ExportService {
                handler: self.handler.clone(),
                peer,
                outcome: outcome.clone(),
            };
            self.server(codec).unary(service, req).await
        };
        // Refusals the handler never saw: counted here.
        let refused = match outcome.get() {
            Some(Stage::Handled) => None,
            Some(Stage::MemoryLimit) => Some((OtlpError::MemoryLimit(String::new()), false)),
            None => match grpc_status(&response) {
                Some(Code::Ok) | None => None,
                Some(Code::OutOfRange | Code::ResourceExhausted) => Some((
                    OtlpError::TooLarge(format!(
                        "the request message exceeds max_recv_msg_size_mib ({} bytes, decompressed); send smaller requests or raise max_recv_msg_size_mib",
                        self.settings.max_message
                    )),
                    true,
                )),
                Some(code) => Some((
                    OtlpError::bad_request(format!("the request could not be read ({code:?})")),
                    false,
                )),
            },
        };
        match refused {
            None => response,
            Some((error, replace)) => {
                self.handler.refused(&Refused::from(error.clone()));
                if replace {
                    error.to_grpc().into_http()
                } else {
                    response
                }
            }
        }
    }
}

impl Grpc {
    /// Reads the request's body under a fresh memory grant (see the module
    /// docs) and hands the request on with the body in memory; tonic's copy
    /// of it is granted too. Also says whether the message is compressed.
    async fn read_request(
        &self,
        req: Request<Incoming>,
    ) -> Result<(Request<Full<Bytes>>, MemoryGrant, bool), OtlpError> {
        let (parts, body) = req.into_parts();
        // A compression other than gzip is left to tonic (which refuses it).
        let compressed = parts
            .headers
            .get("grpc-encoding")
            .is_some_and(|v| v.as_bytes() != b"identity");
        let limit = self.settings.max_message.saturating_add(MESSAGE_HEADER);
        // A tenant's grant: held to its share when memory is contended.
        let tenant =
            proflow_net::server::request_tenant(&parts.headers).map_err(OtlpError::BadRequest)?;
        let mut grant = self.handler.memory.grant_for(tenant);
        let body = read_body(body, None, limit, &mut grant, self.settings.listener.read_timeout.get())
            .await
            .map_err(|e| {
                OtlpError::from_body(e, |_| format!(
                    "the request message exceeds max_recv_msg_size_mib ({} bytes); send smaller requests or raise max_recv_msg_size_mib",
                    self.settings.max_message
                ))
            })?;
        let (parts, body, compressed) = match gzip_message(&parts.headers, &body) {
            // A gzip message is inflated here, under the grant, and handed
            // to tonic as an uncompressed one.
            Some(payload) => {
                let max = self.settings.max_message;
                let framed = inflate::inflate_after(&[0; MESSAGE_HEADER], payload, max, &mut grant)
                    .map_err(|e| match e {
                        InflateError::TooLarge { .. } => OtlpError::TooLarge(format!(
                            "the request message exceeds max_recv_msg_size_mib ({max} bytes) once decompressed; send smaller requests or raise max_recv_msg_size_mib"
                        )),
                        InflateError::Corrupt(detail) => OtlpError::bad_request(format!(
                            "the gzip message is corrupt ({detail}); send a valid gzip message or an uncompressed one"
                        )),
                        InflateError::OverBudget(e) => OtlpError::from_memory(e),
                    })?;
                let mut framed = framed;
                let len = u32::try_from(framed.len() - MESSAGE_HEADER).unwrap_or(u32::MAX);
                framed[1..MESSAGE_HEADER].copy_from_slice(&len.to_be_bytes());
                grant.shrink(body.len());
                let mut parts = parts;
                parts.headers.remove("grpc-encoding");
                (parts, Bytes::from(framed), false)
            }
            None => (parts, body, compressed),
        };
        // tonic copies the body into a buffer of its own.
        grant
            .grow(body.len(), memory::DEFAULT_WAIT)
            .await
            .map_err(OtlpError::from_memory)?;
        Ok((
            Request::from_parts(parts, Full::new(body)),
            grant,
            compressed,
        ))
    }

    fn server<R: Message + Send + 'static>(
        &self,
        codec: RawCodec<R>,
    ) -> tonic::server::Grpc<RawCodec<R>> {
        tonic::server::Grpc::new(codec)
            .accept_compressed(CompressionEncoding::Gzip)
            .send_compressed(CompressionEncoding::Gzip)
            .max_decoding_message_size(self.settings.max_message)
            .max_encoding_message_size(usize::MAX)
    }
}

type TraceResponse = proflow_model::spans::ExportTraceServiceResponse;

/// The unary traces service: spans for the span index, answered at once.
#[derive(Clone)]
struct TraceExportService {
    handler: Arc<Handler>,
    outcome: Outcome,
}

type TraceFuture =
    Pin<Box<dyn Future<Output = Result<tonic::Response<TraceResponse>, Status>> + Send>>;

impl tower::Service<tonic::Request<Raw>> for TraceExportService {
    type Response = tonic::Response<TraceResponse>;
    type Error = Status;
    type Future = TraceFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<Raw>) -> TraceFuture {
        let _ = self.outcome.set(Stage::Handled);
        let raw = req.into_inner();
        let handler = self.handler.clone();
        Box::pin(async move {
            match handler
                // tonic bounded the message (max_recv_msg_size_mib); what
                // it decodes to is bounded by the memory grant.
                .export_spans(raw.bytes, Encoding::Protobuf, raw.grant, usize::MAX)
                .await
            {
                Ok(response) => Ok(tonic::Response::new(response)),
                Err(error) => {
                    let status = error.to_grpc();
                    handler.refused(&Refused::from(error));
                    Err(status)
                }
            }
        })
    }
}

/// The `grpc-status` of a trailers-only response (every refusal tonic
/// makes before the handler runs is one).
fn grpc_status<B>(response: &Response<B>) -> Option<Code> {
    let value = response.headers().get("grpc-status")?.to_str().ok()?;
    value.parse::<i32>().ok().map(Code::from_i32)
}

/// The gzip payload of a unary request's one message, when the request is
/// gzip-encoded and its body is exactly one compressed message.
fn gzip_message<'a>(headers: &hyper::HeaderMap, body: &'a [u8]) -> Option<&'a [u8]> {
    if headers.get("grpc-encoding")?.as_bytes() != b"gzip" {
        return None;
    }
    let (header, payload) = body.split_at_checked(MESSAGE_HEADER)?;
    let len = u32::from_be_bytes(header[1..].try_into().ok()?) as usize;
    (header[0] == 1 && len == payload.len()).then_some(payload)
}

/// A request message as it arrived, with the memory granted for it.
struct Raw {
    bytes: Bytes,
    grant: MemoryGrant,
}

/// A request's memory grant on its way from [`Grpc::read_request`] to the
/// codec, which hands it to the handler with the message.
#[derive(Clone)]
struct Granted {
    grant: Arc<std::sync::Mutex<Option<MemoryGrant>>>,
    /// The message arrives compressed: tonic inflates it into a buffer of
    /// its own, which the codec grants.
    compressed: bool,
}

impl Granted {
    fn new(grant: MemoryGrant, compressed: bool) -> Self {
        Granted {
            grant: Arc::new(std::sync::Mutex::new(Some(grant))),
            compressed,
        }
    }

    fn take(&self) -> Option<MemoryGrant> {
        self.grant
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }
}

/// Hands the handler the message bytes; encodes the response (`R`) with prost.
struct RawCodec<R> {
    granted: Granted,
    outcome: Outcome,
    response: std::marker::PhantomData<fn() -> R>,
}

impl<R> RawCodec<R> {
    fn new(granted: &Granted, outcome: &Outcome) -> Self {
        RawCodec {
            granted: granted.clone(),
            outcome: outcome.clone(),
            response: std::marker::PhantomData,
        }
    }
}

impl<R: Message + Send + 'static> Codec for RawCodec<R> {
    type Encode = R;
    type Decode = Raw;
    type Encoder = ResponseEncoder<R>;
    type Decoder = RawDecoder;

    fn encoder(&mut self) -> Self::Encoder {
        ResponseEncoder(std::marker::PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawDecoder {
            granted: self.granted.clone(),
            outcome: self.outcome.clone(),
        }
    }
}

struct ResponseEncoder<R>(std::marker::PhantomData<fn() -> R>);

impl<R: Message> Encoder for ResponseEncoder<R> {
    type Item = R;
    type Error = Status;

    fn encode(&mut self, item: Self::Item, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        item.encode(dst)
            .map_err(|e| Status::internal(format!("cannot encode the response: {e}")))
    }
}

struct RawDecoder {
    granted: Granted,
    outcome: Outcome,
}

impl Decoder for RawDecoder {
    type Item = Raw;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Raw>, Status> {
        let len = src.remaining();
        let Some(mut grant) = self.granted.take() else {
            // A unary request has one message; a second is refused.
            return Err(Status::invalid_argument(
                "a unary request carries one message; send one per request",
            ));
        };
        // An uncompressed message is a slice of tonic's buffer (granted
        // already); an inflated one is a buffer of its own.
        if self.granted.compressed
            && let Err(e) = grant.try_grow(len)
        {
            let _ = self.outcome.set(Stage::MemoryLimit);
            return Err(OtlpError::from_memory(e).to_grpc());
        }
        Ok(Some(Raw {
            bytes: src.copy_to_bytes(len),
            grant,
        }))
    }
}

/// The unary service tonic calls with the decoded (raw) message.
#[derive(Clone)]
struct ExportService {
    handler: Arc<Handler>,
    peer: SocketAddr,
    outcome: Outcome,
}

type ExportFuture = Pin<
    Box<dyn Future<Output = Result<tonic::Response<ExportProfilesServiceResponse>, Status>> + Send>,
>;

impl tower::Service<tonic::Request<Raw>> for ExportService {
    type Response = tonic::Response<ExportProfilesServiceResponse>;
    type Error = Status;
    type Future = ExportFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: tonic::Request<Raw>) -> ExportFuture {
        let _ = self.outcome.set(Stage::Handled);
        let origin = Origin {
            tenant: req
                .metadata()
                .get(TENANT_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned),
            tenant_bound: req.extensions().get::<TenantBound>().is_some(),
            client: Some(self.peer),
        };
        let raw = req.into_inner();
        let handler = self.handler.clone();
        Box::pin(async move {
            match handler
                .export(
                    raw.bytes,
                    Encoding::Protobuf,
                    raw.grant,
                    // Protobuf is never decoded: no decoded size to bound.
                    usize::MAX,
                    origin,
                )
                .await
            {
                Ok(response) => Ok(tonic::Response::new(response)),
                Err(refused) => {
                    handler.refused(&refused);
                    Err(refused.error.to_grpc())
                }
            }
        })
    }
}
