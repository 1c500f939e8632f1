#!/usr/bin/env python3
"""Finds import cycles between foldgate's modules, and between its files.

A module is a top-level module of the crate (`src/<name>.rs` or `src/<name>/`), or a
module of the edge (`src/http/<name>`), whose files reach each other through `crate::`
and `super::` paths. A file reaches another when it names an item of the module that
file is (`use` trees expanded, `crate::`, `super::` and `self::` paths resolved to the
deepest file that exists); a file circle is a set of files that reach each other. Comment
lines and `#[cfg(test)]` code are skipped. Prints each cycle found; exits 1 when there is
one.

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


def sources():
    """Each source file's path under src/ and its code: no `#[cfg(test)]` part, no
    comment lines."""
    for root, _, files in os.walk(SRC):
        for f in files:
            if not f.endswith(".rs"):
                continue
            path = os.path.join(root, f)
            rel = os.path.relpath(path, SRC).replace(os.sep, "/")
            text = open(path, encoding="utf-8").read().split("#[cfg(test)]")[0]
            lines = [l for l in text.splitlines() if not l.lstrip().startswith("//")]
            yield rel, lines


def graph():
    edges = {}
    for rel, lines in sources():
        src = module_of(rel)
        for line in lines:
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


def module_path(rel):
    """The module path of a file (`http/dialect/mod.rs` -> `['http', 'dialect']`)."""
    parts = rel[:-3].split("/")
    return parts[:-1] if parts[-1] in ("mod", "lib", "main") else parts


def file_of(parts):
    """The deepest file that defines a prefix of the module path `parts`."""
    for n in range(len(parts), 0, -1):
        stem = "/".join(parts[:n])
        for candidate in (stem + ".rs", stem + "/mod.rs"):
            if os.path.exists(os.path.join(SRC, candidate)):
                return candidate
    return "lib.rs"


def use_paths(tree):
    """Every path a `use` tree names, as lists of segments (`a::{b, c::d}` -> a::b, a::c::d)."""
    tree = tree.strip()
    brace = tree.find("{")
    if brace < 0:
        path = tree.split(" as ")[0].strip()
        return [path.split("::")] if path else []
    prefix = [p for p in tree[:brace].strip().rstrip(":").split("::") if p]
    inner = tree[brace + 1:tree.rfind("}")]
    items, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += (c == "{") - (c == "}")
        if c == "," and depth == 0:
            items.append(inner[start:i])
            start = i + 1
    items.append(inner[start:])
    out = []
    for item in items:
        for sub in use_paths(item):
            out.append(prefix if sub == ["self"] else prefix + sub)
    return out


def absolute(here, segments):
    """`segments` (a `crate::`, `super::` or `self::` path) from the module `here`."""
    if segments[0] == "crate":
        return segments[1:]
    base, k = list(here), 0
    if segments[0] == "self":
        k = 1
    while k < len(segments) and segments[k] == "super":
        base, k = base[:-1], k + 1
    return base + segments[k:] if k else None


def file_graph():
    edges = {}
    for rel, lines in sources():
        text = "\n".join(lines)
        here = module_path(rel)
        paths = [p for m in re.finditer(r"\buse\s+([^;]+);", text) for p in use_paths(m.group(1))]
        paths += [m.group(1).split("::") for m in re.finditer(r"\b((?:crate|super|self)(?:::\w+)+)", text)]
        for segments in paths:
            target = absolute(here, segments) if segments else None
            if target is None:
                continue
            dst = file_of(target)
            if dst != rel:
                edges.setdefault(rel, set()).add(dst)
    return edges


def circles(edges):
    """The strongly connected sets of more than one file (Tarjan's algorithm)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    sys.setrecursionlimit(10_000)

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            members = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                members.append(w)
                if w == v:
                    break
            if len(members) > 1:
                found.append(sorted(members))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return found


if __name__ == "__main__":
    edges = graph()
    found = cycles(edges)
    for c in found:
        print("cycle: " + " -> ".join(c))
    if not found:
        print(f"no import cycle among {len(edges)} modules")
    files = file_graph()
    found_files = circles(files)
    for c in found_files:
        print("file circle: " + ", ".join(c))
    if not found_files:
        print(f"no circle among {len(files)} files")
    sys.exit(1 if found or found_files else 0)
