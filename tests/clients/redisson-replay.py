"""Redisson 3.45's RLock, replayed over redis-py (RESP2), through the proxy.

    PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] \\
        tests/clients/.deps/venv/bin/python tests/clients/redisson-replay.py

Redisson (Java) cannot be installed here, so this script sends what Redisson 3.45 sends for
an `RLock`, as testkit/src/redisson.rs (the Rust replay used by tests/redisson.rs) does: the
exact Lua scripts of `RedissonLock` / `RedissonBaseLock` (ACQUIRE, UNLOCK, RENEW below; byte
for byte the test kit's, which tests/clients.rs checks), by `EVALSHA` with `SCRIPT LOAD` and
`EVALSHA` again after a `NOSCRIPT` (Redisson's script cache), with its key, channel and latch
names and its argument order:

- the lock is a hash `KEY`, field `<uuid>:<threadId>` -> reentrancy count; ACQUIRE answers
  nil when acquired (or re-entered), else the holder's PTTL;
- RENEW is the watchdog's renewal (1 renewed, 0 not held);
- UNLOCK (KEYS = KEY, `redisson_lock__channel:{KEY}`, `redisson_unlock_latch:{KEY}:<requestId>`;
  ARGV = `0`, lease, field, `publish`, 13500) counts down, deletes the hash and runs
  `redis.call(ARGV[4], KEYS[2], ARGV[1])` (PUBLISH) at zero, and leaves the latch holding its
  answer so that a retried request answers the same; the client deletes the latch afterwards;
- a waiter SUBSCRIBEs to the lock channel on a connection of its own, tries, and waits for
  an unlock message (or the holder's PTTL, bounded) before it tries again.

The contract, checked on each master in MASTER_PORTS directly (as python-locks.py): A locks
(the hash {field: 1} on a majority, PTTL ~ the lease), a contender B is refused (the answer is
a PTTL, B's field on no master; B's unlock answers nil and leaves no latch), A re-enters
(count 2), A's watchdog renewal moves the PTTL up, A unlocks twice (count 1 then the key on no
master; each request's latch answers the same when the request is retried), and a waiter W
subscribed to the lock channel is woken by A's unlock message and gets the lock. Exit 0 and
one `RESULT {...}` line on stdout on success; non-zero, a `FAIL ...` line on stderr and a
`RESULT {"status":"fail","step":...}` line otherwise.
"""
import hashlib
import os
import sys
import threading
import time
import uuid

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import common as C  # noqa: E402
import redis  # noqa: E402
from redis.backoff import NoBackoff  # noqa: E402
from redis.retry import Retry  # noqa: E402

REDISSON = "3.45"
API = ("RLock: tryLock() (EVALSHA, SCRIPT LOAD after NOSCRIPT), re-entry, watchdog renewal, "
       "unlock() with latch and publish, waiter woken on the lock channel")

# Redisson 3.45's scripts, byte for byte as testkit/src/redisson.rs has them (tests/clients.rs
# checks these lines against the test kit's constants).
# RedissonLock.tryLockInnerAsync: KEYS = [name], ARGV = [lease ms, <uuid>:<threadId>].
ACQUIRE = "if ((redis.call('exists', KEYS[1]) == 0) or (redis.call('hexists', KEYS[1], ARGV[2]) == 1)) then redis.call('hincrby', KEYS[1], ARGV[2], 1); redis.call('pexpire', KEYS[1], ARGV[1]); return nil; end; return redis.call('pttl', KEYS[1]);"
# RedissonLock.unlockInnerAsync: KEYS = [name, channel, latch],
# ARGV = [unlock message, lease ms, <uuid>:<threadId>, publish command, latch ms].
UNLOCK = "local val = redis.call('get', KEYS[3]); if val ~= false then return tonumber(val);end; if (redis.call('hexists', KEYS[1], ARGV[3]) == 0) then return nil;end; local counter = redis.call('hincrby', KEYS[1], ARGV[3], -1); if (counter > 0) then redis.call('pexpire', KEYS[1], ARGV[2]); redis.call('set', KEYS[3], 0, 'px', ARGV[5]); return 0; else redis.call('del', KEYS[1]); redis.call(ARGV[4], KEYS[2], ARGV[1]); redis.call('set', KEYS[3], 1, 'px', ARGV[5]); return 1; end; "
# RedissonBaseLock.renewExpirationAsync (the watchdog): KEYS = [name], ARGV = [lease ms,
# <uuid>:<threadId>].
RENEW = "if (redis.call('hexists', KEYS[1], ARGV[2]) == 1) then redis.call('pexpire', KEYS[1], ARGV[1]); return 1; end; return 0;"
# LockPubSub.UNLOCK_MESSAGE, and the latch's life: (timeout + retryInterval) x retryAttempts
# of Redisson's defaults (3000 ms, 1500 ms, 3).
UNLOCK_MESSAGE = "0"
LATCH_TIMEOUT_MS = 13500

