"""Python lock libraries, each through its recommended API, through the proxy.

    PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] \\
        tests/clients/.deps/venv/bin/python tests/clients/python-locks.py LIB

LIB:
  pottery            pottery `Redlock` (masters={the proxy}): acquire(), locked(), extend(),
                     the context manager; key `redlock:KEY`
  python-redis-lock  python-redis-lock `redis_lock.Lock`: acquire/release, extend(60),
                     auto_renewal=True, blocking acquire (BLPOP on the signal list); name
                     `{KEY}`, keys `lock:{KEY}` and `lock-signal:{KEY}`
  sherlock           sherlock `RedisLock`: acquire (a SETNX + EXPIRE script), renew(),
                     locked(), the context manager

Every library goes through the same contract (contract() below), checked on each master in
MASTER_PORTS directly: A acquires (its value on a majority with the expected PTTL), B's
attempt is refused (B's value on no master), A extends (PTTL moved up on a majority), A
releases (the key on no master), the library's own extras (locked(), auto-renewal past the
TTL, the context manager), and last a waiter W blocked in the library's blocking acquire gets
the lock once A releases it. Exit 0 and one `RESULT {...}` line on stdout on success;
non-zero, a `FAIL ...` line on stderr and a `RESULT {"status":"fail","step":...}` line
otherwise.
"""
import logging
import os
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import common as C  # noqa: E402
import redis  # noqa: E402

try:
    from importlib.metadata import version as dist_version
except ImportError:  # pragma: no cover
    dist_version = None

# The libraries log the Redis errors they swallow (pottery: "locked() caught ResponseError"):
# shown on stderr, so a failure says what the proxy answered.
logging.basicConfig(level=logging.ERROR, stream=sys.stderr, format="  log %(name)s: %(message)s")

LIBS = ("pottery", "python-redis-lock", "sherlock")
LIB = sys.argv[1] if len(sys.argv) > 1 else ""
if LIB not in LIBS:
    sys.stderr.write("usage: python-locks.py %s\n" % "|".join(LIBS))
    sys.exit(2)

TTL_MS = 10000      # every lock's TTL: long enough that no check races its expiry
WAIT_S = 8          # the waiter's blocking-acquire timeout: ample, it gets in within ~1 s


def client():
    """A redis-py client of the proxy, as an application would make one (redis-py 8's
    default protocol: RESP3)."""
    return redis.Redis(host=C.HOST, port=C.PROXY_PORT, socket_timeout=10, socket_connect_timeout=5)


def protocol_of(r):
    pool = r.connection_pool
    conn = pool.get_connection()
    try:
        return "RESP%d" % int(conn.protocol)
    finally:
        pool.release(conn)


class Library:
    """What the contract drives; the defaults fit all three libraries: acquire(blocking=False)
    answers True or False, release() raises if the lock was not held."""
    prefix = ""          # what the library puts before the key
    extend_ms = TTL_MS   # the PTTL extend() sets
    waits_by = "polling"  # how its blocking acquire waits (named in the waiter's step)

    def __init__(self, key):
        self.r = client()
        self.key = key
        self.lock_key = self.prefix + key

    def acquire(self, lock):
        C.check(lock.acquire(blocking=False) is True, "acquire(blocking=False): expected True")
        return token_of(lock)

    def try_acquire(self, lock):
        return lock.acquire(blocking=False)

    def release(self, lock):
        lock.release()


class Pottery(Library):
    """pottery's Redlock over a single "master", the proxy (pottery's quorum is then 1 of 1;
    the proxy makes the majority over the real masters)."""
    api = "Redlock: acquire(blocking=False), locked(), extend(), release(), with-block, acquire(timeout)"
    prefix = "redlock:"   # extend() sets the TTL back to auto_release_time: extend_ms = TTL_MS

    def __init__(self, key):
        from pottery import Redlock
        self.Redlock = Redlock
        super().__init__(key)

    def new(self, **kw):
        return self.Redlock(key=self.key, masters={self.r}, auto_release_time=TTL_MS / 1000, **kw)

    def extend(self, lock):
        lock.extend()   # raises ExtendUnlockedLock if a majority did not extend

    def blocking_acquire(self, lock):
        return lock.acquire(timeout=WAIT_S)

    def extras(self, key):
        C.step("locked() while held")
        lock = self.new()
        self.acquire(lock)
        left = lock.locked()
        C.check(7 < left <= TTL_MS / 1000,
                "locked() while held: expected the seconds left (~10), got %r" % (left,))
        C.step("locked() of a contender")
        C.check(self.new().locked() == 0, "locked() of a Redlock that does not hold the lock: expected 0")
        C.step("release, then locked()")
        lock.release()
        C.check_absent(key, "after release()")
        C.check(lock.locked() == 0, "locked() after release(): expected 0")


