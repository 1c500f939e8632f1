#!/usr/bin/env python3
"""Memory a proxied request touches: distinct cache lines (64 bytes) and pages (4 KiB) of
data and of code, per request, for foldgate (compaction on and off) and nginx in front
of one mock upstream.

Between two paced requests the client, the upstream and the kernel evict much of a
proxy's working set, so at 200 requests a second a request's user-space time depends on
how much memory it touches as well as on the instructions it runs (which
scripts/instructions-per-request.sh counts). Each proxy runs
alone under valgrind's lackey (`--trace-mem=yes`: every load, store and instruction
fetch), with one connection thread or worker. Requests are sent one at a time; what the
trace holds from a request's start until it has been quiet for half a second is that
request (the proxy's once-a-second tick may fall in a window: the median leaves it out).
Prints, for each target, the median over the requests after two of warm-up, and the
data lines split by region (the binary's read-only data, its writable data, thread
stacks, other anonymous memory such as the heap, shared libraries), averaged.

The request and answer are those of `scripts/cpu-side-by-side.py` (the latency bench's
chat body, BODY_KB KiB, and its `MOCK_RESPONSE`); foldgate runs in the default
configuration (`info` log), with `compaction.enabled` as the target says.

Usage: scripts/footprint-per-request.py [--requests 10] [--body-kb 2] TARGET...
  TARGET is NAME=KIND:PATH as in scripts/cpu-side-by-side.py (KIND on, off or nginx).
Needs valgrind (apt-get install -y valgrind). Slow: a foldgate start under lackey takes
a minute or two.
"""

import argparse
import collections
import importlib.util
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.util.spec_from_file_location("side_by_side", os.path.join(HERE, "cpu-side-by-side.py"))
side_by_side = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(side_by_side)

# The side-by-side script's nginx, one worker and no master (as under callgrind).
NGINX_ONE_WORKER = side_by_side.NGINX.replace(
    "master_process on; worker_processes auto;", "master_process off; worker_processes 1;")
assert "worker_processes 1;" in NGINX_ONE_WORKER

QUIET = 0.5  # seconds without an access that end a request's trace


class Trace(threading.Thread):
    """lackey's trace, read off its pipe as it comes (a proxy blocks when the pipe is
    full); parsed only while a request is recorded."""

    def __init__(self, fd):
        super().__init__(daemon=True)
        self.fd, self.pending, self.last = fd, b"", time.time()
        self.recording, self.data, self.code = False, set(), set()
        self.lock = threading.Lock()

    def run(self):
        while True:
            chunk = os.read(self.fd, 1 << 20)
            if not chunk:
                return
            with self.lock:
                self.last = time.time()
                if not self.recording:
                    self.pending = b""
                    continue
                lines = (self.pending + chunk).split(b"\n")
                self.pending = lines.pop()
                for line in lines:
                    # "I  04012345,3" for a fetch, " L 0401,8", " S ...", " M ..." for data.
                    if len(line) < 5 or line.startswith(b"="):
                        continue
                    try:
                        address = int(line[3:].split(b",", 1)[0], 16)
                    except ValueError:
                        continue
                    (self.code if line[0:1] == b"I" else self.data).add(address >> 6)

    def quiet(self, seconds):
        """Waits until `seconds` pass without an access."""
        while True:
            with self.lock:
                left = self.last + seconds - time.time()
            if left <= 0:
                return
            time.sleep(left)

    def record(self, action):
        """The lines (data, code) touched from `action` until the trace is quiet."""
        with self.lock:
            self.recording, self.pending, self.data, self.code = True, b"", set(), set()
        action()
        self.quiet(QUIET)
        with self.lock:
            self.recording = False
            return self.data, self.code


