//! Storing a Responses answer as the end of its chain, so that the next request naming it
//! (`previous_response_id`) can be read whole, on this replica or any other sharing the
//! store. The answer's end is held until the chain is stored: a client continues a
//! response only once it has all of it, so no replica can be asked for a chain that is
//! still being written. What is held: a JSON answer whole, or an event stream from its
//! `response.completed` event on; every byte goes on unchanged, in order, once the store
//! answered (or after [`SAVE_WAIT`]).

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::Response;
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;

use super::body::{BoxError, ProxyBody};
use super::session_key::ChainScope;
use super::usage::response_output;
use crate::api::responses::joined_items;
use crate::conversation::Conversations;
use crate::session::SessionKey;

/// The longest the end of an answer waits for its chain to be stored.
pub const SAVE_WAIT: Duration = Duration::from_secs(2);

/// A Responses answer to store as the end of its chain.
pub struct ChainSave {
    /// The conversation stage, which stores it.
    pub conversations: Conversations,
    /// The caller's scope of chain keys.
    pub scope: ChainScope,
    /// The conversation's items before the answer (a JSON array text).
    pub items: String,
    /// The key of the response the request continued (dropped once this one is stored).
    pub replaces: Option<SessionKey>,
    /// Set once the chain is stored (read by the request's recorder).
    pub stored: Arc<AtomicBool>,
}

impl ChainSave {
    /// Stores the chain ending with the answer `answer` (its held bytes), if it is a
    /// Responses answer with an id and an `output`.
    async fn store(self, answer: Bytes) {
        let Some((id, output)) = response_output(&answer) else { return };
        let Some(items) = joined_items(&[&self.items, &output]) else { return };
        let key = self.scope.key(&id);
        let saving =
            self.conversations.save_chain(&key, Bytes::from(items), self.replaces.as_ref());
        if tokio::time::timeout(SAVE_WAIT, saving).await.is_ok() {
            self.stored.store(true, Ordering::Release);
        }
    }
}

/// `answer` with its end held until `save` stored the chain it ends (see the module).
pub fn stored_before_end(answer: Response<ProxyBody>, save: ChainSave) -> Response<ProxyBody> {
    let json = answer
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    answer.map(|inner| {
        let held = Held {
            inner,
            save: Some(save),
            holding: json,
            held: Vec::new(),
            saving: None,
            release: VecDeque::new(),
            ended: false,
            failed: None,
        };
        held.boxed_unsync()
    })
}

/// The answer's body, its end held while the chain is stored.
struct Held {
    inner: ProxyBody,
    save: Option<ChainSave>,
    /// From here on, frames are held.
    holding: bool,
    held: Vec<Bytes>,
    saving: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
    /// Held frames, to go on once the chain is stored.
    release: VecDeque<Bytes>,
    ended: bool,
    /// The answer's failure, given once what was held went on.
    failed: Option<BoxError>,
}

impl Body for Held {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(saving) = this.saving.as_mut() {
                ready!(saving.as_mut().poll(cx));
                this.saving = None;
                this.release.extend(this.held.drain(..));
            }
            if let Some(bytes) = this.release.pop_front() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            if this.ended {
                return Poll::Ready(this.failed.take().map(Err));
            }
            match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                Some(Ok(frame)) => {
                    let Some(data) = frame.data_ref() else { return Poll::Ready(Some(Ok(frame))) };
                    let completed = memchr::memmem::find(data, b"response.completed").is_some();
                    this.holding |= completed;
                    if !this.holding {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.held.push(data.clone());
                }
                Some(Err(error)) => {
                    // A failed answer is not stored; what was held goes first.
                    this.save = None;
                    this.release.extend(this.held.drain(..));
                    this.ended = true;
                    this.failed = Some(error);
                }
                None => {
                    this.ended = true;
                    match this.save.take() {
                        Some(save) => {
                            let answer = Bytes::from(this.held.concat());
                            this.saving = Some(Box::pin(save.store(answer)));
                        }
                        None => this.release.extend(this.held.drain(..)),
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended && self.saving.is_none() && self.release.is_empty() && self.failed.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
