//! One request of a compacted route (chat completions, Responses, Messages,
//! `/v1/responses/compact`), from its body to its record: an [`Exchange`] holds the
//! request's context, and its phases are its methods, in the order the request meets
//! them. [`run`] drives them:
//!
//! 1. `Exchange::read_body`: the body, once, within `server.max_body_size`, decoded
//!    when compressed (`super::request_body`).
//! 2. `Exchange::prepare`: the provider compaction API the body asks for, taken out
//!    when foldgate serves it (`super::provider_compaction`), and the headers to forward.
//!    `Exchange::expand_chain`: a Responses body naming a response foldgate kept is
//!    read as the whole conversation (`super::chain` keeps them).
//! 3. `Exchange::decide`: the conversation stage decides what to forward (`decide`):
//!    from the outline when clearly below the trigger, else parsed and compacted.
//! 4. `Exchange::serve_provider_api`: the provider compaction foldgate serves, folded
//!    now; it may answer the request itself.
//! 5. `Exchange::forward`: the body sent upstream.
//! 6. `Exchange::read_answer`: the answer read as far as it tells of an overflow, or
//!    of an upstream that refuses the provider compaction it was left (then foldgate
//!    serves it and the exchange goes back to 2).
//! 7. `Exchange::retry_after_overflow`: after an overflow no client byte has seen,
//!    compacted deeper and sent once more.
//! 8. `Exchange::respond`: the answer's head tagged, the provider compaction's
//!    addition written into its body.
//! 9. The end: the recorder ([`super::record`]) writes metrics, inspector entry, span,
//!    usage and calibration when the answer's last byte was sent or the client left.
//!
//! Requests of other routes are forwarded as they are (`super::passthrough`), recorded
//! by the same recorder.

mod decide;

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use http::header::{self, HeaderMap};

use super::body::{BodyProgress, ProxyBody, full};
use super::chain::{self, ChainSave};
use super::dialect::Dialect;
use super::error::ProxyError;
use super::inspect::{EdgeFacts, Inspector};
use super::overflow;
use super::passthrough::{self, build_request, client_response};
use super::provider_compaction::answer;
use super::provider_compaction::on_request::Addition;
use super::provider_compaction::{CompactionApis, CompactionFamily, FoldFacts, Prepared};
use super::record::{AnswerEnds, Operation, Record, team_of};
use super::request_body::{self, ReceivedBody};
use super::session_key::ChainScope;
use super::session_key::SessionHeaders;
use super::upstream::Upstream;
use super::upstream_socket::UpstreamSocket;
use super::wire::server::ClientRequest;
use crate::config::ServedBy;
use crate::conversation::{Conversations, PinError, Steer};
use crate::metrics::{ChainResult, Metrics};
use crate::model::ChatRequest;
use crate::session::SessionKey;
use crate::summarizer::llm::SUMMARY_HEADER;
use crate::vocab::Outcome;

/// What the exchanges of the compacted routes share. Cheap to clone: every connection
/// thread holds one.
#[derive(Clone)]
pub struct CompactedRoutes {
    /// The conversation stage.
    pub conversations: Conversations,
    /// The headers naming a conversation (`session.header`).
    pub session_header: SessionHeaders,
    /// `summarizer.instructions` and `compaction.pin`, which a request's
    /// `x-foldgate-compact-instructions` and `x-foldgate-pin` add to.
    pub steer: Steer,
    /// `compaction.enabled`.
    pub enabled: bool,
    /// The session inspector, when on (`admin.listen`): every request is recorded.
    pub inspector: Option<Arc<Inspector>>,
    /// Who serves the providers' own compaction APIs.
    pub compaction_apis: Arc<CompactionApis>,
}

/// Where a request of a compacted route arrived and goes.
#[derive(Clone, Copy)]
pub struct Place<'a, D> {
    /// What the compacted routes share.
    pub routes: &'a CompactedRoutes,
    /// The request's API shape.
    pub dialect: &'a D,
    /// Where it goes.
    pub upstream: &'a Upstream,
    /// Every metric (written only by the recorder).
    pub metrics: &'a Arc<Metrics>,
    /// `server.max_body_size` in bytes.
    pub max_body: u64,
    /// The upstream's WebSocket, when the request is a frame of a client connection
    /// whose upstream accepted one (see `super::websocket`): it is sent there.
    pub socket: Option<&'a UpstreamSocket>,
}

