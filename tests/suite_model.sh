#!/bin/sh
# tests/suite_model.sh - the shipped default model (models/default.gguf) loads
# in the C engine, has both layer kinds, and scores the committed held-out
# excerpt (models/heldout.txt) as recorded by the training tool in
# models/default.json ("reference_perplexity", within 1%).
#
# Needs only the C binary and the committed files (no Python, no torch).
# Prints one line per check and, last, "model: N passed, N failed"; exit
# status is non-zero on any failure.
#
# Env: HYSERVE (default build/hyserve).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
: "${HYSERVE:=build/hyserve}"
case $HYSERVE in /*) ;; *) HYSERVE=$(pwd)/$HYSERVE ;; esac
cd "$root" || { echo "model: 0 passed, 1 failed"; exit 1; }

MODEL=models/default.gguf
TEXT=models/heldout.txt
CARD=models/default.json
pass=0; fail=0
ok() { echo "ok   - $1"; pass=$((pass + 1)); }
bad() { echo "FAIL - $1"; fail=$((fail + 1)); }

# "key": number from the one-key-per-line JSON the training tool writes
json_num() {
    sed -n "s/^ *\"$1\": *\([-0-9.eE+]*\),\{0,1\} *$/\1/p" "$CARD" | head -n 1
}

if [ -x "$HYSERVE" ] && [ -f "$MODEL" ] && info=$("$HYSERVE" info -m "$MODEL" 2>&1); then
    ok "hyserve info loads $MODEL"
else
    bad "hyserve info loads $MODEL (binary $HYSERVE)"
    info=""
fi

layout=$(echo "$info" | sed -n 's/^layout: *\([ALM]*\).*/\1/p')
case $layout in
    *A*L* | *L*A*) ok "layout $layout has attention (A) and DeltaNet (L) layers" ;;
    *) bad "layout '$layout' should have both attention (A) and DeltaNet (L) layers" ;;
esac

want=$(json_num reference_perplexity)
ctx=$(json_num reference_ctx)
stride=$(json_num reference_stride)
if [ -n "$want" ] && [ -n "$ctx" ] && [ -n "$stride" ] && [ -f "$TEXT" ]; then
    ok "recorded perplexity $want (ctx $ctx, stride $stride) in $CARD"
else
    bad "recorded perplexity, ctx and stride in $CARD, and $TEXT present"
fi

ntok=$(json_num reference_tokens)
if [ -n "$info" ] && [ -n "$want" ] && [ -n "$ctx" ] && [ -n "$stride" ] &&
    out=$("$HYSERVE" perplexity -m "$MODEL" -f "$TEXT" --ctx "$ctx" --stride "$stride" 2>/dev/null); then
    got=$(echo "$out" | sed -n 's/^perplexity: *//p')
    toks=$(echo "$out" | sed -n 's/^tokens: *\([0-9]*\).*/\1/p')
    if [ -n "$got" ] && awk -v g="$got" -v w="$want" 'BEGIN { d = (g - w) / w; if (d < 0) d = -d; exit !(d <= 0.01) }'; then
        ok "hyserve perplexity on $TEXT: $got, within 1% of $want"
    else
        bad "hyserve perplexity on $TEXT: '$got', expected $want within 1%"
    fi
    if [ -n "$toks" ] && [ "$toks" = "$ntok" ]; then
        ok "the C tokenizer splits $TEXT into $toks tokens, as the training tool did"
    else
        bad "the C tokenizer splits $TEXT into '$toks' tokens, the training tool into '$ntok'"
    fi
else
    bad "hyserve perplexity runs on $TEXT"
fi

echo "model: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
