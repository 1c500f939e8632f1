//! The compaction engine: plans how a chat request's `messages` are compacted to fit a
//! token budget. Pure and synchronous except the summarizer call; knows nothing of HTTP.
