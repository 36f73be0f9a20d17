#!/bin/sh
# tests/suite_options.sh - docs/options.md, the generated reference of every
# option and HYSERVE_* variable, against the code it is generated from
# (tools/gen_options_doc.py), and every HYSERVE_* name the code reads
# against the two tables in server/config.c (tests/suite_options.py says
# what). Needs cc, no build. The last line is
# "options: N passed, N failed"; non-zero exit on failure.
set -u
: "${PYTHON:=/usr/bin/python3}"
cd "$(dirname "$0")/.." || exit 1
exec "$PYTHON" tests/suite_options.py "$@"
