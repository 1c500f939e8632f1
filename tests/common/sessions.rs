//! Long synthetic agent sessions, as a coding agent sends them: short user instructions,
//! rounds of (sometimes parallel) tool calls with sizeable outputs, pasted terminal logs,
//! and a mix of streamed and plain requests. Deterministic for a seed.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic, missing_docs)]

use bytes::Bytes;
use serde_json::{Value, json};

/// A small deterministic generator (xorshift64*), so sessions need no extra crate.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() % (hi - lo + 1) as u64) as usize
    }
}

const WORDS: &[&str] = &[
    "parser", "module", "config", "request", "handler", "value", "buffer", "token", "index",
    "result", "error", "warning", "check", "build", "test", "passed", "failed", "line", "file",
    "function", "struct", "field", "return", "match", "option", "string", "number", "cache",
    "session", "client", "server", "route", "stream", "header", "body", "length", "limit", "retry",
    "timeout", "window", "budget", "digest", "block", "range", "state", "store",
];

/// About `tokens` tokens of text: words, identifiers and numbers, in lines.
pub fn words(rng: &mut Rng, tokens: usize, tag: &str) -> String {
    let mut s = String::with_capacity(tokens * 7);
    s.push_str(tag);
    for i in 0..tokens {
        s.push(if i % 12 == 11 { '\n' } else { ' ' });
        let w = WORDS[(rng.next() % WORDS.len() as u64) as usize];
        if i % 9 == 4 {
            s.push_str(&format!("{}_{}", w, rng.range(0, 999)));
        } else {
            s.push_str(w);
        }
    }
    s
}

/// What kind of session to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Short user messages (15-80 tokens), up to four rounds of tool calls per turn,
    /// every fourth user message a pasted terminal log of 1,000-2,000 tokens, and a
    /// closing assistant answer per turn.
    CodingAgent,
    /// Short user messages and nothing but tool calls: two to six rounds per turn,
    /// no assistant text.
    ToolCalling,
    /// Like `CodingAgent` with shorter turns, and every third user message a paste just
    /// under `user_verbatim_max_tokens`: together the small user messages outgrow the
    /// floor, while the short ones alone stay far below it.
    PastingAgent,
}

/// One request of a session: the history so far, and whether it streams.
pub struct SessionRequest {
    pub body: Bytes,
    pub stream: bool,
}

/// The tool definitions every request carries.
pub fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "read_file", "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}},
        {"type": "function", "function": {"name": "run", "description": "Run a shell command",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}},
        {"type": "function", "function": {"name": "edit_file", "description": "Replace text in a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}}}}
    ])
}

