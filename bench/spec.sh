#!/bin/sh
# bench/spec.sh - speculative decoding's decode speed against none, side by
# side in one run (`make bench-spec`, and a section of `make bench`):
# bench/spec_bench.py alternates no speculation, a token prediction equal to
# the greedy output, one wrong at every position, and n-gram drafts ("speculative": true; the server runs --spec-type none, so a prediction row drafts from the prediction alone), and
# draft-model rows (a server of its own with --model-draft: "draft" against its own "none") on
#   (a) the Qwen3.5-0.8B-shaped Q8_0 bench model (random weights: its text
#       copies nothing, so only the prediction rows say much there), 128
#       tokens, a free-text prompt; the same shape in Q4_K_M;
#   (b) the trained default model (models/default.gguf), a free-text prompt
#       and a prompt-copying one ("repeat this list"), 128 tokens: real
#       acceptance, on a 4.4M-parameter model that copies little;
#   (c) draft models: the bench model as its own draft (every draft accepted:
#       the upper bound, at the cost of a second full model per token) and
#       a 2-layer synth draft of the bench shape (the real cost of a small
#       draft; random weights, so it is rarely right), and the default model
#       as its own draft on both prompts;
#   (d) MTP drafts: the Q8_0 bench shape with a random MTP block (synth
#       --mtp 1; its drafts are rarely right, so the row is the cost of
#       drafting and verifying, which the adaptive length must keep near 1x).
# Writes bench/results/spec-latest.json and spec-latest.md.
#   BENCH_SPEC_MODEL=FILE   (a) on another model (a smoke run: a small synth)
#   BENCH_SPEC_ROUNDS=3     rounds per mode
#   BENCH_QUICK=1           1 round, 64 tokens
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}"
OUT=bench/results
MODEL=${BENCH_SPEC_MODEL:-bench/models/q35-q8_0.gguf}
SYNTH="--layers 24 --attn-every 4 --embd 1024 --heads 8 --kv-heads 2 --head-dim 256 --rope-dim 64 \
--dnet-k-heads 16 --dnet-k-dim 128 --ff 3584 --vocab 4096 --ctx 16384 --dtype q8_0"
ROUNDS=${BENCH_SPEC_ROUNDS:-3}
NEW=128
[ "${BENCH_QUICK:-0}" = 1 ] && ROUNDS=1 NEW=64
log() { echo "bench-spec: $*" >&2; }
case "$(dirname "$HYSERVE")" in
*san*) log "$HYSERVE is a sanitizer build; benchmark a plain build"; exit 1 ;;
esac
mkdir -p "$OUT" bench/models
if [ -z "${BENCH_SPEC_MODEL:-}" ] && { [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.args" 2>/dev/null)" != "$SYNTH" ]; }; then
    log "synthesizing $MODEL"
    # shellcheck disable=SC2086
    "$HYSERVE" synth -o "$MODEL" $SYNTH >&2 || exit 1
    echo "$SYNTH" > "$MODEL.args"
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-spec.XXXXXX")
SRV_PID=
cleanup() {
    if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
LOAD0=$(loadavg)
run_model() {   # tag, model, spec_bench arguments...
    tag=$1 m=$2
    shift 2
    port=$("$PYTHON" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    # shellcheck disable=SC2086
    "$HYSERVE" serve -m "$m" --port "$port" -t 2 --config /dev/null ${SRV_ARGS:---spec-type none} \
        > "$TMP/server-$tag.log" 2>&1 &
    SRV_PID=$!
    i=0
    until "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready')" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 120 ] || ! kill -0 "$SRV_PID" 2>/dev/null; then
            log "server did not come up: $(tail -n 2 "$TMP/server-$tag.log")"
            return 1
        fi
        sleep 1
    done
    log "$tag: running"
    "$PYTHON" bench/spec_bench.py --port "$port" --max-new "$NEW" --rounds "$ROUNDS" "$@" > "$TMP/$tag.json" || return 1
    kill "$SRV_PID"
    wait "$SRV_PID" 2>/dev/null
    SRV_PID=
}
# a bench-shape file (another type, an MTP block, a draft), synthesized once: path, synth arguments
synth_once() {
    if [ ! -f "$1" ] || [ "$(cat "$1.args" 2>/dev/null)" != "$2" ]; then
        log "synthesizing $1"
        # shellcheck disable=SC2086
        "$HYSERVE" synth -o "$1" $2 >&2 || return 1
        echo "$2" > "$1.args"
    fi
}
run_model bench "$MODEL" --prompt "free=The history of the city begins" || exit 1
MODEL4=bench/models/q35-q4_k_m.gguf
SYNTH4=$(echo "$SYNTH" | sed 's/--dtype q8_0/--dtype q4_k_m/')
MODELMTP=bench/models/q35-q8_0-mtp.gguf
SYNTHMTP="$SYNTH --mtp 1"
if [ -z "${BENCH_SPEC_MODEL:-}" ]; then
    synth_once "$MODEL4" "$SYNTH4" || exit 1
    run_model bench4 "$MODEL4" --prompt "free=The history of the city begins" || exit 1
    synth_once "$MODELMTP" "$SYNTHMTP" || exit 1
    SRV_ARGS="--spec-type draft-mtp" run_model bmtp "$MODELMTP" --modes none,draft \
        --prompt "free=The history of the city begins" || exit 1
fi
COPY="Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges, peaches, melons. \
Repeat this list exactly: apples, pears, plums, cherries, grapes, lemons, limes, oranges, peaches, melons. \
Repeat this list exactly: apples, pears,"
run_model default models/default.gguf --prompt "free=Once upon a time" --prompt "copy=$COPY" || exit 1
# (c) draft models: a server each, "draft" (its own drafts) against "none"
DRAFT=${MODEL%.gguf}-draft2.gguf
DSYNTH=$(echo "$SYNTH" | sed 's/--layers 24 --attn-every 4/--layers 2 --attn-every 2/')
synth_once "$DRAFT" "$DSYNTH" || exit 1
SRV_ARGS="--model-draft $MODEL" run_model bself "$MODEL" --modes none,draft \
    --prompt "free=The history of the city begins" || exit 1
SRV_ARGS="--model-draft $DRAFT" run_model bdraft2 "$MODEL" --modes none,draft \
    --prompt "free=The history of the city begins" || exit 1
SRV_ARGS="--model-draft models/default.gguf" run_model dself models/default.gguf --modes none,draft \
    --prompt "free=Once upon a time" --prompt "copy=$COPY" || exit 1
"$PYTHON" - "$TMP/bench.json" "$TMP/default.json" "$OUT/spec-latest.json" "$OUT/spec-latest.md" "$LOAD0" \
    "$(loadavg)" "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" "$MODEL" \
    "$TMP/bself.json" "$TMP/bdraft2.json" "$TMP/dself.json" "$DRAFT" "$TMP/bench4.json" "$MODEL4" \
    "$TMP/bmtp.json" "$MODELMTP" <<'PY'
import json, os, sys, time
bench, dflt = (json.load(open(p)) for p in sys.argv[1:3])
bself, bdraft2, dself = (json.load(open(p)) for p in sys.argv[9:12])
# (a) in Q4_K_M and (d) MTP: absent on a BENCH_SPEC_MODEL smoke run
bench4, bmtp = (json.load(open(p)) if os.path.exists(p) else None for p in (sys.argv[13], sys.argv[15]))
res = {"schema": "hyserve-bench-spec/2", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "git": sys.argv[7],
       "threads": 2, "loadavg_start": sys.argv[5], "loadavg_end": sys.argv[6],
       "models": {"bench": sys.argv[8], "default": "models/default.gguf",
                  "bself": f"{sys.argv[8]} (draft: itself)", "bdraft2": f"{sys.argv[8]} (draft: {sys.argv[12]})",
                  "dself": "models/default.gguf (draft: itself)"},
       "bench": bench, "default": dflt, "bself": bself, "bdraft2": bdraft2, "dself": dself}
if bench4:
    res["models"]["bench4"], res["bench4"] = sys.argv[14], bench4
if bmtp:
    res["models"]["bmtp"], res["bmtp"] = f"{sys.argv[16]} (draft: its MTP block)", bmtp
json.dump(res, open(sys.argv[3], "w"), indent=1)
L = ["# Speculative decoding: decode tok/s against none, side by side", "",
     f"{res['date']}, git {res['git']}, 2 threads, load average {res['loadavg_start']} -> {res['loadavg_end']} "
     "(a shared machine). Decode rate: (tokens - 1) / (last token - first token) of a streamed request, median "
     f"over {bench['rounds']} alternating rounds, {bench['max_new']} tokens, ignore_eos.", "",
     "| model | prompt | mode | tok/s | x none | drafts accepted / verified (last run) | same tokens |",
     "|---|---|---|---|---|---|---|"]
for key, r in (("bench", bench), ("bench4", bench4), ("default", dflt), ("bself", bself), ("bdraft2", bdraft2),
               ("dself", dself), ("bmtp", bmtp)):
    if r is None:
        continue
    for name, p in r["prompts"].items():
        for m, v in p["tok_s"].items():
            ratio = p["ratio_to_none"][m]
            la = p["last"][m]
            L.append(f"| {res['models'][key]} | {name} | {m} | {v:.1f} | {ratio:.2f} | {la['accepted_tokens']} / "
                     f"{la['draft_tokens']} | {p['same_tokens_as_none']} |")
open(sys.argv[4], "w").write("\n".join(L) + "\n")
print("\n".join(L))
PY
