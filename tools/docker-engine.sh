#!/bin/sh
# tools/docker-engine.sh - make sure a Docker Engine answers, and stop it
# afterwards only if this script started it.
#
# usage: sh tools/docker-engine.sh start STATEFILE
#        sh tools/docker-engine.sh stop STATEFILE
#
# start: installs Debian's docker.io with apt when dockerd is missing; when
#   `docker info` gets no answer, starts dockerd in the background (there is
#   no systemd here), waits for it (bounded), and writes its pid to
#   STATEFILE. A daemon that already answers is used as it is, and
#   STATEFILE stays absent.
# stop: ends the dockerd whose pid STATEFILE holds (SIGTERM, then SIGKILL
#   after 30 s) and removes STATEFILE; does nothing without STATEFILE.
# Needs root to install or start the daemon.
set -u

say() { echo "docker-engine: $*" >&2; }

# true when a daemon answers within 20 s
answers() { timeout 20 docker info >/dev/null 2>&1; }

alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }

# the process is a dockerd (not a recycled pid)
is_dockerd() { [ "$(cat "/proc/$1/comm" 2>/dev/null)" = dockerd ]; }

apt_install() {
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "$@" >/dev/null 2>&1 ||
        { apt-get update -qq && apt-get install -y -qq "$@" >/dev/null; }
}

start() {
    state=$1
    if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
        if [ "$(id -u)" != 0 ]; then
            say "dockerd is not installed (as root: apt-get install docker.io)"
            return 1
        fi
        say "installing docker.io"
        apt_install docker.io || { say "apt-get install docker.io failed"; return 1; }
    fi
    answers && return 0
    # a daemon that is still starting: give it time rather than start another
    if pgrep -x dockerd >/dev/null 2>&1; then
        say "a dockerd is running but not answering yet: waiting for it"
        i=0
        while [ $i -lt 60 ]; do
            answers && return 0
            sleep 1
            i=$((i + 1))
        done
        say "the running dockerd does not answer"
        return 1
    fi
    if [ "$(id -u)" != 0 ]; then
        say "no Docker daemon answers, and starting one needs root"
        return 1
    fi
    # a pid file left by a daemon that died stops a new one from starting
    if [ -f /var/run/docker.pid ] && ! alive "$(cat /var/run/docker.pid)"; then
        rm -f /var/run/docker.pid
    fi
    log=${state}.log
    say "starting dockerd (log: $log)"
    # a background job of a non-interactive shell ignores SIGINT: Ctrl-C on
    # the caller leaves the daemon up for the caller's cleanup
    dockerd >"$log" 2>&1 &
    pid=$!
    echo "$pid" >"$state"
    i=0
    while [ $i -lt 90 ]; do
        if ! alive "$pid"; then
            say "dockerd exited while starting:"
            tail -n 15 "$log" >&2
            rm -f "$state"
            return 1
        fi
        answers && return 0
        sleep 1
        i=$((i + 1))
    done
    say "dockerd did not answer within 90 s:"
    tail -n 15 "$log" >&2
    stop "$state"
    return 1
}

stop() {
    state=$1
    [ -f "$state" ] || return 0
    pid=$(cat "$state")
    if alive "$pid" && is_dockerd "$pid"; then
        say "stopping the dockerd this run started (pid $pid)"
        kill -TERM "$pid" 2>/dev/null
        i=0
        while alive "$pid" && [ $i -lt 300 ]; do
            sleep 0.1
            i=$((i + 1))
        done
        if alive "$pid"; then
            say "dockerd still up after 30 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null
        fi
    fi
    rm -f "$state"
}

case "${1:-}" in
start | stop)
    [ $# -eq 2 ] || { echo "usage: sh tools/docker-engine.sh start|stop STATEFILE" >&2; exit 2; }
    "$1" "$2"
    ;;
*)
    echo "usage: sh tools/docker-engine.sh start|stop STATEFILE" >&2
    exit 2
    ;;
esac
