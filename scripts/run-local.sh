#!/usr/bin/env bash
# Quick start, command 1: install what is missing (redis-server), then run the proxy on an
# embedded local cluster of 5 masters, listening on 127.0.0.1:7379. Extra flags are passed on.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q
  $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server redis-tools
  # The Debian package may start a system-wide server on 6379; the proxy does not need it.
  (command -v systemctl >/dev/null && $sudo_cmd systemctl disable --now redis-server 2>/dev/null) || true
fi
exec cargo run --release --bin redlock-proxy -- --local 5 "$@"
