//! The mock provider of the benches: a hyper 1 server on a free loopback port that reads
//! each request's whole body, then answers `POST /v1/chat/completions` with a fixed
//! `chat.completion` (and 404 with the same body for anything else), on its own
//! connection task per client connection. It also takes OTLP/HTTP trace exports
//! (`POST /v1/traces`: 200, an empty answer), for a foldgate exporting its spans to it.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;

/// Starts the mock on the current tokio runtime, answering every chat completion with
/// `completion` (JSON, one piece, not streamed); its address.
pub async fn start(completion: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let service = service_fn(|request| answer(request, completion));
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

/// Reads the whole request, then answers `completion` as `application/json`: 200 for
/// `POST /v1/chat/completions`, 404 for anything else.
async fn answer(
    request: Request<Incoming>,
    completion: &'static str,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let known = request.method() == Method::POST && request.uri().path() == "/v1/chat/completions";
    let traces = request.method() == Method::POST && request.uri().path() == "/v1/traces";
    request.into_body().collect().await?;
    if traces {
        // An empty ExportTraceServiceResponse: every span accepted.
        return Ok(Response::new(Full::new(Bytes::new())));
    }
    let mut response = Response::new(Full::new(Bytes::from_static(completion.as_bytes())));
    if !known {
        *response.status_mut() = StatusCode::NOT_FOUND;
    }
    let json = header::HeaderValue::from_static("application/json");
    response.headers_mut().insert(header::CONTENT_TYPE, json);
    Ok(response)
}
