//! OpenAI's per-message token accounting.
//!
//! Following the openai-cookbook notebook "How to count tokens with tiktoken": every
//! message costs 3 tokens of framing plus its role and content, a `name` costs its tokens
//! plus 1, and every reply is primed with 3 tokens. Tool and function calls add their
//! name and arguments plus a small framing overhead; tool definitions are counted as
//! their JSON text, which over-estimates OpenAI's internal rendering (safe for a budget).
//! Image parts cost by detail: `low` is 85 tokens, `high`/`auto` 85 plus 170 per 512 px
//! tile, and the largest possible tiling when the size is unknown. A PDF file part costs
//! [`PDF_PAGE_TOKENS`] per page when its pages can be counted (its base64 text would be
//! counted several times over what the providers charge), else its JSON text.

use std::sync::LazyLock;

use memchr::memmem::Finder;
use serde_json::Value;

use super::encoding::Encoding;
use crate::model::{Message, call_parts, field};

/// Framing tokens of every message.
pub const TOKENS_PER_MESSAGE: usize = 3;
/// Extra tokens when a message has a `name`.
pub const TOKENS_PER_NAME: usize = 1;
/// Tokens priming the reply, once per request.
pub const REPLY_PRIMING: usize = 3;
/// Framing tokens of one tool or function call.
pub const CALL_OVERHEAD: usize = 3;
/// An image part at `detail: low`.
pub const IMAGE_LOW: usize = 85;
/// Per 512 px tile at `detail: high`.
pub const IMAGE_TILE: usize = 170;
/// An image of unknown size at `high`/`auto`: the most tiles any size can produce
/// (768 × 2048 after scaling → 2 × 4 tiles).
pub const IMAGE_UNKNOWN: usize = IMAGE_LOW + 8 * IMAGE_TILE;

/// The most a PDF page costs: its text (up to about 3,000 tokens, by Anthropic's
/// documentation) and the image of the page both providers add (about 1,600).
pub const PDF_PAGE_TOKENS: usize = 5_000;

