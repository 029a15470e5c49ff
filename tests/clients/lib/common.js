// Shared helpers for the Node.js client scripts in tests/clients.
//  - env: PROXY_PORT, MASTER_PORTS, KEY (see README in each script)
//  - requireDep(): loads the pinned modules from tests/clients/.deps/node
//    (CLIENT_DEPS_DIR overrides .deps), never from a global install
//  - Masters: plain ioredis 5 (RESP2) connections to every master, for the checks
//  - startTap(): an in-process loopback TCP relay in front of the proxy that
//    records, per connection, the command names the client sent, whether HELLO 3
//    was accepted (-> RESP3), and every error reply prefix (e.g. NOSCRIPT). It
//    changes nothing in the bytes; it only lets the scripts see what the library
//    really did (protocol, EVALSHA -> NOSCRIPT -> EVAL fallback, extensions).
"use strict";
const fs = require("fs");
const net = require("net");
const path = require("path");
const crypto = require("crypto");
const { createRequire } = require("module");

const HOST = "127.0.0.1";
const DEPS = process.env.CLIENT_DEPS_DIR || path.join(__dirname, "..", ".deps");
const NODE_DEPS = path.join(DEPS, "node");
const depRequire = createRequire(path.join(NODE_DEPS, "package.json"));

let CLIENT = "node";
let KEY = "";
let CHECKS = 0;
// Upper PTTL bounds allow a proxy to pad the TTL it sends to the masters (e.g. by its
// clock-drift allowance): limit = expected + TTL_SLACK * expected + 50 ms.
const TTL_SLACK = Number(process.env.TTL_SLACK || "0.05");
// A proxy may reply once a quorum agreed and finish the other masters a moment later:
// "gone" / "no foreign value" get up to MASTER_SETTLE_MS to become true.
const SETTLE_MS = Number(process.env.MASTER_SETTLE_MS || "1000");
let LAST_CLIENT_ERROR = null;
let STAGE = "start";            // the step under way, named in a failure   // last "error" event of a lock client, shown on failure