LEASE_MS = 10000   # lockWatchdogTimeout set to 10 s: the lease of a lock taken without one
WAIT_S = 8         # the waiter's wait time (tryLock(waitTime)): it is woken within ~1 s
WOKEN_S = 3        # W must have the lock this soon after A's unlock (A's lease is 10 s)

SCRIPT_CALLS = {"evalsha": 0, "noscript": 0}


def sha1(script):
    return hashlib.sha1(script.encode()).hexdigest()


def prefix_name(prefix, name):
    """Redisson's prefixName: `prefix:name` if the name has a hash tag, else `prefix:{name}`."""
    return "%s:%s" % (prefix, name) if "{" in name else "%s:{%s}" % (prefix, name)


def channel_name(name):
    return prefix_name("redisson_lock__channel", name)


def latch_name(name, request_id):
    return "%s:%s" % (prefix_name("redisson_unlock_latch", name), request_id)


def request_id():
    """Redisson's generateId(): 16 random bytes in hex."""
    return os.urandom(16).hex()


def connection():
    """A RESP2 connection to the proxy with nothing sent on connect (no HELLO, no CLIENT
    SETINFO) and no silent retry: Redisson's command connection, as far as the wire goes."""
    return redis.Redis(host=C.HOST, port=C.PROXY_PORT, protocol=2, socket_timeout=10,
                       socket_connect_timeout=5, driver_info=None, retry=Retry(NoBackoff(), 0))


def evalsha(r, script, keys, args):
    """One script call as Redisson's script cache makes it: EVALSHA; after NOSCRIPT,
    SCRIPT LOAD (which must answer the same SHA1) and EVALSHA again."""
    sha = sha1(script)
    words = ["EVALSHA", sha, str(len(keys))] + list(keys) + list(args)
    SCRIPT_CALLS["evalsha"] += 1
    try:
        return r.execute_command(*words)
    except redis.exceptions.NoScriptError:
        SCRIPT_CALLS["noscript"] += 1
        loaded = r.execute_command("SCRIPT", "LOAD", script)
        C.check(loaded == sha.encode(), lambda: "SCRIPT LOAD after NOSCRIPT answered %r, expected %s" % (loaded, sha))
        C.note("NOSCRIPT for %s: SCRIPT LOAD, EVALSHA again" % sha)
        SCRIPT_CALLS["evalsha"] += 1
        return r.execute_command(*words)


class RLock:
    """`redisson.getLock(name)` as the thread `thread_id` of the Redisson client `client_id`
    uses it, on a command connection of its own."""

    def __init__(self, name, client_id, thread_id=1):
        self.r = connection()
        self.name = name
        self.field = "%s:%d" % (client_id, thread_id)
        self.lease_ms = LEASE_MS   # internalLockLeaseTime

    def try_acquire(self):
        """tryAcquire without a lease of its own: the watchdog's. nil acquired, else a PTTL."""
        return evalsha(self.r, ACQUIRE, [self.name], [str(self.lease_ms), self.field])

    def renew(self):
        return evalsha(self.r, RENEW, [self.name], [str(self.lease_ms), self.field])

    def unlock_request(self, rid):
        keys = [self.name, channel_name(self.name), latch_name(self.name, rid)]
        args = [UNLOCK_MESSAGE, str(self.lease_ms), self.field, "publish", str(LATCH_TIMEOUT_MS)]
        return evalsha(self.r, UNLOCK, keys, args)

    def delete_latch(self, rid):
        return self.r.execute_command("DEL", latch_name(self.name, rid))


