#!/usr/bin/env bash
# Three independent Redis Clusters of three shards each (a primary and a replica per shard),
# the masters of deploy/clusters/redlock-proxy.toml, on this machine's loopback:
#   cluster A: ports 7101-7106, cluster B: 7201-7206, cluster C: 7301-7306.
# Each node runs in its own directory under $DIR (default /tmp/redlock-clusters), without
# persistence (the proxy quarantines what a restart loses), with maxmemory-policy noeviction.
# On real machines, put each cluster's nodes on machines of their own: the clusters share
# nothing, which is what makes them independent Redlock masters.
#
#   deploy/clusters/clusters.sh start   # 18 redis-server processes, 3 x redis-cli --cluster create
#   deploy/clusters/clusters.sh status  # each cluster's CLUSTER INFO state and shards
#   deploy/clusters/clusters.sh stop
set -euo pipefail
DIR=${DIR:-/tmp/redlock-clusters}
CLUSTERS=(71 72 73)
NODES=(01 02 03 04 05 06)

start() {
  for c in "${CLUSTERS[@]}"; do
    for n in "${NODES[@]}"; do
      local port="$c$n" dir="$DIR/$c$n"
      mkdir -p "$dir"
      redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --daemonize yes \
        --logfile "$dir/redis.log" --pidfile "$dir/redis.pid" \
        --cluster-enabled yes --cluster-config-file nodes.conf --cluster-node-timeout 5000 \
        --save "" --appendonly no --maxmemory-policy noeviction
    done
  done
  for c in "${CLUSTERS[@]}"; do
    for n in "${NODES[@]}"; do
      for _ in $(seq 50); do
        redis-cli -p "$c$n" ping >/dev/null 2>&1 && break
        sleep 0.1
      done
    done
    local addrs=()
    for n in "${NODES[@]}"; do addrs+=("127.0.0.1:$c$n"); done
    redis-cli --cluster create "${addrs[@]}" --cluster-replicas 1 --cluster-yes >/dev/null
  done
  # Every node learns the others through the cluster bus: wait (at most 30 s) until each
  # cluster says ok everywhere.
  for c in "${CLUSTERS[@]}"; do
    for n in "${NODES[@]}"; do
      for _ in $(seq 300); do
        redis-cli -p "$c$n" cluster info | grep -q '^cluster_state:ok' && break
        sleep 0.1
      done
    done
  done
  status
}

status() {
  for c in "${CLUSTERS[@]}"; do
    local state
    state=$(redis-cli -p "${c}01" cluster info | tr -d '\r' | grep '^cluster_state:')
    echo "cluster ${c}01-${c}06: $state, primaries:" \
      "$(redis-cli -p "${c}01" cluster nodes | grep -c master)"
  done
}

stop() {
  for c in "${CLUSTERS[@]}"; do
    for n in "${NODES[@]}"; do
      redis-cli -p "$c$n" shutdown nosave >/dev/null 2>&1 || true
    done
  done
  rm -rf "$DIR"
}

case "${1:-}" in
  start) start ;;
  status) status ;;
  stop) stop ;;
  *) echo "usage: $0 start|status|stop" >&2; exit 2 ;;
esac
