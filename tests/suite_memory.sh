#!/bin/sh
# tests/suite_memory.sh - cache memory accounting on a running server
# (issue 4): /stats bytes vs layout arithmetic vs the planner, admission
# against the budget, /v1/memory/estimate, /metrics, serve --synth.
# The last line is "memory: N passed, N failed"; non-zero exit on failure.
# Arguments go to the Python suite: -k PATTERN runs only the test functions
# whose name contains PATTERN (e.g. -k admission), --list names them.
exec sh "$(dirname "$0")/python_suite.sh" memory "$@"
