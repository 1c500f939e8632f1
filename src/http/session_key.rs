//! Which conversation a request belongs to, scoped by tenant.
//!
//! Tenant = a hash of the request's credential (`Authorization`, `api-key`,
//! `x-api-key`), so one tenant can never reach another's state. Within a tenant the
//! first of the configured headers present (`session.header`: `x-session-id`, Codex's
//! `thread-id` and `session-id` by default) names the conversation; without one a
//! fingerprint of (model, first system message, first user message) does, split by the
//! client's own name for the conversation when the body gives one (its scope: see
//! [`scope_of`]). Only hashes leave this module: raw session ids and credentials are
//! never stored or shown.

use std::any::Any;
use std::rc::Rc;
use std::sync::Arc;

use http::{HeaderMap, HeaderName, HeaderValue};
use sha2::{Digest, Sha256};
use xxhash_rust::xxh3::Xxh3;

use crate::model::{ChatRequest, Role};
use crate::outline::Outline;
use crate::session::SessionKey;

/// Headers that carry a client credential, in the order they are looked up (as header
/// names, so that a lookup does not parse a string on every request).
pub static CREDENTIAL_HEADERS: [HeaderName; 3] = [
    http::header::AUTHORIZATION,
    HeaderName::from_static("api-key"),
    HeaderName::from_static("x-api-key"),
];

/// The request headers that name a conversation (`session.header`), looked up in order:
/// the first present and not empty names it.
#[derive(Debug, Clone)]
pub struct SessionHeaders(Box<[HeaderName]>);

impl SessionHeaders {
    /// The headers `names`, in order; `Err` names the first that is not a header name.
    pub fn new<S: AsRef<str>>(names: &[S]) -> Result<Self, String> {
        names
            .iter()
            .map(|n| {
                HeaderName::from_bytes(n.as_ref().as_bytes())
                    .map_err(|_| format!("`{}` is not a valid header name", n.as_ref()))
            })
            .collect::<Result<Box<[_]>, _>>()
            .map(Self)
    }

    /// The value of the first of these headers `headers` carry, when not empty.
    fn id<'h>(&self, headers: &'h HeaderMap) -> Option<&'h HeaderValue> {
        super::headers::first_of(headers, &self.0, |v| !v.is_empty()).map(|(_, v)| v)
    }
}

impl Default for SessionHeaders {
    /// The headers of `session.header`'s default.
    fn default() -> Self {
        let names = crate::config::HeaderNames::default();
        Self(
            names
                .names()
                .iter()
                .filter_map(|n| HeaderName::from_bytes(n.as_bytes()).ok())
                .collect(),
        )
    }
}

/// The first credential header present: its name and value.
pub fn credential(headers: &HeaderMap) -> Option<(&'static str, &http::HeaderValue)> {
    CREDENTIAL_HEADERS.iter().find_map(|name| headers.get(name).map(|v| (name.as_str(), v)))
}

/// The tenant of a request: a hash of its credential, the same credential that scopes
/// its session keys (the session inspector lists a tenant's sessions by it); `None`
/// without a credential.
pub fn tenant(headers: &HeaderMap) -> Option<String> {
    let (name, value) = credential(headers)?;
    let mut hash = Sha256::new();
    hash.update(b"foldgate/tenant/v1\0");
    hash.update(name.as_bytes());
    hash.update(b"\0");
    hash.update(value.as_bytes());
    Some(hex(&hash.finalize()[..16]))
}

/// Where the Responses chains of one caller are kept: keys scoped by its credential like
/// a conversation's, so that no tenant reads another's chain.
#[derive(Clone)]
pub struct ChainScope(Sha256);

impl ChainScope {
    /// The scope of the caller with `headers`.
    pub fn of(headers: &HeaderMap) -> Self {
        Self(scoped(b"foldgate/chain/v1\0", headers))
    }

    /// The key of the chain ending with response `id`.
    pub fn key(&self, id: &str) -> SessionKey {
        let mut hash = self.0.clone();
        hash.update(id.as_bytes());
        SessionKey::from_digest(hex(&hash.finalize()[..16]))
    }
}

/// What names a conversation that no session header names: the model, the JSON text of
/// its first system and first user messages (neutral form), and its scope.
pub struct Fingerprint<'a> {
    /// The request's `model`.
    pub model: String,
    /// The first system (or developer) message.
    pub system: Option<&'a [u8]>,
    /// The first user message.
    pub user: Option<&'a [u8]>,
    /// The client's own name for the conversation, if the body gives one.
    pub scope: Option<String>,
    /// The first messages may carry prompt-cache breakpoints (`cache_control`), which
    /// the fingerprint leaves out; `false` only when a scan saw none in them.
    pub marked: bool,
}

