#!/bin/bash
# Check the client scripts themselves, without the proxy: start one plain
# redis-server on a free loopback port, run run-all.sh with PROXY_PORT and
# MASTER_PORTS both set to it (one master, quorum 1: a correct proxy must behave
# exactly like this), then stop the server.
#
#   bash tests/clients/selftest.sh [NAME...]       (NAME: as in run-all.sh)
#
# Needs redis-server (Debian package redis-server) besides tests/clients/install.sh.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
command -v redis-server >/dev/null || { echo "selftest.sh: redis-server not installed (apt-get install redis-server)" >&2; exit 2; }
PORT=""
for p in $(seq "${SELFTEST_PORT_MIN:-17001}" "${SELFTEST_PORT_MAX:-17099}"); do
  if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then PORT=$p; break; fi
done
[ -n "$PORT" ] || { echo "selftest.sh: no free port in range" >&2; exit 2; }
LOG=$(mktemp)
redis-server --port "$PORT" --bind 127.0.0.1 --save '' --appendonly no --daemonize no >"$LOG" 2>&1 &
SRV=$!
trap 'kill "$SRV" 2>/dev/null; wait "$SRV" 2>/dev/null; rm -f "$LOG"' EXIT
for _ in $(seq 50); do
  [ "$(redis-cli -p "$PORT" PING 2>/dev/null)" = PONG ] && break
  sleep 0.1
done
[ "$(redis-cli -p "$PORT" PING 2>/dev/null)" = PONG ] || { echo "selftest.sh: redis-server on $PORT did not start:" >&2; cat "$LOG" >&2; exit 2; }
echo "selftest.sh: redis-server $(redis-server --version | awk '{print $3}') on 127.0.0.1:$PORT" >&2
PROXY_PORT=$PORT MASTER_PORTS=$PORT bash "$HERE/run-all.sh" "$@"