/// Runs one request of a compacted route through its exchange; how far its body was
/// read goes to `progress`.
pub async fn run<D: Dialect>(
    place: Place<'_, D>,
    request: ClientRequest,
    progress: Arc<BodyProgress>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let Place { routes, dialect, upstream, metrics, max_body, .. } = place;
    // A name made once: looked up by `&str`, it would be parsed on every request.
    static SUMMARY: http::HeaderName = http::HeaderName::from_static(SUMMARY_HEADER);
    let summary_call = request.headers().contains_key(&SUMMARY);
    if !routes.enabled || summary_call {
        // A digest call of foldgate's own goes as it is; so does every request when
        // compaction is off.
        let mut record = Record::new(dialect.route(), Operation::Forward, Instant::now());
        record.untaken = (!routes.enabled).then_some(Outcome::Disabled);
        return passthrough::forward(upstream, max_body, metrics, request, progress, record).await;
    }
    let exchange = Exchange::read_body(place, request, progress).await?;
    exchange.run().await
}

/// Runs one request of a compacted route whose body is already read (a WebSocket
/// frame made a request, see `super::websocket`): the same phases from the second on.
/// `as_received`: the request as the client sent it, forwarded when it is not compacted
/// (a frame naming a response the upstream's socket holds).
pub async fn run_read<D: Dialect>(
    place: Place<'_, D>,
    parts: http::request::Parts,
    body: Bytes,
    as_received: Option<Bytes>,
) -> Result<Response<ProxyBody>, ProxyError> {
    let operation = if answers_whole(place.dialect) { Operation::Compact } else { Operation::Chat };
    let mut record = Record::new(place.dialect.route(), operation, Instant::now());
    record.team = team_of(place.metrics, &parts.headers);
    let mut exchange = Exchange::new(place, parts, ReceivedBody::identity(body), record);
    exchange.as_received = as_received;
    exchange.run().await
}

/// True for a shape foldgate answers from the whole conversation when it serves its
/// provider compaction (see [`CompactionFamily::answers_whole`]).
pub fn answers_whole<D: Dialect>(dialect: &D) -> bool {
    dialect.compaction().is_some_and(|family| family.answers_whole())
}

/// One request's exchange: its context, and its phases as methods.
pub struct Exchange<'a, D: Dialect> {
    place: Place<'a, D>,
    parts: http::request::Parts,
    /// The body as received, and its content.
    received: ReceivedBody,
    /// The body as prepared for the decision (see [`Exchange::prepare`]).
    prepared: Prepared,
    /// The headers to forward (see [`CompactionFamily::forwarded_headers`]).
    headers: HeaderMap,
    /// The body as prepared before the Responses chain it continues was expanded into
    /// it, and the key of that chain (see [`Exchange::expand_chain`]).
    continued: Option<(Bytes, SessionKey)>,
    /// The request as the client sent it, forwarded when it is not compacted (a frame
    /// of a connection whose upstream holds its chain).
    as_received: Option<Bytes>,
    /// The parsed request and the origins of its messages; `None` until parsed (a
    /// request decided from its outline never is).
    parsed: Option<(Arc<ChatRequest>, D::Origins)>,
    /// What the request's headers add to the operator's instructions and pins, once
    /// read (`None`: nothing).
    steer: Option<Steer>,
    /// What is learned on the way, for the recorder.
    record: Record,
}

/// The answer an exchange's phases came to.
struct Answer {
    response: Response<ProxyBody>,
    /// What the provider compaction foldgate served adds to it.
    addition: Option<Addition>,
    /// It is the upstream's (its usage is counted); else foldgate's own.
    upstream: bool,
}

/// How an upstream's answer was read.
enum Read {
    /// It stands, or tells of an error to judge (an overflow or not).
    Answer(overflow::Read),
    /// The upstream refused the provider compaction fields left for it.
    Refused,
}

impl<'a, D: Dialect> Exchange<'a, D> {
    /// Phase 1: reads the body, once (see [`request_body::read`]).
    async fn read_body(
        place: Place<'a, D>,
        request: ClientRequest,
        progress: Arc<BodyProgress>,
    ) -> Result<Box<Self>, ProxyError> {
        let (parts, body) = request.into_parts();
        let operation =
            if answers_whole(place.dialect) { Operation::Compact } else { Operation::Chat };
        let mut record = Record::new(place.dialect.route(), operation, Instant::now());
        record.team = team_of(place.metrics, &parts.headers);
        let (received, coding) =
            request_body::read(body, place.max_body, &parts.headers, progress).await;
        record.encoded = coding;
        let received = match received {
            Ok(received) => received,
            Err(error) => {
                record.failed(place.metrics);
                return Err(error);
            }
        };
        record.started = Instant::now();
        Ok(Self::new(place, parts, received, record))
    }

