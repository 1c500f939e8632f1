//! foldgate's own headers on an answer: the `x-foldgate-*` tags saying what happened to
//! the request, and its ids. They are gathered while the request is handled and travel
//! beside the answer's headers (a response extension), not in its header map: the
//! HTTP/1.1 server writes them after the answer's own lines as the head goes out, with
//! numbers formatted straight into the head; other transports put them in the map
//! ([`Tags::apply`]). Either way a tag replaces any header of its name the answer
//! brought (an upstream that is itself a foldgate).

use http::Response;
use http::header::{HeaderMap, HeaderName, HeaderValue};

use crate::session::SessionKey;

/// A tag's name, and its name as a head line starts (`name: `).
struct Name(HeaderName, &'static [u8]);

macro_rules! tag_name {
    ($const:ident, $name:literal) => {
        const $const: Name = Name(HeaderName::from_static($name), concat!($name, ": ").as_bytes());
    };
}

tag_name!(OUTCOME, "x-foldgate-outcome");
tag_name!(SESSION, "x-foldgate-session");
tag_name!(TOKENS_BEFORE, "x-foldgate-tokens-before");
tag_name!(TOKENS_AFTER, "x-foldgate-tokens-after");
tag_name!(TIER, "x-foldgate-tier");
tag_name!(FOLD_WAIT, "x-foldgate-fold-wait-ms");
tag_name!(RETRIED, "x-foldgate-retried");
tag_name!(LEARNED_WINDOW, "x-foldgate-learned-window");
tag_name!(SERVED_BY, "x-foldgate-served-by");
tag_name!(FOLDGATE_REQUEST_ID, "x-foldgate-request-id");
tag_name!(REQUEST_ID, "x-request-id");

/// The prefix every tag but `x-request-id` has: a name without it is never replaced.
const PREFIX: &str = "x-foldgate-";

/// foldgate's headers for one answer (see the module). Empty fields write nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tags {
    /// `x-foldgate-outcome`.
    pub outcome: Option<&'static str>,
    /// `x-foldgate-session`: the hashed session key (left out should it not be visible
    /// ASCII).
    pub session: Option<SessionKey>,
    /// `x-foldgate-tokens-before` and `x-foldgate-tokens-after`.
    pub tokens: Option<(usize, usize)>,
    /// `x-foldgate-tier`.
    pub tier: Option<&'static str>,
    /// `x-foldgate-fold-wait-ms`.
    pub fold_wait_ms: Option<u64>,
    /// `x-foldgate-retried: 1`.
    pub retried: bool,
    /// `x-foldgate-learned-window`.
    pub learned_window: Option<usize>,
    /// `x-foldgate-served-by: foldgate`: foldgate answered, not the upstream.
    pub served_here: bool,
    /// `x-foldgate-request-id`: foldgate's id of the request.
    pub request_id: Option<HeaderValue>,
    /// The id also goes out as `x-request-id` (the answer brought none of its own).
    pub request_id_as_answers: bool,
}

impl Tags {
    /// The tags carried by `response`, made empty when it has none yet.
    pub fn on<B>(response: &mut Response<B>) -> &mut Tags {
        response.extensions_mut().get_or_insert_default::<Tags>()
    }

    /// Whether `response` is foldgate's own answer (`x-foldgate-served-by`), its tags
    /// in its extensions or already in its headers.
    pub fn served_here<B>(response: &Response<B>) -> bool {
        response.extensions().get::<Tags>().is_some_and(|t| t.served_here)
            || response.headers().contains_key(&SERVED_BY.0)
    }