def new_client_id():
    """A Redisson client's id (ServiceManager.getId(): a UUID)."""
    return str(uuid.uuid4())


def check_pttl_answer(ans, label):
    lim = LEASE_MS + int(LEASE_MS * C.TTL_SLACK) + 50
    C.check(isinstance(ans, int) and 0 < ans <= lim,
            lambda: "%s: expected the holder's PTTL (0 < PTTL <= %d), got %r" % (label, lim, ans))


def check_latch(key, rid, answer, label):
    """The latch of request `rid` holds `answer` on a majority, for the latch timeout."""
    C.check_majority(latch_name(key, rid), str(answer), LATCH_TIMEOUT_MS - 2000, label, LATCH_TIMEOUT_MS)


class Waiter:
    """W's tryLock(WAIT_S): one try; refused, SUBSCRIBE on a connection of its own, then
    try / wait for an unlock message (at most the holder's PTTL) until acquired or WAIT_S
    ran out; UNSUBSCRIBE. `events` records every answer and message, for the checks."""

    def __init__(self, key):
        self.key = key
        self.lock = RLock(key, new_client_id())
        self.channel = channel_name(key).encode()
        self.events = []
        self.waiting = threading.Event()   # subscribed, refused once more, waiting
        self.acquired_at = None
        self.outcome = None

    def run(self):
        self.outcome = C.outcome(self._run)

    def _run(self):
        deadline = time.monotonic() + WAIT_S
        first = self.lock.try_acquire()
        self.events.append(("try", first))
        if first is None:
            return "acquired at once"
        sub = redis.Redis(host=C.HOST, port=C.PROXY_PORT, protocol=2, socket_timeout=10,
                          socket_connect_timeout=5, driver_info=None,
                          retry=Retry(NoBackoff(), 0)).pubsub()
        sub.subscribe(self.channel)
        confirmed = sub.get_message(timeout=5)
        self.events.append(("subscribe", confirmed))
        if confirmed != {"type": "subscribe", "pattern": None, "channel": self.channel, "data": 1}:
            return "SUBSCRIBE not confirmed: %r" % (confirmed,)
        result = "wait time ran out"
        while time.monotonic() < deadline:
            ans = self.lock.try_acquire()
            self.events.append(("try", ans))
            if ans is None:
                self.acquired_at = time.monotonic()
                result = "acquired"
                break
            if not isinstance(ans, int):
                result = "try answered %r" % (ans,)
                break
            self.waiting.set()
            pause = max(0.0, min(ans / 1000.0, deadline - time.monotonic()))
            msg = sub.get_message(timeout=pause)
            self.events.append(("message", msg))
        sub.unsubscribe(self.channel)
        self.events.append(("unsubscribe", sub.get_message(timeout=5)))
        sub.close()
        return result


def master_subscribers(channel):
    """One subscriber per master, directly: which masters the unlock's PUBLISH ran on."""
    subs = {}
    for p in C.MASTER_PORTS:
        s = redis.Redis(host=C.HOST, port=p, protocol=2, socket_timeout=5).pubsub()
        s.subscribe(channel)
        confirmed = s.get_message(timeout=5)
        C.check(confirmed is not None and confirmed["type"] == "subscribe",
                lambda: "master %d: SUBSCRIBE %s: %r" % (p, channel, confirmed))
        subs[p] = s
    return subs


def published_on(subs, channel):
    """{port: the messages each master's subscriber got} after up to MASTER_SETTLE_MS."""
    got = {p: [] for p in subs}
    deadline = time.monotonic() + C.SETTLE
    while time.monotonic() < deadline and not all(got.values()):
        for p, s in subs.items():
            m = s.get_message(timeout=0.02)
            if m is not None:
                got[p].append((m["type"], m["channel"], m["data"]))
    for s in subs.values():
        s.close()
    return got