/// The pages of a PDF: its page objects (`/Type /Page`, not `/Pages`); `None` when it
/// names none (its page tree is inside compressed object streams).
pub fn pdf_pages(pdf: &[u8]) -> Option<usize> {
    static PAGE: LazyLock<[Finder<'static>; 2]> =
        LazyLock::new(|| [Finder::new(b"/Type /Page"), Finder::new(b"/Type/Page")]);
    let pages: usize = PAGE
        .iter()
        .map(|f| {
            f.find_iter(pdf).filter(|&at| pdf.get(at + f.needle().len()) != Some(&b's')).count()
        })
        .sum();
    (pages > 0).then_some(pages)
}

/// The pages of a PDF given as base64 text (standard alphabet); `None` when it does not
/// decode or names no page (see [`pdf_pages`]).
pub fn base64_pdf_pages(data: &str) -> Option<usize> {
    use base64::Engine as _;
    let pdf = base64::engine::general_purpose::STANDARD.decode(data.trim()).ok()?;
    pdf_pages(&pdf)
}

/// Tokens of a `file` part: a PDF by its pages (noted by a dialect as `file.pages`, or
/// counted in its `file_data`), anything else by its JSON text.
fn file_tokens(part: &Value) -> usize {
    let noted = part.pointer("/file/pages").and_then(Value::as_u64);
    let pages = noted.and_then(|p| usize::try_from(p).ok()).or_else(|| {
        let data = part.pointer("/file/file_data")?.as_str()?;
        base64_pdf_pages(data.strip_prefix("data:application/pdf;base64,")?)
    });
    pages.map_or_else(|| json_tokens(part), |p| p.max(1).saturating_mul(PDF_PAGE_TOKENS))
}

/// A part's JSON text as tokens: a generous stand-in for what cannot be counted.
fn json_tokens(part: &Value) -> usize {
    serde_json::to_string(part).map_or(0, |s| s.len() / 3 + 1)
}

/// Tokens of an image part by detail and, when known, pixel size.
pub fn image_tokens(detail: &str, size: Option<(u32, u32)>) -> usize {
    if detail == "low" {
        return IMAGE_LOW;
    }
    let Some((w, h)) = size else { return IMAGE_UNKNOWN };
    let (mut w, mut h) = (f64::from(w.max(1)), f64::from(h.max(1)));
    let fit = (2048.0 / w.max(h)).min(1.0);
    w *= fit;
    h *= fit;
    let short = (768.0 / w.min(h)).min(1.0);
    w *= short;
    h *= short;
    let tiles = (w / 512.0).ceil() * (h / 512.0).ceil();
    // At most 16 tiles (2048 / 512 squared); the value is small and non-negative.
    IMAGE_LOW + IMAGE_TILE * (tiles.clamp(0.0, 16.0) as usize)
}

fn part_tokens(count: &impl Fn(&str) -> usize, part: &Value) -> usize {
    match field(part, "type").and_then(Value::as_str) {
        Some("text") => field(part, "text").and_then(Value::as_str).map_or(0, count),
        Some("image_url") => {
            let detail =
                part.pointer("/image_url/detail").and_then(Value::as_str).unwrap_or("auto");
            image_tokens(detail, None)
        }
        Some("file") => file_tokens(part),
        // Audio and unknown parts: their JSON text, a generous stand-in.
        _ => json_tokens(part),
    }
}

fn content_tokens(count: &impl Fn(&str) -> usize, content: Option<&Value>) -> usize {
    match content {
        Some(Value::String(s)) => count(s),
        Some(Value::Array(parts)) => parts.iter().map(|p| part_tokens(count, p)).sum(),
        _ => 0,
    }
}

/// Exact tokens of one message (without the reply priming).
pub fn message_tokens(enc: Encoding, msg: &Message) -> usize {
    tokens_of(&|text| enc.count(text), &|role| enc.count_role(role), msg)
}

/// [`message_tokens`] with the message's texts counted by `count` (to compare another
/// tokenizer under the same framing).
pub fn message_tokens_by(count: &impl Fn(&str) -> usize, msg: &Message) -> usize {
    tokens_of(count, count, msg)
}

/// The tokens of `msg`, its texts counted by `count` and its role by `count_role`.
fn tokens_of(
    count: &impl Fn(&str) -> usize,
    count_role: &impl Fn(&str) -> usize,
    msg: &Message,
) -> usize {
    let mut n = TOKENS_PER_MESSAGE;
    if let Some(role) = msg.role_text() {
        n += count_role(role);
    }
    n += content_tokens(count, msg.content());
    if let Some(name) = msg.name() {
        n += count(name) + TOKENS_PER_NAME;
    }
    if let Some(refusal) = msg.refusal() {
        n += count(refusal);
    }
    let calls = msg.tool_calls().iter().chain(msg.function_call());
    for call in calls {
        let (_, name, args) = call_parts(call);
        n += CALL_OVERHEAD + count(name) + count(args);
    }
    n
}

/// A cheap upper bound of [`message_tokens`], from the message's JSON text alone (it
/// need not be parsed): a token is at least one byte of text, text never takes more
/// bytes than its JSON encoding, and every image part (which names `"image_url"` twice:
/// its type and its key) and every call (which names `"arguments"`) is charged its most.
pub fn message_upper_bound(msg: &Message) -> usize {
    raw_upper_bound(msg.raw().as_bytes())
}

/// [`message_upper_bound`] of a message's JSON text.
pub fn raw_upper_bound(raw: &[u8]) -> usize {
    static IMAGE: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"image_url\""));
    static CALL: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(b"\"arguments\""));
    let images = IMAGE.find_iter(raw).count().div_ceil(2);
    upper_bound_of(raw.len(), images, CALL.find_iter(raw).count())
}

/// The bound of a message of `len` bytes of JSON with at most `images` image parts and
/// `calls` calls (see [`message_upper_bound`]).
pub fn upper_bound_of(len: usize, images: usize, calls: usize) -> usize {
    len + TOKENS_PER_MESSAGE + TOKENS_PER_NAME + images * IMAGE_UNKNOWN + calls * CALL_OVERHEAD
}

