//! Sentinel-managed master groups on loopback ([`SentinelGroups`]): per group a primary and a
//! replica (`redis-server`, no persistence), and sentinels (`redis-server --sentinel`) that
//! watch every group, each sentinel with its own configuration file in a temporary directory.
//! Everything is stopped when dropped.

use crate::masters::start_replicas;
use crate::resp::{blocking_cmd, Reply};
use redlock_proxy::LocalMaster;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a sentinel waits before it calls an unanswering primary down.
pub const DOWN_AFTER_MS: u64 = 1000;

/// A sentinel process.
struct Sentinel {
    port: u16,
    child: Child,
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Groups `g0`, `g1`, … of a primary and a replica each, watched by the same sentinels.
pub struct SentinelGroups {
    /// The servers of each group: the first started as its primary, the second as its
    /// replica (roles change with failovers: ask [`SentinelGroups::primary`]).
    pub servers: Vec<[LocalMaster; 2]>,
    sentinels: Vec<Sentinel>,
    dir: PathBuf,
}

/// A `redis-server` reply, waiting at most 2 s.
fn cmd(port: u16, args: &[&str]) -> Reply {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    blocking_cmd(port, &args, Duration::from_secs(2))
        .unwrap_or_else(|err| panic!("{args:?} on port {port}: {err}"))
}

/// Polls `done` every 20 ms for at most `limit`; panics with `what` if it never holds.
fn until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl SentinelGroups {
    /// `groups` groups watched by `sentinels` sentinels (quorum: a majority of them).
    pub fn start(groups: usize, sentinels: usize) -> SentinelGroups {
        let dir = std::env::temp_dir().join(format!(
            "redlock-sentinels-{}-{}",
            std::process::id(),
            crate::workload::now_ns()
        ));
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let primaries: Vec<LocalMaster> = (0..groups)
            .map(|_| LocalMaster::start(None, &[]).expect("redis-server"))
            .collect();
        let replicas = start_replicas(&primaries).expect("replicas in sync");
        let servers: Vec<[LocalMaster; 2]> = primaries
            .into_iter()
            .zip(replicas)
            .map(Into::into)
            .collect();
        let mut config = String::new();
        for (g, [primary, _]) in servers.iter().enumerate() {
            let quorum = sentinels / 2 + 1;
            config += &format!(
                "sentinel monitor g{g} 127.0.0.1 {} {quorum}\n\
                 sentinel down-after-milliseconds g{g} {DOWN_AFTER_MS}\n\
                 sentinel failover-timeout g{g} 10000\n",
                primary.port
            );
        }
        let sentinels = (0..sentinels)
            .map(|i| {
                let port = TcpListener::bind("127.0.0.1:0")
                    .and_then(|l| l.local_addr())
                    .expect("a free port")
                    .port();
                let file = dir.join(format!("sentinel-{i}.conf"));
                std::fs::write(&file, format!("port {port}\n{config}")).expect("sentinel config");
                let child = Command::new("redis-server")
                    .arg(&file)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server --sentinel");
                Sentinel { port, child }
            })
            .collect();
        let groups = SentinelGroups {
            servers,
            sentinels,
            dir,
        };
        for s in &groups.sentinels {
            until(Duration::from_secs(10), "sentinel up", || {
                blocking_cmd(s.port, &[b"PING"], Duration::from_millis(200)).is_ok()
            });
        }
        groups
    }

    /// The proxy's address of group `g`: `sentinel://<every sentinel>/g<g>`.
    pub fn backend(&self, g: usize) -> String {
        let sentinels: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("sentinel://{}/g{g}", sentinels.join(","))
    }

    /// Every group's address, in order.
    pub fn backends(&self) -> Vec<String> {
        (0..self.servers.len()).map(|g| self.backend(g)).collect()
    }

    /// The port the first sentinel names group `g`'s primary.
    pub fn primary(&self, g: usize) -> u16 {
        match cmd(
            self.sentinels[0].port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &format!("g{g}")],
        ) {
            Reply::Array(items) => items[1]
                .text()
                .and_then(|p| p.parse().ok())
                .expect("a port"),
            other => panic!("no primary for g{g}: {other}"),
        }
    }

    /// Which of group `g`'s servers (0 or 1) is on `port`.
    pub fn index_of(&self, g: usize, port: u16) -> usize {
        usize::from(self.servers[g][1].port == port)
    }

    /// Waits (at most `limit`) until every sentinel names a primary of group `g` other than
    /// `old`, and that server answers `role:master`; returns its port.
    pub fn wait_new_primary(&self, g: usize, old: u16, limit: Duration) -> u16 {
        let name = format!("g{g}");
        let mut new = old;
        until(limit, "a new primary", || {
            let named: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .map(|s| {
                    let reply = blocking_cmd(
                        s.port,
                        &[b"SENTINEL", b"GET-MASTER-ADDR-BY-NAME", name.as_bytes()],
                        Duration::from_millis(500),
                    );
                    match reply {
                        Ok(Reply::Array(items)) => items[1].text().and_then(|p| p.parse().ok()),
                        _ => None,
                    }
                })
                .collect();
            let Some(Some(port)) = named.first().copied() else {
                return false;
            };
            new = port;
            port != old
                && named.iter().all(|n| *n == Some(port))
                && matches!(
                    blocking_cmd(port, &[b"ROLE"], Duration::from_millis(500)),
                    Ok(Reply::Array(items)) if items[0].text().as_deref() == Some("master")
                )
        });
        new
    }

    /// Asks a sentinel to fail group `g` over (`SENTINEL FAILOVER`: no agreement needed) and
    /// waits for the new primary; returns its port.
    pub fn failover(&self, g: usize, limit: Duration) -> u16 {
        let old = self.primary(g);
        let asked = cmd(
            self.sentinels[0].port,
            &["SENTINEL", "FAILOVER", &format!("g{g}")],
        );
        assert!(asked.is_ok(), "SENTINEL FAILOVER g{g}: {asked}");
        self.wait_new_primary(g, old, limit)
    }
}

impl Drop for SentinelGroups {
    fn drop(&mut self) {
        self.sentinels.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
