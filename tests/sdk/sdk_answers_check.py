#!/usr/bin/env python3
"""Feeds the answers foldgate synthesizes or rewrites (written to DIR by
`tests/sdk_answers.rs`) through the official SDKs'
own clients over a mock transport, and checks what the SDKs build from them:

- anthropic: `beta.messages.stream(...).get_final_message()` (the SDK's stream
  accumulator) and `beta.messages.create(...)` give a message whose first content block
  is the compaction block, with `stop_reason`, `context_management` and
  `usage.iterations` as sent;
- openai: `responses.stream(...).get_final_response()` and `responses.create(...)` give
  a response whose first output item is the compaction item.

Usage: sdk_answers_check.py DIR (exit status 0 when every check holds).
"""

import pathlib
import sys

try:
    import httpx2 as httpx
except ImportError:  # SDKs before the httpx2 move
    import httpx

import anthropic
import openai


def client_of(cls, body: bytes, content_type: str):
    def handler(request):
        return httpx.Response(200, content=body, headers={"content-type": content_type})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    return cls(api_key="test", base_url="http://upstream.test", http_client=http)


def anthropic_message(body: bytes, stream: bool):
    kind = "text/event-stream" if stream else "application/json"
    client = client_of(anthropic.Anthropic, body, kind)
    args = dict(model="claude-x", max_tokens=10, messages=[{"role": "user", "content": "hi"}])
    if stream:
        with client.beta.messages.stream(**args) as s:
            return s.get_final_message()
    return client.beta.messages.create(**args)


def check_anthropic(d: pathlib.Path) -> None:
    for name, stream, stop, blocks in [
        ("anthropic_paused.sse", True, "compaction", ["compaction"]),
        ("anthropic_paused.json", False, "compaction", ["compaction"]),
        ("anthropic_injected.sse", True, "tool_use", ["compaction", "text", "tool_use"]),
        ("anthropic_decorated.json", False, "end_turn", ["compaction", "text"]),
    ]:
        m = anthropic_message((d / name).read_bytes(), stream)
        got = [b.type for b in m.content]
        assert got == blocks, (name, got)
        first = m.content[0]
        assert type(first).__name__ == "BetaCompactionBlock", (name, type(first))
        assert first.content == (d / "summary.txt").read_text(), (name, first.content)
        assert m.stop_reason == stop, (name, m.stop_reason)
        assert m.context_management is not None, name
        assert m.usage.iterations and m.usage.iterations[0].type == "compaction", name
        print(f"ok {name}: {got}, stop_reason={m.stop_reason}, "
              f"applied_edits={[e.type for e in m.context_management.applied_edits]}, "
              f"iterations={[i.type for i in m.usage.iterations]}")
    m = anthropic_message((d / "anthropic_injected.sse").read_bytes(), True)
    assert m.content[2].input == {"path": "a"}, m.content[2]


def check_openai(d: pathlib.Path) -> None:
    args = dict(model="gpt-x", input="hi")
    sse = client_of(openai.OpenAI, (d / "responses_injected.sse").read_bytes(), "text/event-stream")
    with sse.responses.stream(**args) as s:
        events = [e.type for e in s]
        r = s.get_final_response()
    got = [o.type for o in r.output]
    assert got == ["compaction", "message"], got
    assert type(r.output[0]).__name__ == "ResponseCompactionItem", type(r.output[0])
    print(f"ok responses_injected.sse: output={got}, events={len(events)}")
    whole = client_of(openai.OpenAI, (d / "responses_inserted.json").read_bytes(), "application/json")
    r = whole.responses.create(**args)
    got = [o.type for o in r.output]
    assert got == ["compaction", "message"], got
    print(f"ok responses_inserted.json: output={got}")


if __name__ == "__main__":
    directory = pathlib.Path(sys.argv[1])
    check_anthropic(directory)
    check_openai(directory)
