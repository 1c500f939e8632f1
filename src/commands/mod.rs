//! Offline commands on the compaction engine: `compact` and `replay`.

pub mod compact;
pub mod replay;
