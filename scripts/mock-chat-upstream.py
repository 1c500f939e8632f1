#!/usr/bin/env python3
"""A mock chat-completions upstream for the measuring scripts: answers every request on
127.0.0.1:PORT (HTTP/1.1, keep-alive, the request read whole) with one fixed
`chat.completion`. The answer is `plain` (1.2 KB, three usage members) or `bench`
(the latency bench's `MOCK_RESPONSE`, benches/proxy_latency.rs, with OpenAI's usage
details). A request to `/v1/messages` gets an Anthropic `message` of the same text. A
request that asks for a stream (`"stream": true`) gets an event stream in its API's
shape instead (chat chunks, Responses events, Messages events; usage in its last
events), chunked, one chunk an event.

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


def event_stream(events):
    """An event stream's whole HTTP answer: one chunk an event."""
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events)
    return (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n" + chunks + b"0\r\n\r\n")


TEXT = "a" * 500
CHAT_EVENTS = [b"data: %s\n\n" % e.encode() for e in (
    '{"id":"chatcmpl-x","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,'
    '"delta":{"role":"assistant","content":""},"finish_reason":null}]}',
    '{"id":"chatcmpl-x","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,'
    '"delta":{"content":"' + TEXT + '"},"finish_reason":null}]}',
    '{"id":"chatcmpl-x","object":"chat.completion.chunk","model":"gpt-4o","choices":[{"index":0,'
    '"delta":{},"finish_reason":"stop"}],"usage":null}',
    '{"id":"chatcmpl-x","object":"chat.completion.chunk","model":"gpt-4o","choices":[],'
    '"usage":{"prompt_tokens":500,"completion_tokens":20,"total_tokens":520}}',
    "[DONE]")]
RESPONSE = ('{"id":"resp_mock","object":"response","model":"gpt-4o","status":"%s","output":[%s],'
            '"usage":%s}')
OUTPUT = ('{"type":"message","id":"msg_mock","role":"assistant","status":"completed",'
          '"content":[{"type":"output_text","text":"' + TEXT + '","annotations":[]}]}')
RESPONSES_EVENTS = [b"event: %s\ndata: %s\n\n" % (name.encode(), data.encode()) for name, data in (
    ("response.created", '{"type":"response.created","response":%s}'
     % (RESPONSE % ("in_progress", "", "null"))),
    ("response.output_text.delta", '{"type":"response.output_text.delta","item_id":"msg_mock",'
     '"output_index":0,"content_index":0,"delta":"' + TEXT + '"}'),
    ("response.completed", '{"type":"response.completed","response":%s}' % (RESPONSE % (
        "completed", OUTPUT, '{"input_tokens":500,"output_tokens":20,"total_tokens":520}'))))]
MESSAGES_EVENTS = [b"event: %s\ndata: %s\n\n" % (name.encode(), data.encode()) for name, data in (
    ("message_start", '{"type":"message_start","message":{"id":"msg_mock","type":"message",'
     '"role":"assistant","model":"claude-sonnet-4-5","content":[],"stop_reason":null,'
     '"usage":{"input_tokens":500,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,'
     '"output_tokens":1}}}'),
    ("content_block_start", '{"type":"content_block_start","index":0,'
     '"content_block":{"type":"text","text":""}}'),
    ("content_block_delta", '{"type":"content_block_delta","index":0,'
     '"delta":{"type":"text_delta","text":"' + TEXT + '"}}'),
    ("content_block_stop", '{"type":"content_block_stop","index":0}'),
    ("message_delta", '{"type":"message_delta","delta":{"stop_reason":"end_turn"},'
     '"usage":{"output_tokens":20}}'),
    ("message_stop", '{"type":"message_stop"}'))]


async def serve(port, answer):
    response, message = framed(answer), framed(MESSAGE)
    streams = {b"/v1/messages": event_stream(MESSAGES_EVENTS),
               b"/v1/responses": event_stream(RESPONSES_EVENTS),
               b"": event_stream(CHAT_EVENTS)}

    async def handle(reader, writer):
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":")[1])
                body = await reader.readexactly(length) if length else b""
                path = head.split(b" ", 2)[1]
                if b'"stream":true' in body or b'"stream": true' in body:
                    writer.write(next(v for k, v in streams.items() if path.startswith(k)))
                else:
                    writer.write(message if path.startswith(b"/v1/messages") else response)
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
