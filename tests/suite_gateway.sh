#!/bin/sh
# tests/suite_gateway.sh - the inference gateway's model-server protocol
# (issue 40): the keyless metrics listener, its scrape parsed by promtool
# and python3-prometheus-client and timed under a 16-stream load, the
# render routes against generation, the x-llm-d-* headers in the log and
# /stats (tests/suite_gateway.py says how each is checked). The last line
# is "gateway: N passed, N failed, N skipped". GATEWAY_LOAD_SECONDS sets the
# length of the load (default 4).
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_gateway: $HYSERVE is not built"
    echo "gateway: 0 passed, 1 failed"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export ASAN_OPTIONS
exec "$PYTHON" tests/suite_gateway.py "$@"