    /// The exchange of a request whose body was read as `received`, boxed: it moves
    /// through the phases' futures as a pointer, not as its kilobyte of context.
    fn new(
        place: Place<'a, D>,
        parts: http::request::Parts,
        received: ReceivedBody,
        record: Record,
    ) -> Box<Self> {
        let prepared = Prepared::unchanged(received.readable());
        let headers = HeaderMap::new();
        Box::new(Self {
            place,
            parts,
            received,
            prepared,
            headers,
            continued: None,
            as_received: None,
            parsed: None,
            steer: None,
            record,
        })
    }

    /// Phases 2 to 9 (see the module).
    async fn run(mut self: Box<Self>) -> Result<Response<ProxyBody>, ProxyError> {
        match self.phases().await {
            Ok(answer) => Ok(self.respond(answer)),
            Err(error) => {
                self.record.failed(self.place.metrics);
                Err(error)
            }
        }
    }

    /// Phases 2 to 7, until an answer; again from 2 when the upstream refused the
    /// provider compaction it was left.
    async fn phases(&mut self) -> Result<Answer, ProxyError> {
        if self.received.content().is_none() {
            // Compressed in a way foldgate cannot undo: forwarded as received, uncompacted.
            self.headers = self.parts.headers.clone();
            return out_of_line(self.untaken()).await;
        }
        self.steer = steer_of(&self.place.routes.steer, &self.parts.headers)
            .map_err(|e| ProxyError::InvalidRequest(e.to_string()))?;
        let mut serve = self.foldgate_serves();
        loop {
            let may_refuse = self.prepare(serve)?;
            self.continued = None;
            if let Some(id) = self.place.dialect.continues(&self.prepared.body) {
                out_of_line(self.expand_chain(id)).await;
            }
            if !self.decide().await {
                if self.prepared.served.as_ref().is_some_and(|s| s.answered_here()) {
                    return Err(ProxyError::InvalidRequest(
                        "the body is not a request this gateway can read".to_owned(),
                    ));
                }
                // A body foldgate does not understand goes as it is; the upstream answers.
                return out_of_line(self.untaken()).await;
            }
            let addition = match self.prepared.served.is_some() {
                true => out_of_line(self.serve_provider_api()).await?,
                false => None,
            };
            if let Some(Addition::Answer { body, events }) = addition {
                // foldgate's own answer: the upstream is never asked.
                let response = answer::local(body, events);
                return Ok(Answer { response, addition: None, upstream: false });
            }
            let response = self.forward(self.body()).await?;
            let first = match self.read_answer(response, may_refuse).await {
                Read::Refused => {
                    out_of_line(self.learn_refused()).await;
                    serve = true;
                    continue;
                }
                Read::Answer(first) => first,
            };
            let retry = match first.error.as_deref() {
                Some(error) => {
                    // The first send took the headers: the retry forwards them again.
                    self.headers = self.forwarded_headers();
                    out_of_line(self.retry_after_overflow(error)).await
                }
                None => None,
            };
            let response = match retry {
                None => first.response,
                Some(body) => {
                    drop(first);
                    self.forward(body).await?
                }
            };
            return Ok(Answer { response, addition, upstream: true });
        }
    }

    /// True when foldgate serves the dialect's provider compaction API for this
    /// upstream before asking it.
    fn foldgate_serves(&self) -> bool {
        let Place { routes, dialect, upstream, .. } = self.place;
        let apis = &routes.compaction_apis;
        let conversations = &routes.conversations;
        let original = self.received.readable();
        let serves = |api| apis.foldgate_serves(api, conversations, upstream.name());
        dialect.compaction().is_some_and(|family| serves(family.api_for(original)))
    }

    /// Phase 2: prepares the body for the decision (`serve`: foldgate serves the
    /// provider compaction it asks for) and the headers to forward. True when the
    /// upstream may refuse the provider compaction fields left for it (in `auto`, it is
    /// then served here and the exchange goes back to this phase).
    fn prepare(&mut self, serve: bool) -> Result<bool, ProxyError> {
        let Place { routes, dialect, .. } = self.place;
        let original = self.received.readable();
        let apis = &routes.compaction_apis;
        let Some(family) = dialect.compaction() else {
            self.prepared = Prepared::unchanged(original);
            self.headers = self.forwarded_headers();
            return Ok(false);
        };
        let prepared = family.prepare(original, apis, serve).map_err(ProxyError::InvalidRequest)?;
        self.prepared = prepared;
        self.headers = self.forwarded_headers();
        let prepared = &self.prepared;
        let api = family.api_for(original);
        if prepared.left_for_upstream {
            self.record.provider_api = Some((api, false));
        }
        // In `auto`, an upstream that refuses the API is asked once.
        let may_refuse = prepared.left_for_upstream && apis.served_by(api) == ServedBy::Auto;
        Ok(may_refuse)
    }

