#!/usr/bin/env bash
# Quick start, command 2: install what the tests need (redis-server, chromium for the status
# page's browser test, the real lock clients of tests/clients), then run every test of the workspace (the proxy and its test kit): unit,
# integration, client compatibility, fault injection.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh
ensure_redis
ensure_chromium
if [ -x tests/clients/install.sh ]; then
  tests/clients/install.sh
fi
# Release code without debug info (Cargo.toml, profile `release-tests`).
cargo test --profile release-tests --workspace "$@"
