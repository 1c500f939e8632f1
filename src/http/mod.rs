//! The edge: listener, tower stack, router, the one handler of compacted routes (and the
//! turn it walks a request through), passthrough, upstream pool, and the dialects (the
//! API shapes at the edge). The only module that imports hyper, http and tower (with
//! the model summarizer's own small client).

mod body;
pub mod compaction_apis;
mod connections;
pub mod content_coding;
pub mod dialect;
mod error;
pub mod handler;
mod headers;
pub mod inspect;
pub mod layers;
mod linger;
mod overflow;
mod passthrough;
pub mod provider_compaction;
mod request_body;
mod routes;
pub mod server;
pub mod session_key;
pub mod sse;
pub mod trace;
pub mod turn;
pub mod upstream;
pub mod usage_tap;

pub use body::ProxyBody;
pub use error::ProxyError;
pub use server::Server;
