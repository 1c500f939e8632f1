//! The Responses API's WebSocket mode (`GET /v1/responses` with `Upgrade: websocket`,
//! what Codex CLI tries first), served by foldgate (`responses.websocket = "auto"`).
//!
//! Each `response.create` frame is one request through the same exchange as a
//! `POST /v1/responses` (`super::exchange::run_read`): the same compaction, guarantees,
//! metrics, inspector entry and span. The connection keeps its chain: for each response,
//! the whole conversation up to its output (encrypted reasoning included), so that a frame
//! naming `previous_response_id` (and carrying only the new items, as Codex sends them) is
//! read as the whole conversation. Upstream, foldgate opens a socket of its own at the
//! connection's first frame (`super::upstream_socket`): when the upstream accepts it,
//! each frame goes there, as received below the trigger (the upstream holds the
//! response it names) and as the whole compacted conversation past it; when it does
//! not, each frame is a streamed `POST /v1/responses` carrying the whole conversation,
//! compacted past the trigger. The upstream's events come back as text frames, in order. A `generate: false` frame (the
//! warm-up) is answered by foldgate with an empty response, the upstream not asked. An
//! error (the upstream's, or foldgate's own) is an `error` event; the connection stays.
//!
//! Bounds: a frame (and a message) at most `server.max_body_size`; a connection with no
//! frame for `responses.websocket_idle_timeout` is closed; at most
//! `responses.websocket_max_connections` at once (past it, the upgrade gets 503).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Map, Value, json};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};

use super::body::{ProxyBody, full};
use super::dialect::Responses;
use super::error::ProxyError;
use super::exchange::CompactedRoutes;
use super::exchange::{self, Place};
use super::sse::Events;
use super::tags::Tags;
use super::trace::in_span;
use super::upstream::Upstream;
use super::upstream_socket::UpstreamSocket;
use super::wire::server::{ClientRequest, OnUpgrade};
use crate::api::responses::{input_as_items, joined_items, without_trigger};
use crate::metrics::Metrics;

/// How many responses of one connection stay continuable (the latest ones).
const KEPT_RESPONSES: usize = 8;

/// The longest the first frame of a connection waits for the upstream's socket.
const SOCKET_OPEN_WAIT: Duration = Duration::from_secs(10);

/// What each frame's request goes through: the compacted routes' shared state, the
/// upstream, the metrics, the body limit.
pub struct Frames {
    /// What the compacted routes share.
    pub compacted: CompactedRoutes,
    /// Where the Responses API is (`upstream.url`).
    pub upstream: Upstream,
    /// Every metric (written by the recorder).
    pub metrics: Arc<Metrics>,
    /// `server.max_body_size`: the largest frame.
    pub max_body: u64,
}

/// The WebSocket mode's settings and its connection count.
pub struct WebSockets {
    frames: Arc<Frames>,
    permits: Arc<Semaphore>,
    idle: Duration,
}

impl WebSockets {
    /// Serving `frames`, at most `max_connections` at once, each closed after `idle`
    /// without a frame.
    pub fn new(frames: Frames, max_connections: usize, idle: Duration) -> Self {
        let permits = Arc::new(Semaphore::new(max_connections.max(1)));
        Self { frames: Arc::new(frames), permits, idle }
    }
}

