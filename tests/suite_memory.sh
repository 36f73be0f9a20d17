#!/bin/sh
# tests/suite_memory.sh - cache memory accounting on a running server
# (issue 4): /stats bytes vs layout arithmetic vs the planner, admission
# against the budget, /v1/memory/estimate, /metrics, serve --synth.
# The last line is "memory: N passed, N failed"; non-zero exit on failure.
# Arguments go to the Python suite: -k PATTERN runs only the test functions
# whose name contains PATTERN (e.g. -k admission), --list names them.
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_memory: $HYSERVE is not built"
    echo "memory: 0 passed, 1 failed"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
exec "$PYTHON" tests/suite_memory.py "$@"
