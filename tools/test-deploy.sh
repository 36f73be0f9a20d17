#!/bin/sh
# tools/test-deploy.sh - `make test-deploy`: build the Docker images and
# check the deployment with real containers (tools/deploy_checks.py says
# which checks).
#
#   1. a Docker Engine answers (tools/docker-engine.sh: installs docker.io,
#      starts dockerd when none runs, and this script stops it at exit);
#   2. debian:bookworm-slim exists (tools/docker-base.sh: pulled, or made
#      by debootstrap and cached);
#   3. the images build: hyserve:latest (docker/Dockerfile, its build stage
#      kept as hyserve-build:cache so the next run reuses its layers) and
#      hyserve-nginx:latest (docker/nginx/Dockerfile);
#   4. the checks, each printed as "ok - ..." or "not ok - ...".
# Last line: "deploy: N passed, N failed"; exit status 1 on any failure.
#
# Idempotent: what an earlier run left (containers with the test label,
# the compose project, stale image layers) is removed first, and
# everything this run starts is removed on any exit, by a trap. Ports are
# on 127.0.0.1 only. Needs root (Docker). The images stay, tagged, for the
# next run's cache; the base image's root filesystem is cached in
# /var/cache/hyserve-docker.
set -u
cd "$(dirname "$0")/.." || exit 1
: "${PYTHON:=/usr/bin/python3}"

PROJECT=hyserve-deploy-test
LABEL=io.hyserve.test=deploy
STATE=$(mktemp -d "${TMPDIR:-/tmp}/hyserve-deploy.XXXXXX")
OUT=$STATE/checks.out
T0=$(date +%s)
COMPOSE=""
n_pass=0
n_fail=0

ok() { n_pass=$((n_pass + 1)); echo "ok - $*"; }
not_ok() { n_fail=$((n_fail + 1)); echo "not ok - $*"; }

# a compose command: the `docker compose` plugin where it exists, else
# Debian's docker-compose (installed when missing)
find_compose() {
    if docker compose version >/dev/null 2>&1; then
        COMPOSE="docker compose"
    elif command -v docker-compose >/dev/null 2>&1; then
        COMPOSE=docker-compose
    else
        echo "test-deploy: installing docker-compose" >&2
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null 2>&1 ||
            { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose >/dev/null; }
        command -v docker-compose >/dev/null 2>&1 && COMPOSE=docker-compose
    fi
    [ -n "$COMPOSE" ]
}

# remove this test's containers, compose project (and its network), and
# the dangling layers of earlier builds of these images; bounded
remove_leftovers() {
    [ -n "$COMPOSE" ] &&
        timeout 180 $COMPOSE -p "$PROJECT" -f docker/compose.yaml down -v --remove-orphans -t 5 >/dev/null 2>&1
    ids=$(timeout 30 docker ps -aq --filter "label=$LABEL" 2>/dev/null)
    [ -n "$ids" ] && timeout 120 docker rm -f $ids >/dev/null 2>&1
    ids=$(timeout 30 docker ps -aq --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null)
    [ -n "$ids" ] && timeout 120 docker rm -f $ids >/dev/null 2>&1
    nets=$(timeout 30 docker network ls -q --filter "label=com.docker.compose.project=$PROJECT" 2>/dev/null)
    [ -n "$nets" ] && timeout 60 docker network rm $nets >/dev/null 2>&1
    timeout 120 docker image prune -f --filter "label=io.hyserve.image" >/dev/null 2>&1
    return 0
}

cleanup() {
    rc=$?
    trap - EXIT INT TERM
    if timeout 20 docker info >/dev/null 2>&1; then
        remove_leftovers
    fi
    sh tools/docker-engine.sh stop "$STATE/engine"
    rm -rf "$STATE"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

finish() {
    echo "# make test-deploy took $(($(date +%s) - T0)) s"
    echo "deploy: $n_pass passed, $n_fail failed"
    [ "$n_fail" -eq 0 ]
    exit $?
}

# build one image, quietly; the log's tail on failure
build() {
    what=$1
    shift
    log=$STATE/build-$what.log
    tb=$(date +%s)
    if timeout 1500 docker build --rm --force-rm "$@" . >"$log" 2>&1; then
        echo "# built $what in $(($(date +%s) - tb)) s"
        return 0
    fi
    tail -n 30 "$log" | sed 's/^/#   /'
    return 1
}

if ! sh tools/docker-engine.sh start "$STATE/engine"; then
    not_ok "a Docker Engine answers"
    finish
fi
if ! find_compose; then
    not_ok "docker compose or docker-compose is available"
    finish
fi
echo "# docker $(docker version -f '{{.Server.Version}}' 2>/dev/null), compose: $COMPOSE"
remove_leftovers
if ! sh tools/docker-base.sh; then
    not_ok "the base image debian:bookworm-slim is there (pulled, or made by debootstrap)"
    finish
fi

t=$(date +%s)
if build build-stage -f docker/Dockerfile --target build -t hyserve-build:cache &&
    build hyserve -f docker/Dockerfile -t hyserve:latest &&
    build nginx -f docker/nginx/Dockerfile -t hyserve-nginx:latest; then
    ok "the images build from debian:bookworm-slim (hyserve:latest, hyserve-nginx:latest) in $(($(date +%s) - t)) s"
else
    not_ok "the images build"
    finish
fi

"$PYTHON" tools/deploy_checks.py --project "$PROJECT" --label "$LABEL" --state "$STATE" --compose "$COMPOSE" |
    tee "$OUT"
n_pass=$((n_pass + $(grep -c '^ok - ' "$OUT")))
n_fail=$((n_fail + $(grep -c '^not ok - ' "$OUT")))
# a checker that died before its report
grep -q '^checks: [0-9]* passed, [0-9]* failed' "$OUT" || not_ok "tools/deploy_checks.py reported"
finish
