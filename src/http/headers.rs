//! Header rules of a proxy: hop-by-hop headers stay on their hop; looking up names most
//! requests do not carry.

use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue};

/// Headers that describe one connection, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
];

/// Removes hop-by-hop headers, including those named by `Connection`.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none: one pass over the names instead of a lookup per rule.
    if !headers.keys().any(|name| name == header::UPGRADE || HOP_BY_HOP.contains(name)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in HOP_BY_HOP.iter().chain(named.iter()) {
        headers.remove(name);
    }
    headers.remove(header::UPGRADE);
}

/// Maps with at most this many entries are read in one pass over their names by
/// [`first_of`] and [`present`]; larger ones are looked up name by name.
const PASS_UP_TO: usize = 32;

/// The first of `names` whose first value `accept`s, in the order of `names`, with
/// that value and its index: what `headers.get` of each name in turn finds. A small map
/// is read in one pass over its entries (a name compared is cheaper than a name hashed,
/// and most names looked for are absent); a large one is looked up name by name.
pub fn first_of<'h>(
    headers: &'h HeaderMap,
    names: &[HeaderName],
    accept: impl Fn(&HeaderValue) -> bool,
) -> Option<(usize, &'h HeaderValue)> {
    if headers.len() > PASS_UP_TO || names.len() > 64 {
        return names.iter().enumerate().find_map(|(i, name)| {
            headers.get(name).filter(|value| accept(value)).map(|value| (i, value))
        });
    }
    let mut first: Option<(usize, &HeaderValue)> = None;
    // Each name once (not each value), its first value only when it is one looked for.
    for name in headers.keys() {
        let Some(i) = names.iter().position(|n| n == name) else { continue };
        if first.is_some_and(|(at, _)| at < i) {
            continue;
        }
        if let Some(value) = headers.get(name).filter(|value| accept(value)) {
            first = Some((i, value));
        }
    }
    first
}

/// Which of `names` (at most 64) `headers` has: bit `i` set for `names[i]`. A small map
/// is read in one pass over its names, as in [`first_of`]; a large one is looked up
/// name by name.
pub fn present(headers: &HeaderMap, names: &[HeaderName]) -> u64 {
    debug_assert!(names.len() <= 64);
    let bit = |i: usize| 1u64 << (i & 63);
    if headers.len() > PASS_UP_TO {
        return names
            .iter()
            .enumerate()
            .filter(|(_, n)| headers.contains_key(*n))
            .fold(0, |m, (i, _)| m | bit(i));
    }
    let mut found = 0;
    for name in headers.keys() {
        for (i, wanted) in names.iter().enumerate() {
            if wanted == name {
                found |= bit(i);
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// One pass over the entries finds what looking each name up in turn finds.
        #[test]
        fn first_of_finds_what_lookups_in_order_find(
            entries in proptest::collection::vec((0usize..6, "[ab]{0,2}"), 0..12),
            wanted in proptest::collection::vec(0usize..6, 0..5),
        ) {
            let names: Vec<HeaderName> = ["x-a", "x-b", "session-id", "authorization", "x-c", "thread-id"]
                .iter().map(|n| HeaderName::from_static(n)).collect();
            let mut headers = HeaderMap::new();
            for (name, value) in &entries {
                headers.append(names[*name].clone(), HeaderValue::from_str(value).unwrap());
            }
            let looked_for: Vec<HeaderName> = wanted.iter().map(|i| names[*i].clone()).collect();
            let accept = |v: &HeaderValue| !v.is_empty();
            let by_lookups = looked_for.iter().enumerate().find_map(|(i, name)| {
                headers.get(name).filter(|v| accept(v)).map(|v| (i, v))
            });
            // Repeated names: the first index of a name is the one found.
            proptest::prop_assert_eq!(first_of(&headers, &looked_for, accept), by_lookups);
        }
    }

    proptest::proptest! {
        /// One pass over the names finds what a lookup of each finds.
        #[test]
        fn present_finds_what_lookups_find(
            entries in proptest::collection::vec(0usize..8, 0..40),
            wanted in proptest::collection::vec(0usize..8, 0..6),
        ) {
            let names: Vec<HeaderName> = ["x-a", "x-b", "connection", "date", "content-length",
                "transfer-encoding", "x-c", "host"]
                .iter().map(|n| HeaderName::from_static(n)).collect();
            let mut headers = HeaderMap::new();
            for name in &entries {
                headers.append(names[*name].clone(), HeaderValue::from_static("v"));
            }
            let looked_for: Vec<HeaderName> = wanted.iter().map(|i| names[*i].clone()).collect();
            let by_lookups = looked_for.iter().enumerate()
                .filter(|(_, n)| headers.contains_key(*n))
                .fold(0u64, |m, (i, _)| m | 1 << i);
            proptest::prop_assert_eq!(present(&headers, &looked_for), by_lookups);
        }
    }

    #[test]
    fn strips_listed_and_named_headers() {
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, "close, x-custom-hop".parse().unwrap());
        h.insert("x-custom-hop", "1".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        h.insert("openai-organization", "org".parse().unwrap());
        strip_hop_by_hop(&mut h);
        assert!(h.get("x-custom-hop").is_none());
        assert!(h.get(header::CONNECTION).is_none());
        assert!(h.get(header::TRANSFER_ENCODING).is_none());
        assert!(h.get(header::AUTHORIZATION).is_some());
        assert!(h.get("openai-organization").is_some());
    }

    #[test]
    fn strips_any_single_hop_by_hop_header_and_keeps_the_rest_untouched() {
        for name in HOP_BY_HOP.iter().chain([&header::UPGRADE]) {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, "application/json".parse().unwrap());
            h.insert(name.clone(), "x".parse().unwrap());
            strip_hop_by_hop(&mut h);
            assert!(h.get(name).is_none(), "{name} kept");
            assert_eq!(h.len(), 1);
        }
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer k".parse().unwrap());
        h.append("x-custom", "1".parse().unwrap());
        h.append("x-custom", "2".parse().unwrap());
        let before = h.clone();
        strip_hop_by_hop(&mut h);
        assert_eq!(h, before);
    }
}
