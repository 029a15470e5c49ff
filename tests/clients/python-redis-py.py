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
import os
import sys
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import common as CM  # noqa: E402  (fail/check/note, the master checks, RESULT lines)
from common import check, check_absent, check_majority, fail, note  # noqa: E402
import redis  # noqa: E402
import redis.asyncio as aredis  # noqa: E402
from redis.exceptions import LockError, LockNotOwnedError  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "sync"
PROTO = sys.argv[2] if len(sys.argv) > 2 else "resp3"
if MODE not in ("sync", "asyncio") or PROTO not in ("resp3", "resp2"):
    sys.stderr.write("usage: python-redis-py.py sync|asyncio resp3|resp2\n")
    sys.exit(2)
CLIENT = "redis-py" if MODE == "sync" else "redis-py-asyncio"
KEY = CM.setup(CLIENT, redis.__version__, PROTO.upper(), timeout_s=120)
KW = {} if PROTO == "resp3" else {"protocol": 2}
CONN = dict(host=CM.HOST, port=CM.PROXY_PORT, socket_timeout=10, socket_connect_timeout=5, **KW)
QUORUM = CM.QUORUM


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
    CM.flush_master_scripts()

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
    CM.wait_until(lambda: not any(m.exists(KEY) for m in CM.masters.values()), 5.0,
                  "short-TTL (1000 ms) lock gone from every master")
    await expect_raises(LockNotOwnedError, lambda: short.extend(5), "extend() after expiry")
    await expect_raises(LockNotOwnedError, lambda: short.release(), "release() after expiry")
    check_absent(KEY, "at the end")

    for c in (r, r2):
        await C(c.aclose() if MODE == "asyncio" else c.close())
    CM.set_protocol("RESP%d" % proto)
    CM.result(api="Lock: acquire(), blocking_timeout, extend(), extend(replace_ttl), reacquire(), release(), "
                  "with-block, expiry")


CM.run(lambda: asyncio.run(main()))
