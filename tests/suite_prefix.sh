#!/bin/sh
# tests/suite_prefix.sh - prefix cache black-box tests (issue 26): greedy
# text with a hit equals the cache-off server's, where the cached tokens end
# (at a snapshot, between snapshots, mid-page, a branch point), salts,
# eviction, and a randomized load within the budgets. The last line is
# "prefix: N passed, N failed". Arguments: -k PATTERN, --list.
exec sh "$(dirname "$0")/python_suite.sh" prefix "$@"
