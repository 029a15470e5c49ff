#!/bin/bash
# Run every real-client compatibility scenario against a Redis-compatible
# endpoint, JOBS at a time; every scenario runs, failed or not.
#
#   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 bash tests/clients/run-all.sh [NAME...]
#
#   PROXY_PORT    port on 127.0.0.1 the clients take/extend/release locks through
#   MASTER_PORTS  comma-separated ports on 127.0.0.1 of the N redis-server masters
#                 behind it (checked directly: value on >= N/2+1, gone after release)
#   KEY           optional lock key for every scenario (default: a unique key each;
#                 set it only with JOBS=1, scenarios running at once must not share a key)
#   NAME...       optional: run only these scenarios (see the list below)
#   JOBS          scenarios run at once (default 4: most of a scenario's time is spent
#                 waiting for a TTL or a retry, not on the CPU)
#   SCENARIO_TIMEOUT  seconds per scenario (default 150)
#
#   MASTER_SETTLE_MS  how long a master may lag the proxy's reply before a key must be
#                 gone / a foreign value rolled back (default 1000)
#   TTL_SLACK / TTL_SLACK_PCT  slack on upper PTTL bounds (default 0.05 / 5)
#
# Needs tests/clients/install.sh to have run. Prints one RESULT line per scenario, in the
# order below, with its run-all name added as "scenario" (a failed scenario's line has
# "status":"fail" and the "step" it failed in), then "N passed, M failed, K skipped" (a scenario whose server lacks what it exercises says "status":"n/a"). The output of
# failed scenarios and the WARN lines of passing ones (a minority of masters out of step)
# go to stderr. Exit status 0 only if every scenario passed.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
DEPS=${CLIENT_DEPS_DIR:-$HERE/.deps}
PY="$DEPS/venv/bin/python"
: "${PROXY_PORT:?set PROXY_PORT (port of the proxy on 127.0.0.1)}"
: "${MASTER_PORTS:?set MASTER_PORTS (comma-separated redis-server ports on 127.0.0.1)}"
export PROXY_PORT MASTER_PORTS
TMO=${SCENARIO_TIMEOUT:-150}
JOBS=${JOBS:-4}

SCENARIOS=(
  "redis-cli          bash $HERE/redis-cli.sh oneshot"
  "redis-cli-resp3    bash $HERE/redis-cli.sh resp3"
  "redis-cli-interactive bash $HERE/redis-cli.sh interactive"
  "php-phpredis       php $HERE/php-phpredis.php"
  "redis-py-resp3     $PY $HERE/python-redis-py.py sync resp3"
  "redis-py-resp2     $PY $HERE/python-redis-py.py sync resp2"
  "redis-py-asyncio-resp3 $PY $HERE/python-redis-py.py asyncio resp3"
  "redis-py-asyncio-resp2 $PY $HERE/python-redis-py.py asyncio resp2"
  "redis-py-8.4-commands $PY $HERE/python-redis84.py"
  "node-redis4        node $HERE/node-redis.js redis4"
  "node-redis5        node $HERE/node-redis.js redis5"
  "node-redis6        node $HERE/node-redis.js redis"
  "redlock-ioredis5   node $HERE/node-redlock.js ioredis"
  "redlock-ioredis6   node $HERE/node-redlock.js ioredis6"
  "pottery            $PY $HERE/python-locks.py pottery"
  "python-redis-lock  $PY $HERE/python-locks.py python-redis-lock"
  "sherlock           $PY $HERE/python-locks.py sherlock"
  "redlock-universal-redis   node $HERE/node-locks.js redlock-universal-redis"
  "redlock-universal-ioredis node $HERE/node-locks.js redlock-universal-ioredis"
  "redis-semaphore-mutex     node $HERE/node-locks.js redis-semaphore-mutex"
  "redis-semaphore-semaphore node $HERE/node-locks.js redis-semaphore-semaphore"
  "sesamecare-redlock        node $HERE/node-locks.js sesamecare-redlock"
  "ioredis-lock              node $HERE/node-locks.js ioredis-lock"
  "redisson-replay           $PY $HERE/redisson-replay.py"
)

# Run alone (nothing else at the same time): the first ones SCRIPT LOAD and then expect
# EVALSHA to find the script, the others SCRIPT FLUSH the masters mid-run; against a plain
# redis-server (selftest.sh, the baseline of tests/clients.rs) a flush between another
# scenario's SCRIPT LOAD and EVALSHA makes that EVALSHA fail with NOSCRIPT. (A proxy sends
# a script whole again where a master answers NOSCRIPT: through it they would not collide.)
ALONE="redis-cli redis-cli-resp3 redis-cli-interactive redis-py-resp3 redis-py-resp2
       redis-py-asyncio-resp3 redis-py-asyncio-resp2 node-redis4 node-redis5 node-redis6
       redlock-ioredis5 redlock-ioredis6"

