//! foldgate's own Responses `compaction` items: a digest sealed with an AEAD
//! (ChaCha20-Poly1305, `responses.compaction_key`) into the item's `encrypted_content`,
//! so that a client keeps it as it keeps the provider's, and any replica with the key
//! opens it again.
//!
//! A request that carries such items is rewritten before anything else reads it
//! ([`open_items`]): the last item stands for everything before it, so the items before
//! it are dropped except the messages of the user, system and developer (kept verbatim,
//! as a fold keeps them) and the provider's own items foldgate cannot read; each sealed
//! item becomes its digest, an assistant `message` the upstream reads, at its place. An
//! item foldgate did not seal (no [`SEALED_PREFIX`]: the vendor's) passes byte for byte;
//! one it cannot open (tampered, truncated, sealed with another key) is an error the
//! edge answers with a 400.

use base64::Engine as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use serde::{Deserialize, Serialize};
use serde_json::json;
use serde_json::value::RawValue;

use super::{ListWriter, Origins, json_text, range_in};
use crate::config::COMPACTION_KEY_LEN;

/// What every `encrypted_content` foldgate seals starts with (format version 1).
pub const SEALED_PREFIX: &str = "fgc1.";

/// Bound to every sealed item: a ciphertext of another use never opens as one.
const AAD: &[u8] = b"foldgate responses compaction item v1";

const B64: base64::engine::GeneralPurpose = base64::engine::general_purpose::URL_SAFE_NO_PAD;

/// What a sealed item holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// The digest message's text, marker included, as the upstream is to read it.
    pub digest: String,
}

/// Why a sealed item could not be opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    /// The content is shorter than any sealed item, or not its base64.
    #[error("compaction item {0}: encrypted_content is truncated or malformed")]
    Malformed(usize),
    /// The content does not authenticate: changed, or sealed with another key.
    #[error(
        "compaction item {0}: encrypted_content does not open with this gateway's key (changed, or sealed by a gateway with another responses.compaction_key)"
    )]
    Forged(usize),
}

/// Seals and opens compaction items with one key.
pub struct Sealer {
    key: LessSafeKey,
    random: SystemRandom,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(********)")
    }
}

impl Sealer {
    /// A sealer with `key`.
    pub fn new(key: &[u8; COMPACTION_KEY_LEN]) -> Self {
        let unbound = UnboundKey::new(&CHACHA20_POLY1305, key);
        // The key length is the algorithm's: `new` cannot fail for it.
        let key = match unbound {
            Ok(unbound) => LessSafeKey::new(unbound),
            Err(_) => unreachable_key(),
        };
        Self { key, random: SystemRandom::new() }
    }

    /// A sealer with a random key (items open only in this process).
    pub fn generated() -> Self {
        let mut key = [0u8; COMPACTION_KEY_LEN];
        // The system's random source fails only on a broken system; an all-zero key still
        // seals and opens (and is as good as none), so it is not worth refusing to start.
        let _ = SystemRandom::new().fill(&mut key);
        Self::new(&key)
    }

    /// `sealed` as an `encrypted_content` value.
    pub fn seal(&self, sealed: &Sealed) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        let _ = self.random.fill(&mut nonce);
        let mut data = serde_json::to_vec(sealed).unwrap_or_default();
        let tagged = self.key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(AAD),
            &mut data,
        );
        if tagged.is_err() {
            return String::new();
        }
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        format!("{SEALED_PREFIX}{}", B64.encode(out))
    }

    /// What `content` (an `encrypted_content` with [`SEALED_PREFIX`]) holds; `index` is
    /// the item's position, for the error.
    pub fn open(&self, content: &str, index: usize) -> Result<Sealed, OpenError> {
        let encoded = content.strip_prefix(SEALED_PREFIX).ok_or(OpenError::Malformed(index))?;
        let mut bytes = B64.decode(encoded).map_err(|_| OpenError::Malformed(index))?;
        if bytes.len() < NONCE_LEN + CHACHA20_POLY1305.tag_len() {
            return Err(OpenError::Malformed(index));
        }
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&bytes[..NONCE_LEN]);
        let nonce = Nonce::assume_unique_for_key(nonce);
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(AAD), &mut bytes[NONCE_LEN..])
            .map_err(|_| OpenError::Forged(index))?;
        serde_json::from_slice(plain).map_err(|_| OpenError::Forged(index))
    }
}

