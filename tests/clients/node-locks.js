// Node.js lock libraries, each through its recommended API, through the proxy.
//
//   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] node tests/clients/node-locks.js LIB
//
// LIB:
//   redlock-universal-redis    redlock-universal createLock() + NodeRedisAdapter (node-redis):
//                              acquire, extend(handle, ms), release, using() (auto-extension)
//   redlock-universal-ioredis  the same with IoredisAdapter (ioredis 5)
//   redis-semaphore-mutex      redis-semaphore Mutex (ioredis 5): tryAcquire, acquire, release,
//                              refresh (acquiredExternally), auto-refresh past lockTimeout
//   redis-semaphore-semaphore  redis-semaphore Semaphore, limit 2 (a sorted set of holders): one
//                              permit held throughout by a filler, then as Mutex
//   sesamecare-redlock         @sesamecare-oss/redlock (ioredis 5): acquire, extend, release, using()
//   ioredis-lock               @microfleet/ioredis-lock (ioredis 5): acquire, extend, release
//
// Every library goes through the same contract (contract() below), checked on each master in
// MASTER_PORTS directly: A acquires (its value on a majority with the expected PTTL), B's
// attempt is refused (B's value on no master), A extends (PTTL moved up on a majority), A
// releases (nothing of A's left on any master), a waiter W, retrying in the library's acquire,
// gets the lock once A releases it, and last the library's own extras (auto-extension past
// the TTL). Clients connect through the tap of lib/common.js (protocol, scripts on the wire).
// Exit 0 and one `RESULT {...}` line on stdout on success; non-zero, a `FAIL ...` line on
// stderr and a `RESULT {"status":"fail","step":...}` line otherwise.
"use strict";
const C = require("./lib/common");
const { check, fail, note, sleep, stage } = C;

const TTL = 10000;    // every lock's TTL: long enough that no check races its expiry
const WAIT_MS = 8000; // how long the waiter retries: ample, it gets in within ~1 s

// What each library needs: `make(tap, E)` returns the adapter the contract drives.
const LIBS = {
  "redlock-universal-redis": { pkg: "redlock-universal", client: "redis", make: (t, E) => redlockUniversal(t, E, "redis") },
  "redlock-universal-ioredis": { pkg: "redlock-universal", client: "ioredis", make: (t, E) => redlockUniversal(t, E, "ioredis") },
  "redis-semaphore-mutex": { pkg: "redis-semaphore", client: "ioredis", make: (t, E) => redisSemaphore(t, E, "Mutex") },
  "redis-semaphore-semaphore": { pkg: "redis-semaphore", client: "ioredis", make: (t, E) => redisSemaphore(t, E, "Semaphore") },
  "sesamecare-redlock": { pkg: "@sesamecare-oss/redlock", client: "ioredis", make: sesamecare },
  "ioredis-lock": { pkg: "@microfleet/ioredis-lock", client: "ioredis", make: ioredisLock },
};
const NAME = process.argv[2];
if (!LIBS[NAME]) {
  process.stderr.write(`usage: node node-locks.js ${Object.keys(LIBS).join("|")}\n`);
  process.exit(2);
}
const SPEC = LIBS[NAME];
const VERSION = `${C.depVersion(SPEC.pkg)} (${SPEC.client === "redis" ? "node-redis" : SPEC.client} ${C.depVersion(SPEC.client)})`;
const E = C.env(SPEC.pkg, VERSION);

// A client of the proxy (through the tap), connected.
async function connect(kind, tap) {
  if (kind === "ioredis") {
    const Redis = C.requireDep("ioredis");
    const c = new Redis({ host: C.HOST, port: tap.port, connectTimeout: 5000, commandTimeout: 10000,
                          maxRetriesPerRequest: 2, retryStrategy: (n) => (n > 3 ? null : 200) });
    c.on("error", (e) => C.clientError(`ioredis -> ${C.HOST}:${E.proxyPort}`, e));
    await c.ping();
    return { c, close: () => c.quit() };
  }
  const { createClient } = C.requireDep("redis");
  const c = createClient({ socket: { host: C.HOST, port: tap.port, connectTimeout: 5000, reconnectStrategy: false } });
  c.on("error", (e) => C.clientError(`node-redis -> ${C.HOST}:${E.proxyPort}`, e));
  await c.connect();
  return { c, close: () => c.quit() };
}

// `fn` is a refused acquire: false when it throws an error `isRefusal` accepts (the library's
// "held by someone else"), true when it succeeds; any other error (e.g. the proxy's) fails.
async function refused(fn, isRefusal, label) {
  try {
    await fn();
    return false;
  } catch (e) {
    if (isRefusal(e)) {
      note(`${label}: ${e.constructor.name}: ${e.message}`);
      return true;
    }
    fail(`${label}: expected the library's "lock held" refusal, got ${e && e.constructor.name}: ${e && e.message}`);
  }
}

