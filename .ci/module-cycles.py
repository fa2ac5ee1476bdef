#!/usr/bin/env python3
"""Fail when two top-level modules of src/ depend on each other, directly or in a circle.

Issue 20: imports run one way (faces -> core -> sys). A module `a` depends on `b` when
non-test code under src/a/ (or src/a.rs) names `crate::b` -- in a `use` line, a grouped
`use crate::{b::X, c}`, or a path written inline. The crate-root macros count for the
module that defines them. Code after `#[cfg(test)]` at the end of a file (its
`mod tests`) is not counted. Prints every circle found (one per strongly connected
component, with a shortest path around it) and exits 1; exits 0 when there is none.
"""
import os
import re
import sys

SRC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
# #[macro_export] macros live at the crate root; they belong to the module defining them.
MACROS = {"warn_limited": "log", "error_limited": "log", "info_limited": "log", "syscall": "sys"}
IGNORED = {"main", "lib", "VERSION"}


def strip(text):
    """Non-test code with comments, strings and char literals blanked, scanned left to
    right as rustc would (a `"` inside a char literal or a `crate::` inside a string
    must neither hide code nor count)."""
    out, i, n = [], 0, len(text)
    ident = lambda c: c.isalnum() or c == "_"
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            i = n if j < 0 else j
        elif text.startswith("/*", i):
            depth, i = 1, i + 2
            while i < n and depth:
                if text.startswith("/*", i):
                    depth, i = depth + 1, i + 2
                elif text.startswith("*/", i):
                    depth, i = depth - 1, i + 2
                else:
                    i += 1
        elif c in "rb" and (i == 0 or not ident(text[i - 1])) and re.match(r'(br|r)#*"', text[i:]):
            m = re.match(r'(br|r)(#*)"', text[i:])
            close = '"' + m.group(2)
            j = text.find(close, i + m.end())
            i = n if j < 0 else j + len(close)
            out.append('""')
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
            i += 1
            out.append('""')
        elif c == "'":
            # A char literal ('x', '\n', '\u{..}', '"'); otherwise a lifetime.
            m = re.match(r"'(\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'", text[i:])
            if m:
                i += m.end()
                out.append("' '")
            else:
                out.append(c)
                i += 1
        else:
            out.append(c)
            i += 1
    text = "".join(out)
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+tests\s*\{", text)
    return text[: m.start()] if m else text


def top_names(group):
    """Top-level names of a brace group `a::X, b::{Y, Z}, c` -> [a, b, c]."""
    names, depth, cur = [], 0, ""
    for ch in group:
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
        elif ch == "," and depth == 0:
            names.append(cur)
            cur = ""
            continue
        if depth == 0:
            cur += ch
    names.append(cur)
    out = []
    for n in names:
        m = re.match(r"\s*([A-Za-z_][A-Za-z0-9_]*)", n)
        if m:
            out.append(m.group(1))
    return out


def deps_of(text):
    found = set()
    for m in re.finditer(r"\bcrate::(\{|[A-Za-z_][A-Za-z0-9_]*)", text):
        if m.group(1) == "{":
            depth, i = 1, m.end()
            while i < len(text) and depth:
                depth += {"{": 1, "}": -1}.get(text[i], 0)
                i += 1
            found.update(top_names(text[m.end() : i - 1]))
        else:
            found.add(m.group(1))
    return {MACROS.get(n, n) for n in found}


def graph():
    modules = {}
    for entry in sorted(os.listdir(SRC)):
        path = os.path.join(SRC, entry)
        name = entry[:-3] if entry.endswith(".rs") else entry
        if name in IGNORED:
            continue
        files = []
        if os.path.isdir(path):
            for root, _, fs in os.walk(path):
                files += [os.path.join(root, f) for f in fs if f.endswith(".rs")]
        elif entry.endswith(".rs"):
            files = [path]
        deps = set()
        for f in files:
            with open(f, encoding="utf-8") as fh:
                deps |= deps_of(strip(fh.read()))
        modules[name] = deps
    names = set(modules)
    return {m: sorted(d & names - {m}) for m, d in modules.items()}


def sccs(g):
    """Tarjan's strongly connected components."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return [c for c in out if len(c) > 1]


def shortest_cycle(g, comp):
    """A shortest path from a member of `comp` back to itself, inside `comp`."""
    members, best = set(comp), None
    for start in comp:
        prev, queue, found = {start: None}, [start], None
        while queue and found is None:
            nxt = []
            for v in queue:
                for w in g[v]:
                    if w == start:
                        found = v
                        break
                    if w in members and w not in prev:
                        prev[w] = v
                        nxt.append(w)
                if found is not None:
                    break
            queue = nxt
        if found is None:
            continue
        path, v = [], found
        while v is not None:
            path.append(v)
            v = prev[v]
        path.reverse()
        if best is None or len(path) < len(best):
            best = path
    return best


def main():
    g = graph()
    bad = sccs(g)
    if not bad:
        print("module-cycles: ok (%d top-level modules, no circle)" % len(g))
        return 0
    for comp in bad:
        cyc = shortest_cycle(g, comp)
        print("module-cycles: circle among {%s}: %s" % (", ".join(comp), " -> ".join(cyc + [cyc[0]])))
        for m in comp:
            inside = [d for d in g[m] if d in comp]
            print("  %s imports %s" % (m, ", ".join(inside)))
    return 1


if __name__ == "__main__":
    sys.exit(main())