def contract(key):
    channel = channel_name(key)
    C.step("precondition")
    C.check_absent(key, "precondition")

    C.step("A locks (EVALSHA, SCRIPT LOAD after NOSCRIPT)")
    a = RLock(key, new_client_id())
    ans = a.try_acquire()
    C.check(ans is None, lambda: "A's acquire: expected nil (acquired), got %r" % (ans,))
    C.check_field_majority(key, a.field, 1, LEASE_MS - 1000, "after A locks", LEASE_MS)
    C.note("script calls so far: %r" % SCRIPT_CALLS)

    C.step("B contends")
    b = RLock(key, new_client_id())
    ans = b.try_acquire()
    check_pttl_answer(ans, "B's acquire while A holds the lock")
    C.check_field_absent(key, b.field, "after B's attempt")
    C.check_field_majority(key, a.field, 1, LEASE_MS - 3000, "after B's attempt")

    C.step("B unlocks a lock it does not hold")
    rid = request_id()
    ans = b.unlock_request(rid)
    C.check(ans is None, lambda: "B's unlock: expected nil (not held: IllegalMonitorStateException), got %r" % (ans,))
    C.check_absent(latch_name(key, rid), "after B's unlock (no latch)")
    C.check_field_majority(key, a.field, 1, LEASE_MS - 3000, "after B's unlock")

    C.step("A re-enters")
    ans = a.try_acquire()
    C.check(ans is None, lambda: "A's re-entrant acquire: expected nil, got %r" % (ans,))
    before = C.check_field_majority(key, a.field, 2, LEASE_MS - 1000, "after A re-enters", LEASE_MS)

    C.step("A's watchdog renews (RENEW)")
    # The renewal sets the lease back to LEASE_MS: wait until the PTTL is >= 1.5 s below it,
    # so that "moved up by > 400 ms" holds even if the check after it comes 1 s late.
    used = max(before.values()) - (LEASE_MS - 1500)
    if used > 0:
        time.sleep(used / 1000.0)
        before = C.check_field_majority(key, a.field, 2, LEASE_MS - 3000, "before the renewal")
    ans = a.renew()
    C.check(ans == 1, lambda: "A's renewal: expected 1 (renewed), got %r" % (ans,))
    after = C.check_field_majority(key, a.field, 2, LEASE_MS - 1000, "after the renewal", LEASE_MS)
    grown = [p for p in after if p in before and after[p] > before[p] + 400]
    C.check(len(grown) >= C.QUORUM, lambda: "renewal: PTTL did not move up on a majority: %r -> %r" % (before, after))
    ans = b.renew()
    C.check(ans == 0, lambda: "B's renewal of A's lock: expected 0 (not held), got %r" % (ans,))
    C.check_field_majority(key, a.field, 2, LEASE_MS - 2000, "after B's renewal", LEASE_MS)

    C.step("A unlocks once (still held)")
    r1 = request_id()
    ans = a.unlock_request(r1)
    C.check(ans == 0, lambda: "A's first unlock: expected 0 (still held), got %r" % (ans,))
    C.check_field_majority(key, a.field, 1, LEASE_MS - 1000, "after A's first unlock", LEASE_MS)
    check_latch(key, r1, 0, "latch of the first unlock")

    C.step("A's first unlock request again (latch)")
    ans = a.unlock_request(r1)
    C.check(ans == 0, lambda: "the first unlock request retried: expected its latched 0, got %r" % (ans,))
    C.check_field_majority(key, a.field, 1, LEASE_MS - 2000, "after the retried request (counted down once)", LEASE_MS)
    ans = a.delete_latch(r1)
    C.check(ans == 1, lambda: "DEL of the first unlock's latch: expected 1, got %r" % (ans,))
    C.check_absent(latch_name(key, r1), "after DEL of the first latch")

    C.step("A unlocks again (released)")
    r2 = request_id()
    ans = a.unlock_request(r2)
    C.check(ans == 1, lambda: "A's second unlock: expected 1 (released), got %r" % (ans,))
    C.check_absent(key, "after A's second unlock")
    check_latch(key, r2, 1, "latch of the second unlock")

    C.step("A's second unlock request again (latch)")
    ans = a.unlock_request(r2)
    C.check(ans == 1, lambda: "the second unlock request retried: expected its latched 1, got %r" % (ans,))
    C.check_absent(key, "after the retried second request")
    ans = a.delete_latch(r2)
    C.check(ans == 1, lambda: "DEL of the second unlock's latch: expected 1, got %r" % (ans,))
    C.check_absent(latch_name(key, r2), "after DEL of the second latch")
    ans = a.unlock_request(r2)
    C.check(ans is None, lambda: "the second request once its latch is gone: expected nil (not held), got %r" % (ans,))
    C.check_absent(latch_name(key, r2), "after the request without its latch")

    C.step("W waits on the lock channel while A holds the lock")
    ans = a.try_acquire()
    C.check(ans is None, lambda: "A locks again: expected nil, got %r" % (ans,))
    C.check_field_majority(key, a.field, 1, LEASE_MS - 1000, "A holds the lock again", LEASE_MS)
    w = Waiter(key)
    thread = threading.Thread(target=w.run, daemon=True)
    thread.start()
    C.check(w.waiting.wait(5), lambda: "W did not get to wait within 5 s: %r %r" % (w.events, w.outcome))
    time.sleep(0.3)
    C.check(thread.is_alive(), lambda: "W's tryLock returned while A holds the lock: %r, events %r" % (w.outcome, w.events))
    C.check_field_absent(key, w.lock.field, "while W waits")
    C.check_field_majority(key, a.field, 1, LEASE_MS - 2000, "while W waits", LEASE_MS)

    C.step("A unlocks, W is woken by the message and gets in")
    subs = master_subscribers(channel)
    r3 = request_id()
    unlocked_at = time.monotonic()
    ans = a.unlock_request(r3)
    C.check(ans == 1, lambda: "A's unlock with W waiting: expected 1, got %r" % (ans,))
    C.check(a.delete_latch(r3) == 1, "DEL of the unlock's latch: expected 1")
    thread.join(WAIT_S + 2)
    C.check(not thread.is_alive() and w.outcome == ("ok", "acquired"),
            lambda: "W's tryLock(%d s) after A's unlock: expected acquired, got %r; W's events: %r"
            % (WAIT_S, w.outcome, w.events))
    messages = [m for kind, m in w.events if kind == "message"]
    woken = [m for m in messages if m is not None]
    C.check(woken and woken[-1] == {"type": "message", "pattern": None, "channel": channel.encode(),
                                    "data": UNLOCK_MESSAGE.encode()},
            lambda: "W was not woken by the unlock message %r on %s: W's events %r" % (UNLOCK_MESSAGE, channel, w.events))
    C.check(w.acquired_at - unlocked_at < WOKEN_S,
            lambda: "W got the lock %.1f s after A's unlock (woken by the message, it takes < %d s): %r"
            % (w.acquired_at - unlocked_at, WOKEN_S, w.events))
    C.note("W's events: %r" % (w.events,))
    C.check_field_absent(key, a.field, "after W got in")
    C.check_field_majority(key, w.lock.field, 1, LEASE_MS - 2000, "after W got in", LEASE_MS)
    got = published_on(subs, channel)
    want = ("message", channel.encode(), UNLOCK_MESSAGE.encode())
    on = [p for p, ms in got.items() if ms == [want]]
    C.check(len(on) >= C.QUORUM, lambda: "the unlock's PUBLISH: %r once on %d of %d masters (quorum %d): %r"
            % (want, len(on), C.N, C.QUORUM, got))
    if len(on) < C.N:
        C.warn("the unlock's PUBLISH not seen once on master(s) %r: %r"
               % ([p for p in got if p not in on], got))

    C.step("W unlocks")
    r4 = request_id()
    ans = w.lock.unlock_request(r4)
    C.check(ans == 1, lambda: "W's unlock: expected 1, got %r" % (ans,))
    C.check(w.lock.delete_latch(r4) == 1, "DEL of W's latch: expected 1")
    C.check_absent(key, "after W unlocks")
    C.check_absent(latch_name(key, r4), "after W deleted its latch")
    C.note("script calls: %r" % SCRIPT_CALLS)
    if SCRIPT_CALLS["noscript"] == 0:
        C.warn("no NOSCRIPT seen: the scripts were cached already, SCRIPT LOAD not exercised")
    for lock in (a, b, w.lock):
        lock.r.close()


def main():
    C.setup("Redisson", "%s (replayed scripts, redis-py %s)" % (REDISSON, redis.__version__), "RESP2",
            timeout_s=60)
    contract(C.KEY)
    C.result(api=API)


C.run(main)