let VERSION = "";
function setClient(name) { CLIENT = name; }
// the version of the library under test, for the RESULT line of a failure
function setVersion(v) { VERSION = v; }
function fail(msg) {
  process.stderr.write(`FAIL [${CLIENT} key=${KEY}] during ${STAGE}: ${msg}\n`);
  if (LAST_CLIENT_ERROR) process.stderr.write(`  (last client error event: ${LAST_CLIENT_ERROR})\n`);
  // run-all.sh and the README table show the step that failed
  process.stdout.write("RESULT " + JSON.stringify({ client: CLIENT, version: VERSION, protocol: "?", status: "fail",
                                                    step: STAGE, checks: CHECKS }) + "\n");
  process.exit(1);
}
function check(cond, msg) {
  if (!cond) fail(typeof msg === "function" ? msg() : msg);
  CHECKS++;
}
function warn(msg) {
  process.stderr.write(`WARN [${CLIENT} key=${KEY}]: ${msg}\n`);
}
function note(msg) {
  if (process.env.VERBOSE) process.stderr.write(`  [${CLIENT}] ${msg}\n`);
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
function clientError(who, e) {
  LAST_CLIENT_ERROR = `${who}: ${e && e.message ? e.message : e}`;
  note(`error event ${LAST_CLIENT_ERROR}`);
}
// fail if `p` has not settled within `ms`
function deadline(p, ms, label) {
  let t;
  return Promise.race([
    p.finally(() => clearTimeout(t)),
    new Promise((_, rej) => { t = setTimeout(() => rej(new Error(`${label}: no answer within ${ms} ms`)), ms); }),
  ]);
}

function requireDep(name) {
  try {
    return depRequire(name);
  } catch (e) {
    fail(`cannot load module '${name}' from ${NODE_DEPS}/node_modules (run tests/clients/install.sh): ${e.message}`);
  }
}
// an ESM-only package (no require() in Node 20): import() of the file it resolves to
async function importDep(name) {
  const { pathToFileURL } = require("url");
  const pkgDir = path.join(NODE_DEPS, "node_modules", name);
  try {
    const pkg = JSON.parse(fs.readFileSync(path.join(pkgDir, "package.json"), "utf8"));
    const exp = pkg.exports && pkg.exports["."];
    const entry = (exp && (exp.import || exp.default)) || pkg.module || pkg.main;
    return await import(pathToFileURL(path.join(pkgDir, entry)).href);
  } catch (e) {
    fail(`cannot import module '${name}' from ${NODE_DEPS}/node_modules (run tests/clients/install.sh): ${e.message}`);
  }
}
// read <module>/package.json directly (some packages don't export it)
function depVersion(name) {
  const f = path.join(NODE_DEPS, "node_modules", name, "package.json");
  try {
    return JSON.parse(fs.readFileSync(f, "utf8")).version;
  } catch (e) {
    fail(`cannot read the version of '${name}' from ${f}: ${e.message}`);
  }
}

function env(clientName, version = "") {
  setClient(clientName);
  setVersion(version);
  const proxyPort = Number(process.env.PROXY_PORT);
  const masterPorts = (process.env.MASTER_PORTS || "").split(",").filter((s) => s.trim() !== "").map(Number);
  if (!proxyPort || masterPorts.length === 0 || masterPorts.some((p) => !p)) {
    process.stderr.write("set PROXY_PORT and MASTER_PORTS (comma-separated ports on 127.0.0.1)\n");
    process.exit(2);
  }
  KEY = process.env.KEY || `rlp-test:${clientName}:${process.pid}:${crypto.randomBytes(4).toString("hex")}`;
  return { proxyPort, masterPorts, key: KEY, N: masterPorts.length, quorum: Math.floor(masterPorts.length / 2) + 1 };
}

// Bound the whole run; the timer does not keep the process alive.
function stage(s) { STAGE = s; note(`step: ${s}`); }
function watchdog(ms) {
  setTimeout(() => fail(`timed out after ${ms / 1000} s, during: ${STAGE}`), ms).unref();
}

class Masters {
  constructor(ports, quorum) {
    const Redis = requireDep("ioredis");
    this.quorum = quorum;
    this.N = ports.length;
    this.conns = ports.map((port) => ({
      port,
      c: new Redis({ host: HOST, port, lazyConnect: true, connectTimeout: 5000, commandTimeout: 5000,
                     maxRetriesPerRequest: 1, enableOfflineQueue: true, retryStrategy: () => null }),
    }));
  }
  async connect() {
    for (const { port, c } of this.conns) {
      c.on("error", () => {});
      try { await c.connect(); } catch (e) { fail(`master ${port}: cannot connect: ${e.message}`); }
      check((await c.ping()) === "PONG", `master ${port}: PING failed`);
    }
  }
  // No master holds another value than `token` (a proxy gets SETTLE_MS to finish a
  // rollback); >= quorum hold `token` with minPttl < PTTL <= maxPttl (+slack). A minority
  // holding it with a PTTL out of range is only a WARN (Redlock is per majority).
  async checkMajority(key, token, minPttl, label, maxPttl) {
    const deadline = Date.now() + SETTLE_MS;
    let pttls;
    for (;;) {
      pttls = {};
      const foreign = {};
      for (const { port, c } of this.conns) {
        const v = await c.get(key);
        if (v === token) pttls[port] = await c.pttl(key);
        else if (v !== null) foreign[port] = v;
      }
      if (Object.keys(foreign).length === 0) break;
      if (Date.now() > deadline) fail(`${label}: foreign value(s) under ${key} (expected ${JSON.stringify(token)} or nothing): ${JSON.stringify(foreign)}`);
      await sleep(50);
    }
    return this.judge(pttls, minPttl, maxPttl, label, "token");
  }
  // For sorted-set semaphores: >= quorum masters have `member` in the set under `key`, with
  // minPttl < PTTL(key) <= maxPttl (+slack).
  async checkMemberMajority(key, member, minPttl, label, maxPttl) {
    const pttls = {};
    for (const { port, c } of this.conns) {
      if ((await c.zscore(key, member)) !== null) pttls[port] = await c.pttl(key);
    }
    return this.judge(pttls, minPttl, maxPttl, label, `member ${member}`);
  }
  // {port: PTTL} of the holders -> the good ones; fails unless a quorum is good
  judge(pttls, minPttl, maxPttl, label, what) {
    const lim = maxPttl === undefined ? Infinity : maxPttl + Math.floor(maxPttl * TTL_SLACK) + 50;
    CHECKS += this.N;
    const good = Object.keys(pttls).filter((p) => pttls[p] > minPttl && pttls[p] <= lim);
    check(good.length >= this.quorum, `${label}: ${what} with ${minPttl} < PTTL <= ${lim} on ${good.length} of ${this.N} masters (quorum ${this.quorum}); holders' PTTL: ${JSON.stringify(pttls)}`);
    const bad = Object.keys(pttls).filter((p) => !good.includes(p)).map((p) => `${p}:pttl=${pttls[p]}`);
    if (bad.length) warn(`${label}: a minority holds ${what} with PTTL outside (${minPttl}, ${lim}]: ${bad.join(" ")}`);
    note(`${label}: ${what} on ${Object.keys(pttls).length}/${this.N} masters, pttl ${JSON.stringify(pttls)}`);
    return Object.fromEntries(good.map((p) => [p, pttls[p]]));
  }
  // the value held by a majority (for locks whose value the library does not expose)
  async majorityValue(key, label) {
    const counts = new Map();
    for (const { c } of this.conns) {
      const v = await c.get(key);
      if (v !== null) counts.set(v, (counts.get(v) || 0) + 1);
    }
    const best = [...counts.entries()].sort((a, b) => b[1] - a[1])[0];
    check(best && best[1] >= this.quorum, `${label}: no value under ${key} on a majority of masters: ${JSON.stringify([...counts])}`);
    return best[0];
  }
  // the key must be on no master (within SETTLE_MS)
  async checkAbsent(key, label) {
    await this.waitNone(async (c) => ((await c.exists(key)) !== 0 ? (await c.type(key)) === "string" ? await c.get(key) : await c.type(key) : null),
                        `${label}: key ${key}`);
  }
  // `token` is under `key` on no master (the key may hold another value)
  async checkNotHolding(key, token, label) {
    await this.waitNone(async (c) => ((await c.get(key)) === token ? token : null), `${label}: ${token} under ${key}`);
  }
  // `member` is in the sorted set under `key` on no master
  async checkMemberAbsent(key, member, label) {
    await this.waitNone(async (c) => ((await c.zscore(key, member)) !== null ? "member" : null), `${label}: member ${member} of ${key}`);
  }
  // waits up to SETTLE_MS until probe(master) is null on every master
  async waitNone(probe, what) {
    const deadline = Date.now() + SETTLE_MS;
    for (;;) {
      const left = {};
      for (const { port, c } of this.conns) {
        const v = await probe(c);
        if (v !== null) left[port] = v;
      }
      if (Object.keys(left).length === 0) break;
      if (Date.now() > deadline) fail(`${what} still on master(s) after ${SETTLE_MS} ms: ${JSON.stringify(left)}`);
      await sleep(50);
    }
    CHECKS += this.N;
  }
  async flushScripts() {
    for (const { port, c } of this.conns) check((await c.script("FLUSH")) === "OK", `master ${port}: SCRIPT FLUSH failed`);
  }
  async close() {
    for (const { c } of this.conns) c.disconnect();
  }
}

// ---- the tap: loopback relay that watches the RESP stream in both directions ----
async function startTap(targetPort) {
  // fail fast and clearly if nothing listens on the proxy port
  await new Promise((resolve) => {
    const s = net.connect({ host: HOST, port: targetPort });
    const t = setTimeout(() => { s.destroy(); fail(`cannot connect to the proxy at ${HOST}:${targetPort}: no answer in 5 s`); }, 5000);
    s.once("connect", () => { clearTimeout(t); s.end(); resolve(); });
    s.once("error", (e) => { clearTimeout(t); fail(`cannot connect to the proxy at ${HOST}:${targetPort}: ${e.code || e.message}`); });
  });
  const conns = [];
  const server = net.createServer((down) => {
    const rec = { commands: [], helloProto: null, firstReplyType: null, errors: [] };
    conns.push(rec);
    const up = net.connect({ host: HOST, port: targetPort });
    let cbuf = Buffer.alloc(0);
    let tail = "\r\n";     // error replies start the stream or follow a \r\n
    let base = -2;          // absolute offset of tail[0] in the reply stream
    let lastErrAt = -1;
    down.on("data", (d) => {
      up.write(d);
      cbuf = Buffer.concat([cbuf, d]);
      cbuf = parseCommands(cbuf, rec);
    });
    up.on("data", (d) => {
      down.write(d);
      if (rec.firstReplyType === null && d.length > 0) rec.firstReplyType = String.fromCharCode(d[0]);
      const s = tail + d.toString("latin1");
      for (const m of s.matchAll(/\r\n-([A-Z]+)[ \r]/g)) {
        const at = base + m.index;
        if (at > lastErrAt) { lastErrAt = at; rec.errors.push(m[1]); }
      }
      const keep = Math.min(s.length, 64);
      base += s.length - keep;
      tail = s.slice(s.length - keep);
    });
    up.on("error", (e) => clientError(`tap -> proxy ${HOST}:${targetPort}`, e));
    const end = () => { down.destroy(); up.destroy(); };
    down.on("error", end); up.on("error", end); down.on("close", end); up.on("close", end);
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, HOST, () => {
      server.unref();
      resolve({
        port: server.address().port,
        conns,
        close: () => server.close(),
        // "RESP3" when the connection's first command was HELLO 3 and its reply a map
        protocolOf(i) {
          const r = conns[i];
          if (!r) return null;
          const first = r.commands[0];
          return first && first[0] === "HELLO" && first[1] === "3" && r.firstReplyType === "%" ? "RESP3" : "RESP2";
        },
        count(pred) { return conns.reduce((n, r) => n + r.commands.filter(pred).length, 0); },
        errorCount(prefix) { return conns.reduce((n, r) => n + r.errors.filter((e) => e === prefix).length, 0); },
      });
    });
  });
}

