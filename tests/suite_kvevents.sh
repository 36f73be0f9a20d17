#!/bin/sh
# tests/suite_kvevents.sh - the prefix store's blocks as vLLM's KV events (issue
# 40 item 3): a subscriber written from the format (python3-zmq, python3-msgpack)
# decodes --kv-events during multi-turn conversations, evictions and a reset
# (tests/suite_kvevents.py says what it checks). Skipped when those packages
# are missing. The last line is "kvevents: N passed, N failed, N skipped".
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_kvevents: $HYSERVE is not built"
    echo "kvevents: 0 passed, 1 failed"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export ASAN_OPTIONS
exec "$PYTHON" tests/suite_kvevents.py "$@"