/// Answers the upgrade: 101, then the connection is served once the HTTP/1.1 server
/// hands it over.
pub fn upgrade(
    sockets: &WebSockets,
    mut request: ClientRequest,
) -> Result<Response<ProxyBody>, ProxyError> {
    let headers = request.headers();
    let version = headers.get("sec-websocket-version").map(HeaderValue::as_bytes);
    let Some(key) = headers.get("sec-websocket-key").filter(|_| version == Some(b"13")) else {
        return Err(ProxyError::InvalidRequest(
            "a WebSocket upgrade needs Sec-WebSocket-Key and Sec-WebSocket-Version: 13".into(),
        ));
    };
    let accept = derive_accept_key(key.as_bytes());
    let Ok(permit) = sockets.permits.clone().try_acquire_owned() else {
        return Err(ProxyError::Overloaded("WebSocket connections"));
    };
    // Only an HTTP/1.1 connection can be handed over.
    let Some(on_upgrade) = OnUpgrade::take(&mut request) else {
        return Err(ProxyError::InvalidRequest("a WebSocket upgrade needs HTTP/1.1".into()));
    };
    let head = frame_headers(request.headers());
    let (state, idle) = (sockets.frames.clone(), sockets.idle);
    tokio::spawn(async move {
        match on_upgrade.upgraded().await {
            Ok(upgraded) => serve(state, head, upgraded, idle, permit).await,
            Err(error) => tracing::debug!(%error, "the WebSocket upgrade did not complete"),
        }
    });
    let mut response = Response::new(full(Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let out = response.headers_mut();
    out.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    out.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accept) = HeaderValue::from_str(&accept) {
        out.insert("sec-websocket-accept", accept);
    }
    Ok(response)
}

/// The headers each frame's request carries: the upgrade request's (the credential,
/// session headers, betas), without those of the upgrade itself.
fn frame_headers(upgrade: &HeaderMap) -> HeaderMap {
    let mut headers = upgrade.clone();
    for name in [header::UPGRADE, header::CONNECTION, header::SEC_WEBSOCKET_EXTENSIONS] {
        headers.remove(name);
    }
    for name in ["sec-websocket-key", "sec-websocket-version", "sec-websocket-protocol"] {
        headers.remove(name);
    }
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::ACCEPT, HeaderValue::from_static("text/event-stream"));
    headers
}

/// One connection's responses, by id: the conversation up to each one's output; and its
/// upstream, once its first request asked.
#[derive(Default)]
struct Chain {
    kept: VecDeque<(String, String)>,
    /// The upstream's socket; `None` when it has none (streamed POSTs then).
    upstream: Option<UpstreamSocket>,
    /// The upstream was asked for a socket.
    opened: bool,
    /// The responses the upstream's socket holds (it made them): a frame naming one
    /// goes to it as received when it is not compacted.
    held_upstream: VecDeque<String>,
}

impl Chain {
    /// The conversation up to response `id`, if kept.
    fn items(&self, id: &str) -> Option<&str> {
        self.kept.iter().find(|(kept, _)| kept == id).map(|(_, items)| items.as_str())
    }

    /// Keeps `items` as the conversation up to response `id`.
    fn keep(&mut self, id: String, items: String) {
        if self.kept.len() >= KEPT_RESPONSES {
            self.kept.pop_front();
        }
        self.kept.push_back((id, items));
    }

    /// Notes that the upstream's socket holds response `id`.
    fn held_upstream(&mut self, id: &str) {
        if self.held_upstream.len() >= KEPT_RESPONSES {
            self.held_upstream.pop_front();
        }
        self.held_upstream.push_back(id.to_owned());
    }
}

