#!/usr/bin/env bash
# Quick start, command 1: install what is missing (redis-server), then run the proxy on an
# embedded local cluster of 5 masters, listening on 127.0.0.1:7379, with metrics and probes at
# http://127.0.0.1:9379/ (the status page; also /metrics, /healthz, /readyz). Extra flags are passed on, and a flag given
# here wins over the script's default for it (`--local 3`, `--metrics 127.0.0.1:30380`).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
defaults=()
given() {  # flag: whether the caller passed it (`--flag value` or `--flag=value`)
  local arg
  for arg in "${ARGS[@]}"; do
    [[ "$arg" == "$1" || "$arg" == "$1="* ]] && return 0
  done
  return 1
}
ARGS=("$@")
given --local || defaults+=(--local 5)
given --metrics || defaults+=(--metrics 127.0.0.1:9379)
exec cargo run --release --bin redlock-proxy -- "${defaults[@]}" "$@"
