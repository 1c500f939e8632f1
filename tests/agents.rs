//! Real coding agents (Claude Code, Codex in both its modes, opencode, mini-swe-agent),
//! installed by `.ci/run` under `tests/agents/`, run a 30-step shell task through a real
//! foldgate process against the scripted model (`tests/common/scripted_model/`), once with
//! the model summarizer and once with the extractive one. Each run must finish, be
//! compacted, reach the model only with valid requests sent the agent's own way, and print
//! no error. `agents_table` (ignored) also runs each agent directly against the model and
//! prints the figures of docs/PERFORMANCE.md:
//! `cargo test --test agents -- --ignored --nocapture agents_table`.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::print_stderr,
    missing_docs
)]

#[path = "common/agent_cli.rs"]
mod agent_cli;
#[path = "common/agent_run.rs"]
mod agent_run;
#[path = "common/binary.rs"]
mod binary;
#[path = "common/scripted_model/mod.rs"]
mod scripted_model;

use agent_cli::Agent;
use agent_run::{HEADER, LINES, STEPS, Via, report, run};

/// Both summarizer kinds through foldgate; every promise asserted.
async fn through_foldgate(agent: Agent) {
    if !agent.installed() {
        return;
    }
    for kind in ["llm", "extractive"] {
        let outcome = run(agent, Via::Foldgate(kind)).await;
        report(&outcome);
        outcome.assert_ok();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code() {
    through_foldgate(Agent::ClaudeCode).await;
}

/// Claude Code with a model id it does not know sends `system` messages inside `messages`
/// (foldgate read such bodies as no conversation until a7af6b2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_gateway_model() {
    through_foldgate(Agent::ClaudeCodeGatewayModel).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_default_mode() {
    through_foldgate(Agent::CodexDefault).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_http_provider() {
    through_foldgate(Agent::CodexHttp).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode() {
    through_foldgate(Agent::OpenCode).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mini_swe_agent() {
    through_foldgate(Agent::MiniSweAgent).await;
}

/// Each agent directly against the model, then through foldgate with each summarizer:
/// the table of docs/PERFORMANCE.md (nothing asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "prints a table for docs/PERFORMANCE.md"]
async fn agents_table() {
    let mut rows = Vec::new();
    let only = std::env::var("FOLDGATE_AGENTS_ONLY").unwrap_or_default();
    for agent in Agent::ALL {
        if !agent.name().starts_with(only.as_str()) || !agent.installed() {
            continue;
        }
        for via in [Via::Direct, Via::Foldgate("llm"), Via::Foldgate("extractive")] {
            let outcome = run(agent, via).await;
            // Direct runs go over the window; any other violation is the checks' or the agent's.
            for v in outcome.violations.iter().filter(|v| !v.contains("over the window")) {
                eprintln!("{} via {}: {v}", agent.name(), outcome.via());
            }
            eprintln!(
                "{} via {} sent:\n  {}",
                agent.name(),
                outcome.via(),
                outcome.sent.join("\n  ")
            );
            if let Some((refused, after)) = outcome.fallback {
                eprintln!("  WebSocket upgrades refused: {refused}, HTTP {after:.3} s after");
            }
            rows.push(outcome.row());
        }
    }
    eprintln!("{STEPS} steps of {LINES} lines each\n{HEADER}\n{}", rows.join("\n"));
}

/// The model's checks catch what a provider rejects (so a passing run is not vacuous).
#[test]
fn scripted_model_checks() {
    use scripted_model::{chat, messages, responses, validate};
    use serde_json::json;
    let check = |f: fn(&serde_json::Value, &mut Vec<String>), body: serde_json::Value| {
        let mut out = Vec::new();
        f(&body, &mut out);
        out
    };
    let tool_use = |id: &str| json!({"type": "tool_use", "id": id, "name": "Bash", "input": {}});
    let result = |id: &str| json!({"type": "tool_result", "tool_use_id": id, "content": "STEP 1"});
    let thought =
        |text: &str, sig: &str| json!({"type": "thinking", "thinking": text, "signature": sig});
    let good = json!({"messages": [
        {"role": "user", "content": "task"},
        {"role": "system", "content": "reminder"},
        {"role": "assistant", "content": [thought("t", &validate::signature("t")), tool_use("a")]},
        {"role": "user", "content": [result("a")]},
    ]});
    assert_eq!(check(messages::check, good), Vec::<String>::new());
    let cc = json!({"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}});
    for bad in [
        json!({"messages": [{"role": "assistant", "content": "hi"}]}),
        json!({"messages": [{"role": "user", "content": "t"}, {"role": "assistant", "content": [tool_use("a")]}, {"role": "user", "content": "go on"}]}),
        json!({"messages": [{"role": "user", "content": [result("a")]}]}),
        json!({"messages": [{"role": "user", "content": "t"}, {"role": "assistant", "content": [thought("edited", &validate::signature("t"))]}, {"role": "user", "content": "next"}]}),
        json!({"system": [cc.clone(), cc.clone(), cc.clone()], "messages": [{"role": "user", "content": [cc.clone(), cc]}]}),
    ] {
        assert!(!check(messages::check, bad.clone()).is_empty(), "{bad}");
    }
    let call = |id: &str| json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}]});
    let tool = |id: &str| json!({"role": "tool", "tool_call_id": id, "content": "STEP 1"});
    let user = json!({"role": "user", "content": "task"});
    assert!(check(chat::check, json!({"messages": [user, call("a"), tool("a")]})).is_empty());
    for bad in [
        json!({"messages": [user, call("a"), user, tool("a")]}),
        json!({"messages": [user, call("a")]}),
        json!({"messages": [user, tool("a")]}),
    ] {
        assert!(!check(chat::check, bad.clone()).is_empty(), "{bad}");
    }
    let fc = |id: &str| json!({"type": "function_call", "call_id": id, "name": "exec_command", "arguments": "{}"});
    let out = |id: &str| json!({"type": "function_call_output", "call_id": id, "output": "STEP 1"});
    let reasoning =
        |c: &str| json!({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": c});
    let ok = validate::sealed("r");
    assert!(
        check(responses::check, json!({"input": [reasoning(&ok), fc("a"), out("a")]})).is_empty()
    );
    for bad in [
        json!({"input": [out("a"), fc("a")]}),
        json!({"input": [fc("a")]}),
        json!({"input": [{"type": "compaction", "encrypted_content": "sealed"}]}),
        json!({"input": [reasoning(&format!("x{ok}")), fc("a"), out("a")]}),
    ] {
        assert!(!check(responses::check, bad.clone()).is_empty(), "{bad}");
    }
    assert_eq!(
        scripted_model::last_step("Output:\nSTEP 12\nstep 12 output line 1\nEND STEP 12"),
        Some(12)
    );
    assert_eq!(scripted_model::last_step("no marker"), None);
}