/// Serves one connection until it closes, is idle too long, or fails.
async fn serve<S>(
    state: Arc<Frames>,
    head: HeaderMap,
    io: S,
    idle: Duration,
    _permit: OwnedSemaphorePermit,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let limit = usize::try_from(state.max_body).unwrap_or(usize::MAX);
    let config =
        WebSocketConfig::default().max_message_size(Some(limit)).max_frame_size(Some(limit));
    let mut socket = WebSocketStream::from_raw_socket(io, Role::Server, Some(config)).await;
    let mut chain = Chain::default();
    loop {
        let message = match tokio::time::timeout(idle, socket.next()).await {
            Err(_) => {
                tracing::debug!("an idle WebSocket connection closed");
                let _ = socket.close(None).await;
                return;
            }
            Ok(Some(Err(tokio_tungstenite::tungstenite::Error::Capacity(error)))) => {
                // A frame past `server.max_body_size`: closed with 1009 (too big).
                let reason = format!("a frame larger than server.max_body_size: {error}");
                let close = CloseFrame { code: CloseCode::Size, reason: reason.into() };
                let _ = socket.close(Some(close)).await;
                return;
            }
            Ok(None | Some(Err(_))) => return,
            Ok(Some(Ok(message))) => message,
        };
        let text = match message {
            Message::Text(text) => text.as_str().to_owned(),
            Message::Binary(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Message::Close(_) => return,
            _ => continue,
        };
        if frame(&state, &head, &mut chain, &text, &mut socket).await.is_err() {
            return;
        }
    }
}

/// Answers one client frame with its events; an error only when the socket failed.
async fn frame<S>(
    state: &Frames,
    head: &HeaderMap,
    chain: &mut Chain,
    text: &str,
    socket: &mut WebSocketStream<S>,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let request = match create_request(chain, text) {
        Ok(request) => request,
        Err(event) => return send(socket, &event).await,
    };
    if request.warm_up {
        // `generate: false`: nothing is sampled; the upstream is not asked.
        let (events, id) = warm_up(&request.body);
        chain.keep(id, request.items);
        for mut event in events {
            if let (Some(lane), Some(map)) = (&request.lane, event.as_object_mut()) {
                map.insert("stream_id".to_owned(), lane.clone());
            }
            send(socket, &event).await?;
        }
        return Ok(());
    }
    if !chain.opened {
        chain.opened = true;
        chain.upstream = UpstreamSocket::open(&state.upstream, head, SOCKET_OPEN_WAIT).await;
    }
    let mut parts = Request::new(()).into_parts().0;
    parts.method = Method::POST;
    parts.uri = http::Uri::from_static("/v1/responses");
    parts.headers = head.clone();
    // On the upstream's socket, a frame naming a response it holds goes as received
    // when it is not compacted; any other carries the whole conversation.
    let held = request.previous.as_ref().is_none_or(|p| chain.held_upstream.contains(p));
    let as_received = chain.upstream.as_ref().and(held.then_some(request.as_received));
    let place = Place {
        routes: &state.compacted,
        dialect: &Responses,
        upstream: &state.upstream,
        metrics: &state.metrics,
        max_body: state.max_body,
        socket: chain.upstream.as_ref(),
    };
    let span = super::trace::request_span(crate::metrics::Route::Responses, false, head);
    let answer = in_span!(&span, exchange::run_read(place, parts, request.body, as_received));
    let response = match answer {
        Ok(response) => response,
        Err(error) => return send(socket, &error_event(error.status(), &error.body())).await,
    };
    relay(response, (request.items, request.lane), chain, socket).await
}

/// A `response.create` frame as a request: its body (the whole conversation, streamed),
/// the conversation's items before the answer, and whether it is a warm-up.
struct FrameRequest {
    body: Bytes,
    items: String,
    warm_up: bool,
    /// The frame as a request body as it came (only its own items, naming the
    /// response it continues), for an upstream that holds that response.
    as_received: Bytes,
    /// The response it continues.
    previous: Option<String>,
    /// Its `stream_id` (the socket's lane), which every event answering it carries.
    lane: Option<Value>,
}

/// Reads a client frame; an `error` event for one foldgate cannot serve.
fn create_request(chain: &Chain, text: &str) -> Result<FrameRequest, Value> {
    let invalid = |message: String| {
        error_event(
            StatusCode::BAD_REQUEST,
            &json!({"error": {"type": "invalid_request_error", "message": message}}),
        )
    };
    let mut frame: Map<String, Value> = serde_json::from_str(text)
        .map_err(|e| invalid(format!("the frame is not a JSON object: {e}")))?;
    match frame.remove("type") {
        Some(Value::String(kind)) if kind == "response.create" => {}
        other => return Err(invalid(format!("expected a response.create event, not {other:?}"))),
    }
    let warm_up = frame.get("generate") == Some(&Value::Bool(false));
    // As the client sent it (only `type` taken off): what the upstream's socket gets
    // when it holds the response named and the frame is not compacted.
    let as_received = Bytes::from(Value::Object(frame.clone()).to_string());
    // The socket's lane: not a field of a POST; the events answering the frame carry it.
    let lane = frame.remove("stream_id");
    frame.remove("generate");
    let own = frame.get("input").and_then(|input| input_as_items(&input.to_string()));
    let own = own.unwrap_or_else(|| "[]".to_owned());
    let previous = frame.get("previous_response_id").and_then(Value::as_str).map(str::to_owned);
    let items = match frame.remove("previous_response_id") {
        Some(Value::String(previous)) => match chain.items(&previous) {
            Some(before) => joined_items(&[before, &own]).unwrap_or(own),
            None => {
                let message =
                    format!("Previous response with id '{previous}' not found on this connection.");
                return Err(error_event(
                    StatusCode::BAD_REQUEST,
                    &json!({"error": {"type": "invalid_request_error", "code": "previous_response_not_found", "param": "previous_response_id", "message": message}}),
                ));
            }
        },
        _ => own,
    };
    let input: Value = serde_json::from_str(&items).unwrap_or(Value::Array(Vec::new()));
    frame.insert("input".to_owned(), input);
    let items = without_trigger(items);
    frame.insert("stream".to_owned(), Value::Bool(true));
    let body = Bytes::from(Value::Object(frame).to_string());
    Ok(FrameRequest { body, items, warm_up, as_received, previous, lane })
}

/// The events of a warm-up's empty response, and its id.
fn warm_up(body: &[u8]) -> (Vec<Value>, String) {
    let request: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let id = format!("resp_{}", uuid::Uuid::new_v4().simple());
    let response = |status: &str| {
        json!({"id": id, "object": "response", "status": status, "model": request["model"], "output": [],
               "usage": {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0}})
    };
    let events = vec![
        json!({"type": "response.created", "sequence_number": 0, "response": response("in_progress")}),
        json!({"type": "response.completed", "sequence_number": 1, "response": response("completed")}),
    ];
    (events, id)
}

/// Sends the upstream's answer as frames: each event's data, in order; an error answer
/// as one `error` event. The conversation up to a completed response is kept.
async fn relay<S>(
    response: Response<ProxyBody>,
    (items, lane): (String, Option<Value>),
    chain: &mut Chain,
    socket: &mut WebSocketStream<S>,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let status = response.status();
    // foldgate's own answer (a compaction it served): not a response the upstream holds.
    let from_upstream = !Tags::served_here(&response);
    let events = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    let mut body = response.into_body();
    if !status.is_success() || !events {
        let bytes = body.collect().await.map(|c| c.to_bytes()).unwrap_or_default();
        let error: Value = serde_json::from_slice(&bytes).unwrap_or_else(|_| {
            json!({"error": {"type": "server_error", "message": String::from_utf8_lossy(&bytes)}})
        });
        let mut event = error_event(status, &error);
        if let (Some(lane), Some(map)) = (&lane, event.as_object_mut()) {
            map.insert("stream_id".to_owned(), lane.clone());
        }
        return send(socket, &event).await;
    }
    let (mut stream, mut reader) = (Vec::new(), Events::default());
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            let error = json!({"error": {"type": "server_error", "message": "the upstream's stream failed"}});
            return send(socket, &error_event(StatusCode::BAD_GATEWAY, &error)).await;
        };
        let Some(data) = frame.data_ref() else { continue };
        stream.extend_from_slice(data);
        while let Some(event) = reader.next(&stream) {
            // Each event's data goes on as it came; only the one that ends the response
            // is read (for the connection's chain).
            if memchr::memmem::find(&event.data, b"\"response.completed\"").is_some() {
                if let Ok(value) = serde_json::from_slice::<Value>(&event.data) {
                    if value["type"] == "response.completed" {
                        keep(chain, &items, &value["response"]);
                        if chain.upstream.is_some() && from_upstream {
                            if let Some(id) = value["response"]["id"].as_str() {
                                chain.held_upstream(id);
                            }
                        }
                    }
                }
            }
            let text = match &lane {
                // The lane the frame named, on each event that does not carry it.
                Some(lane) => with_lane(&event.data, lane),
                None => String::from_utf8_lossy(&event.data).into_owned(),
            };
            socket.send(Message::text(text)).await?;
        }
    }
    Ok(())
}

