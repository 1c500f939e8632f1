#!/usr/bin/env python3
"""A mock chat-completions upstream for the measuring scripts: answers every request on
127.0.0.1:PORT (HTTP/1.1, keep-alive, the request read whole) with one fixed
`chat.completion`. The answer is `plain` (1.2 KB, three usage members) or `bench`
(the latency bench's `MOCK_RESPONSE`, benches/proxy_latency.rs, with OpenAI's usage
details). A request to `/v1/messages` gets an Anthropic `message` of the same text.

Usage: scripts/mock-chat-upstream.py PORT [plain|bench]
"""

import asyncio
import sys

PLAIN = ('{"id":"chatcmpl-x","object":"chat.completion","model":"gpt-4o","choices":[{"index":0,'
         '"message":{"role":"assistant","content":"' + 'a' * 1050 + '"},"finish_reason":"stop"}],'
         '"usage":{"prompt_tokens":500,"completion_tokens":20,"total_tokens":520}}').encode()
# benches/proxy_latency.rs, MOCK_RESPONSE.
BENCH = b'{"id":"chatcmpl-proxybench0001","object":"chat.completion","created":1763800000,"model":"gpt-4o-mini-2024-07-18","choices":[{"index":0,"message":{"role":"assistant","content":"The failing test comes from the retry loop in `fetch_with_backoff`: the deadline is computed once before the loop, so after the first timeout every later attempt starts with no time left and fails immediately. Move the deadline computation inside the loop, or pass the remaining budget explicitly to each attempt. I also noticed that the error from the last attempt is discarded; returning it instead of a generic timeout error will make the logs far easier to read. Here is the smallest change that fixes both issues without touching the public signature of the function, and a regression test that fails before the change and passes after it.","refusal":null,"annotations":[]},"logprobs":null,"finish_reason":"stop"}],"usage":{"prompt_tokens":512,"completion_tokens":118,"total_tokens":630,"prompt_tokens_details":{"cached_tokens":0,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":0,"audio_tokens":0,"accepted_prediction_tokens":0,"rejected_prediction_tokens":0}},"service_tier":"default","system_fingerprint":"fp_proxybench"}'
# The Messages API's answer, with Anthropic's usage members.
MESSAGE = ('{"id":"msg_mock0001","type":"message","role":"assistant","model":"claude-sonnet-4-5",'
           '"content":[{"type":"text","text":"' + 'a' * 1050 + '"}],"stop_reason":"end_turn",'
           '"stop_sequence":null,"usage":{"input_tokens":500,"cache_creation_input_tokens":0,'
           '"cache_read_input_tokens":0,"output_tokens":20}}').encode()


def framed(answer):
    return (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
            % len(answer) + answer)


async def serve(port, answer):
    response, message = framed(answer), framed(MESSAGE)

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
                writer.write(message if head.startswith(b"POST /v1/messages") else response)
        except Exception:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    shape = sys.argv[2] if len(sys.argv) > 2 else "plain"
    if shape not in ("plain", "bench"):
        sys.exit("the answer is plain or bench, not %r" % shape)
    asyncio.run(serve(int(sys.argv[1]), BENCH if shape == "bench" else PLAIN))
