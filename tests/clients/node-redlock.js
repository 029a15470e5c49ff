// redlock 5.0.0-beta.2 (npm "redlock") with one ioredis client, through the proxy.
//
//   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] node tests/clients/node-redlock.js IOREDIS
//
// IOREDIS (IOREDIS_MODULE-style, as in the recorded traces):
//   ioredis   -> ioredis@5.9.2  (RESP2; sends INFO as its ready check)
//   ioredis6  -> ioredis@6.0.0  (HELLO 3 first, RESP3 unless the server refuses HELLO)
//
// The proxy is given to Redlock as its single "Redis" (quorum 1 from redlock's view;
// the proxy does the majority over the masters). redlock never sends SET NX: it
// acquires/extends/releases with its own Lua scripts (EVALSHA, EVAL on NOSCRIPT).
// Steps: acquire (30 s), contention from a second Redlock instance with retryCount 0
// (must throw ExecutionError), extend to 60 s, SCRIPT FLUSH on the masters directly,
// release, release again (ExecutionError), then using() with a 2000 ms lock and
// automaticExtensionThreshold 500 held for 3200 ms: the same value must still be on
// a majority after the original TTL has passed, and at least one extension must
// have gone over the wire. Every step is checked on each master directly.
// Exit 0 and one `RESULT {...}` line on stdout on success; non-zero otherwise.
"use strict";
const C = require("./lib/common");

const MOD = process.argv[2] || "ioredis";
if (!["ioredis", "ioredis6"].includes(MOD)) {
  process.stderr.write("usage: node node-redlock.js ioredis|ioredis6\n");
  process.exit(2);
}
const IOVER = C.depVersion(MOD);
const RLVER = C.depVersion("redlock");
const CLIENT = `node-redlock+ioredis${IOVER.split(".")[0]}`;
const E = C.env(CLIENT, `${RLVER} (ioredis ${IOVER})`);
const Redis = C.requireDep(MOD);
const RedlockMod = C.requireDep("redlock");
const Redlock = RedlockMod.default;
const { ExecutionError } = RedlockMod;
const { check, fail, note, sleep } = C;

// sha1 of redlock's scripts as recorded (scripts/node-redlock-*.lua in the traces)
const SHA = {
  acquire: "96da70f7716f27d278a5218544df37fd8b0a5e4c",
  extend: "aed6f382e410db8ba7926d4e5e9aab410bf2a78a",
  release: "e4612211c9f8f51c257e26e056b0a654b3187242",
};

