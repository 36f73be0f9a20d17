#!/bin/sh
# tests/suite_http.sh - HTTP black-box tests of `hyserve serve` (issue 3).
#
# Starts the real server on 127.0.0.1 with small synthesized models and
# drives it with tests/suite_http.py (Python standard library only) and the
# `openai` npm package (tests/client, installed with `npm ci` when missing).
# The last line is "http: N passed, N failed"; exit status non-zero on failure.
# Arguments go to the Python suite: -k PATTERN runs only the test functions
# whose name contains PATTERN (e.g. -k stop_sequences), --list names them.
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_http: $HYSERVE is not built"
    echo "http: 0 passed, 1 failed"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
# OpenMP's default active spin-waiting makes every barrier cost a scheduler
# time slice when the machine is busier than its cores (a shared CI box):
# engine steps then take ~0.3 s instead of ~1 ms and the timing-based tests
# (drain, queue timeout) fail. Passive waiting keeps them meaningful.
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
# under ASan, leaks are reported at exit of each server; keep the report in its log
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export ASAN_OPTIONS
exec "$PYTHON" tests/suite_http.py "$@"
