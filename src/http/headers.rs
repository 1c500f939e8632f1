//! Header rules of a proxy: hop-by-hop headers stay on their hop.

use http::HeaderMap;
use http::header::{self, HeaderName};

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

#[cfg(test)]
mod tests {
    use super::*;

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
