//! The HTTP side: listener, tower stack, router, passthrough and upstream client.
//! The only module that imports hyper, http and tower.

mod body;
pub mod chat;
mod connections;
pub mod conversation;
pub mod dialect;
mod error;
mod headers;
pub mod inspect;
pub mod layers;
mod linger;
mod overflow;
mod passthrough;
mod routes;
pub mod server;
pub mod session_key;
pub mod sse;
pub mod upstream;
pub mod usage_tap;

pub use body::ProxyBody;
pub use error::ProxyError;
pub use server::Server;
