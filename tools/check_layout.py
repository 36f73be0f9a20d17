#!/usr/bin/env python3
"""check_layout.py - the include rules that keep the layers apart.

The rooms (docs/architecture.md section 2), each with the arrows it may draw
out of itself (a file's own room is always allowed):
  - engine/ is the model engine: it includes nothing of grammar/, runtime/,
    planning/, server/ or cli/, and never cJSON (engine.h does not pull it in);
  - grammar/ is the structured-output library, which knows nothing of the
    model: outside grammar/ it includes only engine/fault.h (the allocation
    wrapper); its public header is grammar.h;
  - runtime/ is the batching runtime (scheduler, prefix store, the constraint
    hook), a client of engine.h: of engine/ it includes only engine.h,
    sampler.h, tokenizer.h, fault.h and invariant.h, of grammar/ only
    grammar.h, and never cJSON;
  - planning/ is the planner's preset JSON and the synthesizer: of engine/ it
    includes only memplan.h, gguf.h, tokenizer.h and kernels/quant.h (and
    the system's cJSON);
  - server/ is the HTTP face: of engine/ it includes only engine.h, the
    stateless sampler.h and tokenizer.h, and fault.h (the one allocation
    wrapper, whose failure countdown covers both sides), of runtime/ only
    scheduler.h, of planning/ only presets.h;
  - cli/ includes of engine/ only engine.h and what its tools need (gguf.h
    for `tensor` and `synth`, sampler.h and the stateless tokenizer.h for
    `generate`), of planning/ presets.h and synth.h (`mem`, `synth`), and of
    server/ only serve.h (the `serve` entry point);
  - engine/kernels/ is leaf numeric code: its files include only each
    other (never model.h, engine.h or anything else above them);
  - the numeric code is one stack, each level built on the ones below and
    including nothing above it (STACK below: the BLAS wrapper, the plain
    views and the kernel table's type; math; SIMD; block formats; panels
    and attention kernels; the table's filler; matmul dispatch; layers;
    forward; engine);
  - no include circle anywhere in the rooms.

Prints one "ok - ..." or "not ok - ..." line per rule and, last,
"layout: N passed, N failed". Exit status 1 when a rule fails.
Usage: check_layout.py [ROOT]   (default: the repository holding this file)
"""
import os
import re
import sys

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)

ROOMS = ("engine/", "grammar/", "runtime/", "planning/", "server/", "cli/")

# What each room may include outside itself, by path from the root; a
# room not named here (engine/) may include nothing outside itself.
MAY = {
    "grammar/": {"engine/fault.h"},
    "runtime/": {"engine/engine.h", "engine/sampler.h", "engine/tokenizer.h", "engine/fault.h",
                 "engine/invariant.h", "grammar/grammar.h"},
    "planning/": {"engine/memplan.h", "engine/gguf.h", "engine/tokenizer.h", "engine/kernels/quant.h"},
    "server/": {"engine/engine.h", "engine/sampler.h", "engine/tokenizer.h", "engine/fault.h",
                "runtime/scheduler.h", "planning/presets.h"},
    "cli/": {"engine/engine.h", "engine/gguf.h", "engine/sampler.h", "engine/tokenizer.h",
             "planning/presets.h", "planning/synth.h", "server/serve.h"},
}
# The rooms that never include cJSON (system include <cjson/...>).
NO_CJSON = ("engine/", "runtime/")
SYS_INCLUDE = re.compile(r'^\s*#\s*include\s+<([^>]+)>', re.M)

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
    by the compiler's -I order (engine, grammar, runtime, planning, server,
    cli) through its base name."""
    here = os.path.normpath(os.path.join(os.path.dirname(src), name))
    if os.path.exists(os.path.join(root, here)):
        return here
    hits = by_base.get(os.path.basename(name), [])
    for top in ROOMS:
        for h in hits:
            if h.startswith(top) and h.endswith(name):
                return h
    return None


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    files = [f for room in ROOMS for f in sources(root, room.rstrip("/"))]
    by_base = {}
    for f in files:
        by_base.setdefault(os.path.basename(f), []).append(f)
    edges, system = {}, {}
    for f in files:
        with open(os.path.join(root, f), encoding="utf-8", errors="replace") as fh:
            text = fh.read()
        edges[f] = [(n, resolve(root, f, n, by_base)) for n in INCLUDE.findall(text)]
        system[f] = SYS_INCLUDE.findall(text)

    results = []

    def rule(name, bad):
        results.append((name, bad))

    def crossing(room):
        may = MAY.get(room, set())
        bad = []
        for f, inc in edges.items():
            if not f.startswith(room):
                continue
            for n, path in inc:
                if path is None:
                    bad.append(f"{f}: {n} (not found)")
                elif not path.startswith(room) and path not in may:
                    bad.append(f"{f} -> {path}")
        return bad

    def names(room):
        may = sorted(MAY.get(room, ()))
        out = []
        for r in ROOMS:
            mine = [m[len(r):] for m in may if m.startswith(r)]
            if mine:
                out.append(f"of {r} only {', '.join(mine)}")
        return "; ".join(out) if out else "nothing"

    for room in ROOMS:
        if room == "engine/":
            rule("engine/ includes nothing of grammar/, runtime/, planning/, server/ or cli/", crossing(room))
        else:
            rule(f"{room} includes outside itself {names(room)}", crossing(room))
    rule("no cJSON in " + ", ".join(NO_CJSON) + " (engine.h does not pull it in)",
         [f"{f} -> <{n}>" for f in files if f.startswith(NO_CJSON) for n in system[f] if n.startswith("cjson/")])
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
    rule("no include circle in " + ", ".join(ROOMS), cycles)

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
