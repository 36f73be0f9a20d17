#!/bin/sh
# tree_ab.sh - this tree's engine against another commit's, alternating:
# prompt tokens/s at each length and decode tokens/s, per weight type. The
# evidence for "no weight type and no prompt length slower than before"
# (issue 28): only ratios of neighbouring runs mean much on a shared machine.
#
#   sh bench/tree_ab.sh BASE_REV [TYPES]       (`make bench-ab BASE=REV`)
#   TYPES   weight types with a bench model in bench/models/ (made by
#           `make bench`), default "f32 f16 bf16 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m"
# Env: REPS (alternations, default 3), THREADS (default 2), LENS (prompt
#      lengths, default "2 4 8 16 17 24 32 48 64 128 512"), STEPS (decode
#      steps, default 32), BUILD (this tree's build folder, default build),
#      MODELS (default bench/models), OUT (default bench/results/tree-ab-latest.md).
# BASE_REV is checked out into a worktree under ${TMPDIR:-/tmp} and built
# there with its own Makefile; bench/engine_ab.c (this tree's) is compiled
# against each tree's engine objects. The runs alternate their order every
# repetition; the report gives each figure's median, the ratio this/base
# and marks a ratio below 0.95 "slower".
set -u
BASE=${1:?usage: sh bench/tree_ab.sh BASE_REV [TYPES]}
TYPES=${2:-"f32 f16 bf16 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m"}
REPS=${REPS:-3}
THREADS=${THREADS:-2}
LENS=${LENS:-"2 4 8 16 17 24 32 48 64 128 512"}
STEPS=${STEPS:-32}
BUILD=${BUILD:-build}
MODELS=${MODELS:-bench/models}
OUT=${OUT:-bench/results/tree-ab-latest.md}
PYTHON=${PYTHON:-python3}
log() { echo "tree_ab: $*" >&2; }
loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

rev=$(git rev-parse --short "$BASE^{commit}") || { log "no commit $BASE"; exit 1; }
here=$(git rev-parse --short HEAD)
[ -z "$(git status --porcelain --untracked-files=no)" ] || here="$here (dirty)"
wt=${TMPDIR:-/tmp}/hyserve-ab-$rev
if [ ! -d "$wt" ]; then
    git worktree add --detach "$wt" "$rev" >&2 || { log "worktree for $rev failed"; exit 1; }
fi
log "building $rev in $wt"
make -C "$wt" -j2 all >/dev/null || { log "building $rev failed"; exit 1; }
make -j2 all >/dev/null || { log "building this tree failed"; exit 1; }

BLAS_INC=
[ -d /usr/include/x86_64-linux-gnu/openblas-openmp ] && BLAS_INC=-I/usr/include/x86_64-linux-gnu/openblas-openmp
FLAGS="-std=c11 -D_GNU_SOURCE -O2 -fopenmp -pthread $BLAS_INC"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-tree-ab.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
for side in base this; do
    if [ $side = base ]; then root=$wt; bdir=$wt/build; else root=.; bdir=$BUILD; fi
    init=blas_process_init
    grep -q blas_process_init "$root/engine/kernels/blas.h" || init=blas_choose_core
    # the rooms beside engine/ (grammar/, runtime/, planning/) where the tree has them
    objs=$(for s in "$root"/engine/*.c "$root"/engine/kernels/*.c "$root"/grammar/*.c "$root"/runtime/*.c \
        "$root"/planning/*.c; do
        [ -f "$s" ] || continue; r=${s#"$root"/}; printf '%s ' "$bdir/${r%.c}.o"; done)
    # shellcheck disable=SC2086
    cc $FLAGS -DAB_INIT=$init -I"$root/engine" -I"$root/grammar" -I"$root/runtime" -I"$root/planning" bench/engine_ab.c $objs -lopenblas -lcjson -lm \
        -o "$TMP/ab-$side" || { log "compiling engine_ab.c against $side failed"; exit 1; }
done

LOAD0=$(loadavg)
for dt in $TYPES; do
    m=$MODELS/q35-$dt.gguf
    [ -f "$m" ] || { log "$m is missing (make bench synthesizes it); skipped"; continue; }
    for r in $(seq "$REPS"); do
        if [ $((r % 2)) = 1 ]; then order="base this"; else order="this base"; fi
        for side in $order; do
            "$TMP/ab-$side" -m "$m" -t "$THREADS" -d "$STEPS" -n "$LENS" 2>"$TMP/err" |
                sed "s/^/$dt $side /" >> "$TMP/runs" || true
            [ -s "$TMP/err" ] && log "$dt $side: $(tail -1 "$TMP/err")"
            log "$dt rep $r $side done, load $(loadavg)"
        done
    done
done
LOAD1=$(loadavg)

mkdir -p "$(dirname "$OUT")"
"$PYTHON" - "$TMP/runs" "$rev" "$here" "$THREADS" "$REPS" "$LOAD0" "$LOAD1" > "$OUT" <<'EOF'
import statistics, sys
runs, base, here, threads, reps, load0, load1 = sys.argv[1:]
rows = {}
for line in open(runs):
    dt, side, kind, n, rate = line.split()
    rows.setdefault((dt, kind, int(n)), {}).setdefault(side, []).append(float(rate))
print(f"# This tree ({here}) against {base}: engine tokens/s, alternating runs\n")
print(f"{threads} threads, {reps} alternations per type, medians; in-process each figure is the median of "
      f"3 repetitions after a warm-up. Load average before / after: {load0} / {load1}.\n")
print("| weights | figure | tokens | base tok/s | this tok/s | this / base | |")
print("|---|---|---|---|---|---|---|")
worst = None
for (dt, kind, n), v in rows.items():
    if "base" not in v or "this" not in v:
        continue
    b, t = statistics.median(v["base"]), statistics.median(v["this"])
    ratio = t / b if b > 0 else float("inf")
    if worst is None or ratio < worst[0]:
        worst = (ratio, dt, kind, n)
    label = "prompt" if kind == "prompt" else "decode steps"
    print(f"| {dt} | {label} | {n} | {b:.1f} | {t:.1f} | {ratio:.2f} | {'slower' if ratio < 0.95 else ''} |")
if worst:
    print(f"\nLowest ratio: {worst[0]:.2f} ({worst[1]} {worst[2]} {worst[3]}).")
EOF
cat "$OUT"
