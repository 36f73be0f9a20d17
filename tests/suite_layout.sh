#!/bin/sh
# tests/suite_layout.sh - the include rules between the rooms: engine/,
# engine/kernels/, grammar/, runtime/, planning/, server/ and cli/
# (tools/check_layout.py says what they are). The last line
# is "layout: N passed, N failed".
: "${PYTHON:=/usr/bin/python3}"
cd "$(dirname "$0")/.." || exit 1
exec "$PYTHON" tools/check_layout.py .
