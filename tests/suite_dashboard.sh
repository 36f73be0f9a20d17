#!/bin/sh
# tests/suite_dashboard.sh - the dashboard at GET / in a real browser (issue 27).
#
# Needs Debian's chromium (installed here when missing: about 300 MB with
# its libraries, too heavy for tools/install-deps.sh, which every build
# runs) and playwright-core from npm (tests/dashboard, `npm ci` when its
# node_modules is missing). tests/dashboard/dashboard.mjs starts the real
# server, runs 8 streaming requests and checks the page against /stats;
# screenshots go to $TEST_TMPDIR/dashboard/.
# The last line is "dashboard: N passed, N failed".
set -u
: "${HYSERVE:=build/hyserve}" "${TEST_TMPDIR:=tests/tmp}"
cd "$(dirname "$0")/.." || exit 1
export HYSERVE TEST_TMPDIR
OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMP_WAIT_POLICY

fail() {
    echo "suite_dashboard: $1"
    echo "dashboard: 0 passed, 1 failed"
    exit 1
}
[ -x "$HYSERVE" ] || fail "$HYSERVE is not built"
command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || fail "node and npm are needed"
if [ ! -x /usr/bin/chromium ]; then
    [ "$(id -u)" = 0 ] || fail "chromium is missing (apt-get install chromium, as root)"
    echo "suite_dashboard: installing chromium"
    export DEBIAN_FRONTEND=noninteractive
    { apt-get update -qq && apt-get install -y -qq chromium; } >"$TEST_TMPDIR/chromium-install.log" 2>&1 ||
        fail "apt-get install chromium failed (see $TEST_TMPDIR/chromium-install.log)"
fi
if [ ! -d tests/dashboard/node_modules/playwright-core ]; then
    (cd tests/dashboard && npm ci --no-audit --no-fund --silent) || fail "npm ci in tests/dashboard failed"
fi
exec node tests/dashboard/dashboard.mjs
