//! The edge: listener, tower stack, router, the exchange every request of a compacted
//! route goes through (and its recorder), passthrough, upstream pool, the dialects (the
//! API shapes at the edge) and the providers' compaction APIs. The only module that imports hyper, http and tower (with
//! the model summarizer's own small client).

mod body;
mod chain;
mod connections;
pub mod content_coding;
pub mod deadline;
pub mod dialect;
mod error;
pub mod exchange;
mod headers;
pub mod inspect;
pub mod layers;
mod linger;
mod overflow;
mod passthrough;
pub mod provider_compaction;
pub mod record;
mod request_body;
mod routes;
pub mod server;
pub mod session_key;
pub mod sse;
pub mod tags;
pub mod trace;
pub mod upstream;
mod upstream_socket;
pub mod usage;
pub mod websocket;
pub mod wire;

pub use body::ProxyBody;
pub use error::ProxyError;
pub use server::Server;
