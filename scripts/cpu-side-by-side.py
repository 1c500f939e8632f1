#!/usr/bin/env python3
"""CPU per proxied request of several proxies side by side: foldgate builds (compaction
on or off) and nginx, in front of one mock upstream, measured in interleaved slices.

The latency bench (benches/proxy_latency.rs) compares one foldgate build with nginx and
takes about 15 minutes. This compares any number of builds or settings in a few minutes,
to tell whether a change moved the CPU a request costs. Each round sends every target a
slice of paced requests (RATE a second for SLICE seconds, over one keep-alive
connection, after a short unmeasured warm-up), in an order that rotates by round; a
target's CPU is its process tree's scheduler time (/proc/<pid>/task/*/schedstat) over
the slice. Prints each target's median over the rounds and the median of its per-round
ratio to the first target, which drift of the machine's speed between rounds moves
least. On a shared virtual machine a difference below about 3 % needs several runs.

The request is the latency bench's chat body (system prompt, user turns, tool calls and
results, padded to BODY_KB KiB), keys sorted and compact; the answer is the bench's
`MOCK_RESPONSE`. foldgate runs as users run it (the default configuration, `info` log
to a file) with `compaction.enabled` as the target says.

Usage: scripts/cpu-side-by-side.py [--rounds 30] [--body-kb 2] TARGET...
  TARGET is NAME=KIND:PATH, KIND one of on (foldgate, compaction on), off (foldgate,
  compaction off), nginx. Example:
  scripts/cpu-side-by-side.py nginx=nginx:/usr/sbin/nginx \\
      head=on:target/release/foldgate before=on:/tmp/foldgate-before
Environment: RATE (default 200), SLICE (seconds, default 1.0).
"""

import argparse
import http.client
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


NGINX = """daemon off; master_process on; worker_processes auto; pid {d}/nginx.pid;
error_log {d}/nginx-error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off; client_body_temp_path {d}/cb; proxy_temp_path {d}/px;
  fastcgi_temp_path {d}/fc; uwsgi_temp_path {d}/uw; scgi_temp_path {d}/sc;
  keepalive_requests 1000000; keepalive_timeout 300s;
  upstream mock {{ server 127.0.0.1:{up}; keepalive 64; keepalive_requests 1000000;
                   keepalive_timeout 300s; }}
  server {{ listen 127.0.0.1:{port}; client_max_body_size 32m;
    location / {{ proxy_pass http://mock; proxy_http_version 1.1;
      proxy_set_header Connection ""; proxy_request_buffering off; proxy_buffering off; }} }}
}}
"""

SYSTEM_PROMPT = (
    "You are a coding agent working in a Rust repository. Use the tools to read files, run "
    "commands and edit code. Keep answers short and explain every change you make. Never "
    "invent file contents: read them first."
)
PROSE = [
    "The build fails on the CI runner but passes locally, and the only difference I can see "
    "is the toolchain version pinned in rust-toolchain.toml. ",
    "I ran the test suite again with RUST_BACKTRACE=1 and the panic comes from the session "
    "store when two requests for the same conversation arrive at the same time. ",
    "Looking at src/session/memory.rs, the guard returned by the map is held across an await "
    "point, which can deadlock when the runtime moves the task to another worker. ",
    "The fix is to clone the value out of the map, drop the guard, and only then call the "
    "summarizer; the test below reproduces the original hang in under a second. ",
    "cargo test -p foldgate --test passthrough -- --nocapture shows the streaming test "
    "receiving the first event only after the mock upstream has sent the last one. ",
    "Please keep the public API unchanged and add a regression test next to the existing "
    "ones in tests/streaming.rs, using the fixture-driven mock upstream. ",
]


def prose(length, seed):
    text, i = "", seed
    while len(text) < length:
        text += PROSE[i % len(PROSE)]
        i += 1
    return text[:length]


def compact(value):
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


def chat_body(length):
    """The latency bench's chat body of exactly `length` bytes (see its `chat_body`)."""
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]

    def envelope(last):
        return compact({"model": "gpt-4o-mini", "messages": messages + [{"role": "user", "content": last}],
                        "temperature": 0.2, "max_tokens": 1024, "stream": False})

    size, turn = len(envelope("")), 0
    while size + 1500 < length:
        call = "call_%04d" % turn
        for message in [
            {"role": "user", "content": prose(300, turn)},
            {"role": "assistant", "content": None, "tool_calls": [{"id": call, "type": "function",
             "function": {"name": "read_file", "arguments": '{"path":"src/module_%d.rs"}' % turn}}]},
            {"role": "tool", "tool_call_id": call, "content": prose(700, turn + 2)},
            {"role": "assistant", "content": prose(250, turn + 4)},
        ]:
            size += len(compact(message)) + 1
            messages.append(message)
        turn += 1
    body = envelope(prose(max(0, length - len(envelope(""))), turn))
    assert len(body) == length, (len(body), length)
    return body


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, process, name):
    for _ in range(300):
        if process.poll() is not None:
            sys.exit("%s exited (status %s) before listening" % (name, process.returncode))
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    sys.exit("%s does not listen on %d" % (name, port))


