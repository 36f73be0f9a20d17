#!/bin/sh
# tests/suite_spec.sh - speculative decoding served end to end (issue 42):
# predictions, n-gram drafts, rollback on every recurrent kind, greedy and
# sampled equality with no speculation, metrics. The last line is
# "spec: N passed, N failed, N skipped"; non-zero exit on failure.
# Arguments go to the Python suite: -k PATTERN runs only the test functions
# whose name contains PATTERN (e.g. -k family), --list names them.
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_spec: $HYSERVE is not built"
    echo "spec: 0 passed, 1 failed, 0 skipped"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
exec "$PYTHON" tests/suite_spec.py "$@"
