"""redis-py `Lock` (redis.lock.Lock / redis.asyncio.lock.Lock) through the proxy.

    PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] \\
        tests/clients/.deps/venv/bin/python tests/clients/python-redis-py.py MODE PROTO

MODE:  sync | asyncio      (redis.Redis or redis.asyncio.Redis)
PROTO: resp3 | resp2       (resp3 = redis-py 8.1's default, no `protocol` argument,
                            HELLO 3 on connect; resp2 = protocol=2)

Through PROXY_PORT, with redis-py's own Lock: acquire (SET k uuid NX PX 30000);
contention from a second client (blocking=False and blocking_timeout=0.3 both give
False); extend(10) (adds to the PTTL, EVALSHA), extend(60, replace_ttl=True);
reacquire(); release(); the context-manager form; and a short-TTL (1000 ms) lock
that is left to expire, after which extend() and release() must raise
LockNotOwnedError. Mid-run, SCRIPT FLUSH is sent to every master directly, so that
the proxy sees EVALSHA for scripts the masters no longer have. Every step is
checked on each master in MASTER_PORTS directly. Exit 0 and one `RESULT {...}`
line on stdout on success; non-zero with a `FAIL ...` message otherwise.
"""
import asyncio
import inspect
import json
import os
import signal
import sys
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import redis
    import redis.asyncio as aredis
    from redis.exceptions import LockError, LockNotOwnedError
except ImportError:
    sys.stderr.write("FAIL [redis-py]: cannot import redis; run tests/clients/install.sh and use "
                     "tests/clients/.deps/venv/bin/python\n")
    sys.exit(1)

MODE = sys.argv[1] if len(sys.argv) > 1 else "sync"
PROTO = sys.argv[2] if len(sys.argv) > 2 else "resp3"
if MODE not in ("sync", "asyncio") or PROTO not in ("resp3", "resp2"):
    sys.stderr.write("usage: python-redis-py.py sync|asyncio resp3|resp2\n")
    sys.exit(2)
CLIENT = "redis-py" if MODE == "sync" else "redis-py-asyncio"
HOST = "127.0.0.1"
try:
    PROXY_PORT = int(os.environ["PROXY_PORT"])
    MASTER_PORTS = [int(p) for p in os.environ["MASTER_PORTS"].split(",") if p.strip()]
except (KeyError, ValueError):
    sys.stderr.write("set PROXY_PORT and MASTER_PORTS (comma-separated ports on 127.0.0.1)\n")
    sys.exit(2)
KEY = os.environ.get("KEY") or "rlp-test:%s-%s:%d:%s" % (CLIENT, PROTO, os.getpid(), uuid.uuid4().hex[:8])
N = len(MASTER_PORTS)
QUORUM = N // 2 + 1
KW = {} if PROTO == "resp3" else {"protocol": 2}
CONN = dict(host=HOST, port=PROXY_PORT, socket_timeout=10, socket_connect_timeout=5, **KW)
CHECKS = 0
# Upper PTTL bounds allow a proxy to pad the TTL it sends to the masters (e.g. by its
# clock-drift allowance): limit = expected + TTL_SLACK * expected + 50 ms.
TTL_SLACK = float(os.environ.get("TTL_SLACK", "0.05"))
# A proxy may reply once a quorum agreed and finish the other masters a moment
# later: "gone" / "no foreign value" get up to MASTER_SETTLE_MS to become true.
SETTLE = int(os.environ.get("MASTER_SETTLE_MS", "1000")) / 1000.0


def fail(msg, detail=""):
    sys.stderr.write("FAIL [%s %s key=%s]: %s\n%s" % (CLIENT, PROTO, KEY, msg, detail))
    sys.stderr.flush()
    os._exit(1)


def check(cond, msg):
    global CHECKS
    if not cond:
        fail(msg)
    CHECKS += 1


def CHECKS_ADD(n):
    global CHECKS
    CHECKS += n


def note(msg):
    if os.environ.get("VERBOSE"):
        sys.stderr.write("  [%s %s] %s\n" % (CLIENT, PROTO, msg))


# Bound the whole run: 120 s.
signal.signal(signal.SIGALRM, lambda *_: fail("timed out after 120 s"))
signal.alarm(120)

# Plain RESP2 connections to each master, for the checks.
masters = {}
for p in MASTER_PORTS:
    m = redis.Redis(host=HOST, port=p, protocol=2, socket_timeout=5, socket_connect_timeout=5)
    try:
        check(m.ping() is True, "master %d: PING failed" % p)
    except redis.RedisError as e:
        fail("master %d: %s: %s" % (p, type(e).__name__, e))
    masters[p] = m