// consume complete RESP arrays of bulk strings from buf; keep [NAME(upper), arg1, arg2 (<=200 chars)]
function parseCommands(buf, rec) {
  for (;;) {
    if (buf.length === 0) return buf;
    if (buf[0] !== 0x2a /* * */) {  // inline command
      const nl = buf.indexOf("\r\n");
      if (nl < 0) return buf;
      const parts = buf.slice(0, nl).toString("latin1").trim().split(/\s+/);
      if (parts[0]) rec.commands.push([parts[0].toUpperCase(), ...parts.slice(1, 3)]);
      buf = buf.slice(nl + 2);
      continue;
    }
    let pos = buf.indexOf("\r\n");
    if (pos < 0) return buf;
    const n = Number(buf.slice(1, pos).toString("latin1"));
    let off = pos + 2;
    const args = [];
    for (let i = 0; i < n; i++) {
      const nl = buf.indexOf("\r\n", off);
      if (nl < 0) return buf;
      const len = Number(buf.slice(off + 1, nl).toString("latin1"));
      if (buf.length < nl + 2 + len + 2) return buf;
      if (i < 3) args.push(buf.slice(nl + 2, nl + 2 + Math.min(len, 200)).toString("latin1"));
      off = nl + 2 + len + 2;
    }
    if (args.length) args[0] = args[0].toUpperCase();
    rec.commands.push(args);
    buf = buf.slice(off);
  }
}

function sha1(s) { return crypto.createHash("sha1").update(s).digest("hex"); }

// the one RESULT line of a passing scenario; `extra` adds fields (api: what was exercised)
function result(client, version, protocol, extra = {}) {
  process.stdout.write("RESULT " + JSON.stringify({ client, version, protocol, status: "pass", checks: CHECKS, ...extra }) + "\n");
}

module.exports = {
  HOST, requireDep, importDep, depVersion, env, watchdog, Masters, startTap, check, fail, note, sleep, sha1, result,
  clientError, deadline, stage, setVersion,
};
