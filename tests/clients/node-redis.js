// node-redis (npm "redis") v4 / v5 / v6 as a lock client, through the proxy.
//
//   PROXY_PORT=7000 MASTER_PORTS=7001,7002,7003 [KEY=...] node tests/clients/node-redis.js MODULE
//
// MODULE (REDIS_MODULE-style, as in the recorded traces):
//   redis4  -> redis@4.7.0   (RESP2)
//   redis5  -> redis@5.9.0   (RESP2 by default)
//   redis   -> redis@6.3.1   (RESP3 by default: HELLO 3 first); "redis6" is accepted too
//
// Through PROXY_PORT, with two clients A and B: SET k tok PX 30000 NX (A: "OK"),
// contention SET NX from B (null), EVAL extend to 60000 ms / EVAL release (the
// recorded scripts; B's wrong-token calls must give 0), then defineScript():
//   * the recorded release script, after SCRIPT FLUSH on every master directly;
//   * a release script with a per-run nonce comment, which nobody can have cached,
//     so the library's EVALSHA -> NOSCRIPT -> EVAL fallback is certainly exercised
//     (checked on the wire by the in-process tap, see lib/common.js);
//   * the same again once cached (EVALSHA only).
// Every step is checked on each master in MASTER_PORTS directly.
// Exit 0 and one `RESULT {...}` line on stdout on success; non-zero otherwise.
"use strict";
const C = require("./lib/common");

const arg = process.argv[2] || "redis";
const MOD = arg === "redis6" ? "redis" : arg;
if (!["redis4", "redis5", "redis"].includes(MOD)) {
  process.stderr.write("usage: node node-redis.js redis4|redis5|redis|redis6\n");
  process.exit(2);
}
const VERSION = C.depVersion(MOD);
const MAJOR = Number(VERSION.split(".")[0]);
const CLIENT = `node-redis${MAJOR}`;
const E = C.env(CLIENT, VERSION);
const { createClient, defineScript } = C.requireDep(MOD);
const { check, fail, note } = C;

const RELEASE = 'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("del",KEYS[1]) else return 0 end';
const EXTEND = 'if redis.call("get",KEYS[1]) == ARGV[1] then return redis.call("pexpire",KEYS[1],ARGV[2]) else return 0 end';
const NONCE = require("crypto").randomBytes(8).toString("hex");
const RELEASE_FRESH = `${RELEASE} -- rlp-test ${NONCE}`;   // same Lua, a SHA1 no server has seen

// defineScript has a different shape in v4 (transformArguments) and v5+ (parseCommand)
const mkScript = (text) => (MAJOR >= 5
  ? defineScript({ SCRIPT: text, NUMBER_OF_KEYS: 1,
      parseCommand(parser, key, token) { parser.pushKey(key); parser.push(token); },
      transformReply(reply) { return reply; } })
  : defineScript({ SCRIPT: text, NUMBER_OF_KEYS: 1,
      transformArguments(key, token) { return [key, token]; },
      transformReply(reply) { return reply; } }));

