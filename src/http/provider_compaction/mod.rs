//! The providers' own compaction APIs, served by foldgate for upstreams that lack them:
//! OpenAI's `POST /v1/responses/compact` ([`compact`]) and `context_management`
//! compaction on `/v1/responses`, Anthropic's `context_management.edits` on
//! `/v1/messages`. Who serves each is configured (`[responses]`, `[messages]`); in `auto`
//! the upstream does until it answers that it does not know the API, which is then
//! remembered per upstream (see [`crate::learned::unserved`]).

pub mod answer;
pub mod compact;
pub mod on_request;