def master_values(key):
    return {p: m.get(key) for p, m in masters.items()}


def warn(msg):
    sys.stderr.write("WARN [%s %s key=%s]: %s\n" % (CLIENT, PROTO, KEY, msg))


def check_majority(key, token, min_pttl, label, max_pttl=None):
    """No master holds another value than `token` (a proxy gets MASTER_SETTLE_MS to
    finish a rollback); >= QUORUM hold `token` with min_pttl < PTTL <= max_pttl (+slack).
    A minority holding it with a PTTL out of range is only a WARN (Redlock is per majority)."""
    token = token if isinstance(token, bytes) else token.encode()
    lim = max_pttl + int(max_pttl * TTL_SLACK) + 50 if max_pttl is not None else float("inf")
    deadline = time.monotonic() + SETTLE
    while True:
        pttls, foreign = {}, {}
        for p, m in masters.items():
            v = m.get(key)
            if v == token:
                pttls[p] = m.pttl(key)
            elif v is not None:
                foreign[p] = v
        if not foreign:
            break
        if time.monotonic() > deadline:
            fail("%s: foreign value(s) under %s (expected %r or nothing): %r" % (label, key, token, foreign))
        time.sleep(0.05)
    CHECKS_ADD(len(masters))
    good = [p for p, t in pttls.items() if min_pttl < t <= lim]
    check(len(good) >= QUORUM, "%s: token with %d < PTTL <= %s on %d of %d masters (quorum %d); holders' PTTL: %r"
          % (label, min_pttl, lim, len(good), N, QUORUM, pttls))
    bad = {p: t for p, t in pttls.items() if p not in good}
    if bad:
        warn("%s: a minority holds the token with PTTL outside (%d, %s]: %r" % (label, min_pttl, lim, bad))
    note("%s: token on %d/%d masters, pttl %s" % (label, len(pttls), N, pttls))
    return {p: pttls[p] for p in good}


def check_absent(key, label):
    """The key must be on no master (within MASTER_SETTLE_MS)."""
    deadline = time.monotonic() + SETTLE
    while True:
        left = {p: m.get(key) for p, m in masters.items() if m.exists(key)}
        if not left:
            break
        if time.monotonic() > deadline:
            fail("%s: key %s still on master(s) after %d ms: %r" % (label, key, SETTLE * 1000, left))
        time.sleep(0.05)
    CHECKS_ADD(len(masters))


def flush_master_scripts():
    for p, m in masters.items():
        check(m.script_flush() is True, "master %d: SCRIPT FLUSH failed" % p)


async def C(x):
    """Await x if the client is asyncio, else it is already the result."""
    return await x if inspect.isawaitable(x) else x


async def expect_raises(exc_type, coro_or_fn, label):
    try:
        r = coro_or_fn()
        await C(r)
    except exc_type as e:
        check(type(e) is exc_type, "%s: expected %s, got %s: %s" % (label, exc_type.__name__, type(e).__name__, e))
        note("%s -> %s: %s" % (label, type(e).__name__, e))
        return e
    except Exception as e:  # noqa: BLE001
        fail("%s: expected %s, got %s: %s" % (label, exc_type.__name__, type(e).__name__, e))
    fail("%s: expected %s, nothing was raised" % (label, exc_type.__name__))


async def negotiated_protocol(client):
    pool = client.connection_pool
    conn = await C(pool.get_connection())
    try:
        proto = int(conn.protocol)
        if proto == 3:
            md = getattr(conn, "handshake_metadata", None)   # sync Connection keeps the HELLO reply
            if md is not None:
                check(md.get(b"proto", md.get("proto")) == 3, "HELLO 3 reply has no proto=3: %r" % (md,))
        return proto
    finally:
        await C(pool.release(conn))


