// Lock-cycle load from node: redlock 5.0.0-beta.2 over ioredis 5.9.2 clients.
//
// Run by benches/lockbench.rs (as a child process); usable by hand:
//   node benches/node/lockbench.js --ports 6379,6380,6381,6382,6383 --workers 50 --secs 4
//   node benches/node/lockbench.js --ports 7379 --workers 50 --secs 4     # through the proxy
//
// One ioredis client per port, one Redlock over all of them (retryCount 0, so a refused
// acquire is counted, not retried). W async workers each loop acquire([own key], ttl) ->
// release() for --warmup + --secs seconds; only cycles that complete inside the measured
// window count. The last stdout line is one JSON object:
//   {cycles, secs, cycles_per_sec, p50_us, p99_us, p999_us, fails, first_error, cpu_pct, ...}
"use strict";
const Redis = require("ioredis");
const Redlock = require("redlock").default;

function parseArgs(argv) {
  const out = { ports: "", workers: 50, secs: 4, warmup: 0.5, ttl: 30000, tag: String(process.pid) };
  for (let i = 2; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, "");
    if (!(name in out)) throw new Error(`unknown option ${argv[i]}`);
    out[name] = typeof out[name] === "number" ? Number(argv[i + 1]) : argv[i + 1];
  }
  out.ports = out.ports.split(",").filter(Boolean).map(Number);
  if (out.ports.length === 0) throw new Error("--ports P1[,P2...] is required");
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
  const clients = opt.ports.map((port) => new Redis({ host: "127.0.0.1", port }));
  await Promise.all(clients.map((c) => c.ping()));
  const redlock = new Redlock(clients, { retryCount: 0 });
  // Redlock emits "error" for every vote against; without a listener EventEmitter throws.
  redlock.on("error", () => {});

  const t0 = performance.now();
  const start = t0 + opt.warmup * 1000;
  const end = start + opt.secs * 1000;
  const latencies = [];
  let cycles = 0;
  let fails = 0;
  let firstError = null;
  let cpuAtStart = null;
  const cpuTimer = setTimeout(() => {
    cpuAtStart = process.cpuUsage();
  }, Math.max(0, start - performance.now()));

  async function worker(id) {
    const key = `nb:${opt.tag}:${id}`;
    while (performance.now() < end) {
      const begin = performance.now();
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
  const cpu = process.cpuUsage(cpuAtStart || undefined);
  latencies.sort((a, b) => a - b);
  const result = {
    clients: clients.length,
    workers: opt.workers,
    cycles,
    secs: opt.secs,
    cycles_per_sec: cycles / opt.secs,
    p50_us: percentile(latencies, 0.5),
    p99_us: percentile(latencies, 0.99),
    p999_us: percentile(latencies, 0.999),
    fails,
    first_error: firstError,
    cpu_pct: cpuAtStart ? ((cpu.user + cpu.system) / 1e6 / opt.secs) * 100 : null,
  };
  await Promise.all(clients.map((c) => c.quit().catch(() => {})));
  console.log(JSON.stringify(result));
}

main().catch((err) => {
  console.error("lockbench.js:", err);
  process.exit(1);
});
