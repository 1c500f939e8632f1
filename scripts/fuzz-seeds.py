#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs (scripts/fuzz.sh calls it): request bodies of
the three API shapes cut from the recorded conversations in ../shared/traces/dev.jsonl
(converted to the Responses and Messages shapes, with reasoning, thinking and
compaction items), answers as JSON and as event streams (the usage fields of every
API), upstream error answers, session headers and stored-state edits.

    scripts/fuzz-seeds.py OUT_DIR [TRACES.jsonl]
"""

import gzip
import hashlib
import json
import os
import sys
import zlib

MAX_BYTES = 200_000


def main():
    out = sys.argv[1]
    here = os.path.dirname(os.path.abspath(__file__))
    traces = sys.argv[2] if len(sys.argv) > 2 else os.path.join(here, "../../shared/traces/dev.jsonl")
    sessions = []
    if os.path.exists(traces):
        with open(traces) as f:
            sessions = [json.loads(line) for line in f]
    else:
        print(f"fuzz-seeds: {traces} not found; seeds from the built-in samples only", file=sys.stderr)
    seeds = {name: [] for name in TARGETS}
    for s in sessions[::6]:
        msgs = s["messages"]
        for end in sorted({min(len(msgs), n) for n in (3, 8, len(msgs))}):
            body = {"model": s.get("model") or "gpt-4o", "messages": msgs[:end]}
            if s.get("tools"):
                body["tools"] = s["tools"]
            chat = json.dumps(body).encode()
            if len(chat) > MAX_BYTES:
                continue
            seeds["chat_request"].append(chat)
            seeds["outline"].append(chat)
            seeds["session_key"].append(b"authorization: Bearer sk-a\x1fx-session-id: s1\n" + chat)
            seeds["session_key"].append(b"x-api-key: k\n" + chat)
            seeds["responses_request"].append(json.dumps(responses_body(body)).encode())
            # request_encoding: the first byte picks gzip (0) or deflate (1), the rest the body.
            seeds["request_encoding"].append(b"\x00" + gzip.compress(chat, 1))
            seeds["request_encoding"].append(b"\x01" + zlib.compress(chat, 1))
            anthropic = messages_body(body)
            seeds["messages_request"].append(json.dumps(anthropic).encode())
            anthropic["context_management"] = {"edits": EDITS}
            seeds["anthropic_edits"].append(json.dumps(anthropic).encode())
    for name, samples in SAMPLES.items():
        seeds[name].extend(samples)
    for name, inputs in seeds.items():
        folder = os.path.join(out, name)
        os.makedirs(folder, exist_ok=True)
        for data in inputs:
            digest = hashlib.sha1(data).hexdigest()
            with open(os.path.join(folder, digest), "wb") as f:
                f.write(data)


def responses_body(chat):
    """A chat request as a Responses API request: messages, calls and outputs as items,
    a reasoning item with encrypted content before each call."""
    items = []
    instructions = None
    for m in chat["messages"]:
        role, content = m.get("role"), m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        if role == "system" and instructions is None:
            instructions = text
        elif role in ("user", "system", "developer"):
            items.append({"type": "message", "role": role, "content": [{"type": "input_text", "text": text or ""}]})
        elif role == "assistant":
            if m.get("tool_calls"):
                items.append({"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAAB" + "x" * 40})
                for c in m["tool_calls"]:
                    f = c.get("function", {})
                    items.append({"type": "function_call", "call_id": c.get("id", "c"), "name": f.get("name", "t"),
                                  "arguments": f.get("arguments", "{}")})
            if text and text != "null":
                items.append({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]})
        elif role == "tool":
            items.append({"type": "function_call_output", "call_id": m.get("tool_call_id", "c"), "output": text or ""})
    body = {"model": "gpt-4.1", "input": items, "store": False}
    if instructions:
        body["instructions"] = instructions
    return body


def messages_body(chat):
    """A chat request as an Anthropic Messages request: tool_use and tool_result blocks,
    a signed thinking block before each call."""
    system, msgs = None, []
    for m in chat["messages"]:
        role, content = m.get("role"), m.get("content")
        text = content if isinstance(content, str) else json.dumps(content)
        if role == "system":
            system = text
        elif role == "user":
            msgs.append({"role": "user", "content": text or "."})
        elif role == "assistant":
            blocks = []
            if m.get("tool_calls"):
                blocks.append({"type": "thinking", "thinking": "I should look.", "signature": "EqQBCkYIBxgC" + "A" * 30})
            if text and text != "null":
                blocks.append({"type": "text", "text": text})
            for c in m.get("tool_calls") or []:
                f = c.get("function", {})
                try:
                    args = json.loads(f.get("arguments", "{}"))
                except ValueError:
                    args = {}
                blocks.append({"type": "tool_use", "id": c.get("id", "t"), "name": f.get("name", "t"), "input": args})
            msgs.append({"role": "assistant", "content": blocks or [{"type": "text", "text": "."}]})
        elif role == "tool":
            msgs.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m.get("tool_call_id", "t"),
                                                       "content": text or ""}]})
    body = {"model": "claude-sonnet-4-5", "max_tokens": 1024, "messages": msgs}
    if system:
        body["system"] = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    return body


def sse(*events):
    return "".join(f"data: {e}\n\n" for e in events).encode()


def control(data, sizes=b"\x03\x07\x01"):
    """A split input: a length byte, chunk sizes, the bytes."""
    return bytes([len(sizes) - 1]) + sizes[1:] + data if sizes else data


CHAT_STREAM = sse(
    '{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{"role":"assistant","content":"o"}}]}',
    '{"id":"c1","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,"delta":{},"finish_reason":"stop"}],'
    '"usage":{"prompt_tokens":120,"completion_tokens":2,"total_tokens":122,"prompt_tokens_details":{"cached_tokens":64}}}',
    "[DONE]",
)
RESPONSES_STREAM = (
    b'event: response.created\ndata: {"type":"response.created","response":{"id":"r1","model":"gpt-4.1","usage":null}}\n\n'
    b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"hi"}\n\n'
    b'event: response.completed\ndata: {"type":"response.completed","response":{"id":"r1","model":"gpt-4.1",'
    b'"usage":{"input_tokens":90,"output_tokens":3,"input_tokens_details":{"cached_tokens":40}}}}\n\n'
)
ANTHROPIC_STREAM = (
    b'event: message_start\r\ndata: {"type":"message_start","message":{"id":"m1","model":"claude-sonnet-4-5",'
    b'"usage":{"input_tokens":40,"cache_creation_input_tokens":10,"cache_read_input_tokens":50,"output_tokens":1}}}\r\n\r\n'
    b'event: content_block_delta\r\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}\r\n\r\n'
    b'event: message_delta\r\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":12}}\r\n\r\n'
)
CHAT_JSON = (b'{"id":"c1","object":"chat.completion","model":"gpt-4o-2024-08-06","choices":[{"index":0,"message":'
             b'{"role":"assistant","content":"ok \\"usage\\""},"finish_reason":"stop"}],'
             b'"usage":{"prompt_tokens":100,"completion_tokens":1,"total_tokens":101,"prompt_tokens_details":{"cached_tokens":50}}}')
ANTHROPIC_JSON = (b'{"id":"m1","type":"message","model":"claude-sonnet-4-5","content":[{"type":"text","text":"hi"}],'
                  b'"usage":{"input_tokens":7,"cache_read_input_tokens":3,"cache_creation_input_tokens":5,"output_tokens":2}}')
ERRORS = [
    b'{"error":{"message":"This model\'s maximum context length is 16000 tokens. However, your messages resulted in 17915 tokens.",'
    b'"type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}',
    b'{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 205000 tokens > 200000 maximum"}}',
    b'{"error":{"message":"Your input exceeds the context window of this model. Please adjust your input and try again.",'
    b'"type":"invalid_request_error","code":"context_length_exceeded"}}',
    b'{"error":{"message":"Unrecognized request argument supplied: context_management","type":"invalid_request_error"}}',
    b'{"type":"error","error":{"type":"invalid_request_error","message":"context_management: Extra inputs are not permitted"}}',
    b'upstream connect error or disconnect/reset before headers',
]
SEALED = (b'{"model":"gpt-4.1","input":[{"type":"message","role":"user","content":"hi"},'
          b'{"type":"compaction","id":"cmp_1","encrypted_content":"fgc1.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},'
          b'{"type":"message","role":"user","content":"go on"}],'
          b'"context_management":[{"type":"compaction","compact_threshold":1000}]}')

EDITS = [
    {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}},
    {"type": "clear_tool_uses_20250919", "trigger": {"type": "input_tokens", "value": 10},
     "keep": {"type": "tool_uses", "value": 1}, "clear_at_least": {"type": "input_tokens", "value": 1},
     "exclude_tools": ["t"], "clear_tool_inputs": True},
    {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 50000}},
]

SAMPLES = {
    "sse_events": [control(CHAT_STREAM), control(RESPONSES_STREAM), control(ANTHROPIC_STREAM),
                   control(b": comment\n\nevent: e\ndata: a\ndata: b\n\n")],
    "usage_tap": [control(CHAT_STREAM, b"\x02\x05\x0b"), control(RESPONSES_STREAM, b"\x02\x05\x0b"),
                  control(ANTHROPIC_STREAM, b"\x02\x03\x05"), control(CHAT_JSON, b"\x01\x04"),
                  control(ANTHROPIC_JSON, b"\x01\x02")],
    "error_readers": ERRORS,
    "session_key": [b"x-session-id: abc\n" + b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'],
    "stored_state": [b"", bytes([0, 0, 200, 0]), bytes([1, 0, 99, 0, 3, 0, 1, 0]), bytes([5, 0, 40, 0, 6, 0, 1, 0]),
                     bytes([7, 0, 3, 0, 8, 0, 1, 0]), b"{}", b'{"blocks":[],"cut":[]}'],
    "compaction_item": [SEALED, b'{"input":[],"context_management":null}'],
    "outline": [], "chat_request": [], "responses_request": [SEALED], "messages_request": [],
    "event_stream": [control(RESPONSES_STREAM), control(RESPONSES_STREAM.replace(b"\n", b"\r\n"), b"\x02\x01\x09"),
                     control(CHAT_JSON)],
    "anthropic_edits": [],
    # A zstd frame (one RLE block of five "a") and a brotli stream ("abc"), written by
    # hand: the standard library writes neither; then deflate inside gzip (first byte 5).
    "client_request": [control(b"POST /v1/chat/completions HTTP/1.1\r\nhost: f\r\ncontent-length: 5\r\n\r\nhelloGET / HTTP/1.1\r\n\r\n",
                               b"\x02\x05\x0b"),
                       control(b"POST /v1/responses HTTP/1.1\r\ntransfer-encoding: gzip, chunked\r\nexpect: 100-continue\r\n\r\n"
                               b"5;x=1\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n", b"\x02\x03\x05"),
                       control(b"GET /healthz HTTP/1.0\r\nconnection: keep-alive\r\nte: trailers\r\n\r\n"),
                       control(b"\r\nHEAD http://h/v1/models?x=1 HTTP/1.1\r\ncontent-length: 2, 2\r\n\r\nok", b"\x01\x04")],
    "upstream_response": [control(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", b"\x02\x05\x0b"),
                          control(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n"
                                  b"5;x=1\r\nhello\r\n0\r\nx-sum: 1\r\n\r\n", b"\x02\x03\x05"),
                          control(b"HTTP/1.0 200 OK\r\n\r\nuntil close"),
                          control(b"HTTP/1.1 204 No Content\r\n\r\nleft", b"\x01\x04")],
    "request_encoding": [b"\x03" + bytes.fromhex("28b52ffd200515000061"), b"\x02" + bytes.fromhex("0b01806162630300"),
                         b"\x05" + gzip.compress(zlib.compress(b'{"model":"m"}'))],
}
TARGETS = list(SAMPLES)

if __name__ == "__main__":
    main()
