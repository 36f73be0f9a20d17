#!/bin/sh
# tests/suite_families.sh - the newer GGUF architectures served end to end:
# qwen35moe, granitehybrid (dense and MoE), nemotron_h and lfm2, each a small
# synthesized model behind `hyserve serve`: greedy chat and /generate equal
# `hyserve generate`, a live request's cache bytes by kind equal the planner
# and the formulas, prefix-cache hits read as cold, n: 3 forks with their
# derived seeds, and DELETE /requests/{id} cancels a stream and leaks nothing.
# The last line is "families: N passed, N failed". Arguments: -k PATTERN
# (test_NAME[FAMILY], e.g. -k lfm2 or -k test_prefix), --list.
set -u
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
export HYSERVE TEST_TMPDIR
if [ ! -x "$HYSERVE" ]; then
    echo "suite_families: $HYSERVE is not built"
    echo "families: 0 passed, 1 failed"
    exit 1
fi
cd "$(dirname "$0")/.." || exit 1
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export ASAN_OPTIONS
exec "$PYTHON" tests/suite_families.py "$@"