// Auto-extension past the TTL: `hold(routine)` takes the lock with TTL `ttl` and runs
// routine(token or null, aborted), which keeps it ttl + 1000 ms and checks it is still held on
// a majority; the wire must show scripts beyond the release (the extensions).
async function autoExtension(H, tap, ttl, hold) {
  const scripts0 = tap.count((c) => c[0] === "EVALSHA" || c[0] === "EVAL");
  const t0 = Date.now();
  let inside = null;
  await hold(async (token, aborted) => {
    const v = token || (await H.masters.majorityValue(H.key, "auto-extension: start"));
    await H.held(v, ttl - 1000, "auto-extension: start", ttl);
    await sleep(ttl + 1000);
    const lost = aborted();
    check(!lost, () => `auto-extension: the library reports the lock lost${lost && lost.message ? `: ${lost.constructor.name}: ${lost.message}` : ""}`
                       + ` (error replies on the wire: ${JSON.stringify(tap.conns.flatMap((c) => c.errors))})`);
    await H.held(v, 0, `auto-extension: ${Date.now() - t0} ms after acquire (TTL ${ttl} ms)`);
    inside = v;
  });
  check(inside !== null, "auto-extension: the routine did not run");
  const scripts = tap.count((c) => c[0] === "EVALSHA" || c[0] === "EVAL") - scripts0;
  check(scripts >= 2, `auto-extension: ${scripts} script call(s) on the wire in ${ttl + 1000} ms (TTL ${ttl} ms), expected extensions and a release`);
  await H.gone(inside, "after the auto-extended lock's release");
}

// ---- redlock-universal: createLock() over one adapter (the proxy) ----
async function redlockUniversal(tap, E, kind) {
  const RU = C.requireDep("redlock-universal");
  const conn = await connect(kind, tap);
  const adapter = kind === "ioredis" ? new RU.IoredisAdapter(conn.c) : new RU.NodeRedisAdapter(conn.c);
  const isHeld = (e) => e instanceof RU.LockAcquisitionError && /already held/.test(e.message);
  return {
    api: "createLock: acquire(), extend(handle, ms), release(handle), using() auto-extension",
    key: E.key,
    extendMs: 20000,
    conns: [conn],
    new: (o = {}) => ({ lock: RU.createLock({ adapter, key: E.key, ttl: TTL, retryAttempts: 0, ...o }) }),
    async acquire(p) { p.h = await p.lock.acquire(); return p.h.value; },
    tryAcquire: async (p) => !(await refused(() => p.lock.acquire(), isHeld, "B acquire")),
    async extend(p) { check((await p.lock.extend(p.h, 20000)) === true, "extend(handle, 20000): expected true"); },
    release: (p) => p.lock.release(p.h),
    waiter: () => ({ lock: RU.createLock({ adapter, key: E.key, ttl: TTL, retryAttempts: WAIT_MS / 200, retryDelay: 200 }) }),
    async extras(H) {
      stage("using(): auto-extension past the TTL");
      // extends when 80 % of the TTL is used, if at least 10 % is left: 500 ms of margin
      const ttl = 5000;
      const lock = RU.createLock({ adapter, key: E.key, ttl, retryAttempts: 0 });
      await autoExtension(H, tap, ttl, (routine) => lock.using((signal) => routine(null, () => signal.aborted && (signal.error || true))));
    },
  };
}

