#!/usr/bin/env python3
"""Finds import cycles between foldgate's modules.

A module is a top-level module of the crate (`src/<name>.rs` or `src/<name>/`), or a
module of the edge (`src/http/<name>`), whose files reach each other through `crate::`
and `super::` paths. Comment lines are skipped. Prints each cycle found; exits 1 when
there is one.

    python3 scripts/module-cycles.py
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")


def module_of(rel):
    parts = rel[:-3].split("/")
    if parts[0] == "http" and len(parts) > 1 and parts[1] != "mod":
        return "http::" + parts[1]
    return parts[0]


def targets(rel, line):
    found = set()
    for name in re.findall(r"crate::(\w+)(?:::(\w+))?", line):
        top, sub = name
        found.add(f"http::{sub}" if top == "http" and sub else top)
    if rel.startswith("http/"):
        # `super::x` inside src/http/<file>.rs or src/http/<dir>/mod.rs names src/http/x.
        depth = rel.count("/")
        for sub in re.findall(r"super::(\w+)", line):
            if depth == 1 or rel.endswith("/mod.rs"):
                found.add(f"http::{sub}")
    return found


def graph():
    edges = {}
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, SRC).replace(os.sep, "/")
            src = module_of(rel)
            text = open(path, encoding="utf-8").read()
            text = text.split("#[cfg(test)]")[0]
            for line in text.splitlines():
                if line.lstrip().startswith("//"):
                    continue
                for dst in targets(rel, line):
                    if dst != src:
                        edges.setdefault(src, set()).add(dst)
    return edges


def cycles(edges):
    found, state, stack = [], {}, []

    def visit(n):
        state[n] = 1
        stack.append(n)
        for m in sorted(edges.get(n, ())):
            if state.get(m) == 1:
                found.append(stack[stack.index(m):] + [m])
            elif m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(edges):
        if n not in state:
            visit(n)
    return found


if __name__ == "__main__":
    edges = graph()
    found = cycles(edges)
    for c in found:
        print("cycle: " + " -> ".join(c))
    if not found:
        print(f"no import cycle among {len(edges)} modules")
    sys.exit(1 if found else 0)