    /// Calls `line` with each tag's name and value, in a fixed order.
    fn each(&self, mut line: impl FnMut(&Name, &[u8])) {
        let mut digits = itoa::Buffer::new();
        if let Some(outcome) = self.outcome {
            line(&OUTCOME, outcome.as_bytes());
        }
        if let Some(session) = &self.session {
            let key = session.as_str().as_bytes();
            if !key.is_empty() && key.iter().all(u8::is_ascii_graphic) {
                line(&SESSION, key);
            }
        }
        if let Some((before, after)) = self.tokens {
            line(&TOKENS_BEFORE, digits.format(before).as_bytes());
            line(&TOKENS_AFTER, digits.format(after).as_bytes());
        }
        if let Some(tier) = self.tier {
            line(&TIER, tier.as_bytes());
        }
        if let Some(millis) = self.fold_wait_ms {
            line(&FOLD_WAIT, digits.format(millis).as_bytes());
        }
        if self.retried {
            line(&RETRIED, b"1");
        }
        if let Some(window) = self.learned_window {
            line(&LEARNED_WINDOW, digits.format(window).as_bytes());
        }
        if self.served_here {
            line(&SERVED_BY, b"foldgate");
        }
        if let Some(id) = &self.request_id {
            line(&FOLDGATE_REQUEST_ID, id.as_bytes());
            if self.request_id_as_answers {
                line(&REQUEST_ID, id.as_bytes());
            }
        }
    }

    /// Whether a tag replaces the answer's header `name`.
    pub fn replaces(&self, name: &HeaderName) -> bool {
        let name = name.as_str();
        if !name.starts_with(PREFIX) {
            return name == REQUEST_ID.0.as_str() && self.request_id_as_answers;
        }
        let mut found = false;
        self.each(|tag, _| found |= tag.0.as_str() == name);
        found
    }

    /// Appends the tags as header lines (`name: value\r\n`) to a head being written.
    pub fn write(&self, out: &mut Vec<u8>) {
        self.each(|name, value| {
            out.reserve(name.1.len() + value.len() + 2);
            out.extend_from_slice(name.1);
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        });
    }

    /// Puts the tags in `headers`, each replacing the values of its name.
    pub fn apply(&self, headers: &mut HeaderMap) {
        self.each(|name, value| {
            // Every value is visible ASCII: a session key, a count, a checked id.
            if let Ok(value) = HeaderValue::from_bytes(value) {
                headers.insert(name.0.clone(), value);
            }
        });
    }
}

