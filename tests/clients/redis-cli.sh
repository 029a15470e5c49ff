#!/bin/bash
# redis-cli as a lock client, through the proxy.
#
#   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] bash tests/clients/redis-cli.sh MODE
#
# MODE:
#   oneshot      (default) one redis-cli process per command, RESP2:
#                SET k tok NX PX 30000, contention SET NX, EVAL extend/release
#                (the recorded scripts), SCRIPT LOAD + EVALSHA, unknown EVALSHA -> NOSCRIPT
#   resp3        the same with `redis-cli -3` (HELLO 3 before every command)
#   interactive  one long-lived `redis-cli -p PORT` fed commands on stdin (no command
#                argument, stdin not a tty): SET NX PX, GET, EVAL extend, EVAL release;
#                the contender is a second interactive session. redis-cli sends
#                `COMMAND DOCS` by itself when such a session starts.
#
# Lock operations go to 127.0.0.1:$PROXY_PORT; the checks read every master in
# MASTER_PORTS directly. Exit status 0 and one `RESULT {...}` line on stdout on
# success; non-zero with a `FAIL ...` message on stderr otherwise.
set -u
MODE=${1:-oneshot}
case "$MODE" in
  oneshot)     PROTO_FLAG=();   PROTOCOL=RESP2; CLIENT=redis-cli ;;
  resp3)       PROTO_FLAG=(-3); PROTOCOL=RESP3; CLIENT=redis-cli-resp3 ;;
  interactive) PROTO_FLAG=();   PROTOCOL=RESP2; CLIENT=redis-cli-interactive ;;
  *) echo "usage: $0 [oneshot|resp3|interactive]" >&2; exit 2 ;;
esac