async function main() {
  C.watchdog(90000);
  const masters = new C.Masters(E.masterPorts, E.quorum);
  await masters.connect();
  const KEY = E.key;
  await masters.checkAbsent(KEY, "precondition");

  const tap = await C.startTap(E.proxyPort);
  const mk = () => {
    const c = new Redis({ host: C.HOST, port: tap.port, connectTimeout: 5000, commandTimeout: 10000,
                          maxRetriesPerRequest: 2, retryStrategy: (n) => (n > 3 ? null : 200) });
    c.on("error", (e) => C.clientError(`ioredis -> 127.0.0.1:${E.proxyPort}`, e));
    return c;
  };
  const client = mk();
  const client2 = mk();
  const redlock = new Redlock([client], { retryCount: 3, retryDelay: 200, retryJitter: 50 });
  const redlock2 = new Redlock([client2], { retryCount: 0 });
  redlock.on("error", () => {});   // ResourceLockedError is emitted for each vote against
  redlock2.on("error", () => {});
  const evalshaCount = (sha) => tap.count((c) => c[0] === "EVALSHA" && c[1] === sha);
  const evalCount = (sha) => tap.count((c) => c[0] === "EVAL" && c[1] && C.sha1(c[1]) === sha);
  const scriptCalls = (name) => evalshaCount(SHA[name]) + evalCount(SHA[name]);

  // ---- acquire ----
  C.stage("acquire");
  let lock = await redlock.acquire([KEY], 30000);
  check(typeof lock.value === "string" && lock.value.length === 32, `acquire: unexpected lock value ${JSON.stringify(lock.value)}`);
  check(lock.expiration > Date.now() + 29000, `acquire: lock.expiration only ${lock.expiration - Date.now()} ms ahead`);
  await masters.checkMajority(KEY, lock.value, 29000, "after acquire", 30000);
  check(scriptCalls("acquire") >= 1, "acquire: redlock's acquire script (sha 96da..) was not seen on the wire");

  // ---- contention: a second Redlock instance, retryCount 0 -> one attempt, ExecutionError ----
  C.stage("contention: a second Redlock instance, retryCount 0 -> one attempt, ExecutionError");
  let t0 = Date.now();
  try {
    await redlock2.acquire([KEY], 30000);
    fail("B acquire while A holds the lock: expected ExecutionError, it succeeded");
  } catch (e) {
    check(e instanceof ExecutionError, `B acquire: expected ExecutionError, got ${e && e.constructor.name}: ${e && e.message}`);
    check(Array.isArray(e.attempts) && e.attempts.length === 1, `B acquire retryCount=0: expected 1 attempt, got ${e.attempts && e.attempts.length}`);
    note(`B acquire -> ${e.constructor.name}: ${e.message} [attempts=${e.attempts.length}] after ${Date.now() - t0} ms`);
  }
  check(Date.now() - t0 < 5000, `B acquire with retryCount 0 took ${Date.now() - t0} ms`);
  await masters.checkMajority(KEY, lock.value, 28000, "after B contention");   // B's value nowhere

  // ---- extend ----
  C.stage("extend");
  const extends0 = scriptCalls("extend");
  lock = await lock.extend(60000);
  check(lock.expiration > Date.now() + 59000, "extend(60000): lock.expiration did not move");
  check(scriptCalls("extend") > extends0, "extend: redlock's extend script (sha aed6..) was not seen on the wire");
  await masters.checkMajority(KEY, lock.value, 59000, "after extend(60000)", 60000);

  // masters forget every script; the next EVALSHA must still work
  await masters.flushScripts();

  // ---- release ----
  C.stage("release");
  const rel = await lock.release();
  check(rel && Array.isArray(rel.attempts), "release: expected an ExecutionResult");
  await masters.checkAbsent(KEY, "after release");
  // release again: the script answers 0 keys != 1 -> vote against -> ExecutionError
  try {
    await redlock.release(lock, { retryCount: 1, retryDelay: 50, retryJitter: 0 });
    fail("release of an already released lock: expected ExecutionError, it succeeded");
  } catch (e) {
    check(e instanceof ExecutionError, `release again: expected ExecutionError, got ${e && e.constructor.name}: ${e && e.message}`);
  }
  await masters.checkAbsent(KEY, "after release again");

  // ---- using(): auto-extension past the original TTL ----
  C.stage("using(): auto-extension past the original TTL");
  const usingTtl = 2000;
  const holdMs = 3200;
  const ext0 = scriptCalls("extend");
  let inside = null;
  t0 = Date.now();
  const ret = await redlock.using([KEY], usingTtl, { automaticExtensionThreshold: 500 }, async (signal) => {
    const v = await masters.majorityValue(KEY, "using(): start");
    await masters.checkMajority(KEY, v, usingTtl - 1000, "using(): start", usingTtl);
    await sleep(holdMs);   // > usingTtl: only an extension keeps the lock alive
    check(!signal.aborted, () => `using(): the signal was aborted: ${signal.error && signal.error.message}`);
    const elapsed = Date.now() - t0;
    check(elapsed > usingTtl + 500, `using(): held only ${elapsed} ms`);
    await masters.checkMajority(KEY, v, 0, `using(): ${elapsed} ms after acquire (TTL ${usingTtl} ms)`);
    inside = v;
    return "routine-done";
  });
  check(ret === "routine-done", `using(): expected the routine's return value, got ${JSON.stringify(ret)}`);
  check(inside !== null, "using(): routine did not run");
  const nExt = scriptCalls("extend") - ext0;
  check(nExt >= 1, `using(): no automatic extension went over the wire in ${holdMs} ms (TTL ${usingTtl} ms)`);
  note(`using(): ${nExt} automatic extension(s)`);
  await masters.checkAbsent(KEY, "after using()");

  // ---- protocol, as negotiated on the wire ----
  C.stage("protocol, as negotiated on the wire");
  const protocol = tap.protocolOf(0);
  check(protocol === tap.protocolOf(1), "the two ioredis clients negotiated different protocols");
  if (client.condition && client.condition.protocol !== undefined) {
    check(`RESP${client.condition.protocol}` === protocol, `ioredis reports protocol ${client.condition.protocol}, wire says ${protocol}`);
  }
  if (MOD === "ioredis6" && protocol !== "RESP3") {
    process.stderr.write(`  [${CLIENT}] note: ioredis 6 fell back to RESP2 (HELLO refused)\n`);
  }
  check(tap.count((c) => c[0] === "INFO") >= 2, "ioredis sent no INFO ready check (expected one per connection)");
  check(tap.count((c) => c[0] === "SET") === 0, "redlock sent a plain SET (it should only use its scripts)");

  const q = await client.quit();
  check(q === "OK", `QUIT: expected "OK", got ${JSON.stringify(q)}`);
  await client2.quit();
  await masters.close();
  tap.close();
  note(`wire: ${JSON.stringify(tap.conns.map((c) => c.commands.map((x) => x.slice(0, 2).join(" ").slice(0, 60))))}`);
  C.result(CLIENT, `${RLVER} (ioredis ${IOVER})`, protocol, { api: "Redlock: acquire(), extend(), release(), using() auto-extension" });
}
main().catch((e) => fail(`unexpected ${e && e.constructor ? e.constructor.name : ""}: ${e && e.stack ? e.stack : e}`));
