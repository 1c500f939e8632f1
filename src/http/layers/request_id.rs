//! Request ids. foldgate's own id is the client's `x-request-id` when well formed, else a
//! new UUIDv7; it replaces the request's `x-request-id` (the access log reads it there),
//! goes upstream with it, and is returned as `x-foldgate-request-id`. The response's
//! `x-request-id` is the upstream's own id (OpenAI's `req_...`, which SDKs expose and
//! support tickets ask for) when the upstream sent one, else foldgate's id.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::{SystemTime, UNIX_EPOCH};

use http::{HeaderName, HeaderValue, Response};

use crate::http::body::ProxyBody;
use crate::http::tags::Tags;
use crate::http::wire::server::{ClientRequest, ClientService};

/// The request id header: sent upstream with foldgate's id, returned with the upstream's.
pub static X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// foldgate's own id of the request, on every response.
pub static X_FOLDGATE_REQUEST_ID: HeaderName = HeaderName::from_static("x-foldgate-request-id");

/// Request ids around a service (see the module).
#[derive(Debug, Clone)]
pub struct RequestIds<S> {
    inner: S,
}

impl<S> RequestIds<S> {
    /// `inner`, its requests and answers given ids.
    pub fn new(inner: S) -> Self {
        Self { inner }
    }
}

impl<S: ClientService> ClientService for RequestIds<S> {
    fn call(
        &mut self,
        mut request: ClientRequest,
    ) -> impl Future<Output = Response<ProxyBody>> + Send + use<S> {
        let id = request
            .headers()
            .get(&X_REQUEST_ID)
            .filter(|v| is_well_formed(v))
            .cloned()
            .unwrap_or_else(generate);
        request.headers_mut().insert(X_REQUEST_ID.clone(), id.clone());
        ResponseFuture { inner: self.inner.call(request), id: Some(id) }
    }
}

pin_project_lite::pin_project! {
    /// Response future of [`RequestIds`]: the inner service's, its answer tagged with
    /// the id.
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        id: Option<HeaderValue>,
    }
}

impl<F: Future<Output = Response<ProxyBody>>> Future for ResponseFuture<F> {
    type Output = Response<ProxyBody>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut response = ready!(this.inner.poll(cx));
        if let Some(id) = this.id.take() {
            let answers_none = !response.headers().contains_key(&X_REQUEST_ID);
            // With the answer's other tags when it has some; else put in its headers
            // (cheaper than carrying tags for the ids alone).
            match response.extensions_mut().get_mut::<Tags>() {
                Some(tags) => {
                    tags.request_id = Some(id);
                    tags.request_id_as_answers = answers_none;
                }
                None => {
                    let headers = response.headers_mut();
                    headers.insert(X_FOLDGATE_REQUEST_ID.clone(), id.clone());
                    if answers_none {
                        headers.insert(X_REQUEST_ID.clone(), id);
                    }
                }
            }
        }
        Poll::Ready(response)
    }
}

/// Visible ASCII, at most 128 bytes: anything else could poison logs.
fn is_well_formed(value: &HeaderValue) -> bool {
    let bytes = value.as_bytes();
    !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(|b| b.is_ascii_graphic())
}

/// A new UUIDv7 (RFC 9562), hyphenated: 48 bits of Unix milliseconds, then 74 random
/// bits, so ids sort by time and never collide across threads, processes or replicas.
/// The random bits come from a per-thread generator seeded once from the OS: no system
/// call per request.
fn generate() -> HeaderValue {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let (a, b) = RANDOM.with(|state| (next(state), next(state)));
    let high = ((millis & 0xFFFF_FFFF_FFFF) << 16) | 0x7000 | (a & 0x0FFF);
    let low = (b & 0x3FFF_FFFF_FFFF_FFFF) | 0x8000_0000_0000_0000;
    let mut text = [0u8; uuid::fmt::Hyphenated::LENGTH];
    let text = uuid::Uuid::from_u64_pair(high, low).hyphenated().encode_lower(&mut text);
    HeaderValue::from_str(text).unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

thread_local! {
    /// splitmix64 state, seeded from the OS's random source once per thread.
    static RANDOM: Cell<u64> = Cell::new(uuid::Uuid::new_v4().as_u64_pair().0);
}

/// splitmix64: a fast generator whose outputs are all distinct over its 2^64 period.
fn next(state: &Cell<u64>) -> u64 {
    let s = state.get().wrapping_add(0x9E37_79B9_7F4A_7C15);
    state.set(s);
    let mut z = s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn rejects_malformed_ids() {
        assert!(is_well_formed(&HeaderValue::from_static("abc-123")));
        assert!(!is_well_formed(&HeaderValue::from_static("has space")));
        assert!(!is_well_formed(&HeaderValue::from_str(&"x".repeat(200)).unwrap()));
    }

    #[test]
    fn generated_ids_are_well_formed_uuid_v7s() {
        let id = generate();
        let text = id.to_str().unwrap();
        let uuid = uuid::Uuid::parse_str(text).unwrap();
        assert_eq!(uuid.get_version_num(), 7, "{text}");
        assert_eq!(uuid.get_variant(), uuid::Variant::RFC4122, "{text}");
        assert_eq!(text, uuid.hyphenated().to_string(), "lowercase, hyphenated");
        assert!(is_well_formed(&id));
        let millis = (u64::from_str_radix(&text[..8], 16).unwrap() << 16)
            | u64::from_str_radix(&text[9..13], 16).unwrap();
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(now.abs_diff(millis) < 5_000, "the time field is now: {millis} vs {now}");
        assert!(!text.ends_with("0000000000000000"));
    }

    #[test]
    fn generated_ids_are_unique_across_threads_and_ordered_by_time() {
        let threads: Vec<_> = (0..4)
            .map(|_| std::thread::spawn(|| (0..20_000).map(|_| generate()).collect::<Vec<_>>()))
            .collect();
        let mut all = HashSet::new();
        for t in threads {
            let ids = t.join().unwrap();
            // Within a thread, the time field never goes back.
            let times: Vec<&[u8]> = ids.iter().map(|id| &id.as_bytes()[..13]).collect();
            assert!(times.windows(2).all(|w| w[0] <= w[1]));
            all.extend(ids);
        }
        assert_eq!(all.len(), 80_000, "no id repeats");
    }
}
