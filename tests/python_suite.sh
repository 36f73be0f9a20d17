#!/bin/sh
# tests/python_suite.sh NAME [ARGS] - runs tests/suite_NAME.py in the
# environment every Python suite shares; the wrappers tests/suite_NAME.sh
# (the files tests/run.sh runs) exec it. ARGS go to the Python suite (-k
# PATTERN, --list). When the server is not built it prints the suite's
# failing last line itself.
set -u
name=$1
shift
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_$name: $HYSERVE is not built"
    echo "$name: 0 passed, 1 failed"
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
exec "$PYTHON" "tests/suite_$name.py" "$@"