    /// The client's headers as they go upstream with the body as prepared.
    fn forwarded_headers(&self) -> http::HeaderMap {
        match self.place.dialect.compaction() {
            Some(family) => family.forwarded_headers(&self.parts.headers, &self.prepared),
            None => self.parts.headers.clone(),
        }
    }

    /// Phase 2b: a body continuing the Responses chain `id` foldgate stored is read as
    /// the whole conversation; the body as prepared is kept, to be forwarded as received
    /// when it is not compacted. A chain foldgate does not know leaves the body as it is.
    async fn expand_chain(&mut self, id: String) {
        let Place { routes, dialect, .. } = self.place;
        let key = ChainScope::of(&self.parts.headers).key(&id);
        let stored = routes.conversations.load_chain(&key).await;
        let expanded = stored.and_then(|items| dialect.expand_chain(&self.prepared.body, &items));
        let Some(body) = expanded else {
            self.record.chain = Some(ChainResult::Unknown);
            return;
        };
        let before = std::mem::replace(&mut self.prepared.body, body);
        self.continued = Some((before, key));
        self.record.chain = Some(ChainResult::Expanded);
    }

    /// Phase 4: serves the provider compaction foldgate took on: folds the request when
    /// it is due; what to add to the answer, or foldgate's whole answer.
    async fn serve_provider_api(&mut self) -> Result<Option<Addition>, ProxyError> {
        let Some(served) = self.prepared.served.clone() else { return Ok(None) };
        let Some(family) = self.place.dialect.compaction() else { return Ok(None) };
        let fold = match family.fold_asked(&served) {
            Some(ask) => self.fold_whole(ask.when, ask.instructions).await,
            None => None,
        };
        let facts = FoldFacts {
            body: &self.prepared.body,
            model: self.record.decided.as_ref().map_or("", |d| &d.model_name),
            streams: self.streams(),
        };
        let apis = &self.place.routes.compaction_apis;
        let served =
            family.conclude(served, fold, &facts, apis).map_err(ProxyError::InvalidRequest)?;
        self.record.notes.extend(served.notes);
        if let Some(api) = served.api {
            self.record.provider_api = Some((api, true));
        }
        Ok(served.addition)
    }

    /// Phase 5: sends `body` upstream with the client's method, path and (forwarded)
    /// headers: the body as received when it is the content unchanged (compressed as it
    /// came), else identity-encoded.
    async fn forward(&mut self, body: Bytes) -> Result<Response<ProxyBody>, ProxyError> {
        let overhead = self.record.started.elapsed();
        let sent = Instant::now();
        let result = match self.place.socket {
            Some(socket) => socket.send(&body).await,
            None => {
                // Taken, not copied: a second send (the retry after an overflow)
                // derives them again.
                let mut headers = std::mem::take(&mut self.headers);
                let body = self.received.outgoing(body, &mut headers);
                // The client's length may not be this body's: the connection states the
                // length of the body it sends.
                headers.remove(header::CONTENT_LENGTH);
                let (method, uri) = (self.parts.method.clone(), &self.parts.uri);
                let upstream = self.place.upstream;
                let request = build_request(upstream, method, uri, headers, full(body))?;
                upstream.send(request).await.map(client_response)
            }
        };
        self.record.sent(overhead, sent.elapsed());
        result
    }

    /// Phase 6: reads the upstream's answer as far as it tells of an overflow (no byte
    /// has reached the client yet), or of a refusal of the provider compaction fields
    /// left for it when `may_refuse`.
    async fn read_answer(&mut self, response: Response<ProxyBody>, may_refuse: bool) -> Read {
        let dialect = self.place.dialect;
        let status = response.status();
        let first = overflow::read(&dialect.overflow(), response, self.retryable()).await;
        let error = first.error.as_deref();
        let refused = |c: D::Compaction| c.refuses(status, error.unwrap_or_default());
        if may_refuse && !status.is_success() && dialect.compaction().is_some_and(refused) {
            return Read::Refused;
        }
        Read::Answer(first)
    }

