#!/usr/bin/env python3
"""Sends N proxied requests, one after another over one keep-alive connection, to a
proxy on 127.0.0.1:PORT: the measuring scripts' conversation (system prompt, user turns,
tool calls, tool results and assistant answers) padded to BODY_KB KiB, as a chat
completions request (API `chat`), a Responses request (`responses`: `instructions` and
`input` items) or an Anthropic Messages request (`messages`: `system`, `tool_use` and
`tool_result` blocks). Every answer must be 200.

Environment: SHAPE `bench` writes the request as `serde_json` does (keys sorted,
compact), as the latency bench sends it; anything else as Python's `json` does. STREAM
`1` asks for an event stream (chat also for its usage).

Usage: SHAPE=plain|bench STREAM=0|1 scripts/chat-load.py PORT N BODY_KB API
Used by scripts/instructions-per-request.sh and scripts/pgo-profile.sh.
"""
import http.client, json, os, sys
port, n, size, api = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]) * 1024, sys.argv[4]
# The bench's request: keys sorted, no spaces (as serde_json writes its json! values).
compact = {"sort_keys": True, "separators": (",", ":")} if os.environ.get("SHAPE") == "bench" else {}
stream = os.environ.get("STREAM") == "1"
usage = {"stream_options": {"include_usage": True}} if stream else {}
words = "the parser reads each frame and the writer flushes buffered output to disk".split()
def prose(n, seed):
    out = []
    while sum(len(w) + 1 for w in out) < n:
        out.append(words[(len(out) * 7 + seed) % len(words)])
    return " ".join(out)[:n]
def items(messages):
    out = []
    for m in messages[1:]:
        if m.get("tool_calls"):
            out += [{"type": "function_call", "call_id": c["id"], "name": c["function"]["name"],
                     "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
        elif m["role"] == "tool":
            out.append({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out
def blocks(messages):
    out = []
    for m in messages[1:]:
        if m.get("tool_calls"):
            out.append({"role": "assistant", "content": [
                {"type": "tool_use", "id": c["id"], "name": c["function"]["name"],
                 "input": json.loads(c["function"]["arguments"])} for c in m["tool_calls"]]})
        elif m["role"] == "tool":
            out.append({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}]})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out
def envelope(messages, last):
    if api == "messages":
        return json.dumps({"model": "claude-sonnet-4-5", "system": messages[0]["content"],
                           "messages": blocks(messages + [{"role": "user", "content": last}]),
                           "max_tokens": 1024, "stream": stream}, **compact).encode()
    if api == "responses":
        return json.dumps({"model": "gpt-4o-mini", "instructions": messages[0]["content"],
                           "input": items(messages + [{"role": "user", "content": last}]),
                           "temperature": 0.2, "max_output_tokens": 1024, "stream": stream}).encode()
    return json.dumps({"model": "gpt-4o-mini", "messages": messages + [{"role": "user", "content": last}],
                       "temperature": 0.2, "max_tokens": 1024, "stream": stream, **usage}, **compact).encode()
messages = [{"role": "system", "content": prose(600, 1)}]
turn = 0
while len(envelope(messages, "")) + 1500 < size:
    call = "call_%04d" % turn
    messages += [{"role": "user", "content": prose(300, turn)},
                 {"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function",
                  "function": {"name": "read_file", "arguments": json.dumps({"path": "src/m%d.rs" % turn})}}]},
                 {"role": "tool", "tool_call_id": call, "content": prose(700, turn + 2)},
                 {"role": "assistant", "content": prose(250, turn + 4)}]
    turn += 1
body = envelope(messages, prose(max(0, size - len(envelope(messages, ""))), turn))
connection = http.client.HTTPConnection("127.0.0.1", port)
for _ in range(n):
    path = {"responses": "/v1/responses", "messages": "/v1/messages"}.get(api, "/v1/chat/completions")
    headers = {"content-type": "application/json", "authorization": "Bearer sk-test"}
    if api == "messages":
        headers = {"content-type": "application/json", "x-api-key": "sk-ant-test",
                   "anthropic-version": "2023-06-01"}
    connection.request("POST", path, body=body, headers=headers)
    response = connection.getresponse()
    response.read()
    assert response.status == 200, response.status
