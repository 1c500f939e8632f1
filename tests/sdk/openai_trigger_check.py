"""The official OpenAI Python SDK sending Codex's remote compaction request (an ordinary
`responses.create` whose last input item is `{"type": "compaction_trigger"}`) to foldgate,
plain and streamed, then the next turn sent with the compaction item that came back.

Usage: openai_trigger_check.py BASE_URL SESSION_JSON
SESSION_JSON holds {"items": [...]}. Prints one JSON line per check; exits non-zero on an
unexpected failure.
"""

import json
import sys

import openai


def dump(item):
    return item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else item


def report(check, **fields):
    print(json.dumps({"check": check, **fields}), flush=True)


def main() -> int:
    base_url, session_file = sys.argv[1], sys.argv[2]
    with open(session_file, encoding="utf-8") as f:
        session = json.load(f)
    client = openai.OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0)
    items = session["items"]
    model = "gpt-4.1"
    headers = {"x-session-id": "trigger-check"}
    trigger = [{"type": "compaction_trigger"}]

    plain = client.responses.create(model=model, input=items + trigger, extra_headers=headers)
    output = [dump(o) for o in plain.output]
    report("trigger", types=[o.get("type") for o in output],
           encrypted=output[0].get("encrypted_content", "") if output else "",
           input_tokens=plain.usage.input_tokens, output_tokens=plain.usage.output_tokens)

    events = []
    final = None
    for event in client.responses.create(model=model, input=items + trigger, stream=True,
                                         extra_headers=headers):
        events.append(event.type)
        if event.type == "response.completed":
            final = event.response
    report("trigger_stream", events=events,
           types=[dump(o).get("type") for o in final.output] if final else None)

    # The next turn: the compaction item in place of the history, then a new message.
    follow = output + [{"role": "user", "content": "Now run the parser tests."}]
    again = client.responses.create(model=model, input=follow, extra_headers=headers)
    report("next", text=again.output_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
