#!/usr/bin/env bash
# Quick start, command 1: install what is missing (redis-server), then run the proxy on an
# embedded local cluster of 5 masters, listening on 127.0.0.1:7379, with metrics and probes at
# http://127.0.0.1:9379/{metrics,healthz,readyz}. Extra flags are passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
exec cargo run --release --bin redlock-proxy -- --local 5 --metrics 127.0.0.1:9379 "$@"
