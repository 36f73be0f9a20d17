#!/usr/bin/env python3
"""check_layout.py - the include rules that keep the layers apart.

The rules (docs/architecture.md section 2; engine/engine.h's header comment):
  - server/ is the HTTP face: of engine/ it includes only engine.h,
    scheduler.h, the stateless sampler.h and tokenizer.h, and fault.h (the
    one allocation wrapper, whose failure countdown covers both sides);
  - cli/ includes of engine/ only engine.h and what its tools need (gguf.h
    for `tensor` and `synth`, synth.h for `synth`, sampler.h and the
    stateless tokenizer.h for `generate`), and of server/ only serve.h
    (the `serve` entry point);
  - engine/ never includes server/ or cli/ headers;
  - engine/kernels/ is leaf numeric code: its files include only each
    other (never model.h, engine.h or anything else above them);
  - the numeric code is one stack, each level built on the ones below and
    including nothing above it (STACK below: the BLAS wrapper, the plain
    views and the kernel table's type; math; SIMD; block formats; panels
    and attention kernels; the table's filler; matmul dispatch; layers;
    forward; engine);
  - no include circle anywhere in engine/, server/ or cli/.

Prints one "ok - ..." or "not ok - ..." line per rule and, last,
"layout: N passed, N failed". Exit status 1 when a rule fails.
Usage: check_layout.py [ROOT]   (default: the repository holding this file)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

SERVER_MAY = {"engine.h", "scheduler.h", "sampler.h", "tokenizer.h", "fault.h"}
CLI_MAY = {"engine.h", "gguf.h", "synth.h", "sampler.h", "tokenizer.h", "serve.h"}

# The levels of the numeric stack, lowest first. A file of a level includes
# files of its own level or lower ones only. kernels/cpu.h (the kernel
# table's type) is at the bottom so every level can call through the table;
# kernels/cpu.c, which fills the table with every level's kernels, is the
# top of kernels/. engine_impl.h is the engine struct forward.c reads.
# Files not named here (cache, model, gguf, tokenizer, ...) sit beside the
# stack and are not ranked; every file of engine/kernels/ must be.
STACK = [
    ("BLAS wrapper, plain views and types",
     ["kernels/blas.h", "kernels/blas.c", "kernels/cpu.h", "kernels/ggml_type.h", "kernels/ggml_type.c",
      "kernels/half.h", "kernels/half.c", "kernels/weight.h", "kernels/kv_pages.h", "kernels/share.h"]),
    ("math", ["kernels/vecmath.h", "kernels/vecmath.c"]),
    ("SIMD", ["kernels/simd.h", "kernels/simd512.h", "kernels/simd_amx.h", "kernels/simd_exp.h",
              "kernels/simd_avx2.c", "kernels/simd_avx512.c", "kernels/simd_amx.c",
              "kernels/simd_kquant.h", "kernels/simd_kquant.c"]),
    ("block formats", ["kernels/quant.h", "kernels/quant.c"]),
    ("panels and attention kernels", ["kernels/panels.h", "kernels/panels.c", "kernels/panel_tile.h", "kernels/simd_bf16.h",
                                      "kernels/simd_bf16.c", "kernels/simd_kqtile.h", "kernels/simd_kqtile.c", "kernels/attn.h", "kernels/attn.c"]),
    ("the kernel table's filler", ["kernels/cpu.c"]),
    ("matmul dispatch", ["matmul.h", "matmul.c"]),
    ("layers", ["layers.h", "attention.c", "deltanet.c", "mla.c", "qwen3next.c"]),
    ("forward", ["forward.c", "engine_impl.h"]),
    ("engine", ["engine.c"]),
]


def sources(root, top):
    out = []
    for dirpath, _, files in os.walk(os.path.join(root, top)):
        for f in sorted(files):
            if f.endswith((".c", ".h")):
                out.append(os.path.relpath(os.path.join(dirpath, f), root))
    return sorted(out)


def resolve(root, src, name, by_base):
    """Path of the header `name` included from src: beside src first, then
    by the compiler's -I order (engine, server, cli) through its base name."""
    here = os.path.normpath(os.path.join(os.path.dirname(src), name))
    if os.path.exists(os.path.join(root, here)):
        return here
    hits = by_base.get(os.path.basename(name), [])
    for top in ("engine/", "server/", "cli/"):
        for h in hits:
            if h.startswith(top) and h.endswith(name):
                return h
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = sources(root, "engine") + sources(root, "server") + sources(root, "cli")
    by_base = {}
    for f in files:
        by_base.setdefault(os.path.basename(f), []).append(f)
    edges = {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            names = INCLUDE.findall(fh.read())
        edges[f] = [(n, resolve(root, f, n, by_base)) for n in names]

    results = []

    def rule(name, bad):
        results.append((name, bad))

    def crossing(prefix, allowed_engine, allowed_other=()):
        bad = []
        for f, inc in edges.items():
            if not f.startswith(prefix):
                continue
            for n, path in inc:
                if path is None:
                    bad.append(f"{f}: {n} (not found)")
                elif path.startswith(prefix):
                    continue
                elif path.startswith("engine/"):
                    if os.path.basename(path) not in allowed_engine or path.startswith("engine/kernels/"):
                        bad.append(f"{f} -> {path}")
                elif os.path.basename(path) not in allowed_other:
                    bad.append(f"{f} -> {path}")
        return bad

    rule("server/ includes of engine/ only engine.h, scheduler.h, sampler.h, tokenizer.h, fault.h",
         crossing("server/", SERVER_MAY))
    rule("cli/ includes of engine/ only engine.h, gguf.h, synth.h, sampler.h, tokenizer.h, of server/ only serve.h",
         crossing("cli/", CLI_MAY - {"serve.h"}, {"serve.h"}))
    rule("engine/ includes nothing of server/ or cli/",
         [f"{f} -> {p}" for f, inc in edges.items() if f.startswith("engine/")
          for _, p in inc if p and not p.startswith("engine/")])
    kern = [f for f in files if f.startswith("engine/kernels/")]
    rule("engine/kernels/ includes only engine/kernels/ (no model.h, engine.h or layers above)",
         [f"{f} -> {p}" for f in kern for _, p in edges[f] if p and not p.startswith("engine/kernels/")])

    level = {"engine/" + f: i for i, (_, fs) in enumerate(STACK) for f in fs}
    rule("the numeric stack is one way: no file includes one of a higher level (" +
         " <- ".join(name for name, _ in STACK) + ")",
         [f"{f} ({STACK[level[f]][0]}) -> {p} ({STACK[level[p]][0]})" for f in level if f in edges
          for _, p in edges[f] if p in level and level[p] > level[f]] +
         [f"{f}: named in STACK but not found" for f in level if f not in edges] +
         [f"{f}: a file of engine/kernels/ without a level in STACK" for f in kern if f not in level])

    # include circles: depth-first search over header edges
    graph = {f: sorted({p for _, p in inc if p}) for f, inc in edges.items()}
    cycles, state, stack = [], {}, []

    def visit(u):
        state[u] = 1
        stack.append(u)
        for v in graph.get(u, []):
            if state.get(v) == 1:
                cycles.append(" -> ".join(stack[stack.index(v):] + [v]))
            elif not state.get(v):
                visit(v)
        stack.pop()
        state[u] = 2

    for f in sorted(graph):
        if not state.get(f):
            visit(f)
    rule("no include circle in engine/, server/ or cli/", cycles)

    failed = 0
    for name, bad in results:
        if bad:
            failed += 1
            print(f"not ok - {name}")
            for b in bad:
                print(f"    {b}")
        else:
            print(f"ok - {name}")
    print(f"layout: {len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
