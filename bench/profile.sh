#!/bin/sh
# profile.sh - where one decode token's time goes (issue 39): the parallel
# regions, join waits and fork delays per token (bench/gomp_prof.c under
# LD_PRELOAD) and the time and GB/s of each product shape (a build with
# HYSERVE_MMPROF, build-prof/), each as the difference of two runs of
# `hyserve generate` (N1 and N2 tokens: load, prompt and the first steps
# cancel), per token of the difference.
#
#   sh bench/profile.sh MODEL          (`make bench-profile MODEL=FILE`)
# Env: THREADS (default 2), N1 (default 32), N2 (default 160), HYSERVE
#      (default build/hyserve), PROF (default build-prof/hyserve),
#      SHIM (default build/bench/gomp_prof.so), KV (default f16).
set -u
MODEL=${1:?usage: sh bench/profile.sh MODEL}
THREADS=${THREADS:-2}
N1=${N1:-32}
N2=${N2:-160}
HYSERVE=${HYSERVE:-build/hyserve}
PROF=${PROF:-build-prof/hyserve}
SHIM=${SHIM:-build/bench/gomp_prof.so}
KV=${KV:-f16}
PYTHON=${PYTHON:-python3}
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-profile.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
gen() {     # gen BINARY N [preload]
    if [ $# -gt 2 ]; then
        LD_PRELOAD=$3 "$1" generate -m "$MODEL" -p "Hello" -n "$2" --temp 0 --ignore-eos -t "$THREADS" --kv-dtype "$KV"
    else
        "$1" generate -m "$MODEL" -p "Hello" -n "$2" --temp 0 --ignore-eos -t "$THREADS" --kv-dtype "$KV"
    fi
}
echo "# profile: $MODEL, $THREADS threads, tokens $N2 - $N1, load $(cut -d' ' -f1-3 /proc/loadavg)"
for n in "$N1" "$N2"; do
    gen "$HYSERVE" "$n" "$(realpath "$SHIM")" 2>"$TMP/gomp-$n" >/dev/null || { echo "generate failed"; exit 1; }
    gen "$PROF" "$n" 2>"$TMP/mm-$n" >/dev/null || { echo "generate (build-prof) failed"; exit 1; }
done
"$PYTHON" - "$TMP" "$N1" "$N2" "$HYSERVE" <<'EOF'
import re, subprocess, sys
tmp, n1, n2, binary = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
dn = n2 - n1
def decode_s(path):
    m = re.search(r"decode: (\d+) tokens in ([0-9.]+) s", open(path).read())
    return float(m.group(2)) if m else None
def gomp(path):
    txt = open(path).read()
    tot = re.search(r"wall ([0-9.]+) s, in regions ([0-9.]+) s, outside ([0-9.]+) s; per 1 tokens: ([0-9.]+) regions, "
                    r"([0-9.]+) explicit barriers.*?, ([0-9.]+) loop-end.*?join waits ([0-9.]+) ms and start delays "
                    r"([0-9.]+) ms", txt)
    fns = {}
    for m in re.finditer(r"fn (\S+)\+(0x[0-9a-f]+) calls ([0-9.]+)/token wall ([0-9.]+) ms/token join-wait ([0-9.]+) "
                         r"ms/token start-delay ([0-9.]+)", txt):
        fns[m.group(2)] = [float(m.group(i)) for i in range(3, 7)]
    return [float(tot.group(i)) for i in range(1, 9)], fns
def mm(path):
    rows = {}
    for m in re.finditer(r"mmprof: (\S+)\s+x(\d+) n_in\s+(\d+) n_out\s+(\d+) (1 tok|n tok)\s+calls\s+(\d+)\s+([0-9.]+) s"
                         r"\s+[0-9.]+%\s+([0-9.]+) MB", open(path).read()):
        rows[m.group(1, 2, 3, 4, 5)] = (int(m.group(6)), float(m.group(7)), float(m.group(8)))
    return rows
d1, d2 = decode_s(f"{tmp}/gomp-{n1}"), decode_s(f"{tmp}/gomp-{n2}")
(t1, f1), (t2, f2) = gomp(f"{tmp}/gomp-{n1}"), gomp(f"{tmp}/gomp-{n2}")
tok_ms = 1e3 * (d2 - d1) / dn if d1 is not None and d2 is not None else float("nan")
print(f"decode (plain build): {tok_ms:.2f} ms/token ({1e3 / tok_ms:.1f} tok/s)")
per = [(b - a) / dn for a, b in zip(t1, t2)]
print(f"parallel regions {per[3]:.1f}/token, explicit barriers {per[4]:.1f}, loop-end barriers {per[5]:.1f}; "
      f"in regions {1e3 * per[1]:.2f} ms, outside {1e3 * per[2]:.2f} ms; join waits {per[6]:.2f} ms and fork "
      f"delays {per[7]:.2f} ms (threads summed)")
names = {}
for a in f2:
    try:
        out = subprocess.run(["addr2line", "-f", "-s", "-e", binary, a], capture_output=True, text=True).stdout.split()
        names[a] = f"{out[0]} ({out[1]})" if len(out) >= 2 else a
    except OSError:
        names[a] = a
print("| region (outlined function) | calls/token | wall ms/token | join wait ms | fork delay ms |")
print("|---|---|---|---|---|")
for a, v in sorted(f2.items(), key=lambda kv: -(kv[1][1] - f1.get(kv[0], [0] * 4)[1])):
    u = f1.get(a, [0.0] * 4)
    c, w, j, l = [(v[i] * 1 - u[i]) / dn for i in range(4)]
    if w >= 0.005:
        print(f"| {names[a]} | {c:.1f} | {w:.3f} | {j:.3f} | {l:.3f} |")
m1, m2 = mm(f"{tmp}/mm-{n1}"), mm(f"{tmp}/mm-{n2}")
pd1, pd2 = decode_s(f"{tmp}/mm-{n1}"), decode_s(f"{tmp}/mm-{n2}")
ptok = 1e3 * (pd2 - pd1) / dn
print(f"\nproducts (build-prof, one token each): decode {ptok:.2f} ms/token")
print("| weights | rows x width | MB | calls/token | ms/token | share of token | GB/s |")
print("|---|---|---|---|---|---|---|")
tot = 0.0
for k, (c, s, mb) in sorted(m2.items(), key=lambda kv: -kv[1][1]):
    if k[4] != "1 tok":
        continue
    c0, s0, _ = m1.get(k, (0, 0.0, mb))
    ms = 1e3 * (s - s0) / dn
    tot += ms
    calls = (c - c0) / dn
    gbs = mb * 1e-3 * calls / (ms * 1e-3) if ms > 0 else 0
    print(f"| {k[0]} x{k[1]} | {k[3]} x {k[2]} | {mb:.2f} | {calls:.1f} | {ms:.2f} | {100 * ms / ptok:.1f}% | {gbs:.1f} |")
print(f"all products {tot:.2f} ms/token of {ptok:.2f} ({100 * tot / ptok:.1f}%); the rest {ptok - tot:.2f} ms")
EOF
