#!/usr/bin/env bash
# No circle among the files of src/ (and bench/kernels/), of any length, in
# either of two graphs:
#   includes  a file -> each file it includes with #include "..." (resolved
#             against src/, then the including file's folder);
#   symbols   a compiled file -> each file whose object defines a symbol it
#             uses (nm over BUILD/obj: the files a build has, CUDA ones only
#             in a CUDA build).
# A circle means two files can only be understood, tested or moved
# together; the fix is usually a declaration in the right header or a
# shared piece in a file of its own. Fails naming each circle, one file
# after the other, with the symbols or includes that close it.
#
#   scripts/check_circles.sh [BUILD]     (BUILD: build folder; without it,
#                                         the include graph only)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - "${1:-}" <<'EOF'
import os, re, subprocess, sys

build = sys.argv[1]
roots = ["src", "bench/kernels"]
exts = (".c", ".h", ".cu", ".cuh")
files = sorted(os.path.join(d, f) for r in roots for d, _, fs in os.walk(r) for f in fs
               if f.endswith(exts))

def shortest_circle(graph, part, start):
    """The shortest path inside part from start back to start."""
    prev, queue = {start: None}, [start]
    for v in queue:
        for w in sorted(graph.get(v, {})):
            if w == start:
                path = [v]
                while prev[path[-1]] is not None: path.append(prev[path[-1]])
                return path[::-1]
            if w in part and w not in prev:
                prev[w] = v
                queue.append(w)
    raise AssertionError("a strongly connected part without a circle")

def circles(graph):
    """Each strongly connected part of more than one node, as one circle
    through it (a node list whose last node leads back to the first)."""
    index, low, stack, on, parts, n = {}, {}, [], set(), [], [0]
    sys.setrecursionlimit(100000)
    def visit(v):
        index[v] = low[v] = n[0]; n[0] += 1
        stack.append(v); on.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w); low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop(); on.discard(w); part.append(w)
                if w == v: break
            if len(part) > 1: parts.append(set(part))
    for v in sorted(graph):
        if v not in index: visit(v)
    out = []
    for part in parts:
        out.append((sorted(part), shortest_circle(graph, part, min(part))))
    return out

failed = 0
def report(kind, graph, why):
    global failed
    for part, path in circles(graph):
        failed = 1
        print(f"check_circles: {kind} circle of {len(part)} files: {' '.join(part)}")
        for a, b in zip(path, path[1:] + path[:1]):
            print(f"    {a} -> {b}: {why(a, b)}")

# ---- includes ----
inc = {}
for f in files:
    for m in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', open(f, errors="replace").read(), re.M):
        for cand in (os.path.join("src", m.group(1)), os.path.join(os.path.dirname(f), m.group(1))):
            if os.path.isfile(cand):
                inc.setdefault(f, {})[os.path.normpath(cand)] = m.group(1)
                break
report("include", inc, lambda a, b: f'#include "{inc[a][b]}"')

# ---- symbols ----
if build:
    objdir = os.path.join(build, "obj")
    units = {}
    for f in files:
        if f.endswith((".c", ".cu")):
            o = os.path.join(objdir, os.path.splitext(f)[0] + ".o")
            if os.path.isfile(o): units[f] = o
    if not units:
        sys.exit(f"check_circles: no objects under {objdir}: build first")
    defs, uses = {}, {}
    for f, o in units.items():
        out = subprocess.run(["nm", "-P", o], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            p = line.split()
            if len(p) < 2: continue
            if p[1] == "U": uses.setdefault(f, set()).add(p[0])
            elif p[1] in "TDBRu": defs.setdefault(p[0], f)  # weak (W, V): defined everywhere used
    sym = {}
    for f, us in uses.items():
        for s in us:
            d = defs.get(s)
            if d and d != f: sym.setdefault(f, {}).setdefault(d, []).append(s)
    def demangle(names):
        try:
            out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                                 text=True, check=True).stdout.split("\n")
            return [re.sub(r"\(.*", "", n) for n in out[:len(names)]]
        except (OSError, subprocess.CalledProcessError):
            return names
    def why(a, b):
        names = demangle(sorted(sym[a][b]))
        return ", ".join(names[:4]) + (f" (+{len(names) - 4} more)" if len(names) > 4 else "")
    report("symbol", sym, why)
    print(f"check_circles: {len(files)} files, {len(units)} objects: "
          f"{'circles above' if failed else 'no include or symbol circle'}")
else:
    print(f"check_circles: {len(files)} files: {'circles above' if failed else 'no include circle'}")
sys.exit(failed)
EOF