/// Tokens of the `tools` definitions, counted as their JSON text.
pub fn tools_tokens(enc: Encoding, tools_raw: &str) -> usize {
    enc.count(tools_raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pdf_file_part_costs_its_pages() {
        let pdf =
            b"%PDF-1.7\n<< /Type /Pages /Kids [3 0 R 4 0 R] >>\n<< /Type /Page >>\n<</Type/Page>>";
        assert_eq!(pdf_pages(pdf), Some(2));
        assert_eq!(pdf_pages(b"%PDF-1.7 /ObjStm compressed"), None);
        use base64::Engine as _;
        let data = base64::engine::general_purpose::STANDARD.encode(pdf);
        let part = json!({"type": "file", "file": {"filename": "a.pdf",
            "file_data": format!("data:application/pdf;base64,{data}")}});
        let count = |t: &str| Encoding::O200kBase.count(t);
        assert_eq!(part_tokens(&count, &part), 2 * PDF_PAGE_TOKENS);
        let noted = json!({"type": "file", "file": {"filename": "x", "pages": 7}});
        assert_eq!(part_tokens(&count, &noted), 7 * PDF_PAGE_TOKENS);
        // Pages that cannot be counted: the JSON text.
        let opaque = json!({"type": "file", "file": {"file_id": "file-abc"}});
        assert_eq!(part_tokens(&count, &opaque), json_tokens(&opaque));
    }

    /// The six messages of the openai-cookbook notebook "How to count tokens with
    /// tiktoken" (examples/How_to_count_tokens_with_tiktoken.ipynb), for which the
    /// notebook reports 129 prompt tokens for gpt-3.5-turbo-0613 and gpt-4-0613
    /// (cl100k_base) and 124 for gpt-4o and gpt-4o-mini (o200k_base), each matching the
    /// `usage.prompt_tokens` the API returned.
    fn cookbook_messages() -> Vec<Message> {
        let v = json!([
            {"role": "system", "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain English."},
            {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
            {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
            {"role": "system", "name": "example_user", "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage."},
            {"role": "system", "name": "example_assistant", "content": "Let's talk later when we're less busy about how to do better."},
            {"role": "user", "content": "This late pivot means we don't have time to boil the ocean for the client deliverable."}
        ]);
        v.as_array().unwrap().iter().map(|m| Message::from_value(m.clone()).unwrap()).collect()
    }

    fn prompt(enc: Encoding, msgs: &[Message]) -> usize {
        msgs.iter().map(|m| message_tokens(enc, m)).sum::<usize>() + REPLY_PRIMING
    }

    #[test]
    fn matches_openai_published_counts() {
        let msgs = cookbook_messages();
        assert_eq!(prompt(Encoding::Cl100kBase, &msgs), 129);
        assert_eq!(prompt(Encoding::O200kBase, &msgs), 124);
    }

    #[test]
    fn upper_bound_bounds() {
        for m in cookbook_messages() {
            assert!(message_upper_bound(&m) >= message_tokens(Encoding::O200kBase, &m));
        }
        let m = Message::from_value(json!({"role":"user","content":[
            {"type":"text","text":"look"},
            {"type":"image_url","image_url":{"url":"https://x/y.png","detail":"high"}}]}))
        .unwrap();
        assert!(message_upper_bound(&m) >= message_tokens(Encoding::O200kBase, &m));
    }

    #[test]
    fn images_by_detail() {
        assert_eq!(image_tokens("low", Some((4096, 4096))), 85);
        // OpenAI's worked examples: 1024×1024 high → 765; 2048×4096 high → 1105.
        assert_eq!(image_tokens("high", Some((1024, 1024))), 765);
        assert_eq!(image_tokens("high", Some((2048, 4096))), 1105);
        assert_eq!(image_tokens("auto", None), IMAGE_UNKNOWN);
    }

    #[test]
    fn calls_are_counted() {
        let plain = Message::from_value(json!({"role":"assistant","content":null})).unwrap();
        let call = Message::from_value(json!({"role":"assistant","content":null,"tool_calls":[
            {"id":"c","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]}))
        .unwrap();
        assert!(
            message_tokens(Encoding::O200kBase, &call)
                > message_tokens(Encoding::O200kBase, &plain) + CALL_OVERHEAD
        );
    }
}
