#!/bin/sh
# tools/run.sh - `make run`: serve a model on http://HOST:PORT.
#
# usage: [PORT=N] [HOST=ADDR] [THREADS=N] [MODEL=FILE] sh tools/run.sh [HYSERVE_BINARY]
# (`make run PORT=8081 THREADS=2 MODEL=/models/x.gguf` passes them.)
# MODEL defaults to models/default.gguf; when that is absent, a small random
# demo model (ChatML template included) is synthesized next to the binary.
# PORT falls back to HYSERVE_PORT, then 8080; HOST to HYSERVE_HOST, then
# 127.0.0.1; THREADS to HYSERVE_THREADS, then the server's own choice.
# Prints the URL and curl lines (with the Authorization header when an API
# key is set), then execs the server (so it receives SIGTERM/SIGINT
# directly: Ctrl-C drains and exits).
set -eu
HYSERVE=${1:-build/hyserve}
cd "$(dirname "$0")/.."
if [ ! -x "$HYSERVE" ]; then
    echo "run: $HYSERVE is not built (run make first)" >&2
    exit 1
fi
HOST=${HOST:-${HYSERVE_HOST:-127.0.0.1}}
PORT=${PORT:-${HYSERVE_PORT:-8080}}
THREADS=${THREADS:-${HYSERVE_THREADS:-}}
case "$PORT" in
'' | *[!0-9]*) echo "run: PORT must be a number, got '$PORT'" >&2; exit 2 ;;
esac
case "$THREADS" in
*[!0-9]*) echo "run: THREADS must be a number, got '$THREADS'" >&2; exit 2 ;;
esac
if [ -n "${MODEL:-}" ]; then
    if [ ! -f "$MODEL" ]; then
        echo "run: MODEL=$MODEL: no such file" >&2
        exit 1
    fi
else
    MODEL=models/default.gguf
    if [ ! -f "$MODEL" ]; then
        MODEL=$(dirname "$HYSERVE")/demo.gguf
        if [ ! -f "$MODEL" ]; then
            echo "run: no models/default.gguf; synthesizing a small random demo model at $MODEL"
            "$HYSERVE" synth -o "$MODEL" --layers 4 --attn-every 2 --embd 64 --vocab 300 --chat-template chatml
        fi
        echo "run: $MODEL has random weights: expect gibberish (put a real GGUF at models/default.gguf, or MODEL=FILE)"
    fi
fi
case "$HOST" in
0.0.0.0 | '' | '*') URL="http://127.0.0.1:$PORT" ;;
*:*) URL="http://[$HOST]:$PORT" ;;
*) URL="http://$HOST:$PORT" ;;
esac
# an API key from the environment or the config file: the curl lines send it
# (the variable's name, not the key: the banner does not print secrets)
AUTH=""
if [ -n "${HYSERVE_API_KEY:-}" ]; then
    AUTH=' -H "Authorization: Bearer $HYSERVE_API_KEY"'
elif [ -n "${HYSERVE_API_KEY_FILE:-}" ] || grep -Eq '^[[:space:]]*api-key(-file)?[[:space:]]*=[[:space:]]*[^[:space:]#]' \
    "${HYSERVE_CONFIG:-config/server.conf}" 2>/dev/null; then
    AUTH=' -H "Authorization: Bearer $KEY"'
fi
set -- serve -m "$MODEL" --host "$HOST" --port "$PORT"
[ -n "$THREADS" ] && set -- "$@" -t "$THREADS"
cat <<MSG

hyserve: serving $MODEL at $URL  (Ctrl-C to drain and stop)
MSG
[ "$AUTH" = ' -H "Authorization: Bearer $KEY"' ] && echo "  (an API key is configured: set KEY to it for these lines)"
cat <<MSG

  curl -s$AUTH $URL/generate -d '{"inputs":"Hello","parameters":{"max_new_tokens":20}}'
  curl -sN$AUTH $URL/generate_stream -d '{"inputs":"Hello","parameters":{"max_new_tokens":20}}'
  curl -s$AUTH $URL/v1/chat/completions -d '{"messages":[{"role":"user","content":"Hi"}],"max_tokens":20}'
  curl -s$AUTH $URL/stats

MSG
exec "$HYSERVE" "$@"
