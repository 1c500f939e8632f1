//! The Responses API's WebSocket mode towards the upstream, for a client connection
//! foldgate serves in that mode (`super::websocket`) when the upstream accepts it: one
//! upstream socket per client connection, opened at its first frame. Each request of the
//! connection is one `response.create` frame on it; the upstream's events until the
//! response ends come back as an event stream (`text/event-stream`, one event per frame),
//! so that the exchange reads them as it reads a streamed `POST`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use serde_json::{Map, Value};
use tokio::net::TcpStream;
use tokio::sync::{Mutex, OwnedMutexGuard};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, connect_async_with_config};

use super::body::{BoxError, ProxyBody};
use super::error::ProxyError;
use super::upstream::Upstream;

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// The events that end a response on the socket.
const LAST_EVENTS: [&str; 4] =
    ["response.completed", "response.failed", "response.incomplete", "error"];

/// One client connection's socket to the upstream.
pub struct UpstreamSocket {
    socket: Arc<Mutex<Socket>>,
}

impl UpstreamSocket {
    /// Opens the upstream's `/v1/responses` as a WebSocket with the client's `headers`
    /// (its credential and betas); `None` when the upstream does not accept one (any
    /// answer but 101, or no answer within `timeout`).
    pub async fn open(upstream: &Upstream, headers: &HeaderMap, timeout: Duration) -> Option<Self> {
        let mut request = upstream.websocket_url("/v1/responses")?.into_client_request().ok()?;
        for (name, value) in headers {
            if !is_handshake_header(name) {
                request.headers_mut().append(name.clone(), value.clone());
            }
        }
        let connecting = connect_async_with_config(request, None, true);
        match tokio::time::timeout(timeout, connecting).await {
            Ok(Ok((socket, _))) => Some(Self { socket: Arc::new(Mutex::new(socket)) }),
            Ok(Err(error)) => {
                tracing::debug!(%error, "the upstream has no WebSocket mode: streamed POSTs");
                None
            }
            Err(_) => None,
        }
    }

    /// Sends `body` (a Responses request body) as a `response.create` frame; the answer
    /// is the upstream's events until the response ends, as an event stream.
    pub async fn send(&self, body: &Bytes) -> Result<Response<ProxyBody>, ProxyError> {
        let fields: Map<String, Value> = serde_json::from_slice(body)
            .map_err(|e| ProxyError::InvalidRequest(format!("not a JSON object: {e}")))?;
        let mut frame = Map::with_capacity(fields.len() + 1);
        frame.insert("type".to_owned(), Value::from("response.create"));
        frame.extend(fields);
        let mut socket = self.socket.clone().lock_owned().await;
        let text = Value::Object(frame).to_string();
        if let Err(error) = socket.send(Message::text(text)).await {
            return Err(ProxyError::UpstreamUnreachable(format!("the upstream socket: {error}")));
        }
        let events = futures_util::stream::unfold(Some(socket), next_event);
        let mut response = Response::new(BodyExt::boxed_unsync(StreamBody::new(events)));
        *response.status_mut() = StatusCode::OK;
        response
            .headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
        Ok(response)
    }
}

/// The next event of the response under way, as one server-sent event; the stream ends
/// after the event that ends the response (or when the socket closes).
async fn next_event(
    socket: Option<OwnedMutexGuard<Socket>>,
) -> Option<(Result<http_body::Frame<Bytes>, BoxError>, Option<OwnedMutexGuard<Socket>>)> {
    let mut socket = socket?;
    loop {
        let message = match socket.next().await? {
            Ok(message) => message,
            Err(error) => return Some((Err(Box::new(error)), None)),
        };
        let text = match message {
            Message::Text(text) => text.as_str().to_owned(),
            Message::Binary(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Message::Close(_) => return None,
            _ => continue,
        };
        let kind = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v["type"].as_str().map(str::to_owned))
            .unwrap_or_default();
        let event = Bytes::from(format!("event: {kind}\ndata: {text}\n\n"));
        let next = (!LAST_EVENTS.contains(&kind.as_str())).then_some(socket);
        return Some((Ok(http_body::Frame::data(event)), next));
    }
}

/// The headers of the client's upgrade that the upstream's handshake makes its own.
fn is_handshake_header(name: &header::HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "connection"
            | "upgrade"
            | "sec-websocket-key"
            | "sec-websocket-version"
            | "sec-websocket-extensions"
            | "sec-websocket-accept"
            | "content-length"
            | "content-type"
            | "accept"
    )
}
