"""The official Anthropic Python SDK's beta context management pointed at foldgate:
each edit type (clear_tool_uses, clear_thinking, compact), plain and streamed, the next
turn sent with the compaction block that came back, and a compaction that pauses.

Usage: anthropic_compaction_check.py BASE_URL SESSION_JSON
SESSION_JSON holds {"params": {...}} (model, max_tokens, system, tools, thinking,
messages). Prints one JSON line per check; exits non-zero on an unexpected failure.
"""

import json
import sys

import anthropic

CLEAR_BETA = "context-management-2025-06-27"
COMPACT_BETA = "compact-2026-01-12"


def blocks(message):
    return [b.model_dump(exclude_none=True) for b in message.content]


def edits_report(message):
    cm = getattr(message, "context_management", None)
    applied = [e.model_dump() for e in cm.applied_edits] if cm else None
    usage = message.usage.model_dump(exclude_none=True)
    return {
        "types": [b["type"] for b in blocks(message)],
        "applied": applied,
        "iterations": usage.get("iterations"),
        "stop_reason": message.stop_reason,
    }


def main() -> int:
    base_url, session_file = sys.argv[1], sys.argv[2]
    with open(session_file, encoding="utf-8") as f:
        session = json.load(f)
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0)
    params = session["params"]
    headers = {"x-session-id": "context-edits"}

    def report(check, **fields):
        print(json.dumps({"check": check, **fields}), flush=True)

    def create(edits, betas, messages=None, **extra):
        return client.beta.messages.create(
            **{**params, "messages": messages or params["messages"]},
            context_management={"edits": edits},
            betas=betas,
            extra_headers=headers,
            **extra,
        )

    def stream(edits, betas, messages=None):
        with client.beta.messages.stream(
            **{**params, "messages": messages or params["messages"]},
            context_management={"edits": edits},
            betas=betas,
            extra_headers=headers,
        ) as events:
            return events.get_final_message()

    clear_tools = [{"type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 1000},
                    "keep": {"type": "tool_uses", "value": 2},
                    "clear_tool_inputs": True}]
    report("clear_tool_uses", **edits_report(create(clear_tools, [CLEAR_BETA])))
    report("clear_tool_uses_stream", **edits_report(stream(clear_tools, [CLEAR_BETA])))

    clear_thinking = [{"type": "clear_thinking_20251015",
                       "keep": {"type": "thinking_turns", "value": 1}}]
    report("clear_thinking", **edits_report(create(clear_thinking, [CLEAR_BETA])))
    report("clear_thinking_stream", **edits_report(stream(clear_thinking, [CLEAR_BETA])))

    compact = [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 2000},
                "instructions": "Name every module that was read."}]
    plain = create(compact, [COMPACT_BETA])
    report("compact", summary=blocks(plain)[0].get("content"), **edits_report(plain))

    streamed = stream(compact, [COMPACT_BETA])
    report("compact_stream", summary=blocks(streamed)[0].get("content"), **edits_report(streamed))

    # The next turn carries the compaction block back.
    follow = params["messages"] + [
        {"role": "assistant", "content": blocks(plain)},
        {"role": "user", "content": "Go on with the parser."},
    ]
    report("compact_next", **edits_report(create(compact, [COMPACT_BETA], messages=follow)))

    pause = [{**compact[0], "pause_after_compaction": True}]
    report("paused", **edits_report(create(pause, [COMPACT_BETA])))
    report("paused_stream", **edits_report(stream(pause, [COMPACT_BETA])))

    # A malformed edit: a clear 400.
    try:
        create([{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": -1}}],
               [CLEAR_BETA])
        report("malformed", status=200)
    except anthropic.BadRequestError as e:
        report("malformed", status=e.status_code, message=str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
