//! A scripted model: a real HTTP server on 127.0.0.1:0 speaking Anthropic Messages, the
//! OpenAI Responses API (HTTP, and WebSocket for agents talking to it directly) and chat
//! completions. It drives an agent through shell steps read back from the last tool result
//! (never by counting messages: foldgate rewrites the history) and checks every request as
//! the provider would, recording each violation.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

pub mod chat;
pub mod messages;
pub mod responses;
pub mod validate;
pub mod websocket;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, Infallible>;

/// What the script makes the agent do.
#[derive(Debug, Clone)]
pub struct Script {
    /// Shell steps before the final answer.
    pub steps: usize,
    /// Output lines each step prints (about 24 bytes each).
    pub lines: usize,
    /// How the agent is told the task is done.
    pub finish: Finish,
    /// The model's context window in tokens (see [`validate::tokens`]).
    pub window: usize,
    /// Serve `GET /v1/responses` WebSocket upgrades (else answer 426, as foldgate does).
    pub websocket: bool,
}

/// How the last turn ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Finish {
    /// A final text answer.
    Answer,
    /// mini-swe-agent's way: a shell call that prints `COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`
    /// then the answer (it wants a tool call in every reply).
    SubmitCommand,
}

impl Script {
    pub fn final_answer(&self) -> String {
        format!("All {} steps done.", self.steps)
    }

    /// The shell command of step `k`: the marker `STEP k`, `lines` lines, `END STEP k`.
    pub fn command(&self, k: usize) -> String {
        format!(
            "echo 'STEP {k}'; seq -f 'step {k} output line %g' 1 {}; echo 'END STEP {k}'",
            self.lines
        )
    }

    /// The next reply, from the last tool result alone.
    fn reply(&self, shell: Option<&Shell>, last_result: Option<&str>) -> Result<Reply, String> {
        let Some(shell) = shell else {
            // A side call without the shell tool (a title, a warm-up): plain text.
            return Ok(Reply::Text("Scripted steps".into()));
        };
        let done = match last_result {
            None => 0,
            Some(text) => match last_step(text) {
                Some(k) => k,
                None => {
                    return Err(format!("the last tool result has no STEP marker: {:.200}", text));
                }
            },
        };
        if done < self.steps {
            let k = done + 1;
            return Ok(Reply::Call {
                text: format!("Running step {k}."),
                name: shell.name.clone(),
                arguments: shell.arguments(&self.command(k)),
            });
        }
        Ok(match self.finish {
            Finish::Answer => Reply::Text(self.final_answer()),
            Finish::SubmitCommand => {
                let command = format!(
                    "printf 'COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\\n{}\\n'",
                    self.final_answer()
                );
                Reply::Call {
                    text: "Submitting.".into(),
                    name: shell.name.clone(),
                    arguments: shell.arguments(&command),
                }
            }
        })
    }
}

