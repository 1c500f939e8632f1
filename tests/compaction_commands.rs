#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]
//! `foldgate compact` and `foldgate replay` as a user runs them.

use std::io::Write;
use std::process::{Command, Stdio};

use serde_json::{Value, json};

fn conversation(rounds: usize) -> Value {
    let mut m = vec![
        json!({"role": "system", "content": "You are a coding agent."}),
        json!({"role": "user", "content": "Fix the bug in src/parse.rs. Keep the public API."}),
    ];
    for r in 0..rounds {
        m.push(json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "read_file", "arguments": format!("{{\"path\":\"src/m{r}.rs\"}}")}}]}));
        m.push(json!({"role": "tool", "tool_call_id": "c", "content": format!("fn f{r}() {{}}\n{}", "let x = 1;\n".repeat(300))}));
    }
    json!({"model": "gpt-4o", "messages": m, "x_extra": [1, 2, 3]})
}

fn foldgate() -> Command {
    Command::new(env!("CARGO_BIN_EXE_foldgate"))
}

#[test]
fn compact_writes_json_to_stdout_and_the_report_to_stderr() {
    let body = serde_json::to_vec(&conversation(12)).unwrap();
    let mut child = foldgate()
        .args(["compact", "--window", "8000", "--report-json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(&body).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let forwarded: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(forwarded["x_extra"], json!([1, 2, 3]));
    assert!(forwarded["messages"].as_array().unwrap().len() < 26);
    let report: Value = serde_json::from_slice(&out.stderr).unwrap();
    assert!(report["tokens_after"].as_u64().unwrap() < report["tokens_before"].as_u64().unwrap());
    assert_eq!(report["budget"]["window"], 8000);
}

#[test]
fn compact_below_the_trigger_echoes_the_input_bytes() {
    let dir = std::env::temp_dir().join(format!("foldgate-compact-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("small.json");
    let body = b"{\"model\":\"gpt-4o\",  \"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
    std::fs::write(&file, body).unwrap();
    let out = foldgate().arg("compact").arg(&file).output().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, body);
    assert!(String::from_utf8_lossy(&out.stderr).contains("tier 0"));
}

#[test]
fn replay_reports_totals_and_exits_zero_without_violations() {
    let dir = std::env::temp_dir().join(format!("foldgate-replay-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("convs.jsonl");
    let mut text = String::new();
    for (i, n) in [3, 12].iter().enumerate() {
        let mut c = conversation(*n);
        c["id"] = json!(format!("conv-{i}"));
        let msgs = c["messages"].as_array_mut().unwrap();
        msgs.push(json!({"role": "assistant", "content": "Done."}));
        text.push_str(&serde_json::to_string(&c).unwrap());
        text.push('\n');
    }
    std::fs::write(&file, text).unwrap();
    let out =
        foldgate().args(["replay", "--window", "8000", "--json"]).arg(&file).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["conversations"].as_array().unwrap().len(), 2);
    assert_eq!(v["total"]["requests"], 3 + 1 + 12 + 1);
    assert!(v["total"]["compacted"].as_u64().unwrap() > 0);
    assert_eq!(v["total"]["violations"], json!({}));
}

#[test]
fn compact_and_replay_read_anthropic_messages_bodies() {
    let dir = std::env::temp_dir().join(format!("foldgate-messages-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut messages = vec![json!({"role": "user", "content": "Fix the parser. Keep the API."})];
    for r in 0..12 {
        let id = format!("toolu_{r}");
        messages.push(json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "read it", "signature": format!("sig{r}")},
            {"type": "tool_use", "id": id, "name": "read", "input": {"path": format!("src/m{r}.rs")}}]}));
        let output = format!("fn f{r}() {{}}\n{}", "let x = 1;\n".repeat(300));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": id, "content": output}]}));
    }
    let body = serde_json::to_vec(&json!({"model": "claude-sonnet-4-5", "max_tokens": 1024,
        "system": "You are a coding agent.", "messages": messages}))
    .unwrap();
    let file = dir.join("messages.json");
    std::fs::write(&file, &body).unwrap();
    let out = foldgate()
        .args(["compact", "--api", "messages", "--window", "8000"])
        .arg(&file)
        .env_remove("FOLDGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let forwarded: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(out.stdout.len() < body.len());
    assert_eq!(forwarded["system"], "You are a coding agent.");
    let sent = forwarded["messages"].as_array().unwrap();
    assert_eq!(sent[0]["role"], "user");
    assert!(sent.windows(2).all(|w| w[0]["role"] != w[1]["role"]));
    // A replay record is a Messages body.
    let trace = dir.join("trace.jsonl");
    std::fs::write(&trace, [&body[..], b"\n"].concat()).unwrap();
    let out = foldgate()
        .args(["replay", "--api", "messages", "--window", "8000", "--json"])
        .arg(&trace)
        .env_remove("FOLDGATE_CONFIG")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["total"]["compacted"].as_u64().unwrap() > 0, "{report}");
}
