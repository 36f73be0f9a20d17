#!/bin/sh
# Install the Debian packages hyserve needs, if any are missing.
# Safe to run repeatedly: does nothing when everything is present.
#
# usage: sh tools/install-deps.sh [build|all]
#   build  what compiling build/hyserve needs (the Docker image's build stage;
#          python3-minimal runs tools/embed_web.py, the dashboard's files as C)
#   all    that, and what the test suites need (default; `make` and `make test`;
#          clang with its libFuzzer runtime and libomp build tests/fuzz/)
set -e
BUILD_PKGS="gcc make pkg-config libmicrohttpd-dev libcjson-dev libzmq3-dev libopenblas-openmp-dev python3-minimal"
TEST_PKGS="python3-numpy python3-yaml python3-prometheus-client python3-zmq python3-msgpack curl nodejs npm unicode-data prometheus clang libclang-rt-dev libomp-dev"
case "${1:-all}" in
build) PKGS=$BUILD_PKGS ;;
all) PKGS="$BUILD_PKGS $TEST_PKGS" ;;
*)
    echo "usage: sh tools/install-deps.sh [build|all]" >&2
    exit 2
    ;;
esac
missing=""
for p in $PKGS; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
# nodejs/npm may come from outside Debian's packages on some images; accept any working node.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
    missing=$(echo "$missing" | sed 's/ nodejs//; s/ npm//')
fi
missing=$(echo "$missing" | sed 's/^ *//')
[ -z "$missing" ] && exit 0
if [ "$(id -u)" != 0 ]; then
    echo "install-deps: missing Debian packages: $missing (run as root, or install them)" >&2
    exit 1
fi
echo "install-deps: installing $missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq $missing >/dev/null