def tree_cpu(root):
    """Scheduler nanoseconds of `root` and its children, all threads."""
    pids = {root}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open("/proc/%s/stat" % entry) as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == root:
                        pids.add(int(entry))
            except OSError:
                pass
    nanos = 0
    for pid in pids:
        try:
            for task in os.listdir("/proc/%d/task" % pid):
                with open("/proc/%d/task/%s/schedstat" % (pid, task)) as f:
                    nanos += int(f.read().split()[0])
        except OSError:
            pass
    return nanos


class Client:
    """Paced requests over one keep-alive connection (opened again if the proxy closed it)."""

    def __init__(self, port, body, rate):
        self.port, self.body, self.rate, self.connection = port, body, rate, None

    def one(self):
        for attempt in range(2):
            if self.connection is None:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                self.connection.request("POST", "/v1/chat/completions", body=self.body, headers={
                    "content-type": "application/json", "authorization": "Bearer sk-side-by-side"})
                response = self.connection.getresponse()
                response.read()
                if response.status != 200:
                    sys.exit("status %d from port %d" % (response.status, self.port))
                return
            except (ConnectionError, http.client.HTTPException):
                self.connection = None
                if attempt:
                    raise

    def send(self, count):
        start = time.perf_counter()
        for i in range(count):
            wait = start + i / self.rate - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            self.one()


def target(spec, upstream, work, nginx_conf=NGINX, **settings):
    """What runs a target, from NAME=KIND:PATH: its name, port, home directory (made in
    `work`), command and environment (None: inherited). nginx runs with `nginx_conf`;
    foldgate in the default configuration (`info` log), compaction as KIND says, with
    `settings` (more FOLDGATE_ variables) added. Both proxy to port `upstream`."""
    name, _, rest = spec.partition("=")
    kind, _, path = rest.partition(":")
    if kind not in ("on", "off", "nginx") or not name or not path:
        sys.exit("a target is NAME=on|off|nginx:PATH, not %r" % spec)
    port, home = free_port(), tempfile.mkdtemp(dir=work)
    if kind == "nginx":
        conf = os.path.join(home, "nginx.conf")
        with open(conf, "w") as f:
            f.write(nginx_conf.format(d=home, up=upstream, port=port))
        return name, port, home, [path, "-p", home, "-c", conf, "-e", os.path.join(home, "err.log")], None
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("FOLDGATE_", "OTEL_")) and k != "RUST_LOG"}
    env.update(FOLDGATE_LISTEN="127.0.0.1:%d" % port,
               FOLDGATE_UPSTREAM_URL="http://127.0.0.1:%d/v1" % upstream,
               FOLDGATE_LOG__LEVEL="info",
               FOLDGATE_COMPACTION__ENABLED="true" if kind == "on" else "false", **settings)
    return name, port, home, [os.path.abspath(path), "serve"], env


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--body-kb", type=int, default=2)
    parser.add_argument("targets", nargs="+", metavar="NAME=KIND:PATH")
    args = parser.parse_args()
    rate = int(os.environ.get("RATE", "200"))
    slice_requests = int(rate * float(os.environ.get("SLICE", "1.0")))
    body = chat_body(args.body_kb * 1024)
    work = tempfile.mkdtemp(prefix="cpu-side-by-side-")
    processes = []
    try:
        upstream = free_port()
        mock_script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mock-chat-upstream.py")
        mock = subprocess.Popen([sys.executable, mock_script, str(upstream), "bench"])
        processes.append(mock)
        wait_port(upstream, mock, "the mock upstream")
        targets = []
        for spec in args.targets:
            name, port, home, command, env = target(spec, upstream, work)
            with open(os.path.join(home, "output"), "w") as output:
                process = subprocess.Popen(command, env=env, cwd=home, stdout=output, stderr=subprocess.STDOUT)
            processes.append(process)
            wait_port(port, process, name)
            targets.append((name, process.pid, Client(port, body, rate)))
        for _, _, client in targets:
            client.send(2 * rate)
        cpu = {name: [] for name, _, _ in targets}
        for round_ in range(args.rounds):
            shift = round_ % len(targets)
            for name, pid, client in targets[shift:] + targets[:shift]:
                client.send(rate // 10)
                before = tree_cpu(pid)
                client.send(slice_requests)
                cpu[name].append((tree_cpu(pid) - before) / 1000 / slice_requests)
        first = targets[0][0]
        print("CPU per request, %d KiB chat body, %d rounds of %d requests at %d/s:"
              % (args.body_kb, args.rounds, slice_requests, rate))
        for name, _, _ in targets:
            ratios = [a / b for a, b in zip(cpu[name], cpu[first])]
            print("  %-12s median %6.1f µs   per-round ratio to %s: median %.3f"
                  % (name, statistics.median(cpu[name]), first, statistics.median(ratios)))
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()


if __name__ == "__main__":
    main()
