#!/bin/sh
# bench/prefix.sh - the prefix cache benchmark (`make bench-prefix`, and a
# section of `make bench`): bench/prefix_bench.py against the
# Qwen3.5-0.8B-shaped Q8_0 bench model (its own copy, with a ChatML template
# for the chat requests) served with --prefix-cache on and
# then off, 2 threads each, one after the other. Writes
# bench/results/prefix-latest.json and prefix-latest.md.
#   BENCH_PREFIX_TURNS=10   turns of the chat (about 300 tokens each)
#   BENCH_PREFIX_N=32       requests sharing the system prompt
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}"
TURNS=${BENCH_PREFIX_TURNS:-10}
NREQ=${BENCH_PREFIX_N:-32}
OUT=bench/results
MODEL=bench/models/q35-q8_0-chat.gguf   # its own file: the same weights as make bench's, with a ChatML template
SYNTH="--layers 24 --attn-every 4 --embd 1024 --heads 8 --kv-heads 2 --head-dim 256 --rope-dim 64 \
--dnet-k-heads 16 --dnet-k-dim 128 --ff 3584 --vocab 4096 --ctx 16384 --dtype q8_0 --chat-template chatml"
log() { echo "bench-prefix: $*" >&2; }
case "$(dirname "$HYSERVE")" in
*san*) log "$HYSERVE is a sanitizer build; benchmark a plain build"; exit 1 ;;
esac
mkdir -p "$OUT" bench/models
if [ ! -f "$MODEL" ] || [ "$(cat "$MODEL.args" 2>/dev/null)" != "$SYNTH" ]; then
    log "synthesizing $MODEL"
    # shellcheck disable=SC2086
    "$HYSERVE" synth -o "$MODEL" $SYNTH >&2 || exit 1
    echo "$SYNTH" > "$MODEL.args"
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-prefix.XXXXXX")
SRV_PID=
cleanup() {
    if [ -n "$SRV_PID" ]; then kill "$SRV_PID" 2>/dev/null; wait "$SRV_PID" 2>/dev/null; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
LOAD0=$(loadavg)
for mode in on off; do
    port=$((19000 + $$ % 1000))
    "$HYSERVE" serve -m "$MODEL" --port "$port" -t 2 --config /dev/null --ctx 8192 --prefix-cache "$mode" \
        > "$TMP/server-$mode.log" 2>&1 &
    SRV_PID=$!
    i=0
    until "$PYTHON" -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/ready')" 2>/dev/null; do
        i=$((i + 1))
        if [ $i -gt 120 ] || ! kill -0 "$SRV_PID" 2>/dev/null; then
            log "server did not come up: $(tail -n 2 "$TMP/server-$mode.log")"
            exit 1
        fi
        sleep 1
    done
    log "cache $mode: running"
    "$PYTHON" bench/prefix_bench.py --port "$port" --turns "$TURNS" --n "$NREQ" > "$TMP/$mode.json" || exit 1
    kill "$SRV_PID"
    wait "$SRV_PID" 2>/dev/null
    SRV_PID=
done
LOAD1=$(loadavg)
"$PYTHON" - "$TMP/on.json" "$TMP/off.json" "$OUT/prefix-latest.json" "$OUT/prefix-latest.md" "$LOAD0" "$LOAD1" \
    "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" <<'EOF'
import json, sys, time
on, off = (json.load(open(p)) for p in sys.argv[1:3])
res = {"schema": "hyserve-bench-prefix/1", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
       "git": sys.argv[7], "model": "bench/models/q35-q8_0-chat.gguf (Qwen3.5-0.8B shape, Q8_0, ChatML template)", "threads": 2,
       "loadavg_start": sys.argv[5], "loadavg_end": sys.argv[6], "on": on, "off": off}
json.dump(res, open(sys.argv[3], "w"), indent=1)
L = ["# Prefix cache: on vs off", "",
     f"{res['date']}, git {res['git']}, {res['model']}, 2 threads, load average {res['loadavg_start']} -> "
     f"{res['loadavg_end']} (a shared machine: other sessions ran beside it).", "",
     "## Multi-turn chat, resent whole every turn (TTFT)", "",
     f"Each server first answered one cold 300-token request (not measured as a turn): TTFT on "
     f"{on.get('warmup_ttft_s', 0):.3f} s, off {off.get('warmup_ttft_s', 0):.3f} s. Steps: the request's engine "
     f"steps (its prefill steps, then one per generated token after the first; 31 of those), prefilled: prompt "
     f"tokens it ran.", "",
     "| turn | prompt tokens | cached (on) | prefilled on / off | steps on / off | TTFT on (s) | TTFT off (s) "
     "| off / on |", "|---|---|---|---|---|---|---|---|"]
for a, b in zip(on["chat"], off["chat"]):
    L.append(f"| {a['turn']} | {a['prompt_tokens']} | {a['cached_tokens']} | {a.get('prefilled')} / "
             f"{b.get('prefilled')} | {a.get('steps')} / {b.get('steps')} | {a['ttft_s']:.3f} | {b['ttft_s']:.3f} "
             f"| {b['ttft_s'] / a['ttft_s']:.1f}x |")
last_on, last_off = on["chat"][-1], off["chat"][-1]
L += ["", f"At the last turn: {last_off['ttft_s'] / last_on['ttft_s']:.1f}x faster with the cache "
      f"({last_on['ttft_s']:.3f} s against {last_off['ttft_s']:.3f} s).", "",
      f"## {len(on['system_prompt'])} chat requests sharing a system message "
      f"({on['system_prompt'][0]['system_turn_tokens']}-token system turn), /v1/chat/completions", ""]
def mean(xs): return sum(xs) / len(xs) if xs else 0
n_sys = on["system_prompt"][0]["system_turn_tokens"]
hits = [r for r in on["system_prompt"][1:] if (r["cached_tokens"] or 0) >= n_sys]
L += [f"- cache on: requests 2..{len(on['system_prompt'])} reusing all {n_sys} system-turn tokens: {len(hits)} of "
      f"{len(on['system_prompt']) - 1}; cached tokens "
      f"{[r['cached_tokens'] for r in on['system_prompt']]}",
      f"- mean TTFT on {mean([r['ttft_s'] for r in on['system_prompt'][1:]]):.3f} s, off "
      f"{mean([r['ttft_s'] for r in off['system_prompt'][1:]]):.3f} s (requests 2..n)"]
open(sys.argv[4], "w").write("\n".join(L) + "\n")
print("\n".join(L))
EOF