#[allow(clippy::panic)]
fn unreachable_key() -> LessSafeKey {
    panic!("a {COMPACTION_KEY_LEN}-byte key is ChaCha20-Poly1305's length")
}

/// The item the client gets: `{"id", "type": "compaction", "encrypted_content",
/// "created_by"}`.
pub fn item(id: &str, encrypted_content: &str) -> String {
    json!({
        "id": id,
        "type": "compaction",
        "encrypted_content": encrypted_content,
        "created_by": "foldgate",
    })
    .to_string()
}

/// True when `text` names a `compaction_trigger` anywhere (the searcher built once: a
/// Responses body is searched for it twice, its whole length each time).
pub fn names_trigger(text: &[u8]) -> bool {
    static TRIGGER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"compaction_trigger"));
    TRIGGER.find(text).is_some()
}

/// `body` without the `compaction_trigger` item that ends its `input` (Codex's remote
/// compaction: the request asks for its conversation to be compacted); `None` when its
/// last input item is not one. Every other byte as received.
pub fn take_trigger(body: &[u8]) -> Option<Vec<u8>> {
    // Most bodies do not name it: they are not parsed.
    if !names_trigger(body) {
        return None;
    }
    let text = std::str::from_utf8(body).ok()?;
    let object = json_text::Object::parse(text)?;
    let input = object.get("input")?.value.clone();
    let items = json_text::array_items(text.get(input.clone())?)?;
    let (last, range) = items.last()?;
    #[derive(serde::Deserialize)]
    struct Typed<'a> {
        #[serde(rename = "type", borrow)]
        kind: Option<&'a str>,
    }
    let typed: Typed<'_> = serde_json::from_str(last).ok()?;
    if typed.kind != Some("compaction_trigger") {
        return None;
    }
    // From the end of the item before it (or the opening bracket) to the trigger's end.
    let start = match items.len() {
        1 => 1,
        n => items[n - 2].1.end,
    };
    let cut = input.start + start..input.start + range.end;
    json_text::splice(text, cut, "").map(String::into_bytes)
}

/// The assistant message the upstream reads in place of an item holding `sealed`.
pub fn digest_message(sealed: &Sealed) -> String {
    json!({"type": "message", "role": "assistant", "content": sealed.digest}).to_string()
}

/// The top-level field `open_items` reads.
#[derive(Deserialize)]
struct Top<'a> {
    #[serde(borrow)]
    input: Option<&'a RawValue>,
}

/// How one input item is treated around sealed items.
#[derive(Deserialize)]
struct ItemHead<'a> {
    #[serde(rename = "type")]
    kind: Option<&'a str>,
    role: Option<&'a str>,
    encrypted_content: Option<&'a str>,
}

impl ItemHead<'_> {
    fn sealed(&self) -> Option<&str> {
        let content = self.encrypted_content.filter(|c| c.starts_with(SEALED_PREFIX));
        (self.kind == Some("compaction")).then_some(content).flatten()
    }

    /// Kept when a later sealed item stands for what precedes it: the messages of the
    /// user, system and developer, and what foldgate cannot read.
    fn survives_fold(&self) -> bool {
        match (self.kind, self.role) {
            (None | Some("message"), Some("user" | "system" | "developer")) => true,
            (None | Some("message"), _) => false,
            (Some("compaction"), _) => self.sealed().is_none(),
            (Some(kind), _) => !is_readable(kind),
        }
    }
}

/// Item types foldgate reads (and a digest can stand for).
fn is_readable(kind: &str) -> bool {
    kind == "reasoning" || kind.ends_with("_call") || kind.ends_with("_call_output")
}

