"""The official Anthropic Python SDK pointed at foldgate with base_url.

Usage: anthropic_sdk_check.py BASE_URL REQUESTS_JSON OUT_DIR
REQUESTS_JSON is a list of {"name", "api_key", "session", "kind" ("create", "stream" or
"count_tokens"), "params"}. Prints one JSON line per request; writes the exact body the
SDK sent for request i to OUT_DIR/sent_<i>.json. Exits non-zero on the first failure.
"""

import json
import os
import sys

import anthropic

try:  # newer SDKs ship their own fork of httpx
    import httpx2 as httpx
except ImportError:
    import httpx


def main() -> int:
    base_url, requests_file, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(requests_file, encoding="utf-8") as f:
        requests = json.load(f)
    sent = []

    def record(request: httpx.Request) -> None:
        sent.append(request.read())

    clients = {}
    for i, req in enumerate(requests):
        key = req["api_key"]
        if key not in clients:
            http_client = httpx.Client(event_hooks={"request": [record]})
            clients[key] = anthropic.Anthropic(
                base_url=base_url, api_key=key, max_retries=0, http_client=http_client
            )
        client = clients[key]
        headers = {"x-session-id": req["session"]}
        before = len(sent)
        line = {"name": req["name"], "index": i}
        if req["kind"] == "count_tokens":
            raw = client.messages.with_raw_response.count_tokens(
                **req["params"], extra_headers=headers
            )
            line["input_tokens"] = raw.parse().input_tokens
        elif req["kind"] == "stream":
            raw = client.messages.with_raw_response.create(
                **req["params"], stream=True, extra_headers=headers
            )
            text, input_tokens, output_tokens = "", None, None
            for event in raw.parse():
                if event.type == "message_start":
                    input_tokens = event.message.usage.input_tokens
                elif event.type == "content_block_delta" and event.delta.type == "text_delta":
                    text += event.delta.text
                elif event.type == "message_delta":
                    output_tokens = event.usage.output_tokens
            line.update(text=text, input_tokens=input_tokens, output_tokens=output_tokens)
        else:
            raw = client.messages.with_raw_response.create(**req["params"], extra_headers=headers)
            message = raw.parse()
            line.update(
                text="".join(b.text for b in message.content if b.type == "text"),
                input_tokens=message.usage.input_tokens,
                request_id=message._request_id,
            )
        for name in [
            "x-foldgate-outcome",
            "x-foldgate-session",
            "x-foldgate-tokens-before",
            "x-foldgate-tokens-after",
            "request-id",
        ]:
            line[name] = raw.headers.get(name)
        if len(sent) != before + 1:
            raise SystemExit(f"request {i}: the SDK sent {len(sent) - before} requests")
        with open(os.path.join(out_dir, f"sent_{i}.json"), "wb") as f:
            f.write(sent[-1])
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
