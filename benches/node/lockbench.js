// Lock-cycle load from node: redlock 5.0.0-beta.2 over ioredis 5.9.2 clients.
//
// Run by benches/lockbench.rs (as a child process); usable by hand:
//   node benches/node/lockbench.js --ports 6379,6380,6381,6382,6383 --workers 50 --secs 4
//   node benches/node/lockbench.js --ports 7379 --workers 50 --secs 4     # through the proxy
//
// --conns C (default 1) ioredis clients per port and C Redlocks, Redlock i over the i-th client
// of every port (--retries R sets redlock's retryCount, default 0, so a refused acquire is
// counted, not retried; redlock's own retryDelay 200 ms and retryJitter 200 ms otherwise);
// worker w uses Redlock w % C. W async workers each loop acquire([key], ttl) -> release() for
// --warmup + --secs seconds, the key their own (--keys own, the default), a fresh random one per
// cycle (--keys random), or one of N keys shared by all workers, drawn at random per cycle
// (--keys shared:N); only cycles that complete inside the measured window count (refused
// acquires are counted apart, as fails; attempts = cycles + fails). The last stdout line is one
// JSON object:
//   {cycles, secs, cycles_per_sec, attempts_per_sec, p50_us, p99_us, p999_us, fails,
//    first_error, cpu_pct, ...}
// cpu_pct is node's own CPU (user + system, % of one core) over the measured window: node runs
// on one thread, so near 100 it is the load generator, not the servers, that limits the rate.
// The lines "window start" and "window end" are printed when the measured window opens and
// closes, so that a caller can sample the servers' CPU over the same window.
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock").default;

function parseArgs(argv) {
  const out = {
    ports: "",
    workers: 50,
    conns: 1,
    keys: "own",
    secs: 4,
    warmup: 0.5,
    ttl: 30000,
    retries: 0,
    tag: String(process.pid),
  };
  for (let i = 2; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, "");
    if (!(name in out)) throw new Error(`unknown option ${argv[i]}`);
    out[name] = typeof out[name] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  out.ports = out.ports.split(",").filter(Boolean).map(Number);
  if (out.ports.length === 0) throw new Error("--ports P1[,P2...] is required");
  if (!(out.conns >= 1)) throw new Error("--conns must be at least 1");
  const shared = /^shared:([1-9][0-9]*)$/.exec(out.keys);
  out.sharedKeys = shared ? Number(shared[1]) : 0;
  if (out.keys !== "own" && out.keys !== "random" && !shared) {
    throw new Error("--keys is own, random or shared:N");
  }
  if (!(out.retries >= 0)) throw new Error("--retries must be 0 or more");
  return out;
}

// What the servers answered when redlock gave up: an ExecutionError's attempts resolve to
// stats whose votesAgainst map each client to the error of its vote.
async function voteErrors(err) {
  if (!Array.isArray(err.attempts) || err.attempts.length === 0) return "";
  try {
    const stats = await err.attempts[err.attempts.length - 1];
    const errors = [...stats.votesAgainst.values()].map((e) => `${e.constructor.name}: ${e.message}`);
    return errors.length ? ` [votes against: ${errors.join("; ")}]` : "";
  } catch (_) {
    return "";
  }
}

function percentile(sorted, q) {
  if (sorted.length === 0) return null;
  const idx = Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1));
  return sorted[idx];
}

async function main() {
  const opt = parseArgs(process.argv);
  const sets = Array.from({ length: opt.conns }, () =>
    opt.ports.map((port) => new Redis({ host: "127.0.0.1", port })),
  );
  const clients = sets.flat();
  await Promise.all(clients.map((c) => c.ping()));
  const redlocks = sets.map((set) => {
    const redlock = new Redlock(set, { retryCount: opt.retries });
    // Redlock emits "error" for every vote against; without a listener EventEmitter throws.
    redlock.on("error", () => {});
    return redlock;
  });

  const t0 = performance.now();
  const start = t0 + opt.warmup * 1000;
  const end = start + opt.secs * 1000;
  const latencies = [];
  let cycles = 0;
  let fails = 0;
  let firstError = null;
  // node's CPU between two timers at the window's ends, over the time they actually fired.
  let cpuAtStart = null;
  let cpuStartedAt = 0;
  let cpuPct = null;
  const cpuTimer = setTimeout(() => {
    cpuAtStart = process.cpuUsage();
    cpuStartedAt = performance.now();
    console.log("window start");
  }, Math.max(0, start - performance.now()));
  const cpuEndTimer = setTimeout(() => {
    if (cpuAtStart === null) return;
    const used = process.cpuUsage(cpuAtStart);
    const ms = performance.now() - cpuStartedAt;
    cpuPct = ms > 0 ? ((used.user + used.system) / 1e3 / ms) * 100 : null;
    console.log("window end");
  }, Math.max(0, end - performance.now()));

  async function worker(id) {
    const redlock = redlocks[id % redlocks.length];
    const own = `nb:${opt.tag}:${id}`;
    let n = 0;
    while (performance.now() < end) {
      const begin = performance.now();
      n += 1;
      let key = own;
      if (opt.keys === "random") key = `${own}:${n}:${Math.random().toString(36).slice(2)}`;
      else if (opt.sharedKeys > 0) key = `nb:${opt.tag}:shared:${Math.floor(Math.random() * opt.sharedKeys)}`;
      try {
        const lock = await redlock.acquire([key], opt.ttl);
        await lock.release();
        const done = performance.now();
        if (done >= start && done < end) {
          cycles += 1;
          latencies.push((done - begin) * 1000);
        }
      } catch (err) {
        const done = performance.now();
        if (done >= start && done < end) fails += 1;
        if (firstError === null) {
          firstError = `${err.constructor.name}: ${err.message}`;
          firstError += await voteErrors(err);
        }
      }
    }
  }

  await Promise.all(Array.from({ length: opt.workers }, (_, i) => worker(i)));
  clearTimeout(cpuTimer);
  clearTimeout(cpuEndTimer);
  latencies.sort((a, b) => a - b);
  const result = {
    clients: clients.length,
    conns_per_port: opt.conns,
    workers: opt.workers,
    keys: opt.keys,
    retries: opt.retries,
    cycles,
    secs: opt.secs,
    cycles_per_sec: cycles / opt.secs,
    attempts_per_sec: (cycles + fails) / opt.secs,
    p50_us: percentile(latencies, 0.5),
    p99_us: percentile(latencies, 0.99),
    p999_us: percentile(latencies, 0.999),
    fails,
    first_error: firstError,
    cpu_pct: cpuPct,
  };
  await Promise.all(clients.map((c) => c.quit().catch(() => {})));
  console.log(JSON.stringify(result));
}

main().catch((err) => {
  console.error("lockbench.js:", err);
  process.exit(1);
});
