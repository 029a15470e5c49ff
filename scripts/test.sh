#!/usr/bin/env bash
# Quick start, command 2: install what the tests need (redis-server, the real lock clients of
# tests/clients), then run every test: unit, integration, client compatibility, fault injection.
set -euo pipefail
cd "$(dirname "$0")/.."
sudo_cmd=""
[ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  $sudo_cmd apt-get update -q
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools
fi
if [ -x tests/clients/install.sh ]; then
  tests/clients/install.sh
fi
cargo test --release "$@"
