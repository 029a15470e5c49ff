//! Direct access to one master, bypassing the proxy: a command and its reply as text, `GET`,
//! the command statistics of `INFO commandstats`, Unix signals to its process (pause,
//! resume), and a replica for each ([`start_replicas`]). The masters themselves are
//! `redlock_proxy::{LocalCluster, LocalMaster}`.

use crate::resp::{blocking_cmd, Client, Reply};
use redlock_proxy::{LocalError, LocalMaster};
use std::collections::BTreeMap;
use std::io;
use std::time::{Duration, Instant};

/// A replica of each of `primaries` (`--replicaof`), returned once every one is in sync
/// (`master_link_status:up`), at most 10 s.
pub fn start_replicas(primaries: &[LocalMaster]) -> Result<Vec<LocalMaster>, LocalError> {
    let replicas = primaries
        .iter()
        .map(|p| LocalMaster::start(None, &["--replicaof", "127.0.0.1", &p.port.to_string()]))
        .collect::<Result<Vec<_>, _>>()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    for replica in &replicas {
        while !in_sync(replica.port) {
            if Instant::now() > deadline {
                return Err(LocalError::NotReady(replica.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    Ok(replicas)
}

/// Whether the replica on `port` has its link to its primary up.
fn in_sync(port: u16) -> bool {
    matches!(
        blocking_cmd(port, &[b"INFO", b"replication"], Duration::from_secs(2)),
        Ok(Reply::Bulk(info)) if String::from_utf8_lossy(&info).contains("master_link_status:up")
    )
}

/// `GET key` directly on a master (`None` where absent or unreachable); panics if a master that
/// accepted the connection does not answer within 10 s.
pub async fn master_get(port: u16, key: &str) -> Option<String> {
    let mut client = Client::try_connect(port).await?;
    let reply = client
        .request(&[b"GET", key.as_bytes()])
        .await
        .expect("a reply within 10 s");
    match reply {
        Reply::Bulk(_) => reply.text(),
        _ => None,
    }
}

/// A command directly on a master, its reply as text (see [`crate::resp::Reply`]).
pub async fn master_cmd(port: u16, args: &[&str]) -> String {
    Client::connect(port).await.cmd(args).await
}

/// `INFO commandstats` of one master: command name (lower case) → calls.
pub async fn command_stats(port: u16) -> io::Result<BTreeMap<String, u64>> {
    let mut conn = Client::open(port, std::time::Duration::from_secs(5)).await?;
    let reply = conn.request(&[b"INFO", b"commandstats"]).await?;
    let Some(text) = reply.text() else {
        return Err(io::Error::other(format!(
            "INFO commandstats: not a bulk reply: {reply}"
        )));
    };
    let mut stats = BTreeMap::new();
    for line in text.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = rest
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        stats.insert(name.to_string(), calls);
    }
    Ok(stats)
}

/// The process ids of the running masters among `masters`.
pub fn pids(masters: &[LocalMaster]) -> Vec<u32> {
    masters.iter().filter_map(LocalMaster::pid).collect()
}

/// Sends `SIG<sig>` (`STOP`, `CONT`, …) to a process; panics if `kill` fails.
pub fn signal(pid: u32, sig: &str) {
    let ok = std::process::Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .expect("run kill")
        .success();
    assert!(ok, "kill -{sig} {pid}");
}

/// `SET key value NX PX ttl_ms` through the proxy on `client` while the master with process
/// `paused` is SIGSTOPped, so that the others decide it; the master resumes once its copy of
/// the acquire is past its write deadline (the proxy's `node_timeout_ms`, plus a margin), so
/// it writes nothing there. The acquire's reply.
pub async fn acquire_while_paused(
    client: &mut Client,
    paused: u32,
    (key, value, ttl_ms): (&str, &str, u64),
    node_timeout_ms: u64,
) -> String {
    signal(paused, "STOP");
    let ttl = ttl_ms.to_string();
    let reply = client.cmd(&["SET", key, value, "NX", "PX", &ttl]).await;
    tokio::time::sleep(Duration::from_millis(node_timeout_ms + 500)).await;
    signal(paused, "CONT");
    reply
}