/// The messages of a session of about `total_tokens` tokens (estimated as the words of
/// its texts), and the indices after which the agent sends a request.
pub fn session(shape: Shape, seed: u64, total_tokens: usize) -> (Vec<Value>, Vec<usize>) {
    let mut rng = Rng::new(seed);
    let mut msgs = vec![json!({"role": "system", "content":
        "You are a coding agent working in a Rust repository. Use the tools to read, run and edit. Keep answers short."})];
    let mut cuts = Vec::new();
    let mut tokens = 0usize;
    let mut turn = 0usize;
    let mut call_seq = 0usize;
    // Per message: its words plus a few tokens of framing and call arguments.
    let push = |msgs: &mut Vec<Value>, tokens: &mut usize, m: Value| {
        *tokens += m.to_string().split_whitespace().count() + 12;
        msgs.push(m);
    };
    while tokens < total_tokens {
        let paste = match shape {
            Shape::CodingAgent => turn % 4 == 3,
            Shape::PastingAgent => turn % 3 == 2,
            Shape::ToolCalling => false,
        };
        let user = if paste && shape == Shape::PastingAgent {
            let n = rng.range(500, 780);
            format!("Log:\n```\n{}\n```", words(&mut rng, n, "$ cargo build"))
        } else if paste {
            // Some pastes count as small user messages (up to 1,000 tokens), most not.
            let n = rng.range(600, 1800);
            format!("Here is the output I get:\n```\n{}\n```", words(&mut rng, n, "$ cargo test"))
        } else {
            let n = rng.range(15, 80);
            words(&mut rng, n, &format!("Instruction {turn}: please keep constraint c{turn} and"))
        };
        push(&mut msgs, &mut tokens, json!({"role": "user", "content": user}));
        cuts.push(msgs.len());
        let rounds = match shape {
            Shape::CodingAgent => rng.range(1, 4),
            Shape::PastingAgent => rng.range(1, 2),
            Shape::ToolCalling => rng.range(2, 6),
        };
        for _ in 0..rounds {
            let parallel = if rng.range(0, 3) == 0 { rng.range(2, 3) } else { 1 };
            let calls: Vec<(String, &str, String)> = (0..parallel)
                .map(|_| {
                    call_seq += 1;
                    let (name, args) = match rng.range(0, 2) {
                        0 => ("read_file", json!({"path": format!("src/mod_{call_seq}.rs")})),
                        1 => ("run", json!({"command": format!("cargo test case_{call_seq}")})),
                        _ => (
                            "edit_file",
                            json!({"path": format!("src/mod_{call_seq}.rs"), "old": "a", "new": "b"}),
                        ),
                    };
                    (format!("call_{call_seq}"), name, args.to_string())
                })
                .collect();
            let tool_calls: Vec<Value> = calls
                .iter()
                .map(|(id, name, args)| {
                    json!({"id": id, "type": "function",
                    "function": {"name": name, "arguments": args}})
                })
                .collect();
            push(
                &mut msgs,
                &mut tokens,
                json!({"role": "assistant", "content": null, "tool_calls": tool_calls}),
            );
            for (id, name, _) in &calls {
                // A few hundred tokens usually, up to about 1,500.
                let n = match (shape, rng.range(0, 3)) {
                    (Shape::PastingAgent, _) => rng.range(150, 600),
                    (_, 0) => rng.range(700, 1500),
                    _ => rng.range(150, 600),
                };
                let out = words(&mut rng, n, &format!("{name} {id} output:"));
                push(
                    &mut msgs,
                    &mut tokens,
                    json!({"role": "tool", "tool_call_id": id, "content": out}),
                );
            }
            cuts.push(msgs.len());
        }
        if shape != Shape::ToolCalling {
            let n = rng.range(20, 60);
            let answer = words(&mut rng, n, &format!("Done with instruction {turn}:"));
            push(&mut msgs, &mut tokens, json!({"role": "assistant", "content": answer}));
        }
        turn += 1;
    }
    (msgs, cuts)
}

/// The requests of a session: one per cut, every third one streamed.
pub fn session_requests(shape: Shape, seed: u64, total_tokens: usize) -> Vec<SessionRequest> {
    let (msgs, cuts) = session(shape, seed, total_tokens);
    cuts.iter()
        .enumerate()
        .map(|(i, &end)| {
            let stream = i % 3 == 2;
            let mut body = json!({"model": "gpt-4o", "messages": &msgs[..end], "tools": tools()});
            if stream {
                body["stream"] = json!(true);
            }
            SessionRequest { body: Bytes::from(serde_json::to_vec(&body).unwrap()), stream }
        })
        .collect()
}

/// A text-mode agent session as mini-swe-agent sends it, of about `total_tokens` tokens
/// (estimated as words): a system prompt, a task statement of about 1,200 tokens, then
/// steps of an assistant message (a thought and one command in a `bash` block, no tool
/// calls) answered by a `user` message holding the command's output
/// (`<returncode>…</returncode><output>…</output>`), most of them small (20 to 400
/// tokens), one in five larger (600 to 1,500). No other user message.
pub fn text_mode_session(seed: u64, total_tokens: usize) -> Vec<Value> {
    let mut rng = Rng::new(seed);
    let task = words(&mut rng, 1_200, "<pr_description>\nConsider the following PR description:");
    let mut msgs = vec![
        json!({"role": "system", "content": "You are a helpful assistant that can interact multiple times with a computer shell to solve programming tasks. Your response must contain exactly ONE bash code block with ONE command."}),
        json!({"role": "user", "content": format!("{task}\n</pr_description>")}),
    ];
    let mut tokens = 1_250;
    let mut step = 0;
    while tokens < total_tokens {
        let n = rng.range(20, 60);
        let thought = words(&mut rng, n, &format!("THOUGHT: step {step}, I look at"));
        let command = format!("grep -n parser_{step} src/module_{step}.py | head -50");
        msgs.push(json!({"role": "assistant", "content": format!("{thought}\n\n```bash\n{command}\n```")}));
        let n = if step % 5 == 4 { rng.range(600, 1_500) } else { rng.range(20, 400) };
        let output = words(&mut rng, n, &format!("module_{step}.py:"));
        msgs.push(json!({"role": "user", "content": format!("<returncode>{}</returncode>\n<output>\n{output}\n</output>", step % 2)}));
        tokens += n + 60 + 12;
        step += 1;
    }
    msgs
}