HOST=127.0.0.1
: "${PROXY_PORT:?set PROXY_PORT (port of the proxy on 127.0.0.1)}"
: "${MASTER_PORTS:?set MASTER_PORTS (comma-separated redis-server ports on 127.0.0.1)}"
IFS=, read -r -a MASTERS <<< "$MASTER_PORTS"
N=${#MASTERS[@]}
QUORUM=$(( N / 2 + 1 ))
KEY=${KEY:-rlp-test:$CLIENT:$$:$RANDOM$RANDOM}
TO=${CLIENT_CMD_TIMEOUT:-10}        # seconds, bound on every single redis-cli run
TTL=30000
CHECKS=0

fail() { echo "FAIL [$CLIENT key=$KEY]: $*" >&2; exit 1; }
ok() { CHECKS=$((CHECKS + 1)); }
note() { [ -n "${VERBOSE:-}" ] && echo "  [$CLIENT] $*" >&2; return 0; }
command -v redis-cli >/dev/null || fail "redis-cli not installed (run tests/clients/install.sh)"
VERSION=$(redis-cli --version | awk '{print $2}')

# --no-raw makes redis-cli print the reply type: OK, (nil), (integer) 1, "str", (error) ...
# The bytes on the wire are the same as in the default (raw) mode; only the printing differs.
# (no command substitution around these two, so that fail() ends the script)
px() {   # redis-cli through the proxy, one-shot; reply text in $OUT
  local rc
  OUT=$(timeout "$TO" redis-cli -h "$HOST" -p "$PROXY_PORT" "${PROTO_FLAG[@]}" --no-raw "$@" 2>&1)
  rc=$?
  [ $rc -eq 124 ] && OUT="(no reply within ${TO}s) $OUT"
  [ $rc -eq 0 ] || fail "redis-cli -p $PROXY_PORT ${PROTO_FLAG[*]} $1 ... exited $rc: $OUT"
}
m() {    # redis-cli on one master (port $1), raw output; reply text in $MV
  local p=$1 rc; shift
  MV=$(timeout "$TO" redis-cli -h "$HOST" -p "$p" "$@" 2>&1)
  rc=$?
  [ $rc -eq 124 ] && MV="(no reply within ${TO}s) $MV"
  [ $rc -eq 0 ] || fail "master $p: redis-cli $1 exited $rc: $MV"
}
expect() {  # label expected actual
  [ "$3" = "$2" ] || fail "$1: expected '$2', got '$3'"
  ok
}

# Masters are read right after the proxy replied. A proxy may answer once a
# quorum agreed and finish the other masters a moment later, so "gone" and "no
# foreign value" may take up to MASTER_SETTLE_MS (default 1000) to become true.
SETTLE_MS=${MASTER_SETTLE_MS:-1000}
TTL_SLACK_PCT=${TTL_SLACK_PCT:-5}   # upper PTTL bounds: + 5% + 50 ms (a proxy may pad TTLs by its drift allowance)
now_ms() { local t=$EPOCHREALTIME; echo $(( ${t%.*} * 1000 + 10#${t#*.} / 1000 )); }
warn() { echo "WARN [$CLIENT key=$KEY]: $*" >&2; }

# No master may hold any other value than $2 under $1 (nothing of a contender
# left anywhere); at least QUORUM masters must hold $2 with $3 < PTTL <= $5 (+slack).
# A minority holding $2 with a PTTL outside that range is reported as WARN only
# (Redlock semantics are per majority).
check_majority() {  # key token min_pttl label [max_pttl]
  local key=$1 tok=$2 min=$3 label=$4 max=${5:-} lim=999999999999 p v t good held foreign seen bad
  [ -n "$max" ] && lim=$(( max + max * TTL_SLACK_PCT / 100 + 50 ))
  local deadline=$(( $(now_ms) + SETTLE_MS ))
  while :; do
    good=0 held=0 foreign="" seen="" bad=""
    for p in "${MASTERS[@]}"; do
      m "$p" GET "$key"; v=$MV
      if [ "$v" = "$tok" ]; then
        m "$p" PTTL "$key"; t=$MV
        case "$t" in ''|*[!0-9]*) t=-999 ;; esac
        held=$((held + 1)); seen="$seen $p:pttl=$t"
        if [ "$t" -gt "$min" ] && [ "$t" -le "$lim" ]; then good=$((good + 1)); else bad="$bad $p:pttl=$t"; fi
      elif [ -n "$v" ]; then
        foreign="$foreign $p='$v'"
      fi
    done
    [ -z "$foreign" ] && break
    [ "$(now_ms)" -ge "$deadline" ] \
      && fail "$label: foreign value(s) under $key (expected '$tok' or nothing):$foreign"
    sleep 0.05
  done
  CHECKS=$((CHECKS + N))
  [ "$good" -ge "$QUORUM" ] \
    || fail "$label: token with $min < PTTL <= $lim on $good of $N masters (quorum $QUORUM); holders:${seen:- none}"
  ok
  [ -z "$bad" ] || warn "$label: a minority holds the token with PTTL outside ($min, $lim]:$bad"
  note "$label: token on $held/$N masters:$seen"
}
check_absent() {  # key label: the key must be on no master (within MASTER_SETTLE_MS)
  local p e left deadline=$(( $(now_ms) + SETTLE_MS ))
  while :; do
    left=""
    for p in "${MASTERS[@]}"; do
      m "$p" EXISTS "$1"; e=$MV
      if [ "$e" != "0" ]; then m "$p" GET "$1"; left="$left $p='$MV'"; fi
    done
    [ -z "$left" ] && break
    [ "$(now_ms)" -ge "$deadline" ] && fail "$2: key $1 still on master(s) after ${SETTLE_MS} ms:$left"
    sleep 0.05
  done
  CHECKS=$((CHECKS + N))
}

RELEASE='if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end'
EXTEND='if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end'
RELEASE_SHA=b70c2384248f88e6b75b9f89241a180f856ad852   # scripts/redis-cli-release.lua in the traces
EXTEND_SHA=36e94d1c6e02fcefaa7ee5d79eee614dbac55f10    # scripts/redis-cli-extend.lua
TOKEN="tok-$$-$RANDOM$RANDOM"
OTHER="other-$$-$RANDOM$RANDOM"

# ---- preconditions: masters reachable, key free everywhere ----
for p in "${MASTERS[@]}"; do m "$p" PING; expect "master $p PING" PONG "$MV"; done
check_absent "$KEY" "precondition"
expect "sha1 of the release script" "$RELEASE_SHA" "$(printf '%s' "$RELEASE" | sha1sum | cut -c1-40)"

run_oneshot() {
  # acquire
  px SET "$KEY" "$TOKEN" NX PX $TTL; expect "acquire SET NX PX" OK "$OUT"
  check_majority "$KEY" "$TOKEN" 29000 "after acquire" 30000
  # contention: a second client (another connection) must get a null reply
  px SET "$KEY" "$OTHER" NX PX $TTL; expect "contention SET NX PX" "(nil)" "$OUT"
  check_majority "$KEY" "$TOKEN" 28000 "after contention"
  px EVAL "$EXTEND" 1 "$KEY" "$OTHER" 60000; expect "extend with the wrong token" "(integer) 0" "$OUT"
  px EVAL "$RELEASE" 1 "$KEY" "$OTHER"; expect "release with the wrong token" "(integer) 0" "$OUT"
  check_majority "$KEY" "$TOKEN" 28000 "after wrong-token extend/release"
  # extend 30 s -> 60 s
  px EVAL "$EXTEND" 1 "$KEY" "$TOKEN" 60000; expect "extend EVAL" "(integer) 1" "$OUT"
  check_majority "$KEY" "$TOKEN" 59000 "after extend to 60000 ms" 60000
  # release
  px EVAL "$RELEASE" 1 "$KEY" "$TOKEN"; expect "release EVAL" "(integer) 1" "$OUT"
  check_absent "$KEY" "after release"
  px EVAL "$RELEASE" 1 "$KEY" "$TOKEN"; expect "release again" "(integer) 0" "$OUT"

  # SCRIPT LOAD + EVALSHA
  px SCRIPT LOAD "$RELEASE"; expect "SCRIPT LOAD release" "\"$RELEASE_SHA\"" "$OUT"
  px SCRIPT LOAD "$EXTEND"; expect "SCRIPT LOAD extend" "\"$EXTEND_SHA\"" "$OUT"
  px SET "$KEY" "$TOKEN" NX PX $TTL; expect "re-acquire SET NX PX" OK "$OUT"
  check_majority "$KEY" "$TOKEN" 29000 "after re-acquire" 30000
  px EVALSHA "$EXTEND_SHA" 1 "$KEY" "$OTHER" 60000; expect "extend EVALSHA (wrong token)" "(integer) 0" "$OUT"
  px EVALSHA "$EXTEND_SHA" 1 "$KEY" "$TOKEN" 60000; expect "extend EVALSHA" "(integer) 1" "$OUT"
  check_majority "$KEY" "$TOKEN" 59000 "after EVALSHA extend" 60000
  px EVALSHA "$RELEASE_SHA" 1 "$KEY" "$TOKEN"; expect "release EVALSHA" "(integer) 1" "$OUT"
  check_absent "$KEY" "after EVALSHA release"

  # a SHA nobody ever loaded: the error must start with NOSCRIPT
  local unknown out
  unknown=$(printf 'return "rlp-never-loaded-%s-%s"' "$$" "$RANDOM$RANDOM" | sha1sum | cut -c1-40)
  px EVALSHA "$unknown" 1 "$KEY" "$TOKEN"; out=$OUT
  [[ "$out" == "(error) NOSCRIPT"* ]] || fail "EVALSHA of an unknown sha: expected '(error) NOSCRIPT...', got '$out'"
  ok
  check_absent "$KEY" "after unknown EVALSHA"
}

run_interactive() {
  local reply line
  # client A: one interactive session on a coprocess, one line in, one line out
  local errf
  errf=$(mktemp)
  coproc CLI { exec timeout 60 redis-cli -h "$HOST" -p "$PROXY_PORT" 2>"$errf"; }
  local cli_pid=$CLI_PID
  send() {  # command-line expected label
    printf '%s\n' "$1" >&"${CLI[1]}" || fail "$3: cannot write to redis-cli"
    IFS= read -r -t "$TO" reply <&"${CLI[0]}" \
      || fail "$3: no reply from interactive redis-cli within ${TO}s; its stderr: $(head -c 500 "$errf")"
    [ "$reply" = "$2" ] || fail "$3: expected '$2', got '$reply'"
    ok
  }
  send "SET $KEY $TOKEN NX PX $TTL" OK "interactive acquire SET NX PX"
  check_majority "$KEY" "$TOKEN" 29000 "after interactive acquire" 30000
  send "GET $KEY" "$TOKEN" "interactive GET"
  # client B: a second interactive session, fed a whole script on stdin
  local outb
  outb=$(printf 'SET %s %s NX PX %s\nGET %s\n' "$KEY" "$OTHER" "$TTL" "$KEY" \
           | timeout "$TO" redis-cli -h "$HOST" -p "$PROXY_PORT" 2>&1) \
    || fail "second interactive session exited non-zero: $outb"
  expect "contention session (nil reply prints an empty line, then GET)" "$(printf '\n%s' "$TOKEN")" "$outb"
  check_majority "$KEY" "$TOKEN" 28000 "after interactive contention"
  send "EVAL '$EXTEND' 1 $KEY $TOKEN 60000" 1 "interactive EVAL extend"
  check_majority "$KEY" "$TOKEN" 59000 "after interactive extend" 60000
  send "EVAL '$RELEASE' 1 $KEY $OTHER" 0 "interactive EVAL release, wrong token"
  send "EVAL '$RELEASE' 1 $KEY $TOKEN" 1 "interactive EVAL release"
  check_absent "$KEY" "after interactive release"
  send "GET $KEY" "" "interactive GET after release (nil)"
  exec {CLI[1]}>&-
  wait "$cli_pid"
  local rc=$?
  [ $rc -eq 0 ] || fail "interactive redis-cli exited with status $rc; its stderr: $(head -c 500 "$errf")"
  ok
  rm -f "$errf"
}

case "$MODE" in
  interactive) run_interactive ;;
  *) run_oneshot ;;
esac

case "$MODE" in
  interactive) API="one session: SET NX PX, GET, EVAL extend and release" ;;
  *) API="SET NX PX, EVAL extend and release, SCRIPT LOAD + EVALSHA, NOSCRIPT" ;;
esac
printf 'RESULT {"client":"%s","version":"%s","protocol":"%s","status":"pass","checks":%d,"api":"%s"}\n' \
  "$CLIENT" "$VERSION" "$PROTOCOL" "$CHECKS" "$API"
