//! The in-process HTTP server the exporters' unit tests answer from, for the
//! refusals and failures a real peer cannot be made to give on cue (a
//! scripted 429, a RESOURCE_EXHAUSTED with RetryInfo, a reset). The answers
//! are the test's; this only serves them, HTTP/1 and HTTP/2 alike.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;

use hyper::body::Incoming;
use hyper::{Request, Response};
use tokio::net::TcpListener;

/// Serves every request on `stream` with `answer` until the client goes.
pub(crate) async fn serve<S, F, Fut, B>(stream: S, answer: F)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let service = hyper::service::service_fn(move |req| {
        let answer = answer.clone();
        async move { Ok::<_, Infallible>(answer(req).await) }
    });
    let _ = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new())
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
        .await;
}

/// Listens on a free loopback port and serves each connection with
/// `answer` ([`serve`]); its address. (The `otlp` tests listen themselves,
/// TLS included.)
#[cfg_attr(not(any(feature = "parca", feature = "pyroscope")), allow(dead_code))]
pub(crate) async fn listen<F, Fut, B>(answer: F) -> SocketAddr
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(serve(stream, answer.clone()));
        }
    });
    addr
}
