"""The official Anthropic Python SDK's beta on-demand compaction (`compaction` with
`type: "summarize"`) pointed at foldgate: plain and streamed, then the next turn sent with
the compaction block that came back first in `messages`.

Usage: anthropic_summarize_check.py BASE_URL SESSION_JSON
SESSION_JSON holds {"params": {...}} (model, max_tokens, system, tools, thinking,
messages). Prints one JSON line per check; exits non-zero on an unexpected failure.
"""

import json
import sys

import anthropic

BETA = "compact-2026-09-04"


def blocks(message):
    return [b.model_dump(exclude_none=True) for b in message.content]


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def summary_report(message):
    found = blocks(message)
    return {
        "types": [b["type"] for b in found],
        "summary": found[0].get("content") if found else None,
        "stop_reason": message.stop_reason,
    }


def main() -> int:
    base_url, session_file = sys.argv[1], sys.argv[2]
    with open(session_file, encoding="utf-8") as f:
        session = json.load(f)
    client = anthropic.Anthropic(base_url=base_url, api_key="sk-ant-test", max_retries=0)
    params = session["params"]
    headers = {"x-session-id": "on-demand"}
    compaction = {"type": "summarize", "instructions": "Name every module that was read."}

    plain = client.beta.messages.create(
        **params, compaction=compaction, betas=[BETA], extra_headers=headers
    )
    report("summarize", **summary_report(plain))

    with client.beta.messages.stream(
        **params, compaction=compaction, betas=[BETA], extra_headers=headers
    ) as events:
        streamed = events.get_final_message()
    report("summarize_stream", **summary_report(streamed))

    # The next turn: the block first, in place of what it summarizes.
    follow = [
        {"role": "assistant", "content": blocks(plain)},
        {"role": "user", "content": "Go on with the parser."},
    ]
    next_turn = client.beta.messages.create(
        **{**params, "messages": follow}, betas=[BETA], extra_headers=headers
    )
    report("next", types=[b["type"] for b in blocks(next_turn)],
           stop_reason=next_turn.stop_reason)

    # Beside context_management: a clear 400, as the API answers.
    try:
        client.beta.messages.create(
            **params, compaction=compaction, betas=[BETA], extra_headers=headers,
            context_management={"edits": [{"type": "clear_thinking_20251015"}]},
        )
        report("combined", status=200)
    except anthropic.BadRequestError as e:
        report("combined", status=e.status_code, message=str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main())