missing=""
[ -x "$PY" ] || missing="$missing python-venv"
[ -d "$DEPS/node/node_modules/redlock-universal" ] || missing="$missing node_modules"
[ -x "$PY" ] && ! "$PY" -c 'import pottery, redis_lock, sherlock' 2>/dev/null && missing="$missing python-lock-libraries"
command -v php >/dev/null || missing="$missing php"
command -v redis-cli >/dev/null || missing="$missing redis-cli"
if [ -n "$missing" ]; then
  echo "run-all.sh: missing:$missing; run: bash $HERE/install.sh" >&2
  exit 2
fi

T0=$EPOCHREALTIME
elapsed() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# one scenario, its output in $WORK/$name.out, its exit status and time in $WORK/$name.rc
run_one() {  # name cmd...
  local name=$1 t0=$EPOCHREALTIME rc
  shift
  timeout --kill-after=5 "$TMO" "$@" > "$WORK/$name.out" 2>&1
  rc=$?
  echo "$rc $(elapsed "$t0")" > "$WORK/$name.rc"
}

alone() { local a; for a in $ALONE; do [ "$a" = "$1" ] && return 0; done; return 1; }

names=()
running=0
for entry in "${SCENARIOS[@]}"; do
  read -r name cmd <<< "$entry"
  if [ $# -gt 0 ]; then
    want=0
    for a in "$@"; do [ "$a" = "$name" ] && want=1; done
    [ $want = 1 ] || continue
  fi
  names+=("$name")
  if alone "$name"; then
    wait
    running=0
    # shellcheck disable=SC2086  # cmd is a trusted word list from above
    run_one "$name" $cmd
    continue
  fi
  if [ "$running" -ge "$JOBS" ]; then
    wait -n
    running=$((running - 1))
  fi
  # shellcheck disable=SC2086  # cmd is a trusted word list from above
  run_one "$name" $cmd &
  running=$((running + 1))
done
wait

passed=0
failed=0
skipped=0
RESULTS=()
for name in "${names[@]}"; do
  out="$WORK/$name.out"
  read -r rc dt < "$WORK/$name.rc"
  result=$(grep '^RESULT ' "$out" | head -n 1)
  nres=$(grep -c '^RESULT ' "$out")
  if [ "$rc" -eq 0 ] && [ "$nres" = 1 ] && [[ "$result" == *'"status":"pass"'* ]]; then
    passed=$((passed + 1))
    printf 'run-all.sh: %-26s pass  %5ss\n' "$name" "$dt" >&2
    grep '^WARN' "$out" | sed 's/^/    | /' >&2
  elif [ "$rc" -eq 0 ] && [ "$nres" = 1 ] && [[ "$result" == *'"status":"n/a"'* ]]; then
    # the server lacks what the scenario exercises (tests/clients.rs allows it on the baseline)
    skipped=$((skipped + 1))
    printf 'run-all.sh: %-26s n/a   %5ss\n' "$name" "$dt" >&2
  else
    failed=$((failed + 1))
    [ "$rc" -eq 124 ] && echo "run-all.sh: $name: killed after ${TMO}s" >&2
    printf 'run-all.sh: %-26s FAIL  %5ss (exit %s, %s RESULT line(s)); output:\n' "$name" "$dt" "$rc" "$nres" >&2
    sed 's/^/    | /' "$out" >&2
    # a script that died without saying where: a RESULT line of its own
    if [[ "$result" != *'"status":"fail"'* ]]; then
      step="exit $rc"
      [ "$rc" -eq 124 ] && step="killed after ${TMO}s"
      result="RESULT {\"client\":\"$name\",\"version\":\"\",\"protocol\":\"?\",\"status\":\"fail\",\"step\":\"$step\",\"checks\":0}"
    fi
  fi
  RESULTS+=("RESULT {\"scenario\":\"$name\",${result#RESULT \{}")
done
for r in "${RESULTS[@]}"; do echo "$r"; done
echo "run-all.sh: total $(elapsed "$T0")s" >&2
echo "$passed passed, $failed failed, $skipped skipped"
[ $failed -eq 0 ] && [ $passed -gt 0 ]
