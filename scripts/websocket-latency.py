#!/usr/bin/env python3
"""A Responses request's added latency through foldgate, over its WebSocket mode beside
the same request as a streamed POST, with the mock upstream asked directly as the
baseline, in one run.

The mock upstream answers every `POST /v1/responses` with a short event stream
(`response.created`, one text delta, `response.completed` with usage). Each mode sends N
sequential requests of the same 2 KiB conversation (a system prompt, user turns, tool
calls and outputs), below the trigger, and times each to its `response.completed`:

- direct: streamed POSTs to the mock (keep-alive);
- post: the same POSTs to foldgate;
- websocket: the same body as `response.create` frames on one foldgate WebSocket.

foldgate runs in its default configuration (compaction on). Prints p50 and p90 of each,
and the added p50 over direct of post and websocket.

Usage: [BIN=target/release/foldgate] scripts/websocket-latency.py [N]   (default N 500)
Needs python3 with `websockets` (pip install websockets); builds foldgate when BIN is
the default and missing.
"""

import asyncio
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

from websockets.sync.client import connect

N = int(sys.argv[1]) if len(sys.argv) > 1 else 500
BIN = os.environ.get("BIN", "target/release/foldgate")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def events():
    created = {"type": "response.created", "sequence_number": 0,
               "response": {"id": "resp_1", "object": "response", "status": "in_progress", "output": []}}
    delta = {"type": "response.output_text.delta", "sequence_number": 1, "delta": "a" * 200}
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": "a" * 200}]}
    completed = {"type": "response.completed", "sequence_number": 2,
                 "response": {"id": "resp_1", "object": "response", "status": "completed",
                              "output": [message],
                              "usage": {"input_tokens": 500, "output_tokens": 20, "total_tokens": 520}}}
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in (created, delta, completed)).encode()


EVENTS = events()
HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n\r\n"
        % len(EVENTS))


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            writer.write(HEAD + EVENTS)
    except Exception:
        writer.close()


def mock(port):
    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()
    asyncio.run(main())


def conversation():
    items = [{"role": "user", "content": "Fix the failing parser test in src/parser.rs."}]
    n = 0
    while len(json.dumps(items)) < 2048:
        n += 1
        items.append({"type": "function_call", "call_id": f"c{n}", "name": "shell",
                      "arguments": json.dumps({"cmd": f"sed -n {n},{n + 40}p src/parser.rs"})})
        items.append({"type": "function_call_output", "call_id": f"c{n}",
                      "output": f"line {n}: fn parse_{n}() -> Result<Ast> {{ todo!() }}"})
    return {"model": "gpt-4.1", "instructions": "You are a careful coding agent.",
            "input": items, "stream": True, "store": False}


def timed_posts(port, body):
    conn = http.client.HTTPConnection("127.0.0.1", port)
    headers = {"content-type": "application/json", "authorization": "Bearer sk-bench",
               "x-session-id": "bench-post"}
    data = json.dumps(body).encode()
    times = []
    for _ in range(N + 50):
        start = time.perf_counter()
        conn.request("POST", "/v1/responses", body=data, headers=headers)
        answer = conn.getresponse().read()
        assert b"response.completed" in answer, answer[:200]
        times.append(time.perf_counter() - start)
    return times[50:]


def timed_frames(port, body):
    frame = json.dumps({"type": "response.create", **{k: v for k, v in body.items() if k != "stream"}})
    headers = {"authorization": "Bearer sk-bench", "x-session-id": "bench-ws"}
    times = []
    with connect(f"ws://127.0.0.1:{port}/v1/responses", additional_headers=headers,
                 compression=None) as ws:
        for _ in range(N + 50):
            start = time.perf_counter()
            ws.send(frame)
            while json.loads(ws.recv())["type"] != "response.completed":
                pass
            times.append(time.perf_counter() - start)
    return times[50:]


def wait_for(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port}")


def main():
    if BIN == "target/release/foldgate" and not os.path.exists(BIN):
        subprocess.run(["cargo", "build", "--release", "--quiet"], check=True)
    mock_port, fg_port = free_port(), free_port()
    threading.Thread(target=mock, args=(mock_port,), daemon=True).start()
    env = {**os.environ, "FOLDGATE_LISTEN": f"127.0.0.1:{fg_port}",
           "FOLDGATE_UPSTREAM_URL": f"http://127.0.0.1:{mock_port}/v1"}
    foldgate = subprocess.Popen([BIN, "serve"], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    try:
        wait_for(mock_port)
        wait_for(fg_port)
        body = conversation()
        results = {"direct": timed_posts(mock_port, body), "post": timed_posts(fg_port, body),
                   "websocket": timed_frames(fg_port, body)}
    finally:
        foldgate.terminate()
        foldgate.wait()
    p50 = {k: statistics.median(v) * 1000 for k, v in results.items()}
    for name, times in results.items():
        p90 = statistics.quantiles(times, n=10)[-1] * 1000
        print(f"  {name:9} p50 {p50[name]:.3f} ms  p90 {p90:.3f} ms  ({len(times)} requests)")
    post, ws = p50["post"] - p50["direct"], p50["websocket"] - p50["direct"]
    print(f"  added p50 over direct: post {post:.3f} ms, websocket {ws:.3f} ms")


if __name__ == "__main__":
    main()
