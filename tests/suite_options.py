#!/usr/bin/env python3
"""suite_options.py - the option reference tells the truth.

  - docs/options.md is what tools/gen_options_doc.py generates now from
    server/config.c's OPTS and ENV_SWITCHES (a diff is printed when it is
    stale);
  - every "HYSERVE_..." name in the program's C files (every folder but
    tests/, bench/, tools/ and the build outputs: engine/, runtime/,
    grammar/, planning/, server/, cli/, and any room added later)
    (getenv("HYSERVE_X"), or a name passed on to a getenv wrapper) is an
    option's variable or a row of ENV_SWITCHES, and so in docs/options.md;
  - every row of ENV_SWITCHES names a variable some code still reads, and
    no option's variable is also a switch;
  - each option's variable is HYSERVE_ and its flag in capitals;
  - every HYSERVE_* name README.md and docs/ mention is one of the two;
  - the scan finds a getenv planted in a scratch tree (so it can fail).
Prints "ok - ..." / "not ok - ..." per check and, last,
"options: N passed, N failed".
"""
import difflib
import os
import re
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gen_options_doc as gen  # noqa: E402

NAME = re.compile(r'"(HYSERVE_[A-Z0-9_]+)"')
passed = failed = 0


def check(what, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"ok - {what}")
    else:
        failed += 1
        print(f"not ok - {what}")
        if detail:
            for line in str(detail).rstrip("\n").splitlines()[:80]:
                print(f"    {line}")
    return ok


def strip_comments(src):
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", src, flags=re.S)


def env_switch_block(src):
    """The text of the ENV_SWITCHES initializer in config.c, so its own names do not count as reads."""
    m = re.search(r"ENV_SWITCHES\[\][^=]*=\s*\{(.*?)\n\};", src, re.S)
    return m.group(1) if m else ""


NOT_PROGRAM = {"tests", "bench", "tools", "docs", "docker", "config", "models", "node_modules"}


def program_dirs(root):
    """The top-level folders of the program's C code: all but tests, benches, tools and builds."""
    return sorted(d for d in os.listdir(root)
                  if os.path.isdir(os.path.join(root, d)) and d not in NOT_PROGRAM
                  and not d.startswith((".", "build")))


def names_read(root):
    """{name: [files]} of every quoted HYSERVE_* name in the program's C code, outside the
    ENV_SWITCHES table itself."""
    found = {}
    for top in program_dirs(root):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dirpath, f)
                src = open(path, encoding="utf-8", errors="replace").read()
                block = env_switch_block(src)
                if block:
                    src = src.replace(block, "")
                for n in NAME.findall(strip_comments(src)):
                    found.setdefault(n, []).append(os.path.relpath(path, root))
    return found


def main():
    t = gen.tables(ROOT)
    opt_env = {o["env"] for o in t["options"]}
    sw_env = [e["env"] for e in t["switches"]]
    reference = opt_env | set(sw_env)

    # 1. the file is what the generator writes now
    path = os.path.join(ROOT, gen.OUT)
    want = gen.generate(ROOT)
    have = open(path, encoding="utf-8").read() if os.path.exists(path) else ""
    diff = "".join(difflib.unified_diff(have.splitlines(True), want.splitlines(True), gen.OUT, "generated"))
    check(f"{gen.OUT} is what tools/gen_options_doc.py generates (else run it)", have == want,
          diff or f"{gen.OUT} is missing")

    # 2. every HYSERVE_* name the code reads is in a table, and in the file
    read = names_read(ROOT)
    missing = {n: fs for n, fs in read.items() if n not in reference}
    dirs = program_dirs(ROOT)
    check(f"every HYSERVE_* name read in {', '.join(d + '/' for d in dirs)} ({len(read)}) is an option's variable "
          f"or an ENV_SWITCHES row", len(read) >= 10 and {"engine", "server", "cli"} <= set(dirs) and not missing,
          "\n".join(f"{n}: {', '.join(sorted(set(fs)))}: add it to ENV_SWITCHES in server/config.c"
                    for n, fs in sorted(missing.items())))
    undocumented = sorted(n for n in reference if f"`{n}`" not in have)
    check(f"{gen.OUT} names every variable of the two tables ({len(reference)})", not undocumented,
          f"not in {gen.OUT}: {undocumented}")

    # 3. the switch rows are live and apart from the options
    stale = [n for n in sw_env if n not in read]
    check(f"every ENV_SWITCHES row ({len(sw_env)}) names a variable the code reads", sw_env and not stale,
          f"no code reads {stale}: remove the rows")
    dup = sorted({n for n in sw_env if sw_env.count(n) > 1} | (set(sw_env) & opt_env))
    check("no switch is listed twice or is also an option's variable", not dup, dup)

    # 4. the option variables follow the flags
    odd = [(o["name"], o["env"]) for o in t["options"]
           if o["env"] != "HYSERVE_" + o["name"].upper().replace("-", "_")]
    check(f"each option's variable is HYSERVE_ and its flag in capitals ({len(t['options'])} options)", not odd, odd)

    # 5. the prose names no variable the reference lacks
    docs = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
                                  if f.endswith(".md"))
    unknown = {}
    for d in docs:
        for n in re.findall(r"HYSERVE_[A-Z0-9_]*[A-Z0-9]", open(os.path.join(ROOT, d), encoding="utf-8").read()):
            if n not in reference:
                unknown.setdefault(n, set()).add(d)
    check("every HYSERVE_* variable README.md and docs/ name is one the reference lists", not unknown,
          "\n".join(f"{n}: {', '.join(sorted(ds))}" for n, ds in sorted(unknown.items())))

    # 6. the scan can fail: a planted getenv is found
    with tempfile.TemporaryDirectory() as d:
        os.makedirs(os.path.join(d, "engine", "kernels"))
        with open(os.path.join(d, "engine", "kernels", "planted.c"), "w") as f:
            f.write('/* getenv("HYSERVE_IN_A_COMMENT") */\nstatic const char *v(void)\n'
                    '{ return getenv("HYSERVE_PLANTED_SWITCH"); }\n')
        got = names_read(d)
    check("the scan finds a getenv(\"HYSERVE_...\") planted in engine/kernels/ and skips comments",
          set(got) == {"HYSERVE_PLANTED_SWITCH"}, got)

    print(f"options: {passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
