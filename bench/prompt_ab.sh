#!/bin/sh
# prompt_ab.sh - prompt speed, alternating runs (the machine's load moves; only ratios of
# neighbouring runs mean much, so every line also prints the load average).
#
#   engine MODEL A_BIN B_BIN [SIZES]   `hyserve generate -n 1` on prompts of about SIZES tokens
#                                      (default "2 8 32 64 128 512"): A_BIN, then B_BIN with
#                                      $AB_VAR=0 and unset (auto), REPS times
#   server MODEL BIN [SIZE]            the same prompt (default ~320 tokens) through
#                                      `hyserve generate` (the engine alone) and through
#                                      POST /generate of `hyserve serve` (prefill = ttft_ms -
#                                      queue_ms of the access log line), with the prefix cache
#                                      on and off, REPS times
# Env: REPS (default 3), THREADS (default 2), PORT (default 18777), AB_VAR (the switch B_BIN
# runs with =0 and unset: default HYSERVE_INT8_PROMPT; HYSERVE_BF16_PROMPT for BF16 files). Prompts are random letters:
# about one token per character on the bench models' 4096-token vocabulary.
set -u
REPS=${REPS:-3}
THREADS=${THREADS:-2}
PORT=${PORT:-18777}
AB_VAR=${AB_VAR:-HYSERVE_INT8_PROMPT}
export OMP_WAIT_POLICY=PASSIVE

prompt() {   # about $1 tokens of random letters, the same for the same $1
    python3 -c "
import random; random.seed($1); print(''.join(random.choice('abcdefghij klmnop') for _ in range($1)))"
}
loadavg() { cut -d' ' -f1 /proc/loadavg; }

case ${1:-} in
engine)
    [ $# -ge 4 ] || { echo "usage: $0 engine MODEL A_BIN B_BIN [SIZES]" >&2; exit 2; }
    model=$2; a=$3; b=$4; sizes=${5:-"2 8 32 64 128 512"}
    for n in $sizes; do
        p=$(prompt "$n")
        for r in $(seq "$REPS"); do
            for v in a b0 bauto; do
                case $v in a) bin=$a; e=auto ;; b0) bin=$b; e=0 ;; bauto) bin=$b; e=auto ;; esac
                out=$(env "$AB_VAR=$e" "$bin" generate -m "$model" -p "$p" -n 1 -t "$THREADS" --temp 0 2>&1 \
                      >/dev/null | grep -o "prompt: .*tok/s)")
                echo "size $n rep $r $v: $out load $(loadavg)"
            done
        done
    done
    ;;
server)
    [ $# -ge 3 ] || { echo "usage: $0 server MODEL BIN [SIZE]" >&2; exit 2; }
    model=$2; bin=$3; p=$(prompt "${4:-320}")
    log=$(mktemp)
    for pc in on off; do
        "$bin" serve -m "$model" --port "$PORT" -t "$THREADS" --prefix-cache $pc >"$log" 2>&1 &
        sp=$!
        for _ in $(seq 300); do
            curl -s -o /dev/null -w "%{http_code}" "localhost:$PORT/ready" 2>/dev/null | grep -q 200 && break
            sleep 1
        done
        for r in $(seq "$REPS"); do
            e=$("$bin" generate -m "$model" -p "$p" -n 1 -t "$THREADS" --temp 0 2>&1 >/dev/null |
                grep -o "prompt: [0-9]* tokens in [0-9.]* s")
            # a different first character each time: no prefix-cache hit
            curl -s -o /dev/null "localhost:$PORT/generate" -H 'Content-Type: application/json' \
                -d "{\"inputs\": \"$r$p\", \"parameters\": {\"max_new_tokens\": 1}}"
            s=$(grep -o "prompt_tokens=[0-9]* .*queue_ms=[0-9.]* ttft_ms=[0-9.]*" "$log" | tail -1)
            echo "prefix cache $pc rep $r: engine [$e] server [$s] load $(loadavg)"
        done
        kill "$sp"
        wait "$sp" 2>/dev/null
    done
    rm -f "$log"
    ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