/// The body with its sealed compaction items opened (see the module doc); `Ok(None)` when
/// it has none (it goes on as received).
pub fn open_items(body: &[u8], sealer: &Sealer) -> Result<Option<Vec<u8>>, OpenError> {
    // Cheap first: most bodies carry no item of ours.
    if memchr::memmem::find(body, SEALED_PREFIX.as_bytes()).is_none() {
        return Ok(None);
    }
    let Ok(top) = serde_json::from_slice::<Top<'_>>(body) else { return Ok(None) };
    let Some(input) = top.input else { return Ok(None) };
    let Ok(items) = serde_json::from_str::<Vec<&RawValue>>(input.get()) else { return Ok(None) };
    let heads: Vec<Option<ItemHead<'_>>> =
        items.iter().map(|raw| serde_json::from_str(raw.get()).ok()).collect();
    let mut opened = Vec::new();
    for (i, head) in heads.iter().enumerate() {
        if let Some(content) = head.as_ref().and_then(ItemHead::sealed) {
            opened.push((i, sealer.open(content, i)?));
        }
    }
    let Some(&(last, _)) = opened.last() else { return Ok(None) };
    let Some(list_range) = range_in(body, input) else { return Ok(None) };
    let mut list = ListWriter::with_capacity(input.get().len());
    for (i, (raw, head)) in items.iter().zip(&heads).enumerate() {
        if let Some((_, sealed)) = opened.iter().find(|(at, _)| *at == i) {
            if i == last {
                list.push(digest_message(sealed).as_bytes());
            }
            continue;
        }
        let survives = head.as_ref().is_none_or(ItemHead::survives_fold);
        if i > last || survives {
            list.push(raw.get().as_bytes());
        }
    }
    let origins = Origins { list: list_range, ..Origins::default() };
    Ok(Some(origins.splice(body, &list.finish()).to_vec()))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sealer(byte: u8) -> Sealer {
        Sealer::new(&[byte; COMPACTION_KEY_LEN])
    }

    fn sealed(text: &str) -> Sealed {
        Sealed { digest: format!("[COMPACTED CONTEXT]\n{text}") }
    }

    #[test]
    fn a_sealed_item_opens_with_its_key_only() {
        let content = sealer(1).seal(&sealed("done"));
        assert!(content.starts_with(SEALED_PREFIX));
        assert_eq!(sealer(1).open(&content, 0).unwrap(), sealed("done"));
        assert_eq!(sealer(2).open(&content, 3), Err(OpenError::Forged(3)));
        let mut tampered = content.clone().into_bytes();
        let at = tampered.len() - 5;
        tampered[at] = if tampered[at] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(sealer(1).open(&tampered, 0), Err(OpenError::Forged(0)));
        assert_eq!(sealer(1).open(&content[..12], 0), Err(OpenError::Malformed(0)));
        assert_eq!(sealer(1).open("fgc1.!!!", 0), Err(OpenError::Malformed(0)));
    }

    #[test]
    fn the_last_item_stands_for_what_precedes_it() {
        let s = sealer(7);
        let item = item("cmp_1", &s.seal(&sealed("read a.rs")));
        let body = format!(
            r#"{{"model":"m","input":[{{"role":"user","content":"fix it"}},{{"type":"function_call","call_id":"c1","name":"sh","arguments":"{{}}"}},{{"type":"function_call_output","call_id":"c1","output":"ok"}},{{"type":"compaction","encrypted_content":"gAAAA-vendor"}},{item},{{"role":"user","content":"next"}}],"stream":true}}"#
        );
        let out = String::from_utf8(open_items(body.as_bytes(), &s).unwrap().unwrap()).unwrap();
        let expected = r#"{"model":"m","input":[{"role":"user","content":"fix it"},{"type":"compaction","encrypted_content":"gAAAA-vendor"},{"type":"message","role":"assistant","content":"[COMPACTED CONTEXT]\nread a.rs"},{"role":"user","content":"next"}],"stream":true}"#;
        assert_eq!(out, expected);
        // The same body opens to the same bytes every time.
        assert_eq!(open_items(body.as_bytes(), &s).unwrap().unwrap(), expected.as_bytes());
    }

    #[test]
    fn bodies_without_sealed_items_are_left_alone() {
        let s = sealer(7);
        let vendor = br#"{"input":[{"type":"compaction","encrypted_content":"gAAAAB"}]}"#;
        assert_eq!(open_items(vendor, &s).unwrap(), None);
        assert_eq!(open_items(b"not json fgc1.", &s).unwrap(), None);
        let foreign = item("cmp_x", &sealer(9).seal(&sealed("x")));
        let body = format!(r#"{{"input":[{foreign}]}}"#);
        assert_eq!(open_items(body.as_bytes(), &s), Err(OpenError::Forged(0)));
    }
}

/// `context_management: [{"type": "compaction", "compact_threshold": N}]` of a Responses
/// request, as foldgate honours it for an upstream without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextCompaction {
    /// Compact when the prompt reaches this many tokens; `None`: at foldgate's own
    /// trigger.
    pub threshold: Option<usize>,
}

