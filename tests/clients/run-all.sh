#!/bin/bash
# Run every real-client compatibility scenario against a Redis-compatible
# endpoint, in sequence; stop at the first failure and show its output.
#
#   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 bash tests/clients/run-all.sh [NAME...]
#
#   PROXY_PORT    port on 127.0.0.1 the clients take/extend/release locks through
#   MASTER_PORTS  comma-separated ports on 127.0.0.1 of the N redis-server masters
#                 behind it (checked directly: value on >= N/2+1, gone after release)
#   KEY           optional lock key for every scenario (default: a unique key each)
#   NAME...       optional: run only these scenarios (see the list below)
#   SCENARIO_TIMEOUT  seconds per scenario (default 150)
#
#   MASTER_SETTLE_MS  how long a master may lag the proxy's reply before a key must be
#                 gone / a foreign value rolled back (default 1000)
#   TTL_SLACK / TTL_SLACK_PCT  slack on upper PTTL bounds (default 0.05 / 5)
#
# Needs tests/clients/install.sh to have run. Prints every scenario's RESULT line,
# then "N passed, M failed". WARN lines of passing scenarios (a minority of masters
# out of step) go to stderr. Exit status 0 only if every scenario passed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
DEPS=${CLIENT_DEPS_DIR:-$HERE/.deps}
PY="$DEPS/venv/bin/python"
: "${PROXY_PORT:?set PROXY_PORT (port of the proxy on 127.0.0.1)}"
: "${MASTER_PORTS:?set MASTER_PORTS (comma-separated redis-server ports on 127.0.0.1)}"
export PROXY_PORT MASTER_PORTS
TMO=${SCENARIO_TIMEOUT:-150}

SCENARIOS=(
  "redis-cli          bash $HERE/redis-cli.sh oneshot"
  "redis-cli-resp3    bash $HERE/redis-cli.sh resp3"
  "redis-cli-interactive bash $HERE/redis-cli.sh interactive"
  "php-phpredis       php $HERE/php-phpredis.php"
  "redis-py-resp3     $PY $HERE/python-redis-py.py sync resp3"
  "redis-py-resp2     $PY $HERE/python-redis-py.py sync resp2"
  "redis-py-asyncio-resp3 $PY $HERE/python-redis-py.py asyncio resp3"
  "redis-py-asyncio-resp2 $PY $HERE/python-redis-py.py asyncio resp2"
  "node-redis4        node $HERE/node-redis.js redis4"
  "node-redis5        node $HERE/node-redis.js redis5"
  "node-redis6        node $HERE/node-redis.js redis"
  "redlock-ioredis5   node $HERE/node-redlock.js ioredis"
  "redlock-ioredis6   node $HERE/node-redlock.js ioredis6"
)

missing=""
[ -x "$PY" ] || missing="$missing python-venv"
[ -d "$DEPS/node/node_modules/redlock" ] || missing="$missing node_modules"
command -v php >/dev/null || missing="$missing php"
command -v redis-cli >/dev/null || missing="$missing redis-cli"
if [ -n "$missing" ]; then
  echo "run-all.sh: missing:$missing; run: bash $HERE/install.sh" >&2
  exit 2
fi

RESULTS=()
passed=0
failed=0
T0=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT
for entry in "${SCENARIOS[@]}"; do
  read -r name cmd <<< "$entry"
  if [ $# -gt 0 ]; then
    want=0
    for a in "$@"; do [ "$a" = "$name" ] && want=1; done
    [ $want = 1 ] || continue
  fi
  t0=$EPOCHREALTIME
  # shellcheck disable=SC2086  # cmd is a trusted word list from above
  timeout --kill-after=5 "$TMO" $cmd > "$OUT" 2>&1
  rc=$?
  dt=$(elapsed "$t0")
  result=$(grep '^RESULT ' "$OUT")
  nres=$(grep -c '^RESULT ' "$OUT")
  if [ $rc -eq 0 ] && [ "$nres" = 1 ] && [[ "$result" == *'"status":"pass"'* ]]; then
    passed=$((passed + 1))
    RESULTS+=("$result")
    printf 'run-all.sh: %-24s pass  %5ss\n' "$name" "$dt" >&2
    grep '^WARN' "$OUT" | sed 's/^/    | /' >&2
  else
    failed=$((failed + 1))
    [ $rc -eq 124 ] && echo "run-all.sh: $name: killed after ${TMO}s" >&2
    printf 'run-all.sh: %-24s FAIL  %5ss (exit %s, %s RESULT line(s)); output:\n' "$name" "$dt" "$rc" "$nres" >&2
    sed 's/^/    | /' "$OUT" >&2
    break
  fi
done
for r in "${RESULTS[@]}"; do echo "$r"; done
echo "run-all.sh: total $(elapsed "$T0")s" >&2
echo "$passed passed, $failed failed"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