def regions(pid, binary):
    """(start, end, name) of each mapping of `pid`, named for what it holds: `binary`'s
    sections, shared libraries, thread stacks (an anonymous mapping above a guard page)
    and other anonymous memory (the heap; under valgrind, a main thread's stack too)."""
    out, guard_below = [], False
    with open("/proc/%d/maps" % pid) as f:
        for line in f:
            fields = line.split()
            start, end = (int(x, 16) for x in fields[0].split("-"))
            mode, path = fields[1], (fields[5] if len(fields) > 5 else "")
            if path and os.path.realpath(path) == binary:
                name = "binary " + ("code" if "x" in mode else "data" if "w" in mode else "read-only")
            elif ".so" in path:
                name = "libraries"
            elif path == "[stack]" or (path == "" and guard_below and end - start <= 8 << 20):
                name = "thread stacks"
            elif path == "":
                name = "other anonymous memory"
            else:
                name = "other"
            guard_below = mode == "---p" and end - start == 4096
            out.append((start, end, name))
    return out


def name_of(maps, line):
    address = line << 6
    for start, end, name in maps:
        if start <= address < end:
            return name
    return "other"


def measure(name, command, env, port, body, requests, home):
    """Median lines and pages a request touches, and the mean split of its data lines;
    the target runs in `home`, where valgrind's output is kept."""
    output = os.path.join(home, "valgrind-output")
    read_fd, write_fd = os.pipe()
    with open(output, "w") as stderr:
        process = subprocess.Popen(
            ["valgrind", "--tool=lackey", "--trace-mem=yes", "--log-fd=%d" % write_fd] + command,
            env=env, cwd=home, stdout=subprocess.DEVNULL, stderr=stderr,
            pass_fds=(write_fd,), start_new_session=True)
    os.close(write_fd)
    trace = Trace(read_fd)
    trace.start()
    try:
        deadline = time.time() + 900
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    sys.exit("%s does not listen under valgrind (see %s)" % (name, output))
                time.sleep(0.5)
        # The start done: its backlog read (the tick comes every second).
        trace.quiet(0.7)
        client = side_by_side.Client(port, body, 1)
        rows = [trace.record(client.one) for _ in range(requests + 2)][2:]
        maps = regions(process.pid, os.path.realpath(command[0]))
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        os.close(read_fd)

    def median(f):
        return statistics.median(f(data, code) for data, code in rows)

    split = collections.Counter()
    for data, _ in rows:
        split.update(name_of(maps, line) for line in data)
    return {
        "data lines": median(lambda d, c: len(d)),
        "data pages": median(lambda d, c: len({x >> 6 for x in d})),
        "code lines": median(lambda d, c: len(c)),
        "code pages": median(lambda d, c: len({x >> 6 for x in c})),
        "split": {k: v / len(rows) for k, v in split.items()},
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10)
    parser.add_argument("--body-kb", type=int, default=2)
    parser.add_argument("targets", nargs="+", metavar="NAME=KIND:PATH")
    args = parser.parse_args()
    body = side_by_side.chat_body(args.body_kb * 1024)
    work = tempfile.mkdtemp(prefix="footprint-")
    upstream = side_by_side.free_port()
    mock = subprocess.Popen([sys.executable, os.path.join(HERE, "mock-chat-upstream.py"), str(upstream), "bench"])
    try:
        side_by_side.wait_port(upstream, mock, "the mock upstream")
        results = []
        for spec in args.targets:
            name, port, home, command, env = side_by_side.target(
                spec, upstream, work, NGINX_ONE_WORKER, FOLDGATE_SERVER__WORKERS="1")
            results.append((name, measure(name, command, env, port, body, args.requests, home)))
        print("memory touched per %d KiB chat request (median of %d, valgrind lackey):"
              % (args.body_kb, args.requests))
        print("  %-10s %10s %10s %10s %10s" % ("", "data lines", "data pages", "code lines", "code pages"))
        for name, r in results:
            print("  %-10s %10d %10d %10d %10d" % (name, r["data lines"], r["data pages"],
                                                   r["code lines"], r["code pages"]))
        for name, r in results:
            print("  %s, data lines by region: %s" % (name, ", ".join(
                "%s %.0f" % (k, v) for k, v in sorted(r["split"].items(), key=lambda kv: -kv[1]))))
    finally:
        mock.send_signal(signal.SIGTERM)
        mock.wait()


if __name__ == "__main__":
    main()