// ---- redis-semaphore: Mutex, Semaphore (limit 2) ----
async function redisSemaphore(tap, E, kind) {
  const RS = C.requireDep("redis-semaphore");
  const conn = await connect("ioredis", tap);
  const limit = kind === "Semaphore" ? [2] : [];
  const Lock = RS[kind];
  const make = (o) => new Lock(conn.c, E.key, ...limit, { lockTimeout: TTL, refreshInterval: 0, acquireAttemptsLimit: 1,
                                                          retryInterval: 100, onLockLost: (e) => C.clientError("onLockLost", e), ...o });
  const key = `${kind.toLowerCase()}:${E.key}`;   // the library prefixes the key
  let filler = null;   // Semaphore: holds one of the two permits throughout
  const semaphore = kind === "Semaphore";
  return {
    api: `${kind}${semaphore ? " (limit 2)" : ""}: tryAcquire(), acquire(), refresh (acquiredExternally), release(), auto-refresh`,
    key,
    extendMs: 20000,
    conns: [conn],
    // a semaphore's holders are members of a sorted set, not the key's value
    releaseBy: semaphore ? "ZREM" : null,
    held: semaphore ? (m, tok, min, label, max) => m.checkMemberMajority(key, tok, min, label, max) : null,
    gone: semaphore ? (m, tok, label) => m.checkMemberAbsent(key, tok, label) : null,
    async setup(masters) {
      if (!semaphore) return;
      stage("a filler takes one of the 2 permits");
      filler = make();
      check((await filler.tryAcquire()) === true, "filler tryAcquire(): expected true");
      await masters.checkMemberMajority(key, filler.identifier, TTL - 1000, "after the filler's acquire", TTL);
    },
    async teardown(masters) {
      if (!semaphore) return;
      stage("the filler releases");
      await filler.release();
      await masters.checkAbsent(key, "after the filler's release");
    },
    new: () => ({ lock: make() }),
    async acquire(p) { check((await p.lock.tryAcquire()) === true, "tryAcquire(): expected true"); return p.lock.identifier; },
    tryAcquire: (p) => p.lock.tryAcquire(),
    // the documented way to refresh a lock from another object: the same identifier,
    // acquiredExternally, a new lockTimeout -> tryAcquire() runs the refresh script
    async extend(p) {
      const ext = make({ identifier: p.lock.identifier, acquiredExternally: true, lockTimeout: 20000 });
      check((await ext.tryAcquire()) === true, "refresh (acquiredExternally, lockTimeout 20000): expected true");
      ext.stopRefresh();
    },
    release: (p) => p.lock.release(),
    waiter: () => ({ lock: make({ acquireAttemptsLimit: Infinity, acquireTimeout: WAIT_MS }) }),
    async acquireBlocking(p) { await p.lock.acquire(); return p.lock.identifier; },
    async extras(H) {
      stage("auto-refresh past lockTimeout");
      // lockTimeout 2000, refreshed every 1000 ms: 1000 ms of margin
      const ttl = 2000;
      const lock = make({ lockTimeout: ttl, refreshInterval: 1000 });
      await autoExtension(H, tap, ttl, async (routine) => {
        check((await lock.tryAcquire()) === true, "auto-refresh: tryAcquire(): expected true");
        try { await routine(lock.identifier, () => !lock.isAcquired); } finally { await lock.release(); }
      });
    },
  };
}

// ---- @sesamecare-oss/redlock: a Redlock over one client (the proxy) ----
async function sesamecare(tap, E) {
  const RL = C.requireDep("@sesamecare-oss/redlock");
  const conn = await connect("ioredis", tap);
  const make = (o) => {
    const r = new RL.Redlock([conn.c], { retryCount: 0, ...o });
    r.on("error", () => {});   // ResourceLockedError is emitted for each vote against
    return r;
  };
  const redlock = make();
  return {
    api: "Redlock: acquire(), lock.extend(), lock.release(), using() auto-extension",
    key: E.key,
    extendMs: 20000,
    conns: [conn],
    new: () => ({ r: redlock }),
    async acquire(p) { p.l = await p.r.acquire([E.key], TTL); return p.l.value; },
    tryAcquire: async (p) => !(await refused(() => p.r.acquire([E.key], TTL), (e) => e instanceof RL.ExecutionError, "B acquire")),
    async extend(p) { p.l = await p.l.extend(20000); },
    release: (p) => p.l.release(),
    waiter: () => ({ r: make({ retryCount: WAIT_MS / 200, retryDelay: 200, retryJitter: 50 }) }),
    async extras(H) {
      stage("using(): auto-extension past the TTL");
      // extends 1000 ms before expiry (automaticExtensionThreshold)
      const ttl = 2000;
      await autoExtension(H, tap, ttl, (routine) =>
        redlock.using([E.key], ttl, { automaticExtensionThreshold: 1000 }, (signal) => routine(null, () => signal.aborted && (signal.error || true))));
    },
  };
}

