//! Chat completions: the engine's neutral request is a chat request, so a body converts
//! to itself, with no origins to remember, and the body the engine serialized for the
//! compacted request is the body to forward.

use crate::model::ChatRequest;

/// The body as a chat request; `None` when it is not one foldgate understands.
pub fn parse(body: &[u8]) -> Option<ChatRequest> {
    ChatRequest::parse(body).ok()
}
