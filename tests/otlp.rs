//! Trace export over OTLP, to real receivers on loopback: an HTTP/protobuf one (a hyper
//! server decoding `ExportTraceServiceRequest` with prost) and a gRPC one (the generated
//! `TraceService` served by hyper). foldgate runs as the binary (its subscriber is
//! process-wide), in front of a mock upstream in this process. The spans must continue
//! the client's `traceparent`, carry the GenAI and foldgate attributes, have children for
//! store operations and summarizer calls, and name themselves in the `traceparent` the
//! upstream receives; with export off, the client's `traceparent` reaches the upstream
//! unchanged.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

mod common;

use std::convert::Infallible;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::agent::{chat_request_to, conversation, requests};
use common::binary::spawn_serve;
use common::*;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use tokio::net::TcpListener;

/// The client's trace: its trace id and the id of its span that sent the request.
const TRACE_ID: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";
const TRACESTATE: &str = "vendor=opaque";
const CREDENTIAL: &str = "Bearer sk-otlp-secret";

fn traceparent() -> String {
    format!("00-{TRACE_ID}-{CLIENT_SPAN}-01")
}

/// Every span a receiver got, with its service's name.
#[derive(Clone, Default)]
struct Received(Arc<Mutex<Vec<(String, Span)>>>);

impl Received {
    fn add(&self, request: ExportTraceServiceRequest) {
        let mut spans = self.0.lock().unwrap();
        for resource in request.resource_spans {
            let attributes = resource.resource.map(|r| r.attributes).unwrap_or_default();
            let service = attributes
                .iter()
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
    }

    fn spans(&self) -> Vec<Span> {
        self.0.lock().unwrap().iter().map(|(_, s)| s.clone()).collect()
    }

    fn services(&self) -> Vec<String> {
        self.0.lock().unwrap().iter().map(|(s, _)| s.clone()).collect()
    }

    /// Waits (at most 10 s) until `ready` holds of the spans received.
    async fn until(&self, ready: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let spans = self.spans();
            if ready(&spans) {
                return spans;
            }
            assert!(Instant::now() < deadline, "spans received: {:#?}", names(&spans));
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An OTLP/HTTP receiver: `POST /v1/traces` with a protobuf body.
async fn http_receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let sink = received.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let sink = sink.clone();
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let sink = sink.clone();
                async move {
                    assert_eq!(request.uri().path(), "/v1/traces");
                    let content_type = request.headers()["content-type"].clone();
                    assert_eq!(content_type, "application/x-protobuf");
                    let body = request.into_body().collect().await.unwrap().to_bytes();
                    sink.add(ExportTraceServiceRequest::decode(body).unwrap());
                    let answer = ExportTraceServiceResponse::default().encode_to_vec();
                    let mut response = http::Response::new(full(answer));
                    response
                        .headers_mut()
                        .insert("content-type", "application/x-protobuf".parse().unwrap());
                    Ok::<_, Infallible>(response)
                }
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), received)
}

/// The collector's gRPC trace service.
struct Collector(Received);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        self.0.add(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

/// An OTLP/gRPC receiver.
async fn grpc_receiver() -> (String, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Received::default();
    let service = TraceServiceServer::new(Collector(received.clone()));
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            let service = TowerToHyperService::new(service.clone());
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .http2_only()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (format!("http://{addr}"), received)
}

/// The provider: digests for summarization calls, an event stream for `"stream": true`,
/// a chat completion (usage with cached tokens, a dated model) otherwise, a model list
/// for `GET /v1/models`.
async fn provider() -> MockUpstream {
    MockUpstream::start(Arc::new(|rec: Recorded| {
        Box::pin(async move {
            if rec.headers.contains_key("x-foldgate-summary") {
                let digest = "## Milestones\n- Read the modules.\n## Key artifacts\n- src/parser.rs";
                let body = if rec.uri.path().ends_with("/responses") {
                    json!({"output": [{"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": digest}]}]})
                } else {
                    json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": digest}}]})
                };
                return response(200, body.to_string());
            }
            if rec.method == http::Method::GET {
                return response(200, r#"{"object":"list","data":[]}"#);
            }
            let request: serde_json::Value = serde_json::from_slice(&rec.body).unwrap();
            if request["stream"] == json!(true) {
                let events = [
                    r#"{"model":"gpt-4o-2024-08-06","choices":[{"index":0,"delta":{"content":"ok"}}]}"#,
                    r#"{"model":"gpt-4o-2024-08-06","choices":[],"usage":{"prompt_tokens":30,"completion_tokens":2,"total_tokens":32}}"#,
                    "[DONE]",
                ];
                let body: String = events.iter().map(|e| format!("data: {e}\n\n")).collect();
                let mut r = response(200, body);
                r.headers_mut().insert("content-type", "text/event-stream".parse().unwrap());
                return r;
            }
            let completion = json!({"id": "c", "object": "chat.completion", "model": "gpt-4o-2024-08-06",
                "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 7, "total_tokens": 107,
                    "prompt_tokens_details": {"cached_tokens": 40}}});
            let mut r = response(200, completion.to_string());
            r.headers_mut().insert("content-type", "application/json".parse().unwrap());
            r
        })
    }))
    .await
}