// ---- @microfleet/ioredis-lock (ESM only) ----
async function ioredisLock(tap, E) {
  const IL = await C.importDep("@microfleet/ioredis-lock");
  const conn = await connect("ioredis", tap);
  const isHeld = (e) => e instanceof IL.LockAcquisitionError && /Could not acquire/.test(e.message);
  return {
    api: "createLock: acquire(key), extend(ms), release(), retries",
    key: E.key,
    extendMs: 20000,
    conns: [conn],
    new: () => ({ lock: IL.createLock(conn.c, { timeout: TTL, retries: 0 }) }),
    async acquire(p) { await p.lock.acquire(E.key); return p.lock._id; },
    tryAcquire: async (p) => !(await refused(() => p.lock.acquire(E.key), isHeld, "B acquire")),
    extend: (p) => p.lock.extend(20000),
    release: (p) => p.lock.release(),
    waiter: () => ({ lock: IL.createLock(conn.c, { timeout: TTL, retries: WAIT_MS / 200, delay: 200 }) }),
    async extras(H) {
      stage("release of a released lock");
      const p = { lock: IL.createLock(conn.c, { timeout: TTL, retries: 0 }) };
      const tok = await this.acquire(p);
      await H.held(tok, TTL - 1000, "extras: after acquire", TTL);
      await p.lock.release();
      await H.gone(tok, "extras: after release");
      check(await refused(() => p.lock.release(), (e) => e instanceof IL.LockReleaseError, "release again"),
            "release of a released lock: expected LockReleaseError");
    },
  };
}

async function contract(lib, masters) {
  const key = lib.key;
  // what "held by tok" and "tok's hold is gone" mean on the masters: the key's value, or for
  // a semaphore a member of the sorted set under the key
  const heldOn = lib.held || ((m, tok, min, label, max) => m.checkMajority(key, tok, min, label, max));
  const goneOn = lib.gone || ((m, tok, label) => m.checkAbsent(key, label));
  const H = { masters, key, held: (...a) => heldOn(masters, ...a), gone: (...a) => goneOn(masters, ...a) };
  stage("precondition");
  await masters.checkAbsent(key, "precondition");
  if (lib.setup) await lib.setup(masters);

  stage("A acquires");
  let a = lib.new();
  let token = await lib.acquire(a);
  check(typeof token === "string" && token.length > 0, `A acquire: unexpected lock value ${JSON.stringify(token)}`);
  await H.held(token, TTL - 1000, "after A acquires", TTL);

  stage("B contends");
  check((await lib.tryAcquire(lib.new())) === false, "B's attempt while A holds the lock: expected a refusal");
  const before = await H.held(token, TTL - 3000, "after B's attempt");   // B's value nowhere

  stage("A extends");
  await lib.extend(a);
  const after = await H.held(token, lib.extendMs - 1000, "after A extends", lib.extendMs);
  const grown = Object.keys(after).filter((p) => before[p] !== undefined && after[p] > before[p] + 400);
  check(grown.length >= masters.quorum, `extend: PTTL did not move up on a majority: ${JSON.stringify(before)} -> ${JSON.stringify(after)}`);

  stage(`A releases${lib.releaseBy ? ` (${lib.releaseBy})` : ""}`);
  await lib.release(a);
  await H.gone(token, "after A releases");

  stage("W waits while A holds the lock");
  a = lib.new();
  token = await lib.acquire(a);
  const w = lib.waiter();
  let wDone = null;
  const wGot = (lib.acquireBlocking || lib.acquire)(w).then((t) => { wDone = { ok: t }; }, (e) => { wDone = { err: e }; });
  await sleep(500);
  check(wDone === null, () => `W's acquire returned while A holds the lock: ${wDone.err ? wDone.err.message : JSON.stringify(wDone.ok)}`);
  await H.held(token, TTL - 2000, "while W waits");
  stage("A releases, W gets in");
  await lib.release(a);
  await C.deadline(wGot, WAIT_MS + 2000, "W's acquire after A released");
  check(wDone && wDone.ok, () => `W's acquire after A released: ${wDone.err ? `${wDone.err.constructor.name}: ${wDone.err.message}` : "no lock value"}`);
  await H.held(wDone.ok, TTL - 2000, "after W got in", TTL);
  stage("W releases");
  await lib.release(w);
  await H.gone(wDone.ok, "after W releases");

  if (lib.teardown) await lib.teardown(masters);
  await masters.checkAbsent(key, "after the contract");

  // last, without a semaphore's filler: its holders must all use one lockTimeout (an acquire
  // drops the members older than its own lockTimeout)
  await lib.extras(H);
  await masters.checkAbsent(key, "at the end");
}

async function main() {
  C.watchdog(90000);
  const masters = new C.Masters(E.masterPorts, E.quorum);
  await masters.connect();
  const tap = await C.startTap(E.proxyPort);
  stage("connect");
  const lib = await SPEC.make(tap, E);
  await contract(lib, masters);
  const protocol = tap.protocolOf(0);
  for (const conn of lib.conns) await conn.close();
  await masters.close();
  tap.close();
  C.result(SPEC.pkg, VERSION, protocol, { api: lib.api });
}
main().catch((e) => fail(`unexpected ${e && e.constructor ? e.constructor.name : ""}: ${e && e.stack ? e.stack : e}`));