/// [`Fingerprint`] with owned parts, as a dialect finds them without parsing a body.
pub struct FingerprintParts {
    /// The request's `model`.
    pub model: String,
    /// The first system (or developer) message, as neutral JSON text (see
    /// [`fingerprint_part`]).
    pub system: Option<Arc<str>>,
    /// The first user message, as neutral JSON text (see [`fingerprint_part`]).
    pub user: Option<Arc<str>>,
    /// See [`scope_of`].
    pub scope: Option<String>,
}

/// The neutral JSON text `convert` makes of `raw` (the raw JSON of a first system or
/// user message, or what it is made from, as a dialect reads it without parsing the
/// body), without its `cache_control` fields; `what` names the conversion. Made once
/// per text on each thread: an agent sends the same first messages (a system prompt of
/// tens of kilobytes) with every request of a conversation, and parsing them again each
/// time cost more than the rest of a request below the trigger.
pub fn fingerprint_part(
    what: &'static str,
    raw: &[u8],
    convert: impl FnOnce() -> Option<String>,
) -> Option<Arc<str>> {
    remembered(what, raw, || {
        convert().map(|text| {
            let unmarked = match without_cache_control(text.as_bytes()) {
                std::borrow::Cow::Borrowed(_) => None,
                std::borrow::Cow::Owned(unmarked) => Some(unmarked),
            };
            match unmarked {
                None => Arc::from(text),
                Some(unmarked) => Arc::from(String::from_utf8_lossy(&unmarked).as_ref()),
            }
        })
    })
}

/// What `make` makes of the text `raw` (`what` names what is made), made once per text on
/// each thread: the value made last for the same `what` and text is given again. For the
/// parts of a fingerprint a dialect reads without parsing the body (see
/// [`fingerprint_part`]); `V` is cheap to clone.
pub fn remembered<V: Clone + 'static>(
    what: &'static str,
    raw: &[u8],
    make: impl FnOnce() -> V,
) -> V {
    let mut tag = Xxh3::with_seed(*RECENT_SEED);
    tag.update(what.as_bytes());
    tag.update(b"\0");
    tag.update(raw);
    let tag = tag.digest128();
    let kept = PARTS.with(|parts| parts.borrow().get(tag));
    // A value of another type under the same tag (a collision) is made again.
    if let Some(value) = kept.as_deref().and_then(|kept| kept.downcast_ref::<V>()) {
        return value.clone();
    }
    let value = make();
    let kept: Rc<dyn Any> = Rc::new(value.clone());
    PARTS.with(|parts| parts.borrow_mut().put(tag, kept));
    value
}

thread_local! {
    /// Values made last on this thread by [`remembered`] (two a conversation for a
    /// Messages body, its system and user message; a few for a Responses body), each
    /// under a seeded XXH3-128 of what was made and of the raw text.
    static PARTS: std::cell::RefCell<Ring<Rc<dyn Any>, 32>> =
        std::cell::RefCell::new(Ring::new());
}

/// The last `N` values put, each under a tag, the oldest replaced first.
struct Ring<V, const N: usize> {
    /// The next slot to fill.
    next: usize,
    slots: [Option<(u128, V)>; N],
}

impl<V: Clone, const N: usize> Ring<V, N> {
    fn new() -> Self {
        Self { next: 0, slots: std::array::from_fn(|_| None) }
    }

    fn get(&self, tag: u128) -> Option<V> {
        self.slots.iter().flatten().find(|(t, _)| *t == tag).map(|(_, value)| value.clone())
    }

    fn put(&mut self, tag: u128, value: V) {
        self.slots[self.next] = Some((tag, value));
        self.next = (self.next + 1) % N;
    }
}

/// The client's own name for the conversation, from the body's top-level fields (`field`
/// gives one's raw JSON): `prompt_cache_key` (OpenAI's; Codex sets it to its conversation
/// id), else the session in `metadata.user_id` (Anthropic's; see `session_in_user_id`).
/// It splits conversations whose first messages are alike (two agent sessions in one
/// repository start with the same instructions); it never joins two.
pub fn scope_of<'a>(field: impl Fn(&str) -> Option<&'a [u8]>) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Metadata {
        user_id: Option<String>,
    }
    let string = |raw: &[u8]| serde_json::from_slice::<String>(raw).ok();
    if let Some(key) = field("prompt_cache_key").and_then(string).filter(|k| !k.is_empty()) {
        return Some(key);
    }
    let metadata = serde_json::from_slice::<Metadata>(field("metadata")?).ok()?;
    metadata.user_id.filter(|id| !id.is_empty()).map(|id| session_in_user_id(&id))
}

