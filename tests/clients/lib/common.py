"""Shared helpers for the Python client scripts in tests/clients (the Python twin of common.js).

- setup(): reads PROXY_PORT, MASTER_PORTS, KEY; connects plain RESP2 redis-py clients to every
  master (for the checks, never through the proxy) and bounds the whole run (SIGALRM).
- check_majority / check_absent / majority_value / check_member_* / check_field_*: what a
  correct Redlock proxy leaves on the masters, read on each master directly.
- step(): names the step under way; a failure prints it in its FAIL line and in a
  `RESULT {"status":"fail","step":...}` line on stdout, which the README table shows.
- result(): the one `RESULT {...,"status":"pass"}` line of a passing scenario.

Scripts import it after putting this directory on sys.path, and run under the venv that
tests/clients/install.sh makes (tests/clients/.deps/venv/bin/python).
"""
import json
import os
import signal
import sys
import time
import traceback
import uuid

try:
    import redis
except ImportError:
    sys.stderr.write("FAIL: cannot import redis; run tests/clients/install.sh and use "
                     "tests/clients/.deps/venv/bin/python\n")
    sys.exit(1)

HOST = "127.0.0.1"
# Upper PTTL bounds allow a proxy to pad the TTL it sends to the masters (e.g. by its
# clock-drift allowance): limit = expected + TTL_SLACK * expected + 50 ms.
TTL_SLACK = float(os.environ.get("TTL_SLACK", "0.05"))
# A proxy may reply once a quorum agreed and finish the other masters a moment later:
# "gone" / "no foreign value" get up to MASTER_SETTLE_MS to become true.
SETTLE = int(os.environ.get("MASTER_SETTLE_MS", "1000")) / 1000.0

CLIENT = "python"
VERSION = ""
PROTOCOL = "RESP2"
KEY = ""
PROXY_PORT = 0
MASTER_PORTS = []
N = 0
QUORUM = 0
CHECKS = 0
STEP = "start"
masters = {}


def _result_line(status, **extra):
    fields = {"client": CLIENT, "version": VERSION, "protocol": PROTOCOL, "status": status,
              "checks": CHECKS}
    fields.update(extra)
    return "RESULT " + json.dumps(fields, separators=(",", ":"))


def fail(msg, detail=""):
    sys.stderr.write("FAIL [%s key=%s] during %s: %s\n%s" % (CLIENT, KEY, STEP, msg, detail))
    sys.stderr.flush()
    sys.stdout.write(_result_line("fail", step=STEP) + "\n")
    sys.stdout.flush()
    os._exit(1)


def check(cond, msg):
    global CHECKS
    if not cond:
        fail(msg() if callable(msg) else msg)
    CHECKS += 1


def checks_add(n):
    global CHECKS
    CHECKS += n


def note(msg):
    if os.environ.get("VERBOSE"):
        sys.stderr.write("  [%s] %s\n" % (CLIENT, msg))


def warn(msg):
    sys.stderr.write("WARN [%s key=%s]: %s\n" % (CLIENT, KEY, msg))


def step(name):
    global STEP
    STEP = name
    note("step: " + name)


def setup(client, version, protocol="RESP2", timeout_s=90):
    """Names the scenario, reads the environment, connects to every master, starts the
    watchdog. Returns the lock key to use."""
    global CLIENT, VERSION, PROTOCOL, KEY, PROXY_PORT, MASTER_PORTS, N, QUORUM
    CLIENT, VERSION, PROTOCOL = client, version, protocol
    try:
        PROXY_PORT = int(os.environ["PROXY_PORT"])
        MASTER_PORTS = [int(p) for p in os.environ["MASTER_PORTS"].split(",") if p.strip()]
    except (KeyError, ValueError):
        sys.stderr.write("set PROXY_PORT and MASTER_PORTS (comma-separated ports on 127.0.0.1)\n")
        sys.exit(2)
    N = len(MASTER_PORTS)
    QUORUM = N // 2 + 1
    KEY = os.environ.get("KEY") or "rlp-test:%s:%d:%s" % (client, os.getpid(), uuid.uuid4().hex[:8])
    signal.signal(signal.SIGALRM, lambda *_: fail("timed out after %d s" % timeout_s))
    signal.alarm(timeout_s)
    step("connect to the masters")
    for p in MASTER_PORTS:
        m = redis.Redis(host=HOST, port=p, protocol=2, socket_timeout=5, socket_connect_timeout=5)
        try:
            check(m.ping() is True, "master %d: PING failed" % p)
        except redis.RedisError as e:
            fail("master %d: %s: %s" % (p, type(e).__name__, e))
        masters[p] = m
    return KEY


def set_protocol(protocol):
    global PROTOCOL
    PROTOCOL = protocol


def master_values(key):
    return {p: m.get(key) for p, m in masters.items()}


def _holders(key, read, token, label):
    """{port: PTTL} of the masters where read(master) == token; waits up to SETTLE for
    every other master to hold nothing (a proxy may still be rolling back there)."""
    deadline = time.monotonic() + SETTLE
    while True:
        pttls, foreign = {}, {}
        for p, m in masters.items():
            v = read(m)
            if v == token:
                pttls[p] = m.pttl(key)
            elif v is not None:
                foreign[p] = v
        if not foreign:
            return pttls
        if time.monotonic() > deadline:
            fail("%s: foreign value(s) under %s (expected %r or nothing): %r" % (label, key, token, foreign))
        time.sleep(0.05)


