//! Tower middleware, one file each, in tower-http naming (`Foo<S>`, `FooLayer`).

pub mod access_log;
pub mod request_id;

pub use access_log::AccessLogLayer;
pub use request_id::RequestIdLayer;
