#!/bin/sh
# tests/suite_connections.sh - connections at scale, as an attacker would try
# them (issue 43): idle keep-alive connections by the thousand, body tricklers
# cut at their deadline while honest requests from another address are timed,
# concurrent SSE streams with a flat thread count, readers that stop reading
# (tests/suite_connections.py says what it checks). CONN_SCALE=full is the
# issue's scale (make test-connections); the default, short, runs in make test.
# The last line is "connections: N passed, N failed".
exec sh "$(dirname "$0")/python_suite.sh" connections "$@"
