//! foldgate: a reverse proxy for OpenAI-compatible APIs that transparently compacts
//! long chat conversations before forwarding them.
//!
//! Layering (dependencies point one way): `app` → `http` → `compaction` → `model`;
//! `config` is a leaf. See `ARCHITECTURE.md`.

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
