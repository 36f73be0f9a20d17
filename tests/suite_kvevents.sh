#!/bin/sh
# tests/suite_kvevents.sh - the prefix store's blocks as vLLM's KV events (issue
# 40 item 3): a subscriber written from the format (python3-zmq, python3-msgpack)
# decodes --kv-events during multi-turn conversations, evictions and a reset
# (tests/suite_kvevents.py says what it checks). Skipped when those packages
# are missing. The last line is "kvevents: N passed, N failed, N skipped".
exec sh "$(dirname "$0")/python_suite.sh" kvevents "$@"
