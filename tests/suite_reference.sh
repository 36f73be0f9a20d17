#!/bin/sh
# tests/suite_reference.sh - golden test of the C engine against the numpy
# float64 reference (tests/ref/). Runs tests/suite_reference.py, then
# tests/suite_reference_mla.py (MLA layers, tests/ref/mla_ref.py), which print
# one line per case (with its max relative error); the suite's last line sums
# them: "reference: N passed, N failed". Exit status is non-zero on any failure,
# including a missing $HYSERVE binary (the C cases fail, they are not skipped).
#
# Arguments go to each script: -k PATTERN runs the cases whose name contains
# PATTERN (`--list` on a script itself names them).
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
# BF16 decode steps on the exact kernel: the vdpbf16ps one (chosen where it
# measures faster) rounds activations to bf16, which the numpy reference
# does not; tests/test_bf16.c checks that path against its own bound
HYSERVE_BF16_DOT=fma
export HYSERVE_BF16_DOT
cd "$root" || { echo "reference: 0 passed, 1 failed"; exit 1; }
if ! [ -x "$PYTHON" ]; then
    echo "reference: python $PYTHON not found"
    echo "reference: 0 passed, 1 failed"
    exit 1
fi
# Each script below prints its own "<name>: N passed, N failed" last; those lines are held
# back and their counts summed into this suite's single last line (a script that exits
# non-zero with no failure counted, or prints no such line, adds one failure).
scripts="tests/suite_reference.py tests/suite_reference_mla.py"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/suite_reference.XXXXXX") || { echo "reference: 0 passed, 1 failed"; exit 1; }
summary='^[A-Za-z0-9_.-]*: [0-9][0-9]* passed, [0-9][0-9]* failed'
passed=0 failed=0
for script in $scripts; do
    { "$PYTHON" -B "$script" "$@" 2>&1; echo $? >"$tmp/rc"; } | tee "$tmp/out" | grep --line-buffered -v "$summary"
    line=$(grep "$summary" "$tmp/out" | tail -n 1)
    rc=$(cat "$tmp/rc" 2>/dev/null || echo 1)
    if [ -z "$line" ]; then
        echo "reference: $script printed no summary line (exit $rc)"
        failed=$((failed + 1))
        continue
    fi
    p=$(echo "$line" | sed 's/^.*: \([0-9]*\) passed, \([0-9]*\) failed.*$/\1/')
    f=$(echo "$line" | sed 's/^.*: \([0-9]*\) passed, \([0-9]*\) failed.*$/\2/')
    [ "$rc" != 0 ] && [ "$f" = 0 ] && f=1
    echo "reference: $script: $p ok, $f failed"
    passed=$((passed + p)) failed=$((failed + f))
done
rm -rf "$tmp"
echo "reference: $passed passed, $failed failed"
[ "$failed" = 0 ]