/// The session named in Anthropic's `metadata.user_id`, as Claude Code writes it: a JSON
/// object with a `session_id` (today's releases, beside device and account ids), or
/// `user_<hash>_account_<uuid>_session_<uuid>` (earlier ones); any other value whole.
/// Only the session counts, so that the same session is one conversation whatever else
/// the client puts beside it.
fn session_in_user_id(user_id: &str) -> String {
    #[derive(serde::Deserialize)]
    struct Ids {
        session_id: Option<String>,
    }
    if user_id.trim_start().starts_with('{') {
        if let Ok(Ids { session_id: Some(session) }) = serde_json::from_str::<Ids>(user_id) {
            if !session.is_empty() {
                return format!("session:{session}");
            }
        }
    }
    match user_id.rsplit_once("_session_") {
        Some((_, session)) if !session.is_empty() => format!("session:{session}"),
        _ => user_id.to_owned(),
    }
}

/// The session key of `request`: tenant-scoped, from `session_header` or a fingerprint.
pub fn session_key(
    headers: &HeaderMap,
    session_header: &SessionHeaders,
    request: &ChatRequest,
) -> SessionKey {
    key(headers, session_header.id(headers), || {
        let first = |role: Role| {
            request
                .messages()
                .iter()
                .find(|m| m.role() == role || (role == Role::System && m.role() == Role::Developer))
                .map(|m| m.raw().as_bytes())
        };
        Fingerprint {
            model: request.model().unwrap_or_default(),
            system: first(Role::System),
            user: first(Role::User),
            scope: scope_of(|k| request.field(k).map(str::as_bytes)),
            marked: true,
        }
    })
}

/// [`session_key`] of a request known by its [`Outline`] (the same key).
pub fn session_key_of_outline(
    headers: &HeaderMap,
    session_header: &SessionHeaders,
    outline: &Outline<'_>,
) -> SessionKey {
    key_of_digest(headers, session_header.id(headers), || {
        let system = outline.first_message_with_role(Role::System);
        let user = outline.first_message_with_role(Role::User);
        let model = outline.model().unwrap_or_default();
        let scope = scope_of(|k| outline.field(k));
        let marked = [system, user].into_iter().flatten().any(|m| m.breakpoint_mentions > 0);
        // The first messages are most of what is hashed, and lie in the body's first
        // bytes: a body continuing one whose digest this thread made takes that digest
        // (see `Outline::memoized`) when the rest is the same.
        let upto = [system, user].into_iter().flatten().map(|m| m.range.end).max().unwrap_or(0);
        let mut inputs = Xxh3::new();
        inputs.update(&(model.len() as u64).to_le_bytes());
        inputs.update(model.as_bytes());
        inputs.update(&[u8::from(marked), u8::from(scope.is_some())]);
        inputs.update(scope.as_deref().unwrap_or_default().as_bytes());
        outline.memoized(upto, inputs.digest128(), || {
            fingerprint_digest(Fingerprint {
                model: model.into_owned(),
                system: system.map(|m| outline.raw(m)),
                user: user.map(|m| outline.raw(m)),
                scope,
                marked,
            })
        })
    })
}

/// [`session_key`] of a request whose fingerprint parts a dialect finds without parsing
/// the body (the same key as the parsed request's), found by `parts` only when there is
/// no session header; `None` when they are needed and `parts` cannot find them.
pub fn session_key_with(
    headers: &HeaderMap,
    session_header: &SessionHeaders,
    parts: impl FnOnce() -> Option<FingerprintParts>,
) -> Option<SessionKey> {
    let id = session_header.id(headers);
    if id.is_some() {
        let unused = || Fingerprint {
            model: String::new(),
            system: None,
            user: None,
            scope: None,
            marked: false,
        };
        return Some(key(headers, id, unused));
    }
    let parts = parts()?;
    Some(key(headers, None, || Fingerprint {
        model: parts.model,
        system: parts.system.as_deref().map(str::as_bytes),
        user: parts.user.as_deref().map(str::as_bytes),
        scope: parts.scope,
        marked: true,
    }))
}