class PythonRedisLock(Library):
    """python-redis-lock's Lock: SET NX EX to acquire, scripts to extend and release (the release
    script also pushes to a signal list that blocked acquirers wait on with BLPOP)."""
    api = "Lock (name in a hash tag): acquire(blocking=False), extend(60), release(), auto_renewal=True, with-block, blocking acquire(timeout) woken by BLPOP"
    extend_ms = 60000   # extend(expire=60): the proxy's default max_lock_ttl_ms, exactly
    prefix = "lock:"
    waits_by = "BLPOP on the signal list"

    def __init__(self, key):
        import redis_lock
        self.mod = redis_lock
        # The name in a hash tag: its scripts declare the lock and its signal list, which must
        # share a slot where a master is a Redis Cluster (as on one Redis Cluster).
        super().__init__("{%s}" % key)

    def new(self, **kw):
        kw.setdefault("expire", TTL_MS // 1000)
        return self.mod.Lock(self.r, self.key, **kw)

    def extend(self, lock):
        lock.extend(expire=self.extend_ms // 1000)

    def blocking_acquire(self, lock):
        return lock.acquire(blocking=True, timeout=WAIT_S)

    def extras(self, key):
        C.step("auto_renewal=True past the TTL")
        # expire=2: renewed every 2*2/3 s by the library's thread; held 3.5 s, past its TTL
        lock = self.new(expire=2, auto_renewal=True)
        token = self.acquire(lock)
        C.check_majority(key, token, 1000, "auto_renewal: after acquire", 2000)
        time.sleep(3.5)
        C.check(lock.locked() is True, "auto_renewal: locked() 3.5 s after acquire with expire=2")
        # no upper bound: a proxy pads an EXPIRE in seconds by whole seconds (2 s -> 3 s)
        C.check_majority(key, token, 0, "auto_renewal: 3.5 s after acquire (expire=2)")
        lock.release()
        C.check_absent(key, "after release() of the auto-renewed lock")


class Sherlock(Library):
    """sherlock's RedisLock: acquires with a SETNX-then-EXPIRE script, renews with an EXPIRE
    script, releases with compare-and-delete."""
    api = "RedisLock: acquire(blocking=False), renew(), locked(), release(), with-block, acquire()"
    # renew() sets the TTL back to `expire`: extend_ms = TTL_MS

    def __init__(self, key):
        import sherlock
        self.mod = sherlock
        super().__init__(key)

    def new(self, **kw):
        return self.mod.RedisLock(self.key, client=self.r, expire=TTL_MS // 1000, timeout=WAIT_S,
                                  retry_interval=0.1, **kw)

    def extend(self, lock):
        C.check(lock.renew() is True, "renew(): expected True")

    def blocking_acquire(self, lock):
        return lock.acquire()   # blocking, up to `timeout`

    def extras(self, key):
        C.step("locked()")
        lock = self.new()
        C.check(lock.locked() is False, "locked() with the lock free: expected False")
        self.acquire(lock)
        C.check(self.new().locked() is True, "locked() of another RedisLock while held: expected True")
        lock.release()
        C.check_absent(key, "after release()")


def contract(lib):
    key = lib.lock_key
    C.step("precondition")
    C.check_absent(key, "precondition")

    C.step("A acquires")
    a = lib.new()
    token = lib.acquire(a)
    C.check(token, "A acquire: the library reports no lock value")
    C.check_majority(key, token, TTL_MS - 1000, "after A acquires", TTL_MS)
    C.set_protocol(protocol_of(lib.r))

    C.step("B contends")
    C.check(lib.try_acquire(lib.new()) is False, "B's attempt while A holds the lock: expected False")
    before = C.check_majority(key, token, TTL_MS - 3000, "after B's attempt")  # B's value nowhere

    C.step("A extends")
    # A lease that extend() sets back to the same TTL moves only if some of it was used:
    # wait until the PTTL is >= 1.5 s below what extend() sets (then "moved up by > 400 ms"
    # holds even if the check after extend() comes 1 s late).
    used = max(before.values()) - (lib.extend_ms - 1500)
    if used > 0:
        time.sleep(used / 1000)
        before = C.check_majority(key, token, TTL_MS - 3000, "before A extends")
    lib.extend(a)
    after = C.check_majority(key, token, lib.extend_ms - 1000, "after A extends", lib.extend_ms)
    grown = [p for p in after if p in before and after[p] > before[p] + 400]
    C.check(len(grown) >= C.QUORUM, lambda: "extend: PTTL did not move up on a majority: %r -> %r" % (before, after))

    C.step("A releases")
    lib.release(a)
    C.check_absent(key, "after A releases")

    lib.extras(key)

    C.step("context manager")
    with lib.new() as held:
        C.check_majority(key, token_of(held), TTL_MS - 1000, "inside the with-block", TTL_MS)
    C.check_absent(key, "after the with-block")

    C.step("W waits (%s) while A holds the lock" % lib.waits_by)
    a = lib.new()
    token = lib.acquire(a)
    w = lib.new()
    got = []
    waiter = threading.Thread(target=lambda: got.append(C.outcome(lambda: lib.blocking_acquire(w))), daemon=True)
    waiter.start()
    time.sleep(0.5)
    C.check(waiter.is_alive(), lambda: "W's blocking acquire returned while A holds the lock: %r" % (got,))
    C.check_majority(key, token, TTL_MS - 2000, "while W waits")
    C.step("A releases, W gets in")
    lib.release(a)
    C.check_not_holding(key, token, "after A releases with W waiting")
    waiter.join(WAIT_S + 2)
    C.check(not waiter.is_alive() and got and got[0] == ("ok", True),
            lambda: "W's blocking acquire after A released: expected True within %d s, got %r" % (WAIT_S, got))
    C.check_majority(key, token_of(w), TTL_MS - 2000, "after W got in", TTL_MS)
    C.step("W releases")
    lib.release(w)
    C.check_absent(key, "after W releases")


def token_of(lock):
    """The value a lock object of any of these libraries holds."""
    for attr in ("_uuid", "_owner", "id"):
        v = getattr(lock, attr, None)
        if v:
            return v
    C.fail("cannot find the lock value of %r" % (lock,))


def main():
    dist = {"pottery": "pottery", "python-redis-lock": "python-redis-lock", "sherlock": "sherlock"}[LIB]
    C.setup(LIB, dist_version(dist), timeout_s=100)
    lib = {"pottery": Pottery, "python-redis-lock": PythonRedisLock, "sherlock": Sherlock}[LIB](C.KEY)
    contract(lib)
    lib.r.close()
    C.result(api=lib.api)


C.run(main)
