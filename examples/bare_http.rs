//! The ceiling for the push path on this machine: an HTTP server on the same
//! stack as the `pprof_push` receiver (tokio, hyper's auto HTTP/1+2 builder)
//! that only reads each request body and answers 200. BENCHMARKS.md compares
//! proflow's pass-through throughput with it, under the same load tool.
//!
//! ```sh
//! cargo run --release --example bare_http -- 127.0.0.1:24041
//! ```

use std::convert::Infallible;
use std::net::SocketAddr;

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

async fn answer(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    // Read the whole body, as the receiver must, and drop it.
    let _ = req.into_body().collect().await;
    Ok(Response::new(Full::new(Bytes::new())))
}

#[tokio::main]
async fn main() {
    let addr: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:24041".to_owned())
        .parse()
        .expect("usage: bare_http HOST:PORT");
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind the address");
    eprintln!("bare_http listening on {addr}");
    let builder = auto::Builder::new(TokioExecutor::new());
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        tokio::spawn(async move {
            let _ = builder
                .serve_connection(TokioIo::new(stream), hyper::service::service_fn(answer))
                .await;
        });
    }
}
