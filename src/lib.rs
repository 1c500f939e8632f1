//! foldgate: a reverse proxy for OpenAI-compatible APIs that transparently compacts
//! long chat conversations before forwarding them.
//!
//! Stages (dependencies point one way): the edge (`http`, with its dialects) → the
//! conversation (`conversation`, with `session` and `learned`) → the engine
//! (`compaction`) → `model`; `config`, `model` and `vocab` are leaves. See
//! `ARCHITECTURE.md`.

#[allow(unsafe_code)] // A `GlobalAlloc` is unsafe to implement; nothing else is.
pub mod allocator;
pub mod api;
pub mod app;
pub mod cli;
pub mod client;
pub mod commands;
pub mod compaction;
pub mod config;
pub mod conversation;
pub mod http;
pub mod learned;
pub mod metrics;
pub mod model;
pub mod outline;
pub mod session;
pub mod shutdown;
pub mod summarizer;
pub mod telemetry;
pub mod vocab;
