#!/bin/sh
# tools/run.sh - `make run`: serve the default model on http://127.0.0.1:8080.
#
# usage: sh tools/run.sh [HYSERVE_BINARY]
# Serves models/default.gguf when it exists; otherwise synthesizes a small
# random demo model (ChatML template included) next to the binary first.
# Prints the URL and a curl line, then execs the server (so it receives
# SIGTERM/SIGINT directly: Ctrl-C drains and exits).
set -eu
HYSERVE=${1:-build/hyserve}
cd "$(dirname "$0")/.."
if [ ! -x "$HYSERVE" ]; then
    echo "run: $HYSERVE is not built (run make first)" >&2
    exit 1
fi
HOST=127.0.0.1
PORT=${HYSERVE_PORT:-8080}
MODEL=models/default.gguf
if [ ! -f "$MODEL" ]; then
    MODEL=$(dirname "$HYSERVE")/demo.gguf
    if [ ! -f "$MODEL" ]; then
        echo "run: no models/default.gguf; synthesizing a small random demo model at $MODEL"
        "$HYSERVE" synth -o "$MODEL" --layers 4 --attn-every 2 --embd 64 --vocab 300 --chat-template chatml
    fi
    echo "run: $MODEL has random weights: expect gibberish (put a real GGUF at models/default.gguf)"
fi
URL="http://$HOST:$PORT"
cat <<MSG

hyserve: serving $MODEL at $URL  (Ctrl-C to drain and stop)

  curl -s $URL/generate -d '{"inputs":"Hello","parameters":{"max_new_tokens":20}}'
  curl -sN $URL/generate_stream -d '{"inputs":"Hello","parameters":{"max_new_tokens":20}}'
  curl -s $URL/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":20}'
  curl -s $URL/stats

MSG
exec "$HYSERVE" serve -m "$MODEL" --host "$HOST" --port "$PORT"
