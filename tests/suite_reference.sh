#!/bin/sh
# tests/suite_reference.sh - golden test of the C engine against the numpy
# float64 reference (tests/ref/). Runs tests/test_reference.py, which prints
# one line per case (with its max relative error) and, last,
# "reference: N passed, N failed". Exit status is non-zero on any failure,
# including a missing $HYSERVE binary (the C cases fail, they are not skipped).
#
# Env: HYSERVE (default build/hyserve), PYTHON (default /usr/bin/python3),
#      TEST_TMPDIR (default tests/tmp).
set -u
here=$(cd "$(dirname "$0")" && pwd)
root=$(dirname "$here")
: "${HYSERVE:=build/hyserve}" "${PYTHON:=/usr/bin/python3}" "${TEST_TMPDIR:=tests/tmp}"
# resolve relative paths against the caller's directory before moving to the repo root
case $HYSERVE in /*) ;; *) HYSERVE=$(pwd)/$HYSERVE ;; esac
case $TEST_TMPDIR in /*) ;; *) TEST_TMPDIR=$(pwd)/$TEST_TMPDIR ;; esac
export HYSERVE TEST_TMPDIR
cd "$root" || { echo "reference: 0 passed, 1 failed"; exit 1; }
if ! [ -x "$PYTHON" ]; then
    echo "reference: python $PYTHON not found"
    echo "reference: 0 passed, 1 failed"
    exit 1
fi
"$PYTHON" -B tests/test_reference.py "$@" 2>&1
rc=$?
exit $rc
