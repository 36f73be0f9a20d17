#!/bin/sh
# prompt_ab.sh - prompt speed, alternating runs (the machine's load moves; only ratios of
# neighbouring runs mean much, so every line also prints the load average).
#
#   engine MODEL A_BIN B_BIN [SIZES]   `hyserve generate -n 1` on prompts of about SIZES tokens
#                                      (default "2 8 32 64 128 512"): A_BIN, then B_BIN with
#                                      $AB_VAR=0 and unset (auto), REPS times
#   server MODEL BIN [SIZE [BIN_B]]    the same prompt (default ~320 tokens) through
#                                      `hyserve generate` (the engine alone) and through
#                                      POST /generate of two `hyserve serve`s up at once, the
#                                      prefix cache on and off (and BIN_B's two, when given),
#                                      in turn, REPS times; prints the client's seconds, the
#                                      access log's queue_ms and prefill (ttft_ms - queue_ms),
#                                      then medians and each server's prefill over the engine's
# Env: REPS (default 3), THREADS (default 2), PORT (default 18777), AB_VAR (the switch B_BIN
# runs with =0 and unset: default HYSERVE_INT8_PROMPT; HYSERVE_BF16_PROMPT for BF16 files). Prompts are random letters:
# about one token per character on the bench models' 4096-token vocabulary.
set -u
REPS=${REPS:-3}
THREADS=${THREADS:-2}
PORT=${PORT:-18777}
AB_VAR=${AB_VAR:-HYSERVE_INT8_PROMPT}
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY-PASSIVE}"   # OMP_WAIT_POLICY= (empty): libgomp's default, spin then sleep

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
    [ $# -ge 3 ] || { echo "usage: $0 server MODEL BIN [SIZE [BIN_B]]" >&2; exit 2; }
    model=$2; bin=$3; size=${4:-320}; bin_b=${5:-}; p=$(prompt "$size")
    tmp=$(mktemp -d)
    targets="on off"
    [ -n "$bin_b" ] && targets="on off b_on b_off"
    pids=
    cleanup() { for sp in $pids; do kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null; done; rm -rf "$tmp"; }
    trap cleanup EXIT
    trap 'exit 130' INT TERM
    i=0
    for t in $targets; do   # every server up at once: each request runs while the others idle
        case $t in b_*) b=$bin_b ;; *) b=$bin ;; esac
        "$b" serve -m "$model" --port $((PORT + i)) -t "$THREADS" --config /dev/null --prefix-cache "${t#b_}" \
            >"$tmp/$t.log" 2>&1 &
        pids="$pids $!"
        i=$((i + 1))
    done
    i=0
    for t in $targets; do
        for _ in $(seq 300); do
            curl -s -o /dev/null -w "%{http_code}" "localhost:$((PORT + i))/ready" 2>/dev/null | grep -q 200 && break
            sleep 1
        done
        i=$((i + 1))
    done
    ask() {     # ask PORT TEXT: POST /generate, one new token; prints the client's seconds
        curl -s -o /dev/null -w "%{time_total}" "localhost:$1/generate" -H 'Content-Type: application/json' \
            -d "{\"inputs\": \"$2\", \"parameters\": {\"max_new_tokens\": 1}}"
    }
    i=0
    for t in $targets; do ask $((PORT + i)) "w$p" >/dev/null; i=$((i + 1)); done    # each server's first request
    echo "# $size-character prompt, $THREADS threads, REPS=$REPS; per rep the engine alone, then each server"
    echo "# (a prompt no cache holds: its first character differs every time); client = curl's total seconds,"
    echo "# queue/ttft = the access log's queue_ms/ttft_ms, prefill = ttft - queue"
    for r in $(seq "$REPS"); do
        e=$("$bin" generate -m "$model" -p "$r$p" -n 1 -t "$THREADS" --temp 0 2>&1 >/dev/null |
            grep -o "prompt: [0-9]* tokens in [0-9.]* s" | awk '{print $2, $5}')
        echo "rep $r engine tokens_s $e load $(loadavg)"
        i=0
        for t in $targets; do
            c=$(ask $((PORT + i)) "$r$p")
            l=$(grep -o "queue_ms=[0-9.]* ttft_ms=[0-9.]*" "$tmp/$t.log" | tail -1 | tr '=' ' ' | awk '{print $2, $4}')
            echo "rep $r $t client_s $c queue_ttft_ms $l load $(loadavg)"
            i=$((i + 1))
        done
    done | tee "$tmp/runs"
    # medians, and each server's against the engine's prompt seconds
    awk '
    function med(a, n,   i, j, t) { for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
                                    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
    $3 == "engine" { ne++; eng[ne] = $6; ntok = $5; next }
    $1 == "rep" { k = $3; n[k]++; cl[k, n[k]] = $5; q[k, n[k]] = $7; pf[k, n[k]] = ($8 - $7) / 1000; if (!(k in seen)) { seen[k] = 1; order[++no] = k } }
    END {
        em = med(eng, ne)
        printf "median: engine prompt %.3f s (%d tokens)\n", em, ntok
        for (o = 1; o <= no; o++) { k = order[o]
            for (i = 1; i <= n[k]; i++) { a[i] = cl[k, i]; b[i] = q[k, i]; c[i] = pf[k, i] }
            mc = med(a, n[k]); mq = med(b, n[k]); mp = med(c, n[k])
            printf "median: %-5s client %.3f s, queue %.1f ms, prefill %.3f s = %.3fx the engine\n", k, mc, mq, mp, mp / em
        }
    }' "$tmp/runs"
    ;;
*)
    sed -n '2,16p' "$0" >&2
    exit 2
    ;;
esac
