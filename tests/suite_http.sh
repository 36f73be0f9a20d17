#!/bin/sh
# tests/suite_http.sh - HTTP black-box tests of `hyserve serve` (issue 3).
#
# Starts the real server on 127.0.0.1 with small synthesized models and
# drives it with tests/suite_http.py (Python standard library only) and the
# `openai` npm package (tests/client, installed with `npm ci` when missing).
# The last line is "http: N passed, N failed"; exit status non-zero on failure.
# Arguments go to the Python suite: -k PATTERN runs only the test functions
# whose name contains PATTERN (e.g. -k stop_sequences), --list names them.
exec sh "$(dirname "$0")/python_suite.sh" http "$@"
