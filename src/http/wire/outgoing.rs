//! A body's bytes on their way to a socket, framed as its [`Sending`] says: the head
//! first, then the body's pieces (with chunk lines and the last chunk when chunked),
//! written with as few system calls as the socket allows.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};
use http::HeaderMap;

use super::codec::{self, Sending};

/// The body's length differs from the length its head stated.
#[derive(Debug, thiserror::Error)]
#[error("body length differs from its content-length")]
pub(super) struct LengthMismatch;

/// What is still to be written, in order.
pub(super) struct Outgoing {
    /// The pieces (empty ones are never queued).
    queue: VecDeque<Bytes>,
    /// Bytes in `queue`.
    queued: usize,
    sending: Sending,
    /// Body bytes queued so far.
    sent: u64,
    /// The body has ended, and its end is queued.
    pub ended: bool,
    /// Some byte reached the socket.
    pub written: bool,
}

impl Outgoing {
    /// `head` (never empty), then a body sent as `sending`.
    pub fn new(sending: Sending, head: Bytes) -> Self {
        let mut queue = VecDeque::with_capacity(6);
        let queued = head.len();
        queue.push_back(head);
        let ended = sending == Sending::Length(0);
        Self { queue, queued, sending, sent: 0, ended, written: false }
    }

    /// Nothing is waiting to be written.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Bytes waiting to be written.
    pub fn queued(&self) -> usize {
        self.queued
    }

    fn push(&mut self, bytes: Bytes) {
        self.queued += bytes.len();
        self.queue.push_back(bytes);
    }

    /// Queues a piece of the body.
    pub fn data(&mut self, data: Bytes) -> Result<(), LengthMismatch> {
        if data.is_empty() {
            return Ok(());
        }
        self.sent += data.len() as u64;
        match self.sending {
            Sending::Length(length) if self.sent > length => return Err(LengthMismatch),
            Sending::Length(_) | Sending::UntilClose => self.push(data),
            Sending::Chunked { .. } => {
                self.push(Bytes::from(codec::chunk_line(data.len())));
                self.push(data);
                self.push(Bytes::from_static(b"\r\n"));
            }
        }
        Ok(())
    }

    /// The body ended (with `trailers`, when it had some): queues its end.
    pub fn end(&mut self, trailers: Option<HeaderMap>) -> Result<(), LengthMismatch> {
        if self.ended {
            return Ok(());
        }
        self.ended = true;
        match self.sending {
            Sending::Length(length) if self.sent != length => Err(LengthMismatch),
            Sending::Length(_) | Sending::UntilClose => Ok(()),
            Sending::Chunked { trailers: sent } => {
                let trailers = trailers.filter(|_| sent);
                self.push(Bytes::from(codec::last_chunk(trailers.as_ref())));
                Ok(())
            }
        }
    }

    /// Fills `slices` with the front of the queue; how many it filled.
    pub fn slices<'a>(&'a self, slices: &mut [IoSlice<'a>]) -> usize {
        let count = self.queue.len().min(slices.len());
        for (slice, bytes) in slices.iter_mut().zip(&self.queue) {
            *slice = IoSlice::new(bytes);
        }
        count
    }

    /// `written` bytes went out.
    pub fn advance(&mut self, mut written: usize) {
        self.written = true;
        self.queued -= written.min(self.queued);
        while let Some(front) = self.queue.front_mut() {
            if written < front.len() {
                front.advance(written);
                return;
            }
            written -= front.len();
            self.queue.pop_front();
        }
    }
}