/// A hash begun with `domain` and the caller's credential (its header's name and value;
/// `anonymous` without one): every key of a tenant starts so.
fn scoped(domain: &[u8], headers: &HeaderMap) -> Sha256 {
    scoped_by(domain, credential(headers))
}

/// [`scoped`] with the credential found.
fn scoped_by(domain: &[u8], credential: Option<(&str, &HeaderValue)>) -> Sha256 {
    let mut hash = Sha256::new();
    hash.update(domain);
    match credential {
        Some((name, value)) => {
            hash.update(name.as_bytes());
            hash.update(b"\0");
            hash.update(value.as_bytes());
        }
        None => hash.update(b"anonymous"),
    }
    hash.update(b"\0");
    hash
}

/// The key from the credential and `id` (the first session header present), or else
/// from the fingerprint `(model, first system message, first user message)` that
/// `fingerprint` gives.
///
/// The key is SHA-256 of the credential and of what names the conversation, the largest
/// part of a small request's handling; most requests name what the one before named,
/// so the keys made last on this thread are remembered by a seeded XXH3-128 of the same
/// inputs (see [`Recent`]).
fn key<'a>(
    headers: &HeaderMap,
    id: Option<&HeaderValue>,
    fingerprint: impl FnOnce() -> Fingerprint<'a>,
) -> SessionKey {
    key_of_digest(headers, id, || fingerprint_digest(fingerprint()))
}

/// [`key`] with the fingerprint's digest made by `digest`.
fn key_of_digest(
    headers: &HeaderMap,
    id: Option<&HeaderValue>,
    digest: impl FnOnce() -> u128,
) -> SessionKey {
    let credential = credential(headers);
    let named = match id {
        Some(id) => Named::Header(id.as_bytes()),
        None => Named::Fingerprint(digest()),
    };
    let tag = Recent::tag(credential, &named);
    if let Some(key) = Recent::get(tag) {
        return key;
    }
    let mut hash = scoped_by(b"foldgate/session/v2\0", credential);
    match named {
        Named::Header(id) => {
            hash.update(b"header\0");
            hash.update(id);
        }
        Named::Fingerprint(digest) => {
            hash.update(b"fingerprint\0");
            hash.update(digest.to_le_bytes());
        }
    }
    let key = SessionKey::from_digest(hex(&hash.finalize()[..16]));
    Recent::put(tag, &key);
    key
}

/// What names a conversation within its tenant.
enum Named<'a> {
    /// The value of the first session header present.
    Header(&'a [u8]),
    /// The XXH3-128 digest of the fingerprint's parts.
    Fingerprint(u128),
}

/// The first messages can be long pastes: they are hashed with XXH3-128, which keeps up
/// with memory, and only its digest goes through SHA-256 with the credential. A
/// collision could only join two conversations of one tenant, and a fold block is
/// reused only where its messages match exactly.
fn fingerprint_digest(fingerprint: Fingerprint<'_>) -> u128 {
    let Fingerprint { model, system, user, scope, marked } = fingerprint;
    let mut content = Xxh3::new();
    content.update(model.as_bytes());
    // Cache breakpoints move from request to request (Claude Code marks the newest
    // message): they are not part of what the conversation said.
    let unmarked = |raw| if marked { without_cache_control(raw) } else { raw.into() };
    let (system, user) = (system.map(unmarked), user.map(unmarked));
    for first in [system.as_deref(), user.as_deref()] {
        content.update(b"\0");
        content.update(&(first.map_or(0, <[u8]>::len) as u64).to_le_bytes());
        if let Some(raw) = first {
            content.update(raw);
        }
    }
    // Only when there is one, so that the keys of other requests stay as they were.
    if let Some(scope) = scope {
        content.update(b"\0scope\0");
        content.update(&(scope.len() as u64).to_le_bytes());
        content.update(scope.as_bytes());
    }
    content.digest128()
}

/// Session keys made last on this thread, each under a tag: XXH3-128 of the credential
/// and of what names the conversation, seeded with a secret drawn when the process
/// starts, so that no client can make its tag meet another's. Only tags and keys (both
/// hashes) are kept, never a credential.
struct Recent;

/// Keys remembered per thread (a connection thread serves many conversations at once).
const RECENT_KEYS: usize = 16;

thread_local! {
    static RECENT: std::cell::RefCell<Ring<SessionKey, RECENT_KEYS>> =
        std::cell::RefCell::new(Ring::new());
}

static RECENT_SEED: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(0x666f_6c64_6761_7465);
    hasher.finish()
});

