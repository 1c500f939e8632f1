"""The official OpenAI Python SDK's Responses API pointed at foldgate with base_url.

Usage: openai_responses_check.py BASE_URL SESSION_JSON OUT_DIR
SESSION_JSON holds {"instructions", "items", "more", "invalid"}. Every request body the
SDK sends is written to OUT_DIR/sent_<n>.json (n: 0, 1, ...), byte for byte, so the test
can compare it with what foldgate forwarded. Prints one JSON line per check; exits
non-zero on an unexpected failure.
"""

import json
import os
import sys

import openai


def main() -> int:
    base_url, session_file, out_dir = sys.argv[1], sys.argv[2], sys.argv[3]
    with open(session_file, encoding="utf-8") as f:
        session = json.load(f)
    sent = []

    def record(request) -> None:
        path = os.path.join(out_dir, f"sent_{len(sent)}.json")
        with open(path, "wb") as out:
            out.write(request.read())
        sent.append(path)

    # The SDK's own client class (whichever HTTP library it ships with), with a hook.
    http_client = openai.DefaultHttpxClient(event_hooks={"request": [record]})
    client = openai.OpenAI(
        base_url=base_url, api_key="sk-sdk-test", max_retries=0, http_client=http_client
    )
    headers = {"x-session-id": "codex-session"}
    common = {
        "model": "gpt-4.1",
        "instructions": session["instructions"],
        "max_output_tokens": 512,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "extra_headers": headers,
    }
    items = session["items"]

    def report(check, raw, response):
        print(json.dumps({
            "check": check,
            "text": response.output_text,
            "outcome": raw.headers.get("x-foldgate-outcome"),
            "tokens_before": raw.headers.get("x-foldgate-tokens-before"),
            "tokens_after": raw.headers.get("x-foldgate-tokens-after"),
            "input_tokens": response.usage.input_tokens,
            "cached_tokens": response.usage.input_tokens_details.cached_tokens,
        }), flush=True)

    # 0: the start of the session, far below the trigger.
    raw = client.responses.with_raw_response.create(input=items[:4], **common)
    report("small", raw, raw.parse())

    # 1: the whole session, over the trigger.
    raw = client.responses.with_raw_response.create(input=items, **common)
    report("long", raw, raw.parse())

    # 2: one more round, streamed.
    raw = client.responses.with_raw_response.create(
        input=items + session["more"], stream=True, **common
    )
    text, usage = "", None
    for event in raw.parse():
        if event.type == "response.output_text.delta":
            text += event.delta
        if event.type == "response.completed":
            usage = event.response.usage.input_tokens
    print(json.dumps({
        "check": "stream",
        "text": text,
        "outcome": raw.headers.get("x-foldgate-outcome"),
        "tokens_after": raw.headers.get("x-foldgate-tokens-after"),
        "input_tokens": usage,
    }), flush=True)

    # 3: server-side state: the provider holds the history.
    raw = client.responses.with_raw_response.create(
        previous_response_id="resp_earlier", input=items, **common
    )
    report("previous_response_id", raw, raw.parse())

    # 4: an encrypted item the provider cannot decrypt.
    try:
        client.responses.create(input=items + session["invalid"], **common)
        print(json.dumps({"check": "invalid", "status": 200}), flush=True)
    except openai.BadRequestError as e:
        print(json.dumps({
            "check": "invalid",
            "status": e.status_code,
            "code": e.code,
            "body": e.response.text,
            "outcome": e.response.headers.get("x-foldgate-outcome"),
        }), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
