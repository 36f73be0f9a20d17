#!/bin/sh
# bench/families.sh - the hybrid families (`make bench-families`, and a
# section of `make bench`): one synthesized model per architecture, shaped
# like a released one with its layer mix, head and state sizes and expert
# ratios kept and the width scaled to embd 1024 (vocab 4096, tied), in each
# weight type; per model `hyserve-bench family` measures a 512-token prompt
# at 2 threads (MoE: also with each row's experts as one-row products, the
# grouping's baseline) and decode at 2 threads against the triad measured
# before and after it. Writes bench/results/families-latest.json and .md.
#   BENCH_FAMILY_DTYPES="f16 q8_0 q4_k_m"   weight types
#   BENCH_FAMILIES="jamba lfm2"             some of the models below
#   BENCH_QUICK=1                           one repetition each
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}"
BIN=${BENCH_BIN:-$(dirname "$HYSERVE")/bench/hyserve-bench}
DTYPES=${BENCH_FAMILY_DTYPES:-"f16 q8_0 q4_k_m"}
QUICK=${BENCH_QUICK:-0}
OUT=bench/results
MODELS=bench/models
log() { echo "bench-families: $*" >&2; }
case "$(dirname "$HYSERVE")" in
*san*) log "$HYSERVE is a sanitizer build; benchmark a plain build"; exit 1 ;;
esac
[ -x "$BIN" ] || { log "$BIN is missing (make bench-families builds it)"; exit 1; }
mkdir -p "$OUT" "$MODELS"

# name | what it is scaled from | hyserve synth arguments (embd 1024, vocab 4096 and the dtype added)
SHAPES=$(cat <<'EOF'
qwen35moe|Qwen3.5-35B-A3B: 3 DeltaNet : 1 gated attention, 8 of 256 experts (here 64) + shared|--arch qwen35moe --layers 8 --pattern LLLA --heads 8 --kv-heads 2 --head-dim 256 --rope-dim 64 --dnet-k-heads 8 --dnet-v-heads 16 --dnet-k-dim 128 --experts 64 --experts-used 8 --expert-ff 256 --shared-ff 256 --ff 512
granitehybrid-moe|Granite-4.0-H-Tiny: Mamba-2 (d_state 128, 1 group) with 1 attention in 8, 6 of 64 experts + shared|--arch granitehybrid --layers 8 --pattern SSSASSSS --heads 8 --kv-heads 2 --head-dim 128 --ssm-heads 32 --ssm-head-dim 64 --ssm-state 128 --ssm-groups 1 --experts 64 --experts-used 6 --expert-ff 256 --shared-ff 512 --ff 512
granitehybrid|Granite-4.0-H-Micro: the same layers, a dense SwiGLU MLP|--arch granitehybrid --layers 12 --pattern SSSASSSSSASS --heads 8 --kv-heads 2 --head-dim 128 --ssm-heads 32 --ssm-head-dim 64 --ssm-state 128 --ssm-groups 1 --experts 0 --ff 4096
nemotron_h|Nemotron-H-8B: Mamba-2 (8 groups, d_state 128), MLP-only ReLU^2 and a few attention layers|--arch nemotron_h --layers 16 --pattern SFSFAFSFSFSFAFSF --heads 8 --kv-heads 2 --head-dim 128 --ssm-heads 32 --ssm-head-dim 64 --ssm-state 128 --ssm-groups 8 --ff 5376
lfm2|LFM2-1.2B: 10 gated short convs (L 3) : 6 GQA layers|--arch lfm2 --layers 16 --pattern CCACCACCACACACAC --heads 16 --kv-heads 4 --head-dim 64 --conv-kernel 3 --ff 4096
falcon-h1|Falcon-H1-1.5B: attention and Mamba-2 side by side in every layer|--arch falcon-h1 --layers 12 --heads 8 --kv-heads 2 --head-dim 128 --ssm-heads 16 --ssm-head-dim 64 --ssm-state 128 --ssm-groups 1 --ff 4096
jamba|Jamba-Mini: 1 attention : 7 Mamba-1 (d_state 16), 2 of 16 experts every other layer|--arch jamba --layers 8 --pattern BBBBABBB --heads 8 --kv-heads 2 --head-dim 128 --ssm-state 16 --ssm-dt-rank 64 --experts 16 --experts-used 2 --ff 1536
kimi-linear|Kimi-Linear-48B-A3B: 3 KDA : 1 MLA (latent 512, NoPE), 8 of 256 experts (here 64) + shared|--arch kimi-linear --layers 8 --pattern KKKMKKKM --heads 8 --head-dim 128 --mla-kv-lora 512 --mla-rope 64 --mla-nope 128 --mla-vdim 128 --experts 64 --experts-used 8 --expert-ff 256 --shared-ff 256 --ff 1024
EOF
)
WANT=${BENCH_FAMILIES:-$(echo "$SHAPES" | cut -d'|' -f1 | tr '\n' ' ')}

TMP=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-families.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
trap 'exit 130' INT TERM
loadavg() { cut -d' ' -f1-3 /proc/loadavg 2>/dev/null || echo "?"; }
Q=
[ "$QUICK" = 1 ] && Q=--quick
LOAD0=$(loadavg)
T0=$(date +%s)
PARTS=
for name in $WANT; do
    line=$(echo "$SHAPES" | grep "^$name|") || { log "no model named $name"; continue; }
    from=$(echo "$line" | cut -d'|' -f2)
    args=$(echo "$line" | cut -d'|' -f3)
    for dt in $DTYPES; do
        f=$MODELS/fam-$name-$dt.gguf
        want="$args --embd 1024 --vocab 4096 --ctx 4096 --dtype $dt"
        if [ ! -f "$f" ] || [ "$(cat "$f.args" 2>/dev/null)" != "$want" ]; then
            log "synthesizing $f"
            # shellcheck disable=SC2086
            "$HYSERVE" synth -o "$f" $want >&2 || { log "synth $name $dt failed"; continue; }
            echo "$want" > "$f.args"
        fi
        log "$name $dt ..."
        part=$TMP/$name-$dt.json
        # shellcheck disable=SC2086
        if "$BIN" $Q family "$f" "$dt" > "$part.raw" 2> "$TMP/err"; then
            "$PYTHON" -c 'import json, sys
d = json.load(open(sys.argv[1])); d.update(name=sys.argv[2], scaled_from=sys.argv[3], synth=sys.argv[4],
                                          loadavg=sys.argv[5])
json.dump(d, open(sys.argv[6], "w"))' "$part.raw" "$name" "$from" "$want" "$(loadavg)" "$part" &&
                PARTS="$PARTS $part"
        else
            log "$name $dt FAILED: $(tail -n 2 "$TMP/err")"
        fi
    done
done
GIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
DIRTY=false
[ -n "$(git status --porcelain 2>/dev/null)" ] && DIRTY=true
# shellcheck disable=SC2086
"$PYTHON" bench/families_report.py "$OUT/families-latest.json" "$OUT/families-latest.md" \
    "{\"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\", \"git\": \"$GIT\", \"git_dirty\": $DIRTY, \"quick\": $([ "$QUICK" = 1 ] && echo true || echo false), \"seconds\": $(( $(date +%s) - T0 )), \"loadavg_start\": \"$LOAD0\", \"loadavg_end\": \"$(loadavg)\", \"blas\": \"$("$BIN" info)\", \"note\": \"$(echo "${BENCH_NOTE:-}" | tr -d '"\\')\"}" \
    $PARTS || exit 1
cat "$OUT/families-latest.md"
