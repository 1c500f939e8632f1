"""The official OpenAI Python SDK's Responses WebSocket mode (`client.responses.connect()`)
through foldgate, as Codex CLI uses it: a warm-up (`generate: false`) carrying the task,
then N responses, each frame carrying only a large tool output and naming the last
response (`previous_response_id`, `store: false`).

Usage: openai_websocket_check.py STEPS BASE_URL
Prints one JSON line per response; exits non-zero on an unexpected failure.
"""

import json
import sys

import openai


def main() -> int:
    steps, url = int(sys.argv[1]), sys.argv[2]
    client = openai.OpenAI(base_url=url, api_key="sk-ws-test", max_retries=0)
    model = "gpt-4.1"
    common = {"model": model, "instructions": "You are a careful coding agent.", "store": False,
              "stream_id": "lane-1"}
    with client.responses.connect(extra_headers={"x-session-id": "ws-check"}) as connection:

        def exchange(frame):
            connection.send({"type": "response.create", **common, **frame})
            types = []
            while True:
                event = json.loads(connection.recv_bytes())
                types.append(event["type"] if event.get("stream_id") == "lane-1" else "no lane")
                if event["type"] in ("response.completed", "response.failed", "error"):
                    return event, types

        task = [{"role": "user", "content": "Fix the failing parser test in src/parser.rs."}]
        warm, types = exchange({"input": task, "generate": False})
        print(json.dumps({"step": "warm", "types": types,
                          "output": warm["response"]["output"]}), flush=True)
        last, _ = exchange({"input": [], "previous_response_id": warm["response"]["id"]})
        for step in range(steps):
            if last["type"] != "response.completed":
                print(json.dumps({"step": step, "failed": last}), flush=True)
                return 1
            call = next(o for o in last["response"]["output"] if o["type"] == "function_call")
            output = f"step {step}: " + " ".join(f"line {step}-{i} of the build log" for i in range(700))
            item = {"type": "function_call_output", "call_id": call["call_id"], "output": output}
            last, types = exchange({"input": [item], "previous_response_id": last["response"]["id"]})
            print(json.dumps({"step": step, "types": types,
                              "output": [o["type"] for o in last.get("response", {}).get("output", [])]}),
                  flush=True)
        # Codex's remote compaction over the socket: one compaction item back.
        trigger, types = exchange({"input": [{"type": "compaction_trigger"}],
                                   "previous_response_id": last["response"]["id"]})
        print(json.dumps({"step": "trigger", "types": types,
                          "output": [o["type"] for o in trigger["response"]["output"]]}),
              flush=True)
        # The next turn continues from the compaction.
        after, types = exchange({"input": [{"role": "user", "content": "Now run the parser tests."}],
                                 "previous_response_id": trigger["response"]["id"]})
        print(json.dumps({"step": "after_trigger", "types": types, "event": after,
                          "output": [o["type"] for o in after.get("response", {}).get("output", [])]}),
              flush=True)
        # A frame naming a response this connection does not know: an error event.
        unknown, _ = exchange({"input": [], "previous_response_id": "resp_elsewhere"})
        print(json.dumps({"step": "unknown", "event": unknown}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
