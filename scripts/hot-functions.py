#!/usr/bin/env python3
"""Writes linker/hot-functions.txt: the functions a proxied request runs, which build.rs
has the linker place side by side at the start of the binary's text.

Spread over the binary, the code of one request touched about 160 pages of 4 KiB; the
caches and TLBs lose it between requests (the client, the upstream and the kernel run
in between), so each request fetched them again. Placed together, the same code takes
far fewer pages. docs/PERFORMANCE.md has the figures.

The list is taken from callgrind profiles of the release binary as users build it
(scripts/instructions-per-request.sh, KEEP_PROFILES=1): chat completions, Responses and
Messages requests of 2 KiB and 50 KiB answered whole, and of 2 KiB answered as an event
stream (as agents ask), and the latency bench's 2 KiB chat exchange (SHAPE=bench),
compaction on and off. A function is listed when
some instruction of it ran on at least 90 % of the counted requests of a profile. Those
that more profiles run come first (the server's, then the compacted routes'), and
within them the hottest.

The list holds the functions' mangled names without the hash each build gives a symbol
(`...17h*` in the legacy scheme, `Cs*_` for a v0 crate's disambiguator): the hashes
change with the compiler, the dependencies and the directory the project is built in,
so a list of whole names matched a quarter of a build made elsewhere. build.rs turns the
list into a linker script that matches them as patterns of section names. A generic
function has one symbol per instance under the same path: a path that more than
AMBIGUOUS symbols of the profiled binary share is left out (it would place every
instance, most of them cold, among the hot code). A listed path the binary lacks matches
nothing, so a stale list costs speed, never a build. `--check` tells how much of the
list the built binary still has; write the list again when it drops, and keep the new
list only when a chat request costs no more with it side by side
(scripts/cpu-side-by-side.py, the same code linked with each list): a list written after
other paths changed orders the chat path differently, and one such cost 4 % more CPU
(docs/PERFORMANCE.md, sixth pass).

`--footprint PROFILE` prints what one kept profile's requests ran every time: the
cache lines and 4 KiB pages of the binary's code they touched (KEEP_PROFILES=1
scripts/instructions-per-request.sh N writes target/foldgate-default.callgrind; give
the same N as `--requests`).

Usage: scripts/hot-functions.py [--check] [--requests N] [--footprint PROFILE]
Needs valgrind, nginx, python3 and binutils' nm, as instructions-per-request.sh does.
"""

import argparse
import bisect
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "linker", "hot-functions.txt")
BINARY = os.path.join(ROOT, "target", "release", "foldgate")
# A path shared by more symbols than this is not listed (see above).
AMBIGUOUS = 8
# (API, BODY_KB, streamed, SHAPE) profiled; each with compaction on and off. The bench's
# shape (its answer carries OpenAI's full usage details) beside the plain ones.
SHAPES = [(api, kb, stream, "plain") for api in ("chat", "responses", "messages")
          for kb, stream in ((2, False), (50, False), (2, True))] + [("chat", 2, False, "bench")]


def functions(binary):
    """(start address, size, name) of the binary's functions, by address."""
    out = subprocess.run(
        ["nm", "--defined-only", "--numeric-sort", "--print-size", binary],
        check=True, capture_output=True, text=True,
    ).stdout
    found = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[2] in "tTwW":
            found.append((int(parts[0], 16), int(parts[1], 16), parts[3]))
    return found


def pattern(name):
    """`name` without its build's hashes: what the list holds and build.rs matches."""
    name = re.sub(r"17h[0-9a-f]{16}E(\.\d+)?$", "17h*", name)
    return re.sub(r"Cs[0-9A-Za-z]+_", "Cs*_", name)


def instruction_counts(profile, binary_name):
    """Executions of each instruction address of the binary in a callgrind profile
    written with --dump-instr=yes (call lines' inclusive costs left out)."""
    objects, current, address, call = {}, None, 0, False
    counts = collections.Counter()
    with open(profile) as lines:
        for line in lines:
            if line.startswith(("ob=", "cob=")):
                # An object is named where it first appears, as a caller's or a callee's.
                match = re.match(r"\((\d+)\)(?: (.*))?", line.split("=", 1)[1].strip())
                if match.group(2):
                    objects[match.group(1)] = match.group(2)
                if line.startswith("ob="):
                    current = objects.get(match.group(1))
                continue
            if line.startswith("calls="):
                call = True
                continue
            if not line or line[0] not in "0123456789+-*":
                continue
            parts = line.split()
            position = parts[0]
            if position.startswith("0x"):
                address = int(position, 16)
            elif position[0] == "+":
                address += int(position[1:])
            elif position[0] == "-":
                address -= int(position[1:])
            if call:
                call = False
                continue
            if len(parts) >= 3 and current and current.endswith(binary_name):
                counts[address] += int(parts[2])
    return counts