/// An event's data with `stream_id` set to `lane` when it carries none.
fn with_lane(data: &[u8], lane: &Value) -> String {
    match serde_json::from_slice::<Map<String, Value>>(data) {
        Ok(mut event) => {
            event.entry("stream_id").or_insert_with(|| lane.clone());
            Value::Object(event).to_string()
        }
        Err(_) => String::from_utf8_lossy(data).into_owned(),
    }
}

/// Keeps the conversation up to a completed `response` (its id and output).
fn keep(chain: &mut Chain, items: &str, response: &Value) {
    let (Some(id), Some(output)) = (response["id"].as_str(), response.get("output")) else {
        return;
    };
    if let Some(all) = joined_items(&[items, &output.to_string()]) {
        chain.keep(id.to_owned(), all);
    }
}

/// An `error` event for an answer of `status` with the OpenAI-style error `body`.
fn error_event(status: StatusCode, body: &Value) -> Value {
    let error = body.get("error").cloned().unwrap_or_else(|| body.clone());
    json!({"type": "error", "status": status.as_u16(), "error": error})
}

/// Sends `event` as a text frame.
async fn send<S>(
    socket: &mut WebSocketStream<S>,
    event: &Value,
) -> Result<(), tokio_tungstenite::tungstenite::Error>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    socket.send(Message::text(event.to_string())).await
}
