//! The answers foldgate synthesizes or rewrites for the providers' compaction APIs, read
//! by the official Python SDKs (`tests/sdk/sdk_answers_check.py`): the Anthropic compaction
//! block (paused and injected, JSON and streamed) and the Responses compaction item.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout, missing_docs)]

mod common;

use std::path::Path;

use foldgate::api::anthropic_edits::{
    AnswerEdits, AppliedEdit, CompactionAnswer, CompactionInjector, decorate_message,
    paused_message, paused_stream,
};
use foldgate::api::responses_output::{OutputItemInjector, insert_output_item};

const SUMMARY: &str = "The user asked to fix a test.\n- read src/lib.rs\n- \"quoted\" \u{e9}";

fn anthropic_upstream() -> String {
    let events = [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"claude-x","content":[],"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":20,"output_tokens":1}}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Reading."}}"#,
        ),
        ("content_block_stop", r#"{"type":"content_block_stop","index":0}"#),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"read","input":{}}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"path\":"}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"\"a\"}"}}"#,
        ),
        ("content_block_stop", r#"{"type":"content_block_stop","index":1}"#),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":9}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ];
    events.iter().map(|(n, d)| format!("event: {n}\ndata: {d}\n\n")).collect()
}

fn responses_upstream() -> String {
    let message = r#"{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}"#;
    let response = |status: &str, output: &str| {
        format!(
            r#"{{"id":"resp_1","object":"response","created_at":1,"status":"{status}","model":"gpt-x","output":[{output}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[]}}"#
        )
    };
    let events = [
        ("response.created", format!(r#"{{"type":"response.created","sequence_number":0,"response":{}}}"#, response("in_progress", ""))),
        ("response.in_progress", format!(r#"{{"type":"response.in_progress","sequence_number":1,"response":{}}}"#, response("in_progress", ""))),
        ("response.output_item.added", r#"{"type":"response.output_item.added","sequence_number":2,"output_index":0,"item":{"type":"message","id":"msg_1","status":"in_progress","role":"assistant","content":[]}}"#.to_owned()),
        ("response.content_part.added", r#"{"type":"response.content_part.added","sequence_number":3,"output_index":0,"item_id":"msg_1","content_index":0,"part":{"type":"output_text","text":"","annotations":[]}}"#.to_owned()),
        ("response.output_text.delta", r#"{"type":"response.output_text.delta","sequence_number":4,"output_index":0,"item_id":"msg_1","content_index":0,"delta":"Hi","logprobs":[]}"#.to_owned()),
        ("response.output_text.done", r#"{"type":"response.output_text.done","sequence_number":5,"output_index":0,"item_id":"msg_1","content_index":0,"text":"Hi","logprobs":[]}"#.to_owned()),
        ("response.content_part.done", r#"{"type":"response.content_part.done","sequence_number":6,"output_index":0,"item_id":"msg_1","content_index":0,"part":{"type":"output_text","text":"Hi","annotations":[]}}"#.to_owned()),
        ("response.output_item.done", format!(r#"{{"type":"response.output_item.done","sequence_number":7,"output_index":0,"item":{message}}}"#)),
        ("response.completed", format!(r#"{{"type":"response.completed","sequence_number":8,"response":{}}}"#, response("completed", message))),
    ];
    events.iter().map(|(n, d)| format!("event: {n}\ndata: {d}\n\n")).collect()
}

fn write_fixtures(dir: &Path) {
    let c = CompactionAnswer { summary: SUMMARY.into(), input_tokens: 900, output_tokens: 40 };
    let applied =
        vec![AppliedEdit::ClearToolUses { cleared_tool_uses: 2, cleared_input_tokens: 300 }];
    let edits = AnswerEdits { compaction: Some(c.clone()), applied_edits: Some(applied.clone()) };
    let write = |name: &str, bytes: &[u8]| std::fs::write(dir.join(name), bytes).unwrap();
    write("summary.txt", SUMMARY.as_bytes());
    write("anthropic_paused.sse", &paused_stream("msg_p", "claude-x", &c, &applied));
    write("anthropic_paused.json", &paused_message("msg_p", "claude-x", &c, &applied));
    let mut injector = CompactionInjector::new(edits.clone());
    let mut stream: Vec<u8> =
        anthropic_upstream().bytes().flat_map(|b| injector.push(&[b])).collect();
    stream.extend(injector.finish());
    write("anthropic_injected.sse", &stream);
    let message = r#"{"id":"msg_2","type":"message","role":"assistant","model":"claude-x","content":[{"type":"text","text":"Hi"}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":12,"output_tokens":3}}"#;
    write("anthropic_decorated.json", &decorate_message(message.as_bytes(), &edits).unwrap());
    let item = r#"{"type":"compaction","id":"cmp_1","encrypted_content":"opaque"}"#;
    let mut injector = OutputItemInjector::new(item.into());
    let mut stream: Vec<u8> =
        responses_upstream().bytes().flat_map(|b| injector.push(&[b])).collect();
    stream.extend(injector.finish());
    write("responses_injected.sse", &stream);
    let response = r#"{"id":"resp_1","object":"response","created_at":1,"status":"completed","model":"gpt-x","output":[{"type":"message","id":"msg_1","status":"completed","role":"assistant","content":[{"type":"output_text","text":"Hi","annotations":[]}]}],"parallel_tool_calls":true,"tool_choice":"auto","tools":[]}"#;
    write("responses_inserted.json", &insert_output_item(response.as_bytes(), item).unwrap());
}

#[test]
fn official_sdks_read_the_answers() {
    let sdks = ["anthropic", "openai"];
    if !sdks.iter().all(|m| common::tools::python_module_available(m)) {
        return;
    }
    let dir = std::env::temp_dir().join(format!("foldgate-sdk-answers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_fixtures(&dir);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk/sdk_answers_check.py");
    let out = std::process::Command::new("python3").arg(script).arg(&dir).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    print!("{}", String::from_utf8_lossy(&out.stdout));
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
