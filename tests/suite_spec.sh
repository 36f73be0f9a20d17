#!/bin/sh
# tests/suite_spec.sh - speculative decoding served end to end (issue 42):
# predictions, n-gram drafts, rollback on every recurrent kind, greedy and
# sampled equality with no speculation, metrics. The last line is
# "spec: N passed, N failed, N skipped"; non-zero exit on failure.
# Arguments go to the Python suite: -k PATTERN runs only the test functions
# whose name contains PATTERN (e.g. -k family), --list names them.
exec sh "$(dirname "$0")/python_suite.sh" spec "$@"