/// The most bytes [`Recent::tag`] hashes in one piece.
const TAG_BUFFER: usize = 384;

thread_local! {
    /// [`Recent::tag`]'s parts laid end to end.
    static TAG_BYTES: std::cell::RefCell<Vec<u8>> =
        std::cell::RefCell::new(Vec::with_capacity(TAG_BUFFER));
}

impl Recent {
    fn tag(credential: Option<(&str, &HeaderValue)>, named: &Named<'_>) -> u128 {
        let length;
        let digest;
        let (who, what): ([&[u8]; 4], [&[u8]; 2]) = (
            match credential {
                Some((name, value)) => {
                    length = (value.len() as u64).to_le_bytes();
                    [name.as_bytes(), b"\0", &length, value.as_bytes()]
                }
                None => [b"\0anonymous", b"", b"", b""],
            },
            match named {
                Named::Header(id) => [b"\0header\0", id],
                Named::Fingerprint(value) => {
                    digest = value.to_le_bytes();
                    [b"\0fingerprint\0", &digest]
                }
            },
        );
        // The parts one after the other, hashed at once in the thread's buffer when they
        // are small (most are: a key and an id): a streaming hasher's setup costs more
        // than the hash, and a buffer on the stack would be cleared on every call. The
        // digest is the same either way.
        let len: usize = who.iter().chain(&what).map(|part| part.len()).sum();
        if len > TAG_BUFFER {
            let mut tag = Xxh3::with_seed(*RECENT_SEED);
            who.iter().chain(&what).for_each(|part| tag.update(part));
            return tag.digest128();
        }
        TAG_BYTES.with_borrow_mut(|buffer| {
            buffer.clear();
            who.iter().chain(&what).for_each(|part| buffer.extend_from_slice(part));
            xxhash_rust::xxh3::xxh3_128_with_seed(buffer, *RECENT_SEED)
        })
    }

    fn get(tag: u128) -> Option<SessionKey> {
        RECENT.with(|recent| recent.borrow().get(tag))
    }

    fn put(tag: u128, key: &SessionKey) {
        RECENT.with(|recent| recent.borrow_mut().put(tag, key.clone()));
    }
}

/// A message's JSON text without its `cache_control` fields, wherever they are; the text
/// itself when it names none (or is not JSON).
fn without_cache_control(raw: &[u8]) -> std::borrow::Cow<'_, [u8]> {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(fields) => {
                fields.shift_remove("cache_control");
                fields.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    // Built once: a searcher's setup costs more than scanning a message for it.
    static FIELD: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"cache_control\""));
    if FIELD.find(raw).is_none() {
        return std::borrow::Cow::Borrowed(raw);
    }
    match serde_json::from_slice::<serde_json::Value>(raw) {
        Ok(mut value) => {
            strip(&mut value);
            serde_json::to_vec(&value).map_or(std::borrow::Cow::Borrowed(raw), Into::into)
        }
        Err(_) => std::borrow::Cow::Borrowed(raw),
    }
}