async def main():
    Redis = redis.Redis if MODE == "sync" else aredis.Redis
    r = Redis(**CONN)
    r2 = Redis(**CONN)
    check_absent(KEY, "precondition")

    # ---- acquire ----
    lock = r.lock(KEY, timeout=30, blocking_timeout=0.2)
    check(await C(lock.acquire()) is True, "A acquire(): expected True")
    token = lock.local.token
    check(isinstance(token, bytes) and len(token) == 32, "A token: expected 32 hex bytes, got %r" % (token,))
    check_majority(KEY, token, 29000, "after A acquire", max_pttl=30000)
    proto = await negotiated_protocol(r)
    check(proto == (3 if PROTO == "resp3" else 2), "negotiated protocol %d, expected %s" % (proto, PROTO))

    # ---- contention from a second client ----
    other = r2.lock(KEY, timeout=30, blocking_timeout=0.3)
    contender = "contender-" + uuid.uuid4().hex
    check(await C(other.acquire(blocking=False, token=contender)) is False,
          "B acquire(blocking=False) while A holds the lock: expected False")
    t0 = time.monotonic()
    got = await C(other.acquire(token=contender))
    elapsed = time.monotonic() - t0
    check(got is False, "B acquire() blocking_timeout=0.3 while A holds the lock: expected False, got %r" % (got,))
    check(0.15 <= elapsed < 3.0, "B acquire() blocking_timeout=0.3 returned after %.2f s" % elapsed)
    check_majority(KEY, token, 28000, "after B contention")   # no contender token anywhere
    check(await C(lock.owned()) is True, "A owned(): expected True (GET through the proxy)")
    check(await C(other.owned()) is False, "B owned(): expected False")
    await expect_raises(LockError, lambda: other.release(), "B release() without holding (client-side)")

    # ---- extend: add 10 s to the remaining TTL ----
    before = check_majority(KEY, token, 27000, "before extend(10)")
    check(await C(lock.extend(10)) is True, "A extend(10): expected True")
    after = check_majority(KEY, token, 38000, "after extend(10)", max_pttl=40000)
    grown = [p for p in after if p in before and after[p] > before[p] + 9000]
    check(len(grown) >= QUORUM, "extend(10): PTTL did not grow by ~10 s on a majority: %r -> %r" % (before, after))

    # ---- extend with replace_ttl=True: set it to 60 s ----
    check(await C(lock.extend(60, replace_ttl=True)) is True, "A extend(60, replace_ttl=True): expected True")
    check_majority(KEY, token, 59000, "after extend(60, replace_ttl=True)", max_pttl=60000)

    # the masters forget every script: the next EVALSHA must still work
    flush_master_scripts()

    # ---- reacquire: back to the lock timeout (30 s) ----
    check(await C(lock.reacquire()) is True, "A reacquire(): expected True")
    check_majority(KEY, token, 29000, "after reacquire()", max_pttl=30000)

    # the contender runs the extend and release scripts with a token it never held: 0 -> LockNotOwnedError
    other.local.token = contender.encode()
    await expect_raises(LockNotOwnedError, lambda: other.extend(5), "B extend() with a token it never held")
    other.local.token = contender.encode()
    await expect_raises(LockNotOwnedError, lambda: other.release(), "B release() with a token it never held")
    check_majority(KEY, token, 28000, "after B's failed extend/release")

    # ---- release ----
    check(await C(lock.release()) is None, "A release(): expected None")
    check_absent(KEY, "after A release()")
    await expect_raises(LockError, lambda: lock.release(), "A release() again (client-side)")

    # ---- context-manager form ----
    if MODE == "sync":
        with r.lock(KEY, timeout=30, blocking_timeout=0.5) as l2:
            check_majority(KEY, l2.local.token, 29000, "inside `with lock`")
    else:
        async with r.lock(KEY, timeout=30, blocking_timeout=0.5) as l2:
            check_majority(KEY, l2.local.token, 29000, "inside `async with lock`")
    check_absent(KEY, "after the with-block")

    # ---- short-TTL lock left to expire: LockNotOwnedError ----
    short = r.lock(KEY, timeout=1.0, blocking_timeout=0.5)   # PX 1000
    check(await C(short.acquire()) is True, "short lock acquire(): expected True")
    check_majority(KEY, short.local.token, 0, "after short-TTL acquire", max_pttl=1000)
    deadline = time.monotonic() + 5.0
    while any(m.exists(KEY) for m in masters.values()):
        if time.monotonic() > deadline:
            fail("short-TTL (1000 ms) lock still present on a master 5 s later: %r" % master_values(KEY))
        await asyncio.sleep(0.05)
    check(True, "")
    await expect_raises(LockNotOwnedError, lambda: short.extend(5), "extend() after expiry")
    await expect_raises(LockNotOwnedError, lambda: short.release(), "release() after expiry")
    check_absent(KEY, "at the end")

    for c in (r, r2):
        await C(c.aclose() if MODE == "asyncio" else c.close())
    print("RESULT " + json.dumps({"client": CLIENT, "version": redis.__version__,
                                  "protocol": "RESP%d" % proto, "status": "pass", "checks": CHECKS},
                                 separators=(",", ":")))
    sys.stdout.flush()


try:
    asyncio.run(main())
except SystemExit:
    raise
except BaseException as e:  # noqa: BLE001
    import traceback
    fail("unexpected %s: %s" % (type(e).__name__, e), traceback.format_exc())