    /// After a refusal: the upstream is remembered as not serving the API.
    async fn learn_refused(&mut self) {
        let Place { routes, dialect, upstream, .. } = self.place;
        if let Some(family) = dialect.compaction() {
            let original = self.received.readable();
            routes.conversations.learn_unserved(family.api_for(original), upstream.name()).await;
        }
        self.record.provider_api = None;
    }

    /// Forwards the body as received: foldgate does not understand it.
    async fn untaken(&mut self) -> Result<Answer, ProxyError> {
        self.record.untaken = Some(Outcome::NotChat);
        let raw = self.received.raw().clone();
        let response = self.forward(raw).await?;
        Ok(Answer { response, addition: None, upstream: true })
    }

    /// Phase 8: the answer for the client, its head tagged with what happened, the
    /// provider compaction's addition written into its body, watched by the recorder
    /// until it ends (phase 9).
    #[expect(
        clippy::boxed_local,
        reason = "the exchange lives in its box: taken out, its context would be copied"
    )]
    fn respond(self: Box<Self>, answer: Answer) -> Response<ProxyBody> {
        let Answer { response, addition, upstream } = answer;
        let mut response = match addition {
            Some(addition) => answer::rewrite(response, |kind| addition.rewrite(kind)),
            None => response,
        };
        let routes = self.place.routes;
        let calibration = self.calibration().filter(|_| upstream);
        let mut record = self.record;
        record.answered_here = !upstream;
        record.tag(&mut response);
        let mut ends = AnswerEnds::metrics(self.place.metrics);
        if let Some(decided) = &record.decided {
            if let Some(inspector) = &routes.inspector {
                let (key, model) = (&decided.key, decided.model);
                let api = record.provider_api.filter(|(_, here)| *here).map(|(api, _)| api);
                let edge = EdgeFacts { retried: record.retried(), api, notes: &record.notes };
                let entry =
                    inspector.entry(&self.parts.headers, key, model, &decided.decision, edge);
                ends.inspection = Some(Box::new(entry));
            }
        }
        ends.calibration = calibration;
        let continued = self.continued.is_some();
        let items = self.place.dialect.chain_items(&self.prepared.body, continued);
        // A frame on the upstream's socket: the connection keeps its own chain.
        let kept_here = upstream && self.place.socket.is_none();
        if let Some(items) = items.filter(|_| kept_here) {
            let stored = Arc::new(AtomicBool::new(false));
            record.chain_stored = Some(stored.clone());
            let save = ChainSave {
                conversations: routes.conversations.clone(),
                scope: ChainScope::of(&self.parts.headers),
                items,
                replaces: self.continued.map(|(_, key)| key),
                stored,
            };
            response = chain::stored_before_end(response, save);
        }
        record.watch(response, upstream, ends)
    }
}

/// `future` boxed: a phase most requests never reach is polled out of line, so that
/// neither its state nor its code sits in the exchange's, which every request walks.
fn out_of_line<'f, T>(
    future: impl std::future::Future<Output = T> + Send + 'f,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send + 'f>> {
    Box::pin(future)
}

/// Compaction instructions for one conversation (`x-foldgate-compact-instructions`).
pub const INSTRUCTIONS_HEADER: &str = "x-foldgate-compact-instructions";
/// Pin patterns for one conversation (`x-foldgate-pin`: one per line or a JSON array).
pub const PIN_HEADER: &str = "x-foldgate-pin";

/// The operator's settings with what `headers` add; `None` when they add nothing. An
/// error names a pin pattern that cannot be used (the client gets a 400).
fn steer_of(operator: &Steer, headers: &http::HeaderMap) -> Result<Option<Steer>, PinError> {
    // Names made once: looked up by `&str`, each would be parsed on every request.
    static NAMES: [http::HeaderName; 2] = [
        http::HeaderName::from_static(INSTRUCTIONS_HEADER),
        http::HeaderName::from_static(PIN_HEADER),
    ];
    // Most requests carry neither: one pass over the headers tells.
    if super::headers::first_of(headers, &NAMES, |_| true).is_none() {
        return Ok(None);
    }
    let text = |name| headers.get(name).map(|v| String::from_utf8_lossy(v.as_bytes()));
    let (instructions, pins) = (text(&NAMES[0]), text(&NAMES[1]));
    if instructions.is_none() && pins.is_none() {
        return Ok(None);
    }
    operator.with_request(instructions.as_deref(), pins.as_deref()).map(Some)
}
