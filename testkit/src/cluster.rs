//! Redis Clusters on loopback ([`RedisCluster`]): `redis-server --cluster-enabled yes` nodes
//! (no persistence, each with its own node file), joined by `redis-cli --cluster create` into
//! primaries with replicas. Stopped, and their files removed, when dropped.

use crate::launcher::{wait_for_info_within, Proxy};
use crate::resp::{blocking_cmd, Reply};
use redlock_proxy::{Config, LocalMaster};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a node waits before it calls an unanswering peer failing: failovers in tests take
/// a few times this.
pub const NODE_TIMEOUT_MS: u64 = 2000;

/// One Redis Cluster.
pub struct RedisCluster {
    /// Every node, primaries first as created (roles change with failovers).
    pub nodes: Vec<LocalMaster>,
    files: Vec<PathBuf>,
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        for file in &self.files {
            let _ = std::fs::remove_file(file);
        }
    }
}

/// A node's reply, waiting at most 2 s.
fn cmd(port: u16, args: &[&str]) -> Option<Reply> {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    blocking_cmd(port, &args, Duration::from_secs(2)).ok()
}

impl RedisCluster {
    /// A cluster of `primaries` primaries with `replicas` replicas each (one primary alone:
    /// no replicas), every slot covered and every node agreeing (`cluster_state:ok`
    /// everywhere), within 60 s. `redis-cli --cluster create` failed once in a clean-clone CI
    /// run (exit 1, its output not kept): it is tried on fresh nodes up to three times, each
    /// failure's output printed, the last one's in the panic.
    pub fn start(primaries: usize, replicas: usize) -> RedisCluster {
        let mut failures = Vec::new();
        for _ in 0..3 {
            match RedisCluster::create(primaries, replicas) {
                Ok(cluster) => return cluster.settle(),
                Err(failure) => {
                    eprintln!("redis-cli --cluster create failed, trying fresh nodes: {failure}");
                    failures.push(failure);
                }
            }
        }
        panic!("redis-cli --cluster create, three times: {failures:?}");
    }

