"""The official OpenAI Python SDK continuing responses by id over HTTP through foldgate:
one task, then N steps, each sending only a large tool output with
`previous_response_id` naming the last response, alternating between the base URLs
given (replicas sharing a store); every other step streamed.

Usage: openai_chain_check.py STEPS BASE_URL [BASE_URL...]
Prints one JSON line per response; exits non-zero on an unexpected failure.
"""

import json
import sys

import openai


def main() -> int:
    steps, urls = int(sys.argv[1]), sys.argv[2:]
    clients = [openai.OpenAI(base_url=u, api_key="sk-chain-test", max_retries=0) for u in urls]
    model = "gpt-4.1"
    raw = clients[0].responses.with_raw_response.create(
        model=model,
        instructions="You are a careful coding agent.",
        input="Fix the failing parser test in src/parser.rs. Never touch Cargo.lock.",
        store=True,
    )
    response = raw.parse()
    for step in range(steps):
        call = next(o for o in response.output if o.type == "function_call")
        output = f"step {step}: " + " ".join(f"line {step}-{i} of the build log" for i in range(700))
        client = clients[(step + 1) % len(clients)]
        request = dict(
            model=model,
            instructions="You are a careful coding agent.",
            input=[{"type": "function_call_output", "call_id": call.call_id, "output": output}],
            previous_response_id=response.id,
            store=True,
        )
        if step % 2:
            # Every other step streamed, as the Agents SDK streams.
            with client.responses.with_streaming_response.create(**request, stream=True) as raw:
                outcome = raw.headers.get("x-foldgate-outcome")
                for event in raw.parse():
                    if event.type == "response.completed":
                        response = event.response
        else:
            raw = client.responses.with_raw_response.create(**request)
            outcome = raw.headers.get("x-foldgate-outcome")
            response = raw.parse()
        print(json.dumps({"step": step, "id": response.id,
                          "types": [o.type for o in response.output],
                          "outcome": outcome}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