/// `bytes` in lowercase hexadecimal.
fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(first_user: &str) -> ChatRequest {
        let body = serde_json::json!({
            "model": "gpt-4o",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": first_user},
                {"role": "assistant", "content": "ok"}
            ]
        });
        ChatRequest::parse(body.to_string().as_bytes()).unwrap()
    }

    /// A recent key's tag is the seeded hash of its parts in order, whether they fit
    /// the small buffer or are streamed.
    #[test]
    fn recent_tags_hash_the_parts_in_order_at_any_length() {
        for len in [1, 40, 300, 370, 400, 2000] {
            let value = HeaderValue::from_str(&"k".repeat(len)).unwrap();
            for named in [Named::Header(b"abc"), Named::Fingerprint(7 << 70)] {
                let mut stream = Xxh3::with_seed(*RECENT_SEED);
                stream.update(b"authorization\0");
                stream.update(&(len as u64).to_le_bytes());
                stream.update(value.as_bytes());
                match &named {
                    Named::Header(id) => stream.update(&[b"\0header\0", *id].concat()),
                    Named::Fingerprint(d) => {
                        stream.update(&[&b"\0fingerprint\0"[..], &d.to_le_bytes()].concat())
                    }
                }
                assert_eq!(
                    Recent::tag(Some(("authorization", &value)), &named),
                    stream.digest128(),
                    "{len}"
                );
            }
        }
        let mut stream = Xxh3::with_seed(*RECENT_SEED);
        stream.update(b"\0anonymous\0header\0abc");
        assert_eq!(Recent::tag(None, &Named::Header(b"abc")), stream.digest128());
        assert_ne!(
            Recent::tag(None, &Named::Header(b"abc")),
            Recent::tag(None, &Named::Header(b"abd"))
        );
    }

    fn x_session_id() -> SessionHeaders {
        SessionHeaders::new(&["x-session-id"]).unwrap()
    }

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        pairs.iter().map(|(k, v)| (http::HeaderName::from_static(k), v.parse().unwrap())).collect()
    }

    #[test]
    fn same_session_id_under_two_credentials_gives_two_keys() {
        let r = request("hi");
        let a = session_key(
            &headers(&[("authorization", "Bearer A"), ("x-session-id", "s1")]),
            &x_session_id(),
            &r,
        );
        let b = session_key(
            &headers(&[("authorization", "Bearer B"), ("x-session-id", "s1")]),
            &x_session_id(),
            &r,
        );
        assert_ne!(a, b);
        let a2 = session_key(
            &headers(&[("authorization", "Bearer A"), ("x-session-id", "s1")]),
            &x_session_id(),
            &request("other"),
        );
        assert_eq!(a, a2, "with the header, content does not matter");
    }

    #[test]
    fn fingerprint_follows_the_start_of_the_conversation() {
        let h = headers(&[("api-key", "k")]);
        let a = session_key(&h, &x_session_id(), &request("task one"));
        assert_eq!(a, session_key(&h, &x_session_id(), &request("task one")));
        assert_ne!(a, session_key(&h, &x_session_id(), &request("task two")));
        assert_ne!(
            a,
            session_key(&headers(&[("api-key", "other")]), &x_session_id(), &request("task one"))
        );
    }

    #[test]
    fn a_system_message_never_passes_for_a_user_message() {
        let h = headers(&[("api-key", "k")]);
        let body = |messages: serde_json::Value| {
            let body = serde_json::json!({"model": "m", "messages": messages});
            ChatRequest::parse(body.to_string().as_bytes()).unwrap()
        };
        let system_only = body(serde_json::json!([{"role": "system", "content": "x"}]));
        let user_only = body(serde_json::json!([{"role": "user", "content": "x"}]));
        assert_ne!(
            session_key(&h, &x_session_id(), &system_only),
            session_key(&h, &x_session_id(), &user_only)
        );
        assert_eq!(hex(&[0x00, 0x9f, 0xa0, 0xff]), "009fa0ff");
    }

    #[test]
    fn a_tenant_is_its_credential_hashed() {
        let a = tenant(&headers(&[("authorization", "Bearer sk-a")])).unwrap();
        assert_eq!(Some(&a), tenant(&headers(&[("authorization", "Bearer sk-a")])).as_ref());
        assert_ne!(Some(&a), tenant(&headers(&[("authorization", "Bearer sk-b")])).as_ref());
        assert!(a.len() == 32 && !a.contains("sk-a"));
        assert_eq!(tenant(&headers(&[("x-session-id", "s")])), None);
    }

    #[test]
    fn keys_never_contain_the_credential_or_the_session_id() {
        let h = headers(&[("authorization", "Bearer sk-secret"), ("x-session-id", "my-session")]);
        let key = session_key(&h, &x_session_id(), &request("x"));
        assert_eq!(key.as_str().len(), 32);
        assert!(!key.as_str().contains("secret") && !key.as_str().contains("my-session"));
    }

    #[test]
    fn a_scope_splits_conversations_that_start_alike_and_never_joins_two() {
        let h = headers(&[("authorization", "Bearer sk-a")]);
        let scoped = |fields: serde_json::Value| {
            let mut body = serde_json::json!({"model": "gpt-4o", "messages": [
                {"role": "system", "content": "be brief"}, {"role": "user", "content": "task"}]});
            for (k, v) in fields.as_object().unwrap() {
                body[k] = v.clone();
            }
            session_key(
                &h,
                &x_session_id(),
                &ChatRequest::parse(body.to_string().as_bytes()).unwrap(),
            )
        };
        let none = scoped(serde_json::json!({}));
        let a = scoped(serde_json::json!({"prompt_cache_key": "conv-a"}));
        let b = scoped(serde_json::json!({"prompt_cache_key": "conv-b"}));
        let claude = scoped(serde_json::json!({"metadata": {"user_id": "user_1_session_a"}}));
        assert_eq!(a, scoped(serde_json::json!({"prompt_cache_key": "conv-a"})));
        for (x, y) in [(&none, &a), (&a, &b), (&none, &claude), (&a, &claude)] {
            assert_ne!(x, y);
        }
        // No scope, or an empty one, keys the conversation as before.
        assert_eq!(none, session_key(&h, &x_session_id(), &request("task")));
        assert_eq!(none, scoped(serde_json::json!({"prompt_cache_key": ""})));
        assert_eq!(none, scoped(serde_json::json!({"metadata": {"other": "x"}})));
        // The first messages still count: one scope, two starts, two conversations.
        let other = ChatRequest::parse(
            br#"{"model":"gpt-4o","prompt_cache_key":"conv-a","messages":[{"role":"user","content":"other"}]}"#,
        )
        .unwrap();
        assert_ne!(a, session_key(&h, &x_session_id(), &other));
    }

    #[test]
    fn the_outline_gives_the_key_the_parsed_request_gives() {
        let bodies = [
            r#"{"model":"gpt-4o","messages":[{"role":"developer","content":"d"},{"role":"assistant","content":"a"},{"role":"user","content":[{"type":"text","text":"t"}]}]}"#,
            r#"{ "messages" : [ {"content":"no role"}, { "role" : "user" , "content" : "u" } ] }"#,
            r#"{"model":"m","messages":[]}"#,
            r#"{"model":"m","prompt_cache_key":"conv-1","messages":[{"role":"user","content":"u"}]}"#,
            r#"{"model":"m","metadata":{"user_id":"user_x_session_1"},"messages":[]}"#,
        ];
        for body in bodies {
            let parsed = ChatRequest::parse(body.as_bytes()).unwrap();
            let outline = Outline::scan(body.as_bytes()).unwrap();
            for h in [headers(&[("api-key", "k")]), headers(&[("x-session-id", "s")])] {
                assert_eq!(
                    session_key(&h, &x_session_id(), &parsed),
                    session_key_of_outline(&h, &x_session_id(), &outline),
                    "{body}"
                );
            }
        }
    }

    #[test]
    fn a_remembered_value_is_made_once_per_text_and_type() {
        let made = std::cell::Cell::new(0);
        let make = |value: u32| {
            made.set(made.get() + 1);
            value
        };
        assert_eq!(remembered("test/number", b"text", || make(1)), 1);
        assert_eq!(remembered("test/number", b"text", || make(2)), 1, "kept");
        assert_eq!(made.get(), 1);
        assert_eq!(remembered("test/number", b"other text", || make(3)), 3);
        assert_eq!(remembered("test/other", b"text", || make(4)), 4, "what is part of it");
        // A value of another type under the same tag is made, never mistaken for it.
        assert_eq!(remembered("test/number", b"text", || "s".to_owned()), "s");
        assert_eq!(made.get(), 3);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// Bodies that continue the ones before (kept outlines, their digests taken
        /// over), with the model, the scope, the first messages or nothing changed
        /// between them: each gets the key its parsed request gets.
        #[test]
        fn continued_bodies_get_the_parsed_requests_key(
            steps in proptest::collection::vec((0usize..5, "[a-z \\\"é]{0,40}"), 1..16),
        ) {
            let h = headers(&[("authorization", "Bearer sk-a")]);
            let (mut model, mut scope, mut system) = ("m".to_owned(), None::<String>, "x".repeat(600));
            let mut messages: Vec<serde_json::Value> = Vec::new();
            for (change, text) in steps {
                match change {
                    0 => model = format!("m-{text}"),
                    1 => scope = Some(text.clone()),
                    2 => system = format!("{system}{text}"),
                    3 => messages.clear(),
                    _ => {}
                }
                let role = if messages.len() % 2 == 0 { "user" } else { "assistant" };
                messages.push(serde_json::json!({"role": role, "content": text}));
                let mut all = vec![serde_json::json!({"role": "system", "content": system})];
                all.extend(messages.iter().cloned());
                let mut body = serde_json::json!({"model": model, "messages": all});
                if let Some(scope) = &scope {
                    body["prompt_cache_key"] = serde_json::json!(scope);
                }
                let body = bytes::Bytes::from(body.to_string());
                let parsed = ChatRequest::parse(&body).unwrap();
                let expected = session_key(&h, &x_session_id(), &parsed);
                // Twice: the second continues the first's kept outline exactly.
                for _ in 0..2 {
                    let outline = Outline::scan_kept(&body).unwrap();
                    proptest::prop_assert_eq!(
                        &session_key_of_outline(&h, &x_session_id(), &outline),
                        &expected
                    );
                }
            }
        }
    }

    #[test]
    fn the_first_configured_header_present_names_the_conversation() {
        let defaults = SessionHeaders::default();
        let key = |pairs: &[(&'static str, &'static str)], first_user: &str| {
            let mut all = vec![("authorization", "Bearer sk-a")];
            all.extend_from_slice(pairs);
            session_key(&headers(&all), &defaults, &request(first_user))
        };
        // Codex's headers name its conversation whatever its messages.
        for name in ["x-session-id", "thread-id", "session-id", "session_id"] {
            assert_eq!(key(&[(name, "c1")], "one"), key(&[(name, "c1")], "two"), "{name}");
            assert_ne!(key(&[(name, "c1")], "one"), key(&[(name, "c2")], "one"), "{name}");
            assert_ne!(key(&[(name, "c1")], "one"), key(&[], "one"), "{name}");
        }
        // In order: foldgate's own header first, then the thread, then the session.
        assert_eq!(
            key(&[("session-id", "s"), ("thread-id", "t")], "x"),
            key(&[("thread-id", "t")], "y")
        );
        assert_eq!(
            key(&[("session-id", "s"), ("x-session-id", "mine")], "x"),
            key(&[("x-session-id", "mine")], "y")
        );
        // An empty header does not count.
        assert_eq!(
            key(&[("thread-id", ""), ("session-id", "s")], "x"),
            key(&[("session-id", "s")], "y")
        );
        // A configured list is looked up in its own order.
        let custom = SessionHeaders::new(&["x-conversation", "x-session-id"]).unwrap();
        let h = headers(&[("x-conversation", "a"), ("x-session-id", "b")]);
        let only = headers(&[("x-conversation", "a")]);
        assert_eq!(
            session_key(&h, &custom, &request("x")),
            session_key(&only, &custom, &request("y"))
        );
        assert!(SessionHeaders::new(&["bad header"]).is_err());
    }

    #[test]
    fn claude_codes_session_is_read_from_its_user_id() {
        let h = headers(&[("authorization", "Bearer sk-a")]);
        let with_user_id = |user_id: &str| {
            let body = serde_json::json!({"model": "claude", "metadata": {"user_id": user_id},
                "messages": [{"role": "user", "content": "task"}]});
            session_key(
                &h,
                &x_session_id(),
                &ChatRequest::parse(body.to_string().as_bytes()).unwrap(),
            )
        };
        let json = |device: &str, session: &str| {
            serde_json::json!({"device_id": device, "account_uuid": "", "session_id": session})
                .to_string()
        };
        // Today's JSON: the session counts, not what sits beside it.
        assert_eq!(with_user_id(&json("d1", "s1")), with_user_id(&json("d2", "s1")));
        assert_ne!(with_user_id(&json("d1", "s1")), with_user_id(&json("d1", "s2")));
        // The earlier form names the same session the same way.
        assert_eq!(with_user_id(&json("d1", "s1")), with_user_id("user_abc_account__session_s1"));
        assert_ne!(
            with_user_id("user_abc_account__session_s1"),
            with_user_id("user_abc_account__session_s2")
        );
        // Anything else is taken whole.
        assert_ne!(with_user_id("alice"), with_user_id("bob"));
        assert_eq!(with_user_id("{not json"), with_user_id("{not json"));
    }

    #[test]
    fn a_moving_cache_breakpoint_does_not_change_the_conversation() {
        // Claude Code's first request marks its first user message; later ones mark the
        // newest message instead.
        let h = headers(&[("authorization", "Bearer sk-a")]);
        let body = |marked: bool| {
            let mut block = serde_json::json!({"type": "text", "text": "Fix the bug."});
            if marked {
                block["cache_control"] = serde_json::json!({"type": "ephemeral"});
            }
            let body = serde_json::json!({"model": "m", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [block]}]});
            body.to_string()
        };
        let key = |body: &str| {
            let parsed = ChatRequest::parse(body.as_bytes()).unwrap();
            let outline = Outline::scan(body.as_bytes()).unwrap();
            let key = session_key(&h, &x_session_id(), &parsed);
            assert_eq!(key, session_key_of_outline(&h, &x_session_id(), &outline));
            key
        };
        assert_eq!(key(&body(true)), key(&body(false)));
        // Text that only mentions the field is kept as it is.
        let other = body(false).replace("Fix the bug.", "Fix the \\\"cache_control\\\" bug.");
        assert_ne!(key(&other), key(&body(false)));
    }
}
