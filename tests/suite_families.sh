#!/bin/sh
# tests/suite_families.sh - the newer GGUF architectures served end to end:
# qwen35moe, granitehybrid (dense and MoE), nemotron_h and lfm2, each a small
# synthesized model behind `hyserve serve`: greedy chat and /generate equal
# `hyserve generate`, a live request's cache bytes by kind equal the planner
# and the formulas, prefix-cache hits read as cold, n: 3 forks with their
# derived seeds, and DELETE /requests/{id} cancels a stream and leaks nothing.
# The last line is "families: N passed, N failed". Arguments: -k PATTERN
# (test_NAME[FAMILY], e.g. -k lfm2 or -k test_prefix), --list.
exec sh "$(dirname "$0")/python_suite.sh" families "$@"