async function main() {
  C.watchdog(90000);
  const masters = new C.Masters(E.masterPorts, E.quorum);
  await masters.connect();
  const KEY = E.key;
  await masters.checkAbsent(KEY, "precondition");

  const tap = await C.startTap(E.proxyPort);
  const opts = {
    socket: { host: C.HOST, port: tap.port, connectTimeout: 5000, reconnectStrategy: false },
    scripts: { lockRelease: mkScript(RELEASE), lockReleaseFresh: mkScript(RELEASE_FRESH) },
  };
  const a = createClient(opts);
  const b = createClient(opts);
  a.on("error", (e) => C.clientError("client A", e));
  b.on("error", (e) => C.clientError("client B", e));
  await C.deadline(a.connect(), 10000, `client A connect to 127.0.0.1:${E.proxyPort} (via tap)`);
  await C.deadline(b.connect(), 10000, `client B connect to 127.0.0.1:${E.proxyPort} (via tap)`);
  const token = require("crypto").randomBytes(16).toString("hex");
  const other = `other-${require("crypto").randomBytes(8).toString("hex")}`;

  // ---- acquire ----
  C.stage("acquire");
  let r = await a.set(KEY, token, { NX: true, PX: 30000 });
  check(r === "OK", `A SET NX PX: expected "OK", got ${JSON.stringify(r)}`);
  await masters.checkMajority(KEY, token, 29000, "after A SET NX PX", 30000);

  // ---- contention ----
  C.stage("contention");
  r = await b.set(KEY, other, { NX: true, PX: 30000 });
  check(r === null, `B SET NX PX while A holds the lock: expected null, got ${JSON.stringify(r)}`);
  await masters.checkMajority(KEY, token, 28000, "after B contention");
  r = await b.eval(EXTEND, { keys: [KEY], arguments: [other, "60000"] });
  check(r === 0, `B EVAL extend (wrong token): expected the number 0, got ${JSON.stringify(r)} (${typeof r})`);
  r = await b.eval(RELEASE, { keys: [KEY], arguments: [other] });
  check(r === 0, `B EVAL release (wrong token): expected the number 0, got ${JSON.stringify(r)} (${typeof r})`);
  await masters.checkMajority(KEY, token, 28000, "after B's wrong-token EVALs");

  // ---- extend ----
  C.stage("extend");
  r = await a.eval(EXTEND, { keys: [KEY], arguments: [token, "60000"] });
  check(r === 1, `A EVAL extend: expected the number 1, got ${JSON.stringify(r)} (${typeof r})`);
  await masters.checkMajority(KEY, token, 59000, "after A EVAL extend to 60000 ms", 60000);

  // ---- release ----
  C.stage("release");
  r = await a.eval(RELEASE, { keys: [KEY], arguments: [token] });
  check(r === 1, `A EVAL release: expected the number 1, got ${JSON.stringify(r)} (${typeof r})`);
  await masters.checkAbsent(KEY, "after A EVAL release");
  r = await a.eval(RELEASE, { keys: [KEY], arguments: [token] });
  check(r === 0, `A EVAL release again: expected 0, got ${JSON.stringify(r)}`);

  // ---- defineScript, recorded script text, after SCRIPT FLUSH on the masters ----
  C.stage("defineScript, recorded script text, after SCRIPT FLUSH on the masters");
  r = await a.set(KEY, token, { NX: true, PX: 30000 });
  check(r === "OK", `A SET NX PX (2): expected "OK", got ${JSON.stringify(r)}`);
  await masters.checkMajority(KEY, token, 29000, "after A SET NX PX (2)");
  await masters.flushScripts();
  const sha = C.sha1(RELEASE);
  const before = tap.errorCount("NOSCRIPT");
  r = await a.lockRelease(KEY, token);
  check(r === 1, `A lockRelease (defineScript, EVALSHA ${sha.slice(0, 8)}..): expected 1, got ${JSON.stringify(r)}`);
  check(tap.count((c) => c[0] === "EVALSHA" && c[1] === sha) >= 1, "defineScript did not send EVALSHA");
  note(`recorded release script after master SCRIPT FLUSH: NOSCRIPT replies seen: ${tap.errorCount("NOSCRIPT") - before}`);
  await masters.checkAbsent(KEY, "after A lockRelease");

  // ---- defineScript with a script no server has seen: EVALSHA -> NOSCRIPT -> EVAL ----
  C.stage("defineScript with a script no server has seen: EVALSHA -> NOSCRIPT -> EVAL");
  const fsha = C.sha1(RELEASE_FRESH);
  r = await a.set(KEY, token, { NX: true, PX: 30000 });
  check(r === "OK", `A SET NX PX (3): expected "OK", got ${JSON.stringify(r)}`);
  const ns0 = tap.errorCount("NOSCRIPT");
  r = await a.lockReleaseFresh(KEY, token);
  check(r === 1, `A lockReleaseFresh (first call, NOSCRIPT fallback): expected 1, got ${JSON.stringify(r)}`);
  check(tap.count((c) => c[0] === "EVALSHA" && c[1] === fsha) === 1, "fresh script: expected one EVALSHA on the wire");
  check(tap.errorCount("NOSCRIPT") === ns0 + 1, `fresh script: expected one NOSCRIPT reply to EVALSHA ${fsha}, saw ${tap.errorCount("NOSCRIPT") - ns0}`);
  check(tap.count((c) => c[0] === "EVAL" && c[1] === RELEASE_FRESH) === 1, "fresh script: expected the EVAL fallback on the wire");
  await masters.checkAbsent(KEY, "after lockReleaseFresh (fallback)");
  r = await a.set(KEY, token, { NX: true, PX: 30000 });
  check(r === "OK", `A SET NX PX (4): expected "OK", got ${JSON.stringify(r)}`);
  await masters.checkMajority(KEY, token, 29000, "after A SET NX PX (4)");
  r = await b.lockReleaseFresh(KEY, other);
  check(r === 0, `B lockReleaseFresh (wrong token, cached): expected 0, got ${JSON.stringify(r)}`);
  r = await a.lockReleaseFresh(KEY, token);
  check(r === 1, `A lockReleaseFresh (cached): expected 1, got ${JSON.stringify(r)}`);
  check(tap.count((c) => c[0] === "EVAL" && c[1] === RELEASE_FRESH) === 1,
        "fresh script: the cached calls fell back to EVAL again (EVAL should have cached the script for EVALSHA)");
  await masters.checkAbsent(KEY, "after lockReleaseFresh (cached)");

  const protocol = tap.protocolOf(0);
  check(protocol === tap.protocolOf(1), "clients A and B negotiated different protocols");
  if (MAJOR >= 6) check(protocol === "RESP3", `node-redis ${VERSION} defaults to RESP3, the connection ended up ${protocol}`);
  else check(protocol === "RESP2", `node-redis ${VERSION} should speak RESP2, got ${protocol}`);

  r = await a.quit();
  check(r === "OK", `A QUIT: expected "OK", got ${JSON.stringify(r)}`);
  await b.quit();
  await masters.close();
  tap.close();
  note(`wire: ${JSON.stringify(tap.conns.map((c) => c.commands.map((x) => x.slice(0, 2).join(" ").slice(0, 60))))}`);
  C.result(CLIENT, VERSION, protocol, { api: "SET NX PX, EVAL extend and release, defineScript() (EVALSHA, NOSCRIPT -> EVAL)" });
}
main().catch((e) => fail(`unexpected ${e && e.constructor ? e.constructor.name : ""}: ${e && e.stack ? e.stack : e}`));