/// `request` as the client sends it: its credential, session and trace context.
fn traced(mut request: Request<TestBody>) -> Request<TestBody> {
    let headers = request.headers_mut();
    headers.insert("traceparent", traceparent().parse().unwrap());
    headers.insert("tracestate", TRACESTATE.parse().unwrap());
    request
}

/// Ends the child (if the test did not) when dropped.
struct Running(Option<Child>);

impl Running {
    /// SIGTERM, then waits for the graceful exit.
    async fn terminate(&mut self) {
        let mut child = self.0.take().unwrap();
        Command::new("kill").args(["-TERM", &child.id().to_string()]).status().unwrap();
        let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
        assert!(status.success(), "{status:?}");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn text(value: &AnyValue) -> Option<String> {
    match value {
        AnyValue::StringValue(s) => Some(s.clone()),
        _ => None,
    }
}

fn attribute<'a>(span: &'a Span, key: &str) -> Option<&'a AnyValue> {
    span.attributes.iter().find(|kv| kv.key == key)?.value.as_ref()?.value.as_ref()
}

fn string(span: &Span, key: &str) -> String {
    attribute(span, key).and_then(text).unwrap_or_else(|| panic!("{key} on {span:#?}"))
}

fn int(span: &Span, key: &str) -> i64 {
    match attribute(span, key) {
        Some(AnyValue::IntValue(n)) => *n,
        other => panic!("{key} is {other:?} on {span:#?}"),
    }
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The spans of `spans` whose parent is `parent`.
fn children(spans: &[Span], parent: &Span) -> Vec<Span> {
    let of = |s: &&Span| s.trace_id == parent.trace_id && s.parent_span_id == parent.span_id;
    spans.iter().filter(of).cloned().collect()
}

/// The trace id and parent span id a `traceparent` header names.
fn parent_of(traceparent: &str) -> (String, String) {
    let parts: Vec<&str> = traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{traceparent}");
    (parts[1].to_owned(), parts[2].to_owned())
}

fn header(rec: &Recorded, name: &str) -> String {
    rec.headers.get(name).map(|v| v.to_str().unwrap().to_owned()).unwrap_or_default()
}

const SPAN_KIND_SERVER: i32 = 2;
const SPAN_KIND_CLIENT: i32 = 3;

#[tokio::test]
async fn a_compacted_request_exports_its_spans_over_http_protobuf() {
    let (collector, received) = http_receiver().await;
    let upstream = provider().await;
    let (child, addr, _logs) = spawn_serve(
        &upstream.url(),
        &[
            // No path: `/v1/traces` is added.
            ("FOLDGATE_TELEMETRY__OTLP_ENDPOINT", &collector),
            ("FOLDGATE_TELEMETRY__OTLP_PROTOCOL", "http/protobuf"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("FOLDGATE_COMPACTION__MAX_CONTEXT_TOKENS", "12000"),
            ("FOLDGATE_SUMMARIZER__KIND", "llm"),
            ("FOLDGATE_RESPONSES__COMPACT", "foldgate"),
        ],
    );
    let _running = Running(Some(child));
    let body = requests(&conversation(30, 0), &[]).pop().unwrap();
    let url = format!("http://{addr}/v1/chat/completions");
    let request = traced(chat_request_to(&url, body, CREDENTIAL, "otlp"));
    let (status, headers, _) = send(request).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["x-foldgate-outcome"], "compacted");

    let spans = received
        .until(|spans| {
            let has = |name: &str| spans.iter().any(|s| s.name == name);
            has("chat gpt-4o") && has("background_fold") && has("summarize")
        })
        .await;
    let request = named(&spans, "chat gpt-4o");
    let request = request.iter().find(|s| s.kind == SPAN_KIND_SERVER).expect("the request span");
    check_request_span(request, &headers);
    assert!(received.services().iter().all(|s| s == "foldgate"), "{:?}", received.services());

    // The upstream got foldgate's span as the parent, the client's tracestate kept.
    let forwarded = upstream.forwarded().pop().unwrap();
    let (trace, parent) = parent_of(&header(&forwarded, "traceparent"));
    assert_eq!((trace.as_str(), parent), (TRACE_ID, hex(&request.span_id)));
    assert_eq!(header(&forwarded, "tracestate"), TRACESTATE);

    // The store operations of the request are its children.
    let stored = children(&spans, request);
    assert!(names(&stored).contains(&"store load") && names(&stored).contains(&"store save"));
    assert!(stored.iter().all(|s| string(s, "foldgate.store") == "memory"), "{stored:#?}");

    check_background_fold(&spans, request, &upstream);
    let spans = check_compact(&addr, &received).await;
    // Neither the credential nor message text is ever an attribute.
    for span in &spans {
        for kv in &span.attributes {
            let value = format!("{:?}", kv.value);
            assert!(!value.contains("sk-otlp-secret") && !value.contains("fn item_"), "{kv:?}");
        }
    }
}

/// The span of a compacted chat request: the client's trace continued (its span the
/// parent), the GenAI attributes, and foldgate's, as its `headers` say them.
fn check_request_span(request: &Span, headers: &http::HeaderMap) {
    assert_eq!(hex(&request.trace_id), TRACE_ID);
    assert_eq!(hex(&request.parent_span_id), CLIENT_SPAN);
    assert_eq!(string(request, "gen_ai.operation.name"), "chat");
    assert_eq!(string(request, "gen_ai.provider.name"), "openai");
    assert_eq!(string(request, "gen_ai.system"), "openai");
    assert_eq!(string(request, "gen_ai.request.model"), "gpt-4o");
    assert_eq!(string(request, "gen_ai.response.model"), "gpt-4o-2024-08-06");
    assert_eq!(int(request, "gen_ai.usage.input_tokens"), 100);
    assert_eq!(int(request, "gen_ai.usage.output_tokens"), 7);
    assert_eq!(int(request, "gen_ai.usage.cache_read.input_tokens"), 40);
    assert_eq!(string(request, "foldgate.outcome"), "compacted");
    let header_of = |name: &str| headers[name].to_str().unwrap().to_owned();
    assert_eq!(int(request, "foldgate.tier").to_string(), header_of("x-foldgate-tier"));
    let before = int(request, "foldgate.tokens_before");
    let after = int(request, "foldgate.tokens_after");
    assert_eq!(before.to_string(), header_of("x-foldgate-tokens-before"));
    assert_eq!(after.to_string(), header_of("x-foldgate-tokens-after"));
    assert!(after < before, "{before} -> {after}");
    assert_eq!(int(request, "foldgate.fold_wait_ms"), 0);
    assert_eq!(string(request, "foldgate.session"), header_of("x-foldgate-session"));
    assert_eq!(string(request, "foldgate.route"), "chat_completions");
    assert_eq!(string(request, "foldgate.request_id"), header_of("x-foldgate-request-id"));
    assert_eq!(int(request, "http.response.status_code"), 200);
}

/// The fold `request` postponed to the background: a trace of its own, linked to the
/// request, with the summarizer call and the model call under it, whose request to the
/// `upstream` names the model call's span.
fn check_background_fold(spans: &[Span], request: &Span, upstream: &MockUpstream) {
    let fold = named(spans, "background_fold");
    let [fold] = fold.as_slice() else { panic!("{:?}", names(spans)) };
    assert!(fold.parent_span_id.is_empty(), "a root span");
    let link = fold.links.first().expect("a link to the request");
    assert_eq!((&link.trace_id, &link.span_id), (&request.trace_id, &request.span_id));
    assert_eq!(string(fold, "foldgate.fold"), "due");
    let summarize = children(spans, fold).into_iter().find(|s| s.name == "summarize");
    let summarize = summarize.expect("a summarize span");
    assert_eq!(string(&summarize, "foldgate.summarizer"), "llm");
    let [model_call] = children(spans, &summarize).try_into().expect("one model call");
    assert_eq!(model_call.name, "chat gpt-4o");
    assert_eq!(model_call.kind, SPAN_KIND_CLIENT);
    assert_eq!(string(&model_call, "gen_ai.request.model"), "gpt-4o");
    assert_eq!(string(&model_call, "gen_ai.provider.name"), "openai");
    let summaries =
        upstream.recorded().into_iter().filter(|r| r.headers.contains_key("x-foldgate-summary"));
    let (trace, parent) = parent_of(&header(&summaries.last().unwrap(), "traceparent"));
    assert_eq!((trace, parent), (hex(&fold.trace_id), hex(&model_call.span_id)));
}

/// `/v1/responses/compact` to foldgate at `addr`, answered by foldgate: the digest is
/// written inside the request's own trace. Returns every span received by then.
async fn check_compact(addr: &str, received: &Received) -> Vec<Span> {
    let items = common::responses_api::session_items(30)[1..].to_vec();
    let compact = Request::post(format!("http://{addr}/v1/responses/compact"))
        .header("authorization", CREDENTIAL)
        .header("content-type", "application/json")
        .body(full(common::responses_api::body_of(&items, &[])))
        .unwrap();
    let (status, _, _) = send(traced(compact)).await;
    assert_eq!(status, StatusCode::OK);
    let spans = received.until(|spans| spans.iter().any(|s| s.name == "compact gpt-4.1")).await;
    let compact = named(&spans, "compact gpt-4.1")[0].clone();
    assert_eq!(hex(&compact.parent_span_id), CLIENT_SPAN);
    assert_eq!(string(&compact, "foldgate.route"), "responses_compact");
    assert_eq!(string(&compact, "gen_ai.operation.name"), "compact");
    assert_eq!(string(&compact, "foldgate.outcome"), "compacted");
    assert!(int(&compact, "foldgate.tokens_after") < int(&compact, "foldgate.tokens_before"));
    let summarize = children(&spans, &compact);
    assert!(summarize.iter().any(|s| s.name == "summarize"), "{:?}", names(&spans));
    spans
}

#[tokio::test]
async fn the_standard_variables_export_over_grpc_and_shutdown_flushes() {
    let (collector, received) = grpc_receiver().await;
    let upstream = provider().await;
    let (child, addr, logs) = spawn_serve(
        &upstream.url(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &collector),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SERVICE_NAME", "foldgate-under-test"),
            // Nothing is exported before shutdown: the spans arrive because it flushes.
            ("OTEL_BSP_SCHEDULE_DELAY", "600000"),
        ],
    );
    let mut running = Running(Some(child));
    // A streamed answer: its span stays open until the stream's last event, its usage.
    let url = format!("http://{addr}/v1/chat/completions");
    let body = r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
    let (status, _, answer) =
        send(traced(chat_request_to(&url, body.into(), CREDENTIAL, "g"))).await;
    assert_eq!(status, StatusCode::OK);
    assert!(String::from_utf8_lossy(&answer).contains("[DONE]"));
    // A passthrough request.
    let models = Request::get(format!("http://{addr}/v1/models")).body(full(Bytes::new())).unwrap();
    let (status, _, _) = send(traced(models)).await;
    assert_eq!(status, StatusCode::OK);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        received.spans().is_empty(),
        "exported before shutdown: {:?}",
        names(&received.spans())
    );

    running.terminate().await;
    let spans = received.spans();
    assert!(received.services().iter().all(|s| s == "foldgate-under-test"));
    let chat = named(&spans, "chat gpt-4o");
    let [chat] = chat.as_slice() else { panic!("{:?}", names(&spans)) };
    assert_eq!(
        (hex(&chat.trace_id), hex(&chat.parent_span_id)),
        (TRACE_ID.to_owned(), CLIENT_SPAN.to_owned())
    );
    assert_eq!(string(chat, "foldgate.outcome"), "passthrough");
    assert_eq!(int(chat, "gen_ai.usage.input_tokens"), 30);
    assert_eq!(int(chat, "gen_ai.usage.output_tokens"), 2);
    assert_eq!(string(chat, "gen_ai.response.model"), "gpt-4o-2024-08-06");
    let passthrough = named(&spans, "passthrough");
    let [passthrough] = passthrough.as_slice() else { panic!("{:?}", names(&spans)) };
    assert_eq!(hex(&passthrough.parent_span_id), CLIENT_SPAN);
    assert_eq!(string(passthrough, "http.request.method"), "GET");
    // Each upstream request names the span of its own request.
    let recorded = upstream.recorded();
    for (rec, span) in [(&recorded[0], chat), (&recorded[1], passthrough)] {
        let (trace, parent) = parent_of(&header(rec, "traceparent"));
        assert_eq!((trace.as_str(), parent), (TRACE_ID, hex(&span.span_id)), "{}", rec.uri);
    }
    let lines = tokio::task::spawn_blocking(move || logs.after_exit()).await.unwrap();
    assert!(!lines.iter().any(|l| l.contains("WARN") || l.contains("ERROR")), "{lines:?}");
}

#[tokio::test]
async fn without_export_the_clients_trace_context_reaches_the_upstream_unchanged() {
    let upstream = provider().await;
    let proxy = Proxy::to(&upstream.url()).await;
    let body = requests(&conversation(2, 0), &[]).pop().unwrap();
    let chat = chat_request_to(&proxy.url("/v1/chat/completions"), body, CREDENTIAL, "off");
    let (status, _, _) = send(traced(chat)).await;
    assert_eq!(status, StatusCode::OK);
    let models = Request::get(proxy.url("/v1/models")).body(full(Bytes::new())).unwrap();
    let (status, _, _) = send(traced(models)).await;
    assert_eq!(status, StatusCode::OK);
    let recorded = upstream.recorded();
    assert_eq!(recorded.len(), 2);
    for rec in &recorded {
        assert_eq!(header(rec, "traceparent"), traceparent(), "{}", rec.uri);
        assert_eq!(header(rec, "tracestate"), TRACESTATE, "{}", rec.uri);
    }
}
