//! A long history of short messages, for measuring how compaction scales.

use serde_json::json;

/// A request of `n` short messages (a system prompt, then user and assistant alternating,
/// about 55 bytes each), as a client that never trims its history sends it.
pub fn short_messages(n: usize) -> Vec<u8> {
    let mut msgs = vec![json!({"role": "system", "content": "You are helpful."})];
    for i in 1..n {
        let role = if i % 2 == 1 { "user" } else { "assistant" };
        msgs.push(json!({"role": role, "content": format!("short message number {i} ok")}));
    }
    let request = json!({"model": "gpt-4o", "messages": msgs, "temperature": 0});
    serde_json::to_vec(&request).expect("a JSON value serializes")
}