    /// The nodes, started and joined (not yet settled); the output of `redis-cli --cluster
    /// create` if it failed (its nodes are stopped).
    fn create(primaries: usize, replicas: usize) -> Result<RedisCluster, String> {
        let count = primaries * (1 + replicas);
        let mut cluster = RedisCluster {
            nodes: Vec::with_capacity(count),
            files: Vec::with_capacity(count),
        };
        for i in 0..count {
            let file = std::env::temp_dir().join(format!(
                "redlock-cluster-{}-{}-{i}.conf",
                std::process::id(),
                crate::workload::now_ns()
            ));
            let file_arg = file.display().to_string();
            let timeout = NODE_TIMEOUT_MS.to_string();
            let node = LocalMaster::start(
                None,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    &file_arg,
                    "--cluster-node-timeout",
                    &timeout,
                ],
            )
            .expect("redis-server with --cluster-enabled");
            cluster.files.push(file);
            cluster.nodes.push(node);
        }
        if count == 1 {
            // `redis-cli --cluster create` wants 3 primaries: one node takes every slot itself.
            let port = cluster.nodes[0].port;
            let added = cmd(port, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]);
            assert_eq!(
                added,
                Some(Reply::Status("OK".into())),
                "CLUSTER ADDSLOTSRANGE"
            );
        } else {
            let mut create = Command::new("redis-cli");
            create.arg("--cluster").arg("create");
            for node in &cluster.nodes {
                create.arg(node.addr());
            }
            let output = create
                .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
                .stdin(Stdio::null())
                .output()
                .expect("redis-cli");
            if !output.status.success() {
                return Err(format!(
                    "{}: {}{}",
                    output.status,
                    String::from_utf8_lossy(&output.stdout),
                    String::from_utf8_lossy(&output.stderr)
                ));
            }
        }
        Ok(cluster)
    }

    /// Waits until every node agrees (within 60 s).
    fn settle(self) -> RedisCluster {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.settled() {
            assert!(Instant::now() < deadline, "the cluster settles within 60 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        self
    }

    /// Every node says `cluster_state:ok` and knows every other node.
    fn settled(&self) -> bool {
        self.nodes.iter().all(|n| {
            let Some(Reply::Bulk(info)) = cmd(n.port, &["CLUSTER", "INFO"]) else {
                return false;
            };
            let info = String::from_utf8_lossy(&info);
            info.contains("cluster_state:ok")
                && info.contains(&format!("cluster_known_nodes:{}\r", self.nodes.len()))
        })
    }

    /// `host:port` of every node: the seeds a proxy is given.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes.iter().map(LocalMaster::addr).collect()
    }

    /// The index in `nodes` of a replica of the primary at `primary` (`ROLE`).
    pub fn replica_of(&self, primary: u16) -> Option<usize> {
        self.nodes.iter().position(|n| {
            matches!(cmd(n.port, &["ROLE"]), Some(Reply::Array(role))
                if matches!(role.as_slice(), [Reply::Bulk(kind), _, Reply::Int(port), ..]
                    if kind.as_ref() == b"slave" && *port == i64::from(primary)))
        })
    }

    /// Waits until the nodes that answer name `port` the primary of `slot` (at most `limit`).
    pub fn wait_primary_of(&self, slot: u16, port: u16, limit: Duration) {
        let deadline = Instant::now() + limit;
        while self.primary_of(slot) != Some(port) {
            if Instant::now() >= deadline {
                let nodes = self
                    .nodes
                    .iter()
                    .find_map(|n| cmd(n.port, &["CLUSTER", "NODES"]));
                panic!("no failover of slot {slot} to {port} within {limit:?}: {nodes:?}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The port of the primary that serves `slot` now, as the first node answering sees it.
    pub fn primary_of(&self, slot: u16) -> Option<u16> {
        let Reply::Array(ranges) = self
            .nodes
            .iter()
            .find_map(|n| cmd(n.port, &["CLUSTER", "SLOTS"]))?
        else {
            return None;
        };
        ranges.iter().find_map(|range| match range {
            Reply::Array(items) => match (&items[0], &items[1], &items[2]) {
                (Reply::Int(first), Reply::Int(last), Reply::Array(node))
                    if (*first..=*last).contains(&i64::from(slot)) =>
                {
                    match node.get(1) {
                        Some(Reply::Int(port)) => u16::try_from(*port).ok(),
                        _ => None,
                    }
                }
                _ => None,
            },
            _ => None,
        })
    }
}

/// Three independent clusters of `primaries` primaries (with `replicas` replicas each), started
/// side by side.
pub fn three_clusters(primaries: usize, replicas: usize) -> Vec<RedisCluster> {
    std::thread::scope(|s| {
        let starts: Vec<_> = (0..3)
            .map(|_| s.spawn(move || RedisCluster::start(primaries, replicas)))
            .collect();
        starts
            .into_iter()
            .map(|h| h.join().expect("a cluster"))
            .collect()
    })
}

/// `cluster://` addresses of `clusters`.
pub fn cluster_backends(clusters: &[RedisCluster]) -> Vec<String> {
    clusters
        .iter()
        .map(|c| format!("cluster://{}", c.seeds().join(",")))
        .collect()
}

/// A proxy over `clusters` (the default configuration, then `tweak`), once every slot of
/// every cluster may vote: a grant needs only two of the three clusters, and a scenario that
/// needs a given one must not start before it is up.
pub async fn proxy_over(clusters: &[RedisCluster], tweak: impl FnOnce(&mut Config)) -> Proxy {
    let proxy = Proxy::start(cluster_backends(clusters), tweak).await;
    let every_slot = "16384 of 16384 slots usable";
    wait_for_info_within(&mut proxy.client().await, every_slot, 3, READY_LIMIT).await;
    proxy
}

/// How long a fresh proxy over clusters may take to have every slot usable (a bounded wait:
/// it returns as soon as they are; founding claims and lifts every slot of every cluster).
pub const READY_LIMIT: Duration = Duration::from_secs(60);