/// The compaction entry of `body`'s `context_management` and the body without that
/// field; `Ok(None)` when the body has no `context_management` (or is not a JSON object).
/// An entry foldgate cannot honour is an error saying which.
pub fn take_context_management(
    body: &[u8],
) -> Result<Option<(Vec<u8>, ContextCompaction)>, String> {
    let Ok(fields) = serde_json::from_slice::<super::Fields<'_>>(body) else { return Ok(None) };
    let Some(raw) = fields.last("context_management") else { return Ok(None) };
    let text = std::str::from_utf8(body).map_err(|_| "the body is not UTF-8".to_owned())?;
    let stripped = super::json_text::remove_members(text, "context_management")
        .unwrap_or_default()
        .into_bytes();
    if raw.get() == "null" {
        return Ok(Some((stripped, ContextCompaction { threshold: None })));
    }
    let entries: Vec<serde_json::Value> = serde_json::from_str(raw.get())
        .map_err(|_| "`context_management` must be a list of entries".to_owned())?;
    let mut found = None;
    for entry in &entries {
        match entry.get("type").and_then(serde_json::Value::as_str) {
            Some("compaction") => {
                let threshold = match entry.get("compact_threshold") {
                    None | Some(serde_json::Value::Null) => None,
                    Some(n) => {
                        Some(n.as_u64().and_then(|n| usize::try_from(n).ok()).ok_or_else(|| {
                            "`context_management[].compact_threshold` must be a positive integer"
                                .to_owned()
                        })?)
                    }
                };
                found = Some(ContextCompaction { threshold });
            }
            Some(other) => {
                return Err(format!(
                    "`context_management` entry type `{other}` is not supported here (only `compaction`)"
                ));
            }
            None => return Err("every `context_management` entry needs a `type`".to_owned()),
        }
    }
    Ok(Some((stripped, found.unwrap_or(ContextCompaction { threshold: None }))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod context_tests {
    use super::*;

    #[test]
    fn context_management_is_read_and_removed() {
        let body = br#"{"model":"m","context_management":[{"type":"compaction","compact_threshold":2000}],"input":"hi"}"#;
        let (stripped, entry) = take_context_management(body).unwrap().unwrap();
        assert_eq!(stripped, br#"{"model":"m","input":"hi"}"#);
        assert_eq!(entry.threshold, Some(2000));
        assert_eq!(take_context_management(br#"{"model":"m","input":"hi"}"#).unwrap(), None);
        let bad = br#"{"context_management":[{"type":"truncate"}]}"#;
        assert!(take_context_management(bad).unwrap_err().contains("truncate"));
        let bad = br#"{"context_management":[{"type":"compaction","compact_threshold":-1}]}"#;
        assert!(take_context_management(bad).is_err());
    }

    #[test]
    fn a_trailing_compaction_trigger_is_taken_out_and_nothing_else() {
        let take =
            |body: &str| take_trigger(body.as_bytes()).map(|b| String::from_utf8(b).unwrap());
        assert_eq!(
            take(r#"{"model":"m","input":[{"role":"user","content":"hi"}, {"type":"compaction_trigger"}],"stream":true}"#)
                .as_deref(),
            Some(r#"{"model":"m","input":[{"role":"user","content":"hi"}],"stream":true}"#)
        );
        assert_eq!(
            take(r#"{"input":[ {"type":"compaction_trigger","id":"t1"} ]}"#).as_deref(),
            Some(r#"{"input":[ ]}"#)
        );
        // Not last, not an item, or named in text: the request is an ordinary one.
        let middle = r#"{"input":[{"type":"compaction_trigger"},{"role":"user","content":"x"}]}"#;
        assert_eq!(take(middle), None);
        assert_eq!(take(r#"{"input":[{"role":"user","content":"compaction_trigger"}]}"#), None);
        assert_eq!(take(r#"{"input":"compaction_trigger"}"#), None);
        assert_eq!(take("not json compaction_trigger"), None);
    }
}
