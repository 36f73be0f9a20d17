#!/bin/sh
# tests/suite_soak.sh - a short soak (tools/soak.py): 8 streaming clients for
# SOAK_SECONDS (default 30) of mixed prompts, dropped streams, slow readers,
# garbage and completions; passes when no request is lost, no 5xx is seen and
# the pools return to idle. `make soak` is the long run (10 minutes, 32
# clients, RSS checked too). The last line is "soak: N passed, N failed".
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}"
cd "$(dirname "$0")/.." || exit 1
exec "$PYTHON" tools/soak.py --hyserve "$HYSERVE" --seconds "${SOAK_SECONDS:-30}" --clients 8