/// Moves the tags `response` carries into its header map (for a transport that writes
/// the map as it is).
pub fn into_headers<B>(response: &mut Response<B>) {
    if let Some(tags) = response.extensions_mut().remove::<Tags>() {
        tags.apply(response.headers_mut());
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn full() -> Tags {
        Tags {
            outcome: Some("folded"),
            session: Some(SessionKey::from_digest("s-1f2e")),
            tokens: Some((120_000, 40_000)),
            tier: Some("digest"),
            fold_wait_ms: Some(12),
            retried: true,
            learned_window: Some(128_000),
            served_here: true,
            request_id: Some(HeaderValue::from_static("0193-abc")),
            request_id_as_answers: true,
        }
    }

    /// The header lines written, parsed back into a map.
    fn written(headers: &HeaderMap, tags: &Tags) -> HeaderMap {
        let mut out = Vec::new();
        for (name, value) in headers {
            if !tags.replaces(name) {
                out.extend_from_slice(name.as_str().as_bytes());
                out.extend_from_slice(b": ");
                out.extend_from_slice(value.as_bytes());
                out.extend_from_slice(b"\r\n");
            }
        }
        tags.write(&mut out);
        let text = String::from_utf8(out).unwrap();
        let mut map = HeaderMap::new();
        for line in text.split("\r\n").filter(|l| !l.is_empty()) {
            let (name, value) = line.split_once(": ").unwrap();
            map.append(HeaderName::from_bytes(name.as_bytes()).unwrap(), value.parse().unwrap());
        }
        map
    }

    #[test]
    fn every_tag_is_written_with_its_value() {
        let mut out = Vec::new();
        full().write(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "x-foldgate-outcome: folded\r\nx-foldgate-session: s-1f2e\r\n\
             x-foldgate-tokens-before: 120000\r\nx-foldgate-tokens-after: 40000\r\n\
             x-foldgate-tier: digest\r\nx-foldgate-fold-wait-ms: 12\r\n\
             x-foldgate-retried: 1\r\nx-foldgate-learned-window: 128000\r\n\
             x-foldgate-served-by: foldgate\r\nx-foldgate-request-id: 0193-abc\r\n\
             x-request-id: 0193-abc\r\n"
        );
        let mut out = Vec::new();
        Tags::default().write(&mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn tags_replace_the_answers_own_headers_of_their_names_only() {
        let tags = Tags { outcome: Some("unchanged"), ..Tags::default() };
        assert!(tags.replaces(&OUTCOME.0));
        assert!(!tags.replaces(&SESSION.0), "a tag not set replaces nothing");
        assert!(!tags.replaces(&http::header::CONTENT_TYPE));
        assert!(!tags.replaces(&REQUEST_ID.0), "the upstream's id stays");
        assert!(full().replaces(&REQUEST_ID.0));
    }

    #[test]
    fn a_session_key_that_is_not_visible_ascii_is_left_out() {
        for key in ["", "a b", "a\r\nx-injected: 1", "caf\u{e9}"] {
            let tags = Tags { session: Some(SessionKey::from_digest(key)), ..Tags::default() };
            let mut out = Vec::new();
            tags.write(&mut out);
            assert!(out.is_empty(), "{key:?}");
            let mut headers = HeaderMap::new();
            tags.apply(&mut headers);
            assert!(headers.is_empty(), "{key:?}");
        }
    }

    #[test]
    fn served_here_is_read_from_the_extension_or_the_headers() {
        let mut response = Response::new(());
        assert!(!Tags::served_here(&response));
        Tags::on(&mut response).served_here = true;
        assert!(Tags::served_here(&response));
        into_headers(&mut response);
        assert!(response.extensions().get::<Tags>().is_none());
        assert_eq!(response.headers()[&SERVED_BY.0], "foldgate");
        assert!(Tags::served_here(&response));
    }

    fn tags() -> impl Strategy<Value = Tags> {
        (
            proptest::option::of(prop_oneof![Just("unchanged"), Just("folded")]),
            proptest::option::of("[a-z0-9-]{1,20}|[a-z]{0,3}[ \r\n\u{e9}][a-z]{0,3}"),
            proptest::option::of((any::<usize>(), any::<usize>())),
            proptest::option::of(any::<u64>()),
            any::<bool>(),
            proptest::option::of(any::<usize>()),
            any::<bool>(),
            proptest::option::of("[a-zA-Z0-9_-]{1,30}"),
            any::<bool>(),
        )
            .prop_map(
                |(outcome, session, tokens, wait, retried, window, here, id, answers)| Tags {
                    outcome,
                    session: session.map(SessionKey::from_digest),
                    tokens,
                    tier: tokens.map(|_| "digest"),
                    fold_wait_ms: wait,
                    retried,
                    learned_window: window,
                    served_here: here,
                    request_id_as_answers: answers && id.is_some(),
                    request_id: id.map(|s| s.parse().unwrap()),
                },
            )
    }

    fn answer_headers() -> impl Strategy<Value = HeaderMap> {
        let names = prop_oneof![
            Just("content-type"),
            Just("x-foldgate-outcome"),
            Just("x-foldgate-session"),
            Just("x-foldgate-request-id"),
            Just("x-foldgate-tier"),
            Just("x-foldgate-other"),
            Just("x-request-id"),
            Just("x-foldgate"),
        ];
        proptest::collection::vec((names, "[a-z0-9]{1,8}"), 0..8).prop_map(|lines| {
            let mut map = HeaderMap::new();
            for (name, value) in lines {
                map.append(HeaderName::from_static(name), value.parse().unwrap());
            }
            map
        })
    }

    proptest! {
        /// Written after the answer's lines or put in its map, the tags give the same
        /// headers.
        #[test]
        fn writing_the_tags_is_putting_them_in_the_map(
            tags in tags(),
            headers in answer_headers(),
        ) {
            // The id goes out as `x-request-id` only when the answer has none.
            let tags = Tags {
                request_id_as_answers: tags.request_id_as_answers
                    && !headers.contains_key(&REQUEST_ID.0),
                ..tags
            };
            let mut applied = headers.clone();
            tags.apply(&mut applied);
            prop_assert_eq!(written(&headers, &tags), applied);
        }
    }
}