/// The highest `STEP k` in `text`.
pub fn last_step(text: &str) -> Option<usize> {
    text.match_indices("STEP ")
        .filter_map(|(at, m)| {
            let digits: String =
                text[at + m.len()..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .max()
}

/// The answer digest for foldgate's own summarizer calls.
pub const DIGEST: &str = "## Milestones\n- Ran the scripted shell steps; each printed its marker and a few hundred output lines.\n## Key artifacts\n- none";

/// What the model answers.
#[derive(Debug, Clone)]
pub enum Reply {
    Text(String),
    Call { text: String, name: String, arguments: Value },
}

/// The agent's shell tool: its name and argument schema.
#[derive(Debug, Clone)]
pub struct Shell {
    pub name: String,
    pub schema: Value,
}

/// Shell tool names of the agents tested.
const SHELLS: [&str; 5] = ["Bash", "bash", "exec_command", "shell", "shell_command"];

impl Shell {
    /// The shell tool among `(name, schema)` pairs.
    pub fn find<'a>(tools: impl IntoIterator<Item = (&'a str, &'a Value)>) -> Option<Shell> {
        tools
            .into_iter()
            .find(|(name, _)| SHELLS.contains(name))
            .map(|(name, schema)| Shell { name: name.to_owned(), schema: schema.clone() })
    }

    /// Arguments running `command`, shaped by the schema (`cmd`, `command` as a string or
    /// an argv, `description` when the tool has one).
    pub fn arguments(&self, command: &str) -> Value {
        let props = &self.schema["properties"];
        let mut args = serde_json::Map::new();
        if props.get("cmd").is_some() {
            args.insert("cmd".into(), json!(command));
        } else if props["command"]["type"] == "array" {
            args.insert("command".into(), json!(["bash", "-lc", command]));
        } else {
            args.insert("command".into(), json!(command));
        }
        if props.get("description").is_some() {
            args.insert("description".into(), json!("Run the next scripted step"));
        }
        Value::Object(args)
    }
}

/// The API of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Messages,
    Responses,
    Chat,
}

/// One request the model received.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    /// Path and query as received (WebSocket frames: method `WS`).
    pub path: String,
    pub api: Option<Api>,
    /// The body's `stream` field.
    pub stream: Option<bool>,
    /// foldgate's own summarizer call (`x-foldgate-summary: 1`).
    pub summary: bool,
    /// Prompt tokens by [`validate::tokens`].
    pub tokens: usize,
    /// It carries a foldgate digest, goal batch or stub.
    pub compacted: bool,
    /// Thinking blocks or reasoning items it carries (the model's, signed).
    pub signed: usize,
    pub status: u16,
    /// When it arrived, from the model's start.
    pub at: Duration,
}

/// The shared record of a running model.
pub struct State {
    pub script: Script,
    pub seen: Mutex<Vec<Seen>>,
    pub violations: Mutex<Vec<String>>,
    next: AtomicUsize,
    started: Instant,
}

impl State {
    fn id(&self) -> usize {
        self.next.fetch_add(1, Ordering::SeqCst) + 1
    }

    fn violation(&self, n: usize, path: &str, problem: String) {
        self.violations.lock().unwrap().push(format!("request {n} {path}: {problem}"));
    }

    /// Checks a conversation request of `api`, records it, and decides the reply.
    pub fn turn(
        &self,
        api: Api,
        path: &str,
        method: &str,
        body: &Value,
        text: &str,
        summary: bool,
    ) -> (usize, Reply, usize) {
        let n = self.id();
        let tokens = validate::tokens(text);
        let mut problems = Vec::new();
        match api {
            Api::Messages => messages::check(body, &mut problems),
            Api::Responses => responses::check(body, &mut problems),
            Api::Chat => chat::check(body, &mut problems),
        }
        if tokens > self.script.window {
            problems.push(format!(
                "prompt of {tokens} tokens over the window of {}",
                self.script.window
            ));
        }
        let (shell, last) = match api {
            Api::Messages => (messages::shell(body), messages::last_result(body)),
            Api::Responses => (responses::shell(body), responses::last_result(body)),
            Api::Chat => (chat::shell(body), chat::last_result(body)),
        };
        let reply = if summary {
            Reply::Text(DIGEST.into())
        } else {
            self.script.reply(shell.as_ref(), last.as_deref()).unwrap_or_else(|problem| {
                problems.push(problem);
                Reply::Text(self.script.final_answer())
            })
        };
        for p in problems {
            self.violation(n, path, p);
        }
        let compacted = ["[COMPACTED CONTEXT]", "[GOAL BATCH]", "[elided by foldgate:"]
            .iter()
            .any(|m| text.contains(m));
        self.seen.lock().unwrap().push(Seen {
            method: method.into(),
            path: path.into(),
            api: Some(api),
            stream: body["stream"].as_bool(),
            summary,
            tokens,
            compacted,
            signed: validate::signed(body),
            status: 200,
            at: self.started.elapsed(),
        });
        (n, reply, tokens)
    }

    fn other(&self, method: &str, path: &str, status: u16) {
        let seen = Seen {
            method: method.into(),
            path: path.into(),
            api: None,
            stream: None,
            summary: false,
            tokens: 0,
            compacted: false,
            signed: 0,
            status,
            at: self.started.elapsed(),
        };
        self.seen.lock().unwrap().push(seen);
    }
}

/// The scripted model serving on 127.0.0.1:0.
pub struct ScriptedModel {
    pub addr: SocketAddr,
    pub state: Arc<State>,
    _shutdown: oneshot::Sender<()>,
}