def hot(counts, table, requests):
    """Instructions run by each function that ran on at least 90 % of `requests`."""
    starts = [start for start, _, _ in table]
    cost, every = collections.Counter(), set()
    for address, count in counts.items():
        index = bisect.bisect_right(starts, address) - 1
        if index < 0:
            continue
        start, size, name = table[index]
        if address >= start + max(size, 1):
            continue
        cost[name] += count
        if count >= 0.9 * requests:
            every.add(name)
    return {name: cost[name] for name in every}


def profile(api, body_kb, stream, shape, requests, into):
    """Runs instructions-per-request.sh for one shape; the two profiles' paths."""
    env = dict(os.environ, KEEP_PROFILES="1", SKIP_BUILD="1", API=api, BODY_KB=str(body_kb),
               STREAM="1" if stream else "0", SHAPE=shape)
    subprocess.run(
        [os.path.join(ROOT, "scripts", "instructions-per-request.sh"), str(requests)],
        check=True, cwd=ROOT, env=env, stdout=sys.stderr,
    )
    kept = []
    for setting in ("default", "off"):
        path = os.path.join(into, f"{api}-{body_kb}-{int(stream)}-{shape}-{setting}.callgrind")
        shutil.move(os.path.join(ROOT, "target", f"foldgate-{setting}.callgrind"), path)
        kept.append(path)
    return kept


def check(table):
    shared = collections.Counter(pattern(name) for _, _, name in table)
    listed = [line.strip() for line in open(LIST) if line.strip()]
    present = sum(shared[p] > 0 for p in listed)
    print(f"{present} of the {len(listed)} functions in {os.path.relpath(LIST, ROOT)} are in "
          f"{os.path.relpath(BINARY, ROOT)} ({100 * present / max(len(listed), 1):.0f} %), "
          f"{sum(shared[p] for p in listed)} symbols matched")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only tell how much of the list the built binary has")
    parser.add_argument("--requests", type=int, default=300,
                        help="requests counted per profile (default 300)")
    parser.add_argument("--footprint", metavar="PROFILE",
                        help="only print the code a profile's requests ran every time")
    args = parser.parse_args()
    if args.footprint:
        counts = instruction_counts(args.footprint, os.path.basename(BINARY))
        every = [address for address, count in counts.items() if count >= 0.9 * args.requests]
        lines, pages = {a >> 6 for a in every}, {a >> 12 for a in every}
        print(f"code run by every request: {len(lines)} cache lines "
              f"({len(lines) * 64 / 1024:.0f} KiB), {len(pages)} pages of 4 KiB")
        return
    if not args.check:
        subprocess.run(["cargo", "build", "--release", "--quiet"], check=True, cwd=ROOT)
    table = functions(BINARY)
    if args.check:
        check(table)
        return
    total, profiles = collections.Counter(), collections.Counter()
    with tempfile.TemporaryDirectory() as into:
        for api, body_kb, stream, shape in SHAPES:
            for path in profile(api, body_kb, stream, shape, args.requests, into):
                counts = instruction_counts(path, os.path.basename(BINARY))
                found = hot(counts, table, args.requests)
                total.update(found)
                profiles.update(found.keys())
    order = sorted(total, key=lambda name: (-profiles[name], -total[name], name))
    shared = collections.Counter(pattern(name) for _, _, name in table)
    # Each path once, where its hottest symbol stands.
    kept = {}
    for name in order:
        if shared[pattern(name)] <= AMBIGUOUS:
            kept.setdefault(pattern(name), name)
    os.makedirs(os.path.dirname(LIST), exist_ok=True)
    with open(LIST, "w") as out:
        out.write("".join(f"{p}\n" for p in kept))
    sizes = {name: size for _, size, name in table}
    print(f"{len(kept)} functions, {sum(sizes[n] for n in kept.values()) / 1024:.0f} KiB, "
          f"written to {os.path.relpath(LIST, ROOT)}")


if __name__ == "__main__":
    main()
