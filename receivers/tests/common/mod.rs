//! What the receivers' HTTP tests share: a recording `Consumer` that answers
//! as told (our own interface, the pipeline side of a receiver), and a plain
//! HTTP/1 client whose [`Reply`] keeps status, headers and body.

// Each test binary uses a different subset of these helpers.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use proflow_core::component::{Admission, ConsumeError, Consumer};
use proflow_model::model::{Batch, BatchMeta, Envelope};

/// What the [`Recorder`] answers the receiver.
#[derive(Clone, Debug)]
pub enum Answer {
    Accept,
    Backpressure(Duration),
    ShuttingDown,
}

/// Records every batch it is given, with its metadata, and answers as told.
pub struct Recorder {
    pub batches: Mutex<Vec<(Vec<Envelope>, Arc<BatchMeta>)>>,
    pub answer: Mutex<Answer>,
}

impl Recorder {
    pub fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            batches: Mutex::new(Vec::new()),
            answer: Mutex::new(Answer::Accept),
        })
    }

    pub fn answer(&self, answer: Answer) {
        *self.answer.lock().unwrap() = answer;
    }

    pub fn batches(&self) -> Vec<(Vec<Envelope>, Arc<BatchMeta>)> {
        self.batches.lock().unwrap().clone()
    }
}

#[async_trait]
impl Consumer for Recorder {
    async fn consume(&self, batch: Batch, admission: Admission) -> Result<(), ConsumeError> {
        assert_eq!(admission, Admission::Refuse, "a push receiver cannot wait");
        let answer = self.answer.lock().unwrap().clone();
        match answer {
            Answer::Accept => {
                self.batches
                    .lock()
                    .unwrap()
                    .push((batch.envelopes, batch.meta));
                Ok(())
            }
            Answer::Backpressure(retry_after) => Err(ConsumeError::Backpressure {
                exporter: "slow".into(),
                retry_after,
            }),
            Answer::ShuttingDown => Err(ConsumeError::ShuttingDown),
        }
    }
}

/// A response, whole.
pub struct Reply {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

/// Sends one HTTP/1 request on a new connection to `addr` and reads the
/// whole response.
pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: Bytes,
) -> Reply {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(path)
        .header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = sender
        .send_request(req.body(Full::new(body)).unwrap())
        .await
        .unwrap();
    Reply {
        status: resp.status().as_u16(),
        headers: resp.headers().clone(),
        body: resp.into_body().collect().await.unwrap().to_bytes(),
    }
}
