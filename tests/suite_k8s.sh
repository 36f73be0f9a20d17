#!/bin/sh
# tests/suite_k8s.sh - the Kubernetes manifests (docker/k8s/), the
# Dockerfile, compose.yaml and the nginx configurations checked against
# the server's routes, options and metrics, without a cluster
# (tools/check_k8s.py says what). Needs python3-yaml and build/hyserve
# (for `hyserve mem`). The last line is "k8s: N passed, N failed".
: "${PYTHON:=/usr/bin/python3}" "${HYSERVE:=build/hyserve}"
export HYSERVE
cd "$(dirname "$0")/.." || exit 1
exec "$PYTHON" tools/check_k8s.py .