def _judge(pttls, min_pttl, max_pttl, label, what):
    lim = max_pttl + int(max_pttl * TTL_SLACK) + 50 if max_pttl is not None else float("inf")
    checks_add(len(masters))
    good = [p for p, t in pttls.items() if min_pttl < t <= lim]
    check(len(good) >= QUORUM, lambda: "%s: %s with %d < PTTL <= %s on %d of %d masters (quorum %d); "
          "holders' PTTL: %r" % (label, what, min_pttl, lim, len(good), N, QUORUM, pttls))
    bad = {p: t for p, t in pttls.items() if p not in good}
    if bad:
        warn("%s: a minority holds %s with PTTL outside (%d, %s]: %r" % (label, what, min_pttl, lim, bad))
    note("%s: %s on %d/%d masters, pttl %s" % (label, what, len(pttls), N, pttls))
    return {p: pttls[p] for p in good}


def _b(s):
    return s if isinstance(s, bytes) else str(s).encode()


def check_majority(key, token, min_pttl, label, max_pttl=None):
    """No master holds another value than `token` (a proxy gets MASTER_SETTLE_MS to finish
    a rollback); >= QUORUM hold `token` with min_pttl < PTTL <= max_pttl (+slack). A minority
    holding it with a PTTL out of range is only a WARN (Redlock is per majority).
    Returns {port: PTTL} of the good holders."""
    token = _b(token)
    pttls = _holders(key, lambda m: m.get(key), token, label)
    return _judge(pttls, min_pttl, max_pttl, label, "token %r" % token)


def check_member_majority(key, member, min_pttl, label, max_pttl=None):
    """For sorted-set semaphores: >= QUORUM masters have `member` in the set under `key`,
    with min_pttl < PTTL(key) <= max_pttl (+slack)."""
    member = _b(member)
    pttls = {p: m.pttl(key) for p, m in masters.items() if m.zscore(key, member) is not None}
    return _judge(pttls, min_pttl, max_pttl, label, "member %r" % member)


def check_member_absent(key, member, label):
    """`member` is in the set under `key` on no master (within MASTER_SETTLE_MS)."""
    member = _b(member)
    _wait_none(lambda: {p: "member" for p, m in masters.items() if m.zscore(key, member) is not None},
               "%s: member %r of %s" % (label, member, key))


def _hash_or_type(m, key):
    """The hash under `key` on master m as {field: value}; None if there is no key; the
    key's type (bytes) if it is not a hash."""
    kind = m.type(key)
    if kind == b"none":
        return None
    return m.hgetall(key) if kind == b"hash" else kind


def check_field_majority(key, field, count, min_pttl, label, max_pttl=None):
    """For hash locks (Redisson's: field `<uuid>:<threadId>` -> reentrancy count): no master
    holds anything else under `key` than the hash {field: count} (a proxy gets
    MASTER_SETTLE_MS to finish a rollback); >= QUORUM hold exactly that, with
    min_pttl < PTTL <= max_pttl (+slack). Returns {port: PTTL} of the good holders."""
    want = {_b(field): _b(count)}
    pttls = _holders(key, lambda m: _hash_or_type(m, key), want, label)
    return _judge(pttls, min_pttl, max_pttl, label, "hash %r" % want)


def check_field_absent(key, field, label):
    """`field` is in the hash under `key` on no master (within MASTER_SETTLE_MS)."""
    field = _b(field)
    _wait_none(lambda: {p: m.hget(key, field) for p, m in masters.items()
                        if m.type(key) == b"hash" and m.hexists(key, field)},
               "%s: field %r of %s" % (label, field, key))


def majority_value(key, label):
    """The value held by a majority (for locks whose value the library does not expose)."""
    counts = {}
    for m in masters.values():
        v = m.get(key)
        if v is not None:
            counts[v] = counts.get(v, 0) + 1
    best = max(counts.items(), key=lambda kv: kv[1], default=(None, 0))
    check(best[1] >= QUORUM, lambda: "%s: no value under %s on a majority of masters: %r" % (label, key, counts))
    return best[0]


def _wait_none(left_fn, what):
    deadline = time.monotonic() + SETTLE
    while True:
        left = left_fn()
        if not left:
            break
        if time.monotonic() > deadline:
            fail("%s still on master(s) after %d ms: %r" % (what, SETTLE * 1000, left))
        time.sleep(0.05)
    checks_add(len(masters))


def check_absent(key, label):
    """The key must be on no master (within MASTER_SETTLE_MS)."""
    _wait_none(lambda: {p: m.get(key) if m.type(key) == b"string" else m.type(key)
                        for p, m in masters.items() if m.exists(key)},
               "%s: key %s" % (label, key))


def check_not_holding(key, token, label):
    """`token` is under `key` on no master (the key may hold someone else's value)."""
    token = _b(token)
    _wait_none(lambda: {p: v for p, v in master_values(key).items() if v == token},
               "%s: token %r under %s" % (label, token, key))


def flush_master_scripts():
    for p, m in masters.items():
        check(m.script_flush() is True, "master %d: SCRIPT FLUSH failed" % p)


def wait_until(cond, timeout_s, what):
    """Polls cond() every 50 ms for up to timeout_s; fails with `what` if it never holds."""
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            fail("%s: not within %.1f s" % (what, timeout_s))
        time.sleep(0.05)
    checks_add(1)


def result(**extra):
    """The passing scenario's one RESULT line (extra fields: api, ...)."""
    sys.stdout.write(_result_line("pass", **extra) + "\n")
    sys.stdout.flush()


def run(main):
    """Runs main(); any exception is a failure of the current step."""
    try:
        main()
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        fail("unexpected %s: %s" % (type(e).__name__, e), traceback.format_exc())


def outcome(fn):
    """("ok", fn()) or ("error", "Type: message"): for calls made in another thread, whose
    exception the main thread reports."""
    try:
        return ("ok", fn())
    except Exception as e:  # noqa: BLE001
        return ("error", "%s: %s" % (type(e).__name__, e))