impl ScriptedModel {
    pub async fn start(script: Script) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(State {
            script,
            seen: Mutex::default(),
            violations: Mutex::default(),
            next: AtomicUsize::new(0),
            started: Instant::now(),
        });
        let (tx, mut rx) = oneshot::channel::<()>();
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = tokio::select! {
                    a = listener.accept() => a.unwrap(),
                    _ = &mut rx => return,
                };
                let state = shared.clone();
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let state = state.clone();
                    async move { Ok::<_, Infallible>(handle(state, req).await) }
                });
                tokio::spawn(async move {
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        Self { addr, state, _shutdown: tx }
    }

    /// `http://127.0.0.1:P` (Anthropic clients add `/v1/messages`).
    pub fn root(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `http://127.0.0.1:P/v1` (OpenAI clients).
    pub fn v1(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    pub fn violations(&self) -> Vec<String> {
        self.state.violations.lock().unwrap().clone()
    }
}

pub fn full(status: u16, content_type: &str, body: impl Into<Bytes>) -> Response<Body> {
    Response::builder()
        .status(status)
        .header("content-type", content_type)
        .body(Full::new(body.into()).boxed_unsync())
        .unwrap()
}

pub fn json_response(value: &Value) -> Response<Body> {
    full(200, "application/json", value.to_string())
}

/// A `text/event-stream` answer, one frame per event.
pub fn event_stream(events: Vec<String>) -> Response<Body> {
    let frames = events.into_iter().map(|e| Ok::<_, Infallible>(Frame::data(Bytes::from(e))));
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(StreamBody::new(futures_util::stream::iter(frames)).boxed_unsync())
        .unwrap()
}

fn error(status: u16, message: &str) -> Response<Body> {
    let body = json!({"error": {"message": message, "type": "invalid_request_error"}});
    full(status, "application/json", body.to_string())
}

async fn handle(state: Arc<State>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().as_str().to_owned();
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str()).to_owned();
    let route = req.uri().path().to_owned();
    let upgrade = req
        .headers()
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if upgrade {
        if route == "/v1/responses" && state.script.websocket {
            state.other(&method, &path, 101);
            return websocket::accept(state, req);
        }
        state.other(&method, &path, 426);
        return error(426, "upgrade required");
    }
    let summary = req.headers().contains_key("x-foldgate-summary");
    let encoded =
        req.headers().get("content-encoding").map(|v| v.to_str().unwrap_or("?").to_owned());
    let raw = req.into_body().collect().await.map(|c| c.to_bytes()).unwrap_or_default();
    let api = match (method.as_str(), route.as_str()) {
        ("POST", "/v1/messages") => Api::Messages,
        ("POST", "/v1/responses") => Api::Responses,
        ("POST", "/v1/chat/completions") => Api::Chat,
        ("POST", "/v1/messages/count_tokens") => {
            state.other(&method, &path, 200);
            return json_response(
                &json!({"input_tokens": validate::tokens(&String::from_utf8_lossy(&raw))}),
            );
        }
        ("GET", "/v1/models") => {
            state.other(&method, &path, 200);
            return json_response(&json!({"object": "list", "data": [
                {"id": "scripted", "object": "model", "created": 0, "owned_by": "foldgate-tests"}]}));
        }
        _ => {
            state.other(&method, &path, 404);
            return error(404, &format!("the scripted model does not serve {method} {route}"));
        }
    };
    let Ok(body) = serde_json::from_slice::<Value>(&raw) else {
        let n = state.id();
        state.violation(n, &path, format!("body is not JSON (content-encoding {encoded:?})"));
        state.other(&method, &path, 400);
        return error(400, "body is not JSON");
    };
    let (n, reply, tokens) =
        state.turn(api, &path, &method, &body, &String::from_utf8_lossy(&raw), summary);
    let stream = body["stream"].as_bool() == Some(true);
    match api {
        Api::Messages => messages::answer(&body, &reply, n, tokens, stream),
        Api::Responses => responses::answer(&body, &reply, n, tokens, stream),
        Api::Chat => chat::answer(&body, &reply, n, tokens, stream),
    }
}
