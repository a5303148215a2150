//! OpAMP's two transports. WebSocket: one connection, each message a binary
//! frame of a zero varint header and the protobuf message; the server may
//! send at any time. Plain HTTP: each `AgentToServer` is a POST of
//! `application/x-protobuf`, answered by one `ServerToAgent`. TCP and TLS
//! are proflow's own (the shared rustls client setup), the WebSocket
//! handshake and framing tokio-tungstenite's. What the server sends is
//! bounded before it is read.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{HeaderName, HeaderValue, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use proflow_config::OpampConnection;
use prost::Message as _;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::proto::{AgentToServer, ServerToAgent};

/// The largest message read from the server.
pub const MAX_MESSAGE_BYTES: usize = 4 << 20;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// The endpoint's headers, checked once.
pub fn headers(c: &OpampConnection) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    c.headers
        .iter()
        .map(|(k, v)| {
            let name = HeaderName::from_bytes(k.as_bytes())
                .map_err(|_| format!("service.opamp headers: `{k}` is not a header name"))?;
            let value = HeaderValue::from_str(v).map_err(|_| {
                format!("service.opamp headers: the value of `{k}` is not a header value")
            })?;
            Ok((name, value))
        })
        .collect()
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// A WebSocket connection to the server.
pub struct WsConnection {
    ws: WebSocketStream<Box<dyn Io>>,
}

impl WsConnection {
    pub async fn connect(
        endpoint: &str,
        headers: &[(HeaderName, HeaderValue)],
        tls: &Arc<rustls::ClientConfig>,
    ) -> Result<WsConnection, String> {
        let uri: Uri = endpoint
            .parse()
            .map_err(|e| format!("`{endpoint}` is not a URL: {e}"))?;
        let secure = uri.scheme_str() == Some("wss");
        let host = uri.host().ok_or("the endpoint names no host")?.to_owned();
        let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port)),
        )
        .await
        .map_err(|_| format!("connecting to {host}:{port} timed out"))?
        .map_err(|e| format!("connecting to {host}:{port}: {e}"))?;
        let _ = tcp.set_nodelay(true);
        let io: Box<dyn Io> = if secure {
            let name =
                rustls::pki_types::ServerName::try_from(host.trim_matches(['[', ']']).to_owned())
                    .map_err(|e| format!("`{host}` is not a TLS server name: {e}"))?;
            let stream = tokio_rustls::TlsConnector::from(tls.clone())
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
            Box::new(stream)
        } else {
            Box::new(tcp)
        };
        let mut request = endpoint
            .into_client_request()
            .map_err(|e| format!("`{endpoint}`: {e}"))?;
        for (k, v) in headers {
            request.headers_mut().insert(k.clone(), v.clone());
        }
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE_BYTES))
            .max_frame_size(Some(MAX_MESSAGE_BYTES));
        let (ws, _) = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio_tungstenite::client_async_with_config(request, io, Some(config)),
        )
        .await
        .map_err(|_| "the WebSocket handshake timed out".to_owned())?
        .map_err(|e| format!("the WebSocket handshake failed: {e}"))?;
        Ok(WsConnection { ws })
    }

    pub async fn send(&mut self, msg: &AgentToServer) -> Result<(), String> {
        let mut frame = Vec::with_capacity(msg.encoded_len() + 1);
        frame.push(0);
        msg.encode(&mut frame)
            .map_err(|e| format!("encoding: {e}"))?;
        self.ws
            .send(Message::Binary(Bytes::from(frame)))
            .await
            .map_err(|e| format!("sending: {e}"))
    }

    /// The next message from the server; `Err` when the connection ends.
    pub async fn recv(&mut self) -> Result<ServerToAgent, String> {
        loop {
            match self.ws.next().await {
                Some(Ok(Message::Binary(data))) => return decode_ws(&data),
                Some(Ok(Message::Close(frame))) => {
                    return Err(format!(
                        "the server closed the connection{}",
                        frame.map(|f| format!(": {}", f.reason)).unwrap_or_default()
                    ));
                }
                // Pings are answered by the library; text frames are not OpAMP.
                Some(Ok(_)) => continue,
                Some(Err(e)) => return Err(format!("reading: {e}")),
                None => return Err("the connection ended".to_owned()),
            }
        }
    }

    pub async fn close(mut self) {
        let _ = self
            .ws
            .close(Some(CloseFrame {
                code: CloseCode::Normal,
                reason: "proflow is stopping".into(),
            }))
            .await;
    }
}

/// A WebSocket message: a varint header (0) and the protobuf message (a
/// message without the header, as the first servers sent, is read too).
pub fn decode_ws(data: &[u8]) -> Result<ServerToAgent, String> {
    let body = match data.first() {
        Some(0) => &data[1..],
        _ => data,
    };
    ServerToAgent::decode(body).map_err(|e| format!("an undecodable ServerToAgent: {e}"))
}

/// Plain HTTP: one POST per message.
pub struct HttpTransport {
    client: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    uri: Uri,
    headers: Vec<(HeaderName, HeaderValue)>,
}

impl HttpTransport {
    pub fn new(
        endpoint: &str,
        headers: Vec<(HeaderName, HeaderValue)>,
        tls: rustls::ClientConfig,
    ) -> Result<HttpTransport, String> {
        let uri: Uri = endpoint
            .parse()
            .map_err(|e| format!("`{endpoint}` is not a URL: {e}"))?;
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(CONNECT_TIMEOUT));
        let connector = HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(HttpTransport {
            client: Client::builder(TokioExecutor::new()).build(connector),
            uri,
            headers,
        })
    }

    pub async fn exchange(&self, msg: &AgentToServer) -> Result<ServerToAgent, String> {
        let mut request = http::Request::post(self.uri.clone())
            .header("content-type", "application/x-protobuf")
            .body(Full::new(Bytes::from(msg.encode_to_vec())))
            .map_err(|e| format!("building the request: {e}"))?;
        for (k, v) in &self.headers {
            request.headers_mut().insert(k.clone(), v.clone());
        }
        let answer = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("POST {}: {}", self.uri, proflow_net::error_chain(&e)))?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_MESSAGE_BYTES)
                .collect()
                .await
                .map_err(|e| format!("reading the answer: {e}"))?
                .to_bytes();
            if !status.is_success() {
                return Err(format!(
                    "POST {}: HTTP {status}: {}",
                    self.uri,
                    String::from_utf8_lossy(&body[..body.len().min(256)])
                ));
            }
            ServerToAgent::decode(body).map_err(|e| format!("an undecodable ServerToAgent: {e}"))
        };
        tokio::time::timeout(HTTP_TIMEOUT, answer)
            .await
            .map_err(|_| format!("POST {}: no answer in {HTTP_TIMEOUT:?}", self.uri))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn websocket_messages_are_read_with_and_without_their_header() {
        let msg = ServerToAgent {
            instance_uid: vec![1; 16],
            flags: 1,
            ..Default::default()
        };
        let bare = msg.encode_to_vec();
        let mut framed = vec![0];
        framed.extend_from_slice(&bare);
        assert_eq!(decode_ws(&framed).unwrap(), msg);
        assert_eq!(decode_ws(&bare).unwrap(), msg);
        assert!(decode_ws(&[0x81, 0x01, 0x0a]).is_err());
        assert!(decode_ws(&[0, 0x0a, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
    }
}
