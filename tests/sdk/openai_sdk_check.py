"""The official OpenAI Python SDK pointed at foldgate with base_url.

Usage: openai_sdk_check.py BASE_URL MESSAGES_JSON
Prints one JSON line per check; exits non-zero on the first failure.
"""

import json
import sys

import openai


def main() -> int:
    base_url, messages_file = sys.argv[1], sys.argv[2]
    with open(messages_file, encoding="utf-8") as f:
        messages = json.load(f)
    client = openai.OpenAI(base_url=base_url, api_key="sk-sdk-test", max_retries=0)
    headers = {"x-session-id": "sdk-session"}

    raw = client.chat.completions.with_raw_response.create(
        model="gpt-4o", messages=messages, max_tokens=64, extra_headers=headers
    )
    completion = raw.parse()
    print(json.dumps({
        "check": "plain",
        "content": completion.choices[0].message.content,
        "outcome": raw.headers.get("x-foldgate-outcome"),
        "prompt_tokens": completion.usage.prompt_tokens,
        "request_id": completion._request_id,
        "foldgate_request_id": raw.headers.get("x-foldgate-request-id"),
    }))

    # The SDK's own way to the provider's request id, on a plain call.
    plain = client.chat.completions.create(
        model="gpt-4o", messages=messages[:2], max_tokens=8, extra_headers=headers
    )
    print(json.dumps({"check": "request_id", "request_id": plain._request_id}))

    stream = client.chat.completions.create(
        model="gpt-4o",
        messages=messages,
        max_tokens=64,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers=headers,
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        if chunk.usage:
            usage = chunk.usage.prompt_tokens
    print(json.dumps({
        "check": "stream",
        "content": text,
        "prompt_tokens": usage,
        "request_id": stream.response.headers.get("x-request-id"),
    }))

    models = client.models.list()
    print(json.dumps({"check": "models", "ids": [m.id for m in models.data]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
