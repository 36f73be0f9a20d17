#!/bin/sh
# tests/suite_prefix.sh - prefix cache black-box tests (issue 26): greedy
# text with a hit equals the cache-off server's, where the cached tokens end
# (at a snapshot, between snapshots, mid-page, a branch point), salts,
# eviction, and a randomized load within the budgets. The last line is
# "prefix: N passed, N failed". Arguments: -k PATTERN, --list.
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_prefix: $HYSERVE is not built"
    echo "prefix: 0 passed, 1 failed"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export ASAN_OPTIONS
exec "$PYTHON" tests/suite_prefix.py "$@"
