//! The Responses API's WebSocket mode, as Codex uses it when talking to the model
//! directly: `GET /v1/responses` upgraded, `response.create` frames in, each event of the
//! response a text frame out. A frame may continue an earlier response of the same
//! connection (`previous_response_id`, only the new items in `input`), so each connection
//! keeps its conversations by response id. No extension is accepted (no compression).
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use std::collections::HashMap;
use std::sync::Arc;

use base64::Engine as _;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Api, Body, State, responses};

const GUID: &str = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

/// Answers the upgrade (101) and serves the connection's frames once hyper hands it over.
pub fn accept(state: Arc<State>, mut req: Request<Incoming>) -> Response<Body> {
    let key =
        req.headers().get("sec-websocket-key").map(|v| v.as_bytes().to_vec()).unwrap_or_default();
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA1_FOR_LEGACY_USE_ONLY);
    ctx.update(&key);
    ctx.update(GUID.as_bytes());
    let accept = base64::engine::general_purpose::STANDARD.encode(ctx.finish());
    let upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrade.await {
            serve(state, TokioIo::new(upgraded)).await;
        }
    });
    Response::builder()
        .status(101)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept)
        .body(Empty::new().map_err(|never| match never {}).boxed_unsync())
        .unwrap()
}

async fn serve(state: Arc<State>, mut io: impl AsyncRead + AsyncWrite + Unpin) {
    let mut conversations: HashMap<String, Vec<Value>> = HashMap::new();
    let mut message = Vec::new();
    loop {
        let Ok((fin, opcode, payload)) = read_frame(&mut io).await else { return };
        match opcode {
            0x8 => {
                let _ = write_frame(&mut io, 0x8, &payload).await;
                return;
            }
            0x9 => {
                if write_frame(&mut io, 0xA, &payload).await.is_err() {
                    return;
                }
                continue;
            }
            0xA => continue,
            _ => message.extend_from_slice(&payload),
        }
        if !fin {
            continue;
        }
        let text = String::from_utf8_lossy(&std::mem::take(&mut message)).into_owned();
        for frame in respond(&state, &mut conversations, &text) {
            if write_frame(&mut io, 0x1, frame.to_string().as_bytes()).await.is_err() {
                return;
            }
        }
    }
}

/// The events answering one `response.create` frame.
fn respond(
    state: &State,
    conversations: &mut HashMap<String, Vec<Value>>,
    text: &str,
) -> Vec<Value> {
    let path = "/v1/responses";
    let mut body: Value = serde_json::from_str(text).unwrap_or(Value::Null);
    if body["type"] != "response.create" {
        let n = state.id();
        state.violation(n, path, format!("a frame that is not response.create: {:.200}", text));
        return vec![json!({"type": "error", "error": {"message": "expected response.create"}})];
    }
    if let Some(previous) = body["previous_response_id"].as_str().map(str::to_owned) {
        let mut input = conversations.get(&previous).cloned().unwrap_or_else(|| {
            let n = state.id();
            state.violation(n, path, format!("unknown previous_response_id {previous}"));
            Vec::new()
        });
        input.extend(body["input"].as_array().cloned().unwrap_or_default());
        body["input"] = Value::Array(input);
        body.as_object_mut().unwrap().remove("previous_response_id");
    }
    let whole = body.to_string();
    let (n, reply, tokens) = state.turn(Api::Responses, path, "WS", &body, &whole, false);
    // A warm-up (`generate: false`) answers with no output.
    let output = if body["generate"] == json!(false) {
        Vec::new()
    } else {
        responses::output(&body, &reply, n)
    };
    let response = responses::response(&body, &output, n, tokens);
    let mut conversation = body["input"].as_array().cloned().unwrap_or_default();
    conversation.extend(output);
    conversations.insert(format!("resp_{n:05}"), conversation);
    responses::events(&response)
}

async fn read_frame(io: &mut (impl AsyncRead + Unpin)) -> std::io::Result<(bool, u8, Vec<u8>)> {
    let mut head = [0u8; 2];
    io.read_exact(&mut head).await?;
    let fin = head[0] & 0x80 != 0;
    let opcode = head[0] & 0x0F;
    let masked = head[1] & 0x80 != 0;
    let len = match head[1] & 0x7F {
        126 => u64::from(io.read_u16().await?),
        127 => io.read_u64().await?,
        n => u64::from(n),
    };
    let mut mask = [0u8; 4];
    if masked {
        io.read_exact(&mut mask).await?;
    }
    let mut payload = vec![0u8; usize::try_from(len).unwrap()];
    io.read_exact(&mut payload).await?;
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok((fin, opcode, payload))
}

async fn write_frame(
    io: &mut (impl AsyncWrite + Unpin),
    opcode: u8,
    payload: &[u8],
) -> std::io::Result<()> {
    let mut frame = vec![0x80 | opcode];
    match payload.len() {
        n if n < 126 => frame.push(u8::try_from(n).unwrap()),
        n if n <= usize::from(u16::MAX) => {
            frame.push(126);
            frame.extend_from_slice(&u16::try_from(n).unwrap().to_be_bytes());
        }
        n => {
            frame.push(127);
            frame.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    frame.extend_from_slice(payload);
    io.write_all(&frame).await?;
    io.flush().await
}
