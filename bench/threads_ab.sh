#!/bin/sh
# threads_ab.sh - decode when the machine has more runnable threads than cores: 1 thread
# against 2, with 0, 1 or 2 busy loops (a stand-in for a build or a second server) beside
# `hyserve generate`, for each OpenMP wait setting, in alternating runs. The machine's load
# moves, so only the ratios of neighbouring runs mean much; every line prints the load average.
#
#   sh bench/threads_ab.sh MODEL BIN [SETTINGS]
#
# SETTINGS (default "default libgomp passive"), each one of:
#   default   the binary's own choice when neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY is set:
#             passive when the load average at start is at or above the CPUs, else a short
#             spin (docs/performance.md section 8)
#   libgomp   libgomp's own default: 300000 spins (about 3 ms) before a waiting thread sleeps
#   passive   OMP_WAIT_POLICY=passive: sleep at once
#   NUMBER    GOMP_SPINCOUNT=NUMBER
# Env: REPS (default 3), HOGS (default "0 1 2"), N (tokens decoded, default 48).
set -u
[ $# -ge 2 ] || { sed -n '2,19p' "$0" >&2; exit 2; }
model=$1; bin=$2; settings=${3:-"default libgomp passive"}
REPS=${REPS:-3}; HOGS=${HOGS:-"0 1 2"}; N=${N:-48}
loadavg() { cut -d' ' -f1 /proc/loadavg; }
hog_pids=
hogs_stop() {
    for p in $hog_pids; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
    hog_pids=
}
trap hogs_stop EXIT
trap 'exit 130' INT TERM

decode() {   # setting threads -> "12.3" tok/s
    case $1 in
    default) env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$bin" generate -m "$model" -p "Hello" -n "$N" \
                 --ignore-eos --temp 0 -t "$2" 2>&1 >/dev/null ;;
    libgomp) env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=300000 "$bin" generate -m "$model" -p "Hello" -n "$N" \
                 --ignore-eos --temp 0 -t "$2" 2>&1 >/dev/null ;;
    passive) env -u GOMP_SPINCOUNT OMP_WAIT_POLICY=passive "$bin" generate -m "$model" -p "Hello" -n "$N" \
                 --ignore-eos --temp 0 -t "$2" 2>&1 >/dev/null ;;
    *) env -u OMP_WAIT_POLICY GOMP_SPINCOUNT="$1" "$bin" generate -m "$model" -p "Hello" -n "$N" \
                 --ignore-eos --temp 0 -t "$2" 2>&1 >/dev/null ;;
    esac | sed -n 's/.*decode: .*(\([0-9.]*\) tok\/s).*/\1/p'
}

for h in $HOGS; do
    i=0
    while [ "$i" -lt "$h" ]; do
        sh -c 'while :; do :; done' &
        hog_pids="$hog_pids $!"
        i=$((i + 1))
    done
    for r in $(seq "$REPS"); do
        for s in $settings; do
            one=$(decode "$s" 1); two=$(decode "$s" 2)
            echo "hogs $h rep $r $s: 1 thread $one tok/s, 2 threads $two tok/s, 2/1 $(echo "$one $two" |
                awk '{ if ($1 > 0) printf "%.2f", $2 / $1; else print "?" }') load $(loadavg)"
        done
    done
    hogs_stop
done
