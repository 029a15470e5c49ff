#!/usr/bin/env bash
# The one command that reproduces BENCHMARKS.md. Installs what the benchmark needs if it is
# missing (redis-server + redis-benchmark from Debian; the node clients pinned in
# benches/node/package-lock.json, with `npm ci`), builds the release binary, then runs
# `cargo bench --bench lockbench`, which starts its own masters and proxies on loopback, runs
# every section (including the node script as a child process) and prints the markdown report
# (also written to target/bench-results.md).
#
#   scripts/bench.sh                           # everything (about 4 minutes on 2 CPUs)
#   BENCH_SECS=2 scripts/bench.sh              # shorter cells
#   scripts/bench.sh memory contention         # only these sections (same as BENCH_ONLY=memory,contention)
#   BENCH_TARGETS=direct,proxy5 BENCH_CONNS=50 BENCH_DEPTHS=1 scripts/bench.sh cycles
#   BENCH_ROUNDS=5 BENCH_CPU_REQUESTS=200000 scripts/bench.sh cpu   # CPU per request (issues 14, 27:
#                                              # beside twemproxy and haproxy, -P 1 and -P 16)
#   scripts/bench.sh masters                   # the masters' CPU per grant and memory per held
#                                              # lock (issue 27, targets 2 and 5; perf if present)
#
#   scripts/bench.sh latency                   # p99 of SET NX PX at fixed offered rates (open loop), direct vs
#                                              # the proxy over 5 masters (issue 27, target 4)
#   BENCH_NODE_HOGS=1 scripts/bench.sh node    # node redlock beside a CPU hog (issue 27, target 3)
#
#   scripts/bench.sh shards                    # the proxy over single masters vs Redis Clusters of
#                                              # 1 and 3 shards: CPU per acquire per primary (issue 26)
#
#   scripts/bench.sh overload                  # the overload table (issue 38): the proxy's peaks, then
#                                              # 50-200 % of them through the proxy, redis-server and
#                                              # twemproxy; a 10 MB SET beside small clients (~9 minutes)
#   BENCH_OVERLOAD_SECS=0.5 BENCH_WARMUP_SECS=0.2 scripts/bench.sh overload   # its smoke run (~1 minute)
#
# Sections: cycles, clientside, node, redis-benchmark, cpu, memory, contention, fencing, metrics,
# wakeup, latency, masters, confirm, shards; overload only when named (not in a full run). Every
# knob is listed in BENCHMARKS.md.
set -euo pipefail
cd "$(dirname "$0")/.."

. scripts/lib.sh
ensure_redis

# The peer proxies of the cpu section (issue 27) and of overload (issue 38): twemproxy and
# haproxy from Debian. Without them lockbench skips their cells with a note.
if ! command -v nutcracker >/dev/null || ! command -v haproxy >/dev/null; then
  sudo_cmd=""
  [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  if command -v apt-get >/dev/null \
     && $sudo_cmd apt-get update -q \
     && $sudo_cmd env DEBIAN_FRONTEND=noninteractive apt-get install -y -q nutcracker haproxy; then
    # lockbench starts its own instances; not the packages' services.
    (command -v systemctl >/dev/null \
      && $sudo_cmd systemctl disable --now haproxy nutcracker 2>/dev/null) || true
  else
    echo "bench.sh: cannot install nutcracker/haproxy; their cpu and overload cells will be skipped" >&2
  fi
fi

if command -v npm >/dev/null; then
  installed=benches/node/node_modules/.package-lock.json
  if [ ! -f "$installed" ] || [ benches/node/package-lock.json -nt "$installed" ]; then
    (cd benches/node && npm ci --no-audit --no-fund --loglevel=error)
  fi
else
  echo "bench.sh: node/npm not found; the node section will be skipped" >&2
fi

# 10k idle client connections need more than 10k descriptors, both here and in the proxy.
want=20000
hard=$(ulimit -Hn)
if [ "$hard" != unlimited ] && [ "$hard" -lt "$want" ]; then
  want=$hard
fi
ulimit -n "$want" || echo "bench.sh: cannot raise the open-files limit; the memory section may be skipped" >&2

cargo build --release
exec cargo bench --bench lockbench -- "$@"
