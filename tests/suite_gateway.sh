#!/bin/sh
# tests/suite_gateway.sh - the inference gateway's model-server protocol
# (issue 40): the keyless metrics listener, its scrape parsed by promtool
# and python3-prometheus-client and timed under a 16-stream load, the
# render routes against generation, the x-llm-d-* headers in the log and
# /stats (tests/suite_gateway.py says how each is checked). The last line
# is "gateway: N passed, N failed, N skipped". GATEWAY_LOAD_SECONDS sets the
# length of the load (default 4).
exec sh "$(dirname "$0")/python_suite.sh" gateway "$@"
