//! What wraps the router for every request, one file each: `Foo<S>` around a
//! [`ClientService`](super::wire::server::ClientService) `S`.

pub mod access_log;
pub mod request_id;

pub use access_log::AccessLog;
pub use request_id::RequestIds;
