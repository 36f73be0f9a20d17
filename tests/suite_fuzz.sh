#!/bin/sh
# tests/suite_fuzz.sh - the libFuzzer targets of tests/fuzz/ (make fuzz-build).
#
# Default (`make test`): each target runs every regression input of
# tests/fuzz/regress/ once (the hand-made malicious inputs and every crash
# found so far), then FUZZ_RUNS (default 3000) fuzzed inputs from its seed
# corpus, with a fixed seed so a run is repeatable. One test per target and
# part; the last line is "fuzz: N passed, N failed".
#   --seconds S NAME...   fuzz the named targets S seconds each instead (make
#                         fuzz); new inputs are kept in tests/tmp/fuzz/NAME
# A crash leaves its input in tests/tmp/fuzz/NAME/crash-*; copy it into
# tests/fuzz/regress/<folder>/ once fixed. The GGUF targets (gguf, tokenizer)
# share the gguf folders. Without the binaries (no clang with its libFuzzer
# runtime: `make deps` installs it) every target is reported skipped.
cd "$(dirname "$0")/.." || exit 1
: "${FUZZ_DIR:=build-fuzz}" "${FUZZ_RUNS:=3000}" "${TEST_TMPDIR:=tests/tmp}"
export FUZZ_ROOT="$PWD"
# LeakSanitizer is on (libFuzzer's -detect_leaks); ASan's allocator returns
# NULL past the limit instead of aborting, as malloc does when memory runs out
export ASAN_OPTIONS="${ASAN_OPTIONS:-allocator_may_return_null=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
seconds=""
if [ "${1:-}" = "--seconds" ]; then
    seconds=$2; shift 2
fi
names="$*"
[ -n "$names" ] || names=$(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||')

passed=0; failed=0; skipped=0
ok() { echo "ok - $1"; passed=$((passed + 1)); }
notok() { echo "not ok - $1"; failed=$((failed + 1)); }

folder() { case $1 in gguf|tokenizer) echo gguf ;; *) echo "$1" ;; esac; }

for n in $names; do
    bin=$FUZZ_DIR/fuzz_$n
    if [ ! -x "$bin" ]; then
        echo "skipped - fuzz $n: $bin is not built (needs clang and its libFuzzer runtime: make deps fuzz-build)"
        skipped=$((skipped + 1)); continue
    fi
    f=$(folder "$n")
    work=$TEST_TMPDIR/fuzz/$n
    mkdir -p "$work/new"
    log=$work/log
    opts="-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=30 -artifact_prefix=$work/ -print_final_stats=1"
    if [ -n "$seconds" ]; then
        # shellcheck disable=SC2086
        if "$bin" $opts -max_total_time="$seconds" -max_len=65536 "$work/new" "tests/fuzz/corpus/$f" >"$log" 2>&1; then
            ok "fuzz $n: $(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}') inputs in ${seconds}s, no crash"
        else
            notok "fuzz $n: crashed; input and log in $work/"; tail -n 40 "$log"
        fi
        continue
    fi
    nreg=$(ls "tests/fuzz/regress/$f" 2>/dev/null | wc -l)
    if [ "$nreg" -gt 0 ]; then
        # shellcheck disable=SC2086
        if "$bin" $opts "tests/fuzz/regress/$f"/* >"$log.regress" 2>&1; then
            ok "fuzz $n: $nreg regression inputs"
        else
            notok "fuzz $n: a regression input fails"; tail -n 40 "$log.regress"
        fi
    fi
    rm -rf "$work/new"; mkdir -p "$work/new"
    # shellcheck disable=SC2086
    if "$bin" $opts -seed=1 -runs="$FUZZ_RUNS" -max_len=65536 "$work/new" "tests/fuzz/corpus/$f" >"$log" 2>&1; then
        ok "fuzz $n: $FUZZ_RUNS fuzzed inputs from $(ls "tests/fuzz/corpus/$f" | wc -l) seeds"
    else
        notok "fuzz $n: crashed; input and log in $work/"; tail -n 40 "$log"
    fi
done
[ "$skipped" -gt 0 ] && echo "fuzz: $skipped targets skipped (not built)"
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
