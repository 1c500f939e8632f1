"""The official OpenAI Python SDK's compaction APIs pointed at foldgate with base_url:
`responses.compact`, then `context_management` compaction on `responses.create`, plain
and streamed, each followed by the next turn sent with what came back.

Usage: openai_compaction_check.py BASE_URL SESSION_JSON
SESSION_JSON holds {"items": [...], "threshold": N, "foreign": <a compaction item sealed
with another key>}. Prints one JSON line per check; exits non-zero on an unexpected
failure.
"""

import json
import sys

import openai


def dump(item):
    return item.model_dump(exclude_none=True) if hasattr(item, "model_dump") else item


def main() -> int:
    base_url, session_file = sys.argv[1], sys.argv[2]
    with open(session_file, encoding="utf-8") as f:
        session = json.load(f)
    client = openai.OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0)
    items = session["items"]
    model = "gpt-4.1"
    headers = {"x-session-id": "compaction-check"}

    def report(check, **fields):
        print(json.dumps({"check": check, **fields}), flush=True)

    # 1: responses.compact.
    compacted = client.responses.compact(model=model, input=items, extra_headers=headers)
    output = [dump(o) for o in compacted.output]
    report(
        "compact",
        object=compacted.object,
        types=[o.get("type", "message") for o in output],
        roles=[o.get("role") for o in output],
        encrypted=output[-1].get("encrypted_content", ""),
        input_tokens=compacted.usage.input_tokens,
        output_tokens=compacted.usage.output_tokens,
    )

    # 2: the next turn, sent with the compacted output.
    follow = output + [{"role": "user", "content": "Now run the parser tests."}]
    raw = client.responses.with_raw_response.create(model=model, input=follow, extra_headers=headers)
    report("after_compact", text=raw.parse().output_text, outcome=raw.headers.get("x-foldgate-outcome"))

    # 3: context_management, plain.
    cm = [{"type": "compaction", "compact_threshold": session["threshold"]}]
    plain = client.responses.create(model=model, input=items, context_management=cm, extra_headers=headers)
    plain_output = [dump(o) for o in plain.output]
    report("cm_plain", types=[o.get("type") for o in plain_output], text=plain.output_text)

    # 4: the next turn with what came back.
    follow = items + plain_output + [{"role": "user", "content": "Go on."}]
    again = client.responses.create(model=model, input=follow, context_management=cm, extra_headers=headers)
    report("cm_next", types=[dump(o).get("type") for o in again.output])

    # 5: context_management, streamed.
    events = []
    final = None
    stream = client.responses.create(
        model=model, input=items, context_management=cm, stream=True, extra_headers=headers
    )
    for event in stream:
        added = event.type == "response.output_item.added"
        events.append({
            "type": event.type,
            "sequence_number": event.sequence_number,
            "output_index": getattr(event, "output_index", None),
            "item_type": event.item.type if added else None,
        })
        if event.type == "response.completed":
            final = event.response
    report(
        "cm_stream",
        events=events,
        final_types=[o.type for o in final.output] if final else None,
        text=final.output_text if final else None,
    )

    # 6: items foldgate cannot open: a clear 400 each.
    sealed = output[-1]
    content = sealed["encrypted_content"]
    flipped = content[:-3] + ("A" if content[-3] != "A" else "B") + content[-2:]
    for name, item in [
        ("tampered", {**sealed, "encrypted_content": flipped}),
        ("truncated", {**sealed, "encrypted_content": content[:20]}),
        ("foreign", session["foreign"]),
    ]:
        try:
            client.responses.create(
                model=model, input=[item, {"role": "user", "content": "hi"}], extra_headers=headers
            )
            report(name, status=200)
        except openai.BadRequestError as e:
            report(name, status=e.status_code, message=e.message)
    return 0


if __name__ == "__main__":
    sys.exit(main())
