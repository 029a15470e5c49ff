//! Masters that are Redis Clusters (issue 26): what the proxy computes and reads about a
//! cluster, checked against a real one (3 primaries with a replica each, on loopback): hash
//! slots and the per-slot tags of the proxy's own keys against `CLUSTER KEYSLOT`, the slot map
//! from `CLUSTER SHARDS` and from `CLUSTER SLOTS` against each other and against where a key
//! lands, and the redirection a node answers for a slot it does not serve.

use bytes::BytesMut;
use redlock_proxy::cluster::map::{Redirect, SlotMap};
use redlock_proxy::cluster::slots::{key_slot, slot_tag, SLOTS};
use redlock_proxy::fuzzing::{decode_reply, encode_command, Reply as ProxyReply};
use redlock_proxy::Config;
use redlock_testkit::cluster::{proxy_over, three_clusters, RedisCluster};
use redlock_testkit::launcher::{master_state, wait_for_info_where};
use redlock_testkit::masters::{master_cmd, master_get, signal};
use redlock_testkit::resp::{blocking_cmd, Reply};
use redlock_testkit::rig::run_alone;
use redlock_testkit::workload::{contend_until, grant_behind_a_cut_replica, Workload};
use redlock_testkit::{key, lock_grant};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

fn cmd(port: u16, args: &[&[u8]]) -> Reply {
    blocking_cmd(port, args, Duration::from_secs(5)).expect("a reply")
}

/// A reply as the proxy decodes it (what its map and redirection parsers read).
fn proxy_reply(port: u16, args: &[&str]) -> ProxyReply {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).expect("a connection");
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("a timeout");
    stream.write_all(&encode_command(args)).expect("sent");
    let mut buf = BytesMut::new();
    let mut chunk = [0u8; 16 * 1024];
    for _ in 0..10_000 {
        if let Some(reply) = decode_reply(&mut buf).expect("a well-formed reply") {
            return reply;
        }
        let n = stream.read(&mut chunk).expect("a reply within 5 s");
        assert!(n > 0, "the node closed the connection");
        buf.extend_from_slice(&chunk[..n]);
    }
    panic!("no whole reply to {args:?}");
}

#[test]
fn slots_tags_and_maps_agree_with_a_real_cluster() {
    let cluster = RedisCluster::start(3, 1);
    let port = cluster.nodes[0].port;
    // Keys of every shape the hash-tag rule distinguishes, and one tag per 97th slot.
    let mut keys: Vec<Vec<u8>> = [
        "a",
        "b",
        "{a}x",
        "{}",
        "{}a",
        "a{}",
        "a{b}c",
        "}{",
        "}{x}",
        "x{a}{b}",
        "foo{",
        "{foo}",
        "redlock-proxy:token:{foo}",
        "é",
        "",
    ]
    .iter()
    .map(|k| k.as_bytes().to_vec())
    .collect();
    for i in 0..300u32 {
        let n = i.wrapping_mul(2_654_435_761);
        let alphabet = b"ab{}xyz:-";
        let len = (n % 9) as usize;
        keys.push(
            (0..len)
                .map(|j| alphabet[((n >> (3 * j)) % 9) as usize])
                .collect(),
        );
    }
    for slot in (0..SLOTS as u16).step_by(97) {
        keys.push(format!("redlock-proxy:armed:{{{}}}", slot_tag(slot)).into_bytes());
    }
    for key in &keys {
        let Reply::Int(slot) = cmd(port, &[b"CLUSTER", b"KEYSLOT", key]) else {
            panic!("CLUSTER KEYSLOT {key:?}");
        };
        assert_eq!(
            i64::from(key_slot(key)),
            slot,
            "{:?}",
            String::from_utf8_lossy(key)
        );
    }
    let shards = SlotMap::from_cluster_shards(
        &proxy_reply(port, &["CLUSTER", "SHARDS"]),
        false,
        "127.0.0.1",
    )
    .expect("CLUSTER SHARDS");
    let slots = SlotMap::from_cluster_slots(&proxy_reply(port, &["CLUSTER", "SLOTS"]), "127.0.0.1")
        .expect("CLUSTER SLOTS");
    assert_eq!(shards.uncovered(), 0);
    assert_eq!(shards.primaries.len(), 3);
    for slot in 0..SLOTS as u16 {
        assert_eq!(shards.owner(slot), slots.owner(slot), "slot {slot}");
    }
    // A key sent to a primary that does not serve its slot: MOVED, to the map's owner.
    let key = b"a".as_slice();
    let owner = shards.owner(key_slot(key)).expect("an owner").clone();
    assert_eq!(cluster.primary_of(key_slot(key)), Some(owner.port));
    let elsewhere = shards
        .primaries
        .iter()
        .find(|p| p.port != owner.port)
        .expect("another primary");
    let reply = proxy_reply(elsewhere.port, &["SET", "a", "v"]);
    assert_eq!(
        Redirect::parse(&reply),
        Some(Redirect::Moved {
            slot: key_slot(key),
            host: owner.host.clone(),
            port: owner.port
        })
    );
    let Reply::Bulk(id) = cmd(owner.port, &[b"CLUSTER", b"MYID"]) else {
        panic!("CLUSTER MYID");
    };
    assert_eq!(String::from_utf8_lossy(&id), owner.id);
}

/// `lock.lua` as a cluster node runs it, for the slot of its key (every key it declares is in
/// that slot): an acquire when the slot's armed marker holds this node's id; `-1` when it holds
/// another node's (the data came from elsewhere: a promotion, a migration). Negative control:
/// the single-master form takes any stamp for armed and grants.
#[test]
fn the_cluster_lock_script_grants_only_on_a_slot_this_node_armed() {
    use redlock_proxy::on_master::{CLUSTER_LOCK_SCRIPT, CLUSTER_QUARANTINE_SCRIPT, LOCK_SCRIPT};
    let cluster = RedisCluster::start(3, 0);
    let key = "cluster-lock-script";
    let slot = key_slot(key.as_bytes());
    let tag = slot_tag(slot);
    let owner = cluster.primary_of(slot).expect("an owner");
    let armed = format!("redlock-proxy:armed:{{{tag}}}");
    let quarantine = format!("redlock-proxy:quarantine:{{{tag}}}");
    let counter = format!("redlock-proxy:token:{{{tag}}}:{key}");
    let ProxyReply::Array(time) = proxy_reply(owner, &["TIME"]) else {
        panic!("TIME");
    };
    let secs = match &time[0] {
        ProxyReply::Bulk(b) => String::from_utf8_lossy(b).parse::<u64>().expect("seconds"),
        other => panic!("TIME: {other:?}"),
    };
    let deadline = ((secs + 60) * 1000).to_string();
    // The cluster form passes its 4 names counted in its arguments (a node merges calls of
    // several slots into one); the single-master form passes the lock key alone and names the
    // proxy's own keys itself, untagged (a cluster node refuses that: it runs on single
    // masters only), and leads with the write witness floor.
    let acquire_on = |port: u16, script: &str, value: &str| {
        let single = script == LOCK_SCRIPT.text();
        let names: &[&str] = match single {
            true => &["1", key, "0"],
            false => &["0", "4", &armed, &quarantine, key, &counter],
        };
        // The call's bounds (deadline, earliest clock, counter PX), then the acquire (record,
        // value, PX).
        let args = [
            &deadline,
            "0",
            "60000",
            "0000000000000001:test",
            value,
            "30000",
        ];
        proxy_reply(port, &[&["EVAL", script][..], names, &args].concat())
    };
    let acquire = |script: &str, value: &str| acquire_on(owner, script, value);
    // The acquire's answer (the single-master form adds the write witness after a grant, then
    // the clock it read).
    let element = |reply: ProxyReply| match reply {
        ProxyReply::Array(mut items) if (1..=3).contains(&items.len()) => items.remove(0),
        other => panic!("one element: {other:?}"),
    };
    // Armed by another node: refused, and nothing written.
    assert_eq!(
        proxy_reply(owner, &["SET", &armed, "another-node-id"]),
        ProxyReply::ok()
    );
    assert_eq!(
        element(acquire(CLUSTER_LOCK_SCRIPT.text(), "v1")),
        ProxyReply::Integer(-1)
    );
    assert_eq!(proxy_reply(owner, &["EXISTS", key]), ProxyReply::Integer(0));
    // Negative control: the single-master form grants on a foreign stamp (a single master
    // with the same marker).
    let single = redlock_proxy::LocalMaster::start(None, &[]).expect("a master");
    let armed_single = redlock_proxy::on_master::ARMED_KEY;
    assert_eq!(
        proxy_reply(single.port, &["SET", armed_single, "another-node-id"]),
        ProxyReply::ok()
    );
    assert_eq!(
        element(acquire_on(single.port, LOCK_SCRIPT.text(), "v2")),
        ProxyReply::ok()
    );
    // Re-armed by this node, in the script that quarantines the slot: refused while the
    // quarantine runs, granted once it is lifted.
    let left = proxy_reply(
        owner,
        &[
            "EVAL",
            CLUSTER_QUARANTINE_SCRIPT.text(),
            "2",
            &armed,
            &quarantine,
            "60000",
        ],
    );
    assert!(matches!(left, ProxyReply::Integer(1..)), "{left:?}");
    let ProxyReply::Bulk(id) = proxy_reply(owner, &["CLUSTER", "MYID"]) else {
        panic!("CLUSTER MYID");
    };
    assert_eq!(proxy_reply(owner, &["GET", &armed]), ProxyReply::Bulk(id));
    assert_eq!(
        element(acquire(CLUSTER_LOCK_SCRIPT.text(), "v3")),
        ProxyReply::Integer(-1)
    );
    assert_eq!(
        proxy_reply(owner, &["DEL", &quarantine]),
        ProxyReply::Integer(1)
    );
    assert_eq!(
        element(acquire(CLUSTER_LOCK_SCRIPT.text(), "v4")),
        ProxyReply::ok()
    );
    assert_eq!(
        proxy_reply(owner, &["GET", key]),
        ProxyReply::bulk("v4".to_string())
    );
}

/// The lock path through three clusters of three primaries: an acquire lands on its slot's
/// primary in every cluster (armed with that node's id), a second is refused, reads and the
/// compare-and-delete release are answered by the majority, keys of two slots are refused with
/// Redis Cluster's own text, and `INFO` shows every slot usable.
#[test]
fn locks_through_three_clusters() {
    run_alone(async {
        let clusters = tokio::task::block_in_place(|| three_clusters(3, 0));
        let proxy = proxy_over(&clusters, |_| {}).await;
        let mut c = proxy.client().await;
        let k = key("through-clusters");
        assert_eq!(c.cmd(&["SET", &k, "v1", "NX", "PX", "10000"]).await, "+OK");
        assert_eq!(c.cmd(&["SET", &k, "v2", "NX", "PX", "10000"]).await, "$nil");
        assert_eq!(c.cmd(&["GET", &k]).await, "$v1");
        let slot = key_slot(k.as_bytes());
        let [armed, _] = redlock_proxy::cluster::keys::markers(slot);
        let armed = String::from_utf8_lossy(&armed).into_owned();
        for cluster in &clusters {
            let owner = cluster.primary_of(slot).expect("an owner");
            assert_eq!(
                cmd(owner, &[b"GET".as_ref(), k.as_bytes()]),
                Reply::Bulk(bytes::Bytes::from_static(b"v1"))
            );
            let Reply::Bulk(id) = cmd(owner, &[b"CLUSTER".as_ref(), b"MYID"]) else {
                panic!("no node id");
            };
            assert_eq!(
                cmd(owner, &[b"GET".as_ref(), armed.as_bytes()]),
                Reply::Bulk(id)
            );
        }
        let release = "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return 0 end";
        assert_eq!(c.cmd(&["EVAL", release, "1", &k, "v2"]).await, ":0");
        assert_eq!(c.cmd(&["EVAL", release, "1", &k, "v1"]).await, ":1");
        assert_eq!(c.cmd(&["GET", &k]).await, "$nil");
        let other = format!("{k}-elsewhere");
        assert_ne!(key_slot(other.as_bytes()), slot);
        assert_eq!(
            c.cmd(&["EVAL", release, "2", &k, &other, "v1"]).await,
            "-CROSSSLOT Keys in request don't hash to the same slot"
        );
        let tagged = format!("{{{k}}}:b");
        assert_eq!(
            c.cmd(&["EVAL", release, "2", &k, &tagged, "v1"]).await,
            ":0"
        );
        // Lists on the slot too (their waiters: `tests/lists.rs`).
        assert_eq!(c.cmd(&["LPUSH", &k, "x"]).await, ":1");
        assert_eq!(c.cmd(&["LPOP", &k]).await, "$x");
        // Extends and tokens run on the slot too.
        let t = c.cmd(&["LOCK.ACQUIRE", &k, "v3", "10000"]).await;
        assert!(t.starts_with('*') || t == "+OK", "{t}");
        let extended = c.cmd(&["LOCK.EXTEND", &k, "v3", "20000"]).await;
        let validity: i64 = extended[1..].parse().expect(&extended);
        assert!(validity > 10_000, "{extended}");
        // A lock taken by a client script takes a token too, its counter in the slot.
        let (by_script, acquire) = (
            format!("{k}-script"),
            "return redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2])",
        );
        let taken = c
            .cmd(&["EVAL", acquire, "1", &by_script, "v4", "10000"])
            .await;
        assert_eq!(taken, "+OK");
        let token = c.cmd(&["LOCK.TOKEN", &by_script, "v4"]).await;
        let token: i64 = token.trim_start_matches(':').parse().expect(&token);
        // Tokens are one order over every key: a later acquire's is above it.
        let later = format!("{k}-later");
        let granted = c.cmd(&["LOCK.ACQUIRE", &later, "v5", "10000"]).await;
        let (after, _) = lock_grant(&granted).expect(&granted);
        assert!(after as i64 > token, "{after} <= {token}");
        let info = c.cmd(&["INFO", "masters"]).await;
        for i in 0..3 {
            let state = master_state(&info, i).expect("a master line");
            assert!(
                state.starts_with("up (cluster: 3 primaries, 16384 of 16384"),
                "{info}"
            );
        }
    });
}

/// A holds `k` on clusters 0 and 1 (cluster 2 holds a foreign value then); the primary of
/// `k`'s slot in cluster 0 dies and its replica, cut off before A's write, takes over without
/// A's lock; B tries `k` until A's lease ends (the negative control: until its first grant).
/// Returns B's grants.
async fn contender_after_a_lossy_cluster_failover(quarantine: bool) -> usize {
    // Long enough that B still has most of it after the failover (a few cluster node timeouts).
    let ttl_a: u64 = 10_000;
    let mut clusters = tokio::task::block_in_place(|| three_clusters(3, 1));
    let tweak = |c: &mut Config| {
        c.quarantine = quarantine;
        c.max_lock_ttl_ms = ttl_a;
    };
    let proxy = proxy_over(&clusters, tweak).await;
    let k = key(&format!("cluster-failover-{quarantine}"));
    let slot = key_slot(k.as_bytes());
    let owners: Vec<u16> = clusters
        .iter()
        .map(|c| c.primary_of(slot).expect("an owner"))
        .collect();
    assert_eq!(
        master_cmd(owners[2], &["SET", &k, "foreign", "PX", "60000"]).await,
        "+OK"
    );
    // Cluster 0's replica of the slot's primary stops hearing it before A's write.
    let replica = clusters[0].replica_of(owners[0]).expect("a replica");
    let replica_pid = clusters[0].nodes[replica].pid().expect("running");
    let lease_end = grant_behind_a_cut_replica(proxy.port, owners[0], replica_pid, &k, ttl_a).await;
    assert_eq!(master_cmd(owners[2], &["DEL", &k]).await, ":1");
    // The primary dies; the replica, resumed, takes its slots over without A's lock
    // (`TAKEOVER`: an operator's promotion, which needs no election).
    let primary = clusters[0]
        .nodes
        .iter()
        .position(|n| n.port == owners[0])
        .expect("a node");
    clusters[0].nodes[primary].kill();
    signal(replica_pid, "CONT");
    let promoted = clusters[0].nodes[replica].port;
    let takeover = master_cmd(promoted, &["CLUSTER", "FAILOVER", "TAKEOVER"]).await;
    assert_eq!(takeover, "+OK");
    tokio::task::block_in_place(|| clusters[0].wait_primary_of(slot, promoted, FAILOVER_LIMIT));
    assert_eq!(
        master_get(promoted, &k).await,
        None,
        "the replica had A's lock"
    );
    let mut b = proxy.client().await;
    let grants = contend_until(&mut b, &k, lease_end, !quarantine).await;
    if quarantine {
        let info = b.cmd(&["INFO", "masters"]).await;
        let state = master_state(&info, 0).expect("master0");
        assert!(
            !state.contains(" 0 fenced"),
            "the promoted node's slots are fenced: {info}"
        );
    }
    grants
}

/// How long the other nodes take to learn of a takeover.
const FAILOVER_LIMIT: Duration = Duration::from_secs(30);

/// The promoted replica's slots vote for nobody while A's lease runs: the slot's marker names
/// the dead primary, not the node that serves it now. Negative control: with the quarantine
/// off, the promoted node votes for B while A holds.
#[test]
fn a_replica_promoted_without_a_held_lock_is_quarantined_per_slot() {
    run_alone(async {
        assert!(
            contender_after_a_lossy_cluster_failover(false).await > 0,
            "negative control: without the quarantine B must get A's lock"
        );
    });
    run_alone(async {
        assert_eq!(
            contender_after_a_lossy_cluster_failover(true).await,
            0,
            "B got A's lock after the failover"
        );
    });
}

/// A holds `k` on every cluster of 3 primaries with `replicas` replicas each, with
/// `wait_replicas` (1, or 0: a negative control); the primary of `k`'s slot in cluster 0 then
/// hands its slots to a replica (`CLUSTER FAILOVER`, planned: the replica has every write). Returns the `PTTL` of the slot's quarantine marker on
/// the promoted node once the proxy re-stamped the slot with that node's id (with or without a
/// quarantine), and master 0's state then.
async fn planned_failover_in_a_cluster(wait_replicas: u32, replicas: usize) -> (String, String) {
    let clusters = tokio::task::block_in_place(|| three_clusters(3, replicas));
    let proxy = proxy_over(&clusters, |c| {
        c.wait_replicas = wait_replicas;
        // `WAIT` answers within half of it: far above a replica's round trip on a busy machine.
        c.node_timeout_ms = 1000;
        c.max_lock_ttl_ms = 20_000;
    })
    .await;
    let k = key(&format!("planned-failover-{wait_replicas}-{replicas}"));
    let slot = key_slot(k.as_bytes());
    let mut a = proxy.client().await;
    assert_eq!(
        a.cmd(&["SET", &k, "tok-a", "NX", "PX", "20000"]).await,
        "+OK"
    );
    let old = clusters[0].primary_of(slot).expect("an owner");
    let promoted = tokio::task::block_in_place(|| fail_over(&clusters[0], old, ""));
    assert_eq!(
        master_get(promoted, &k).await.as_deref(),
        Some("tok-a"),
        "the replica had A's lock"
    );
    let id = match cmd(promoted, &[b"CLUSTER", b"MYID"]) {
        Reply::Bulk(id) => String::from_utf8_lossy(&id).into_owned(),
        other => panic!("CLUSTER MYID: {other:?}"),
    };
    let [armed, quarantine] = redlock_proxy::cluster::keys::markers(slot);
    let (armed, quarantine) = (
        String::from_utf8_lossy(&armed).into_owned(),
        String::from_utf8_lossy(&quarantine).into_owned(),
    );
    let started = std::time::Instant::now();
    while master_get(promoted, &armed).await.as_deref() != Some(id.as_str()) {
        assert!(
            started.elapsed() < FAILOVER_LIMIT,
            "the proxy never re-stamped the slot on the promoted node"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pttl = master_cmd(promoted, &["PTTL", &quarantine]).await;
    // The keeper records what it wrote once the node answered: every slot up, or some fenced.
    let judged = |info: &str| {
        master_state(info, 0).is_some_and(|s| s.starts_with("up (") || !s.ends_with(" 0 fenced)"))
    };
    let info = wait_for_info_where(&mut a, FAILOVER_LIMIT, "master0 judged", judged).await;
    let state = master_state(&info, 0).expect("master0").to_string();
    // Safety either way: A's lock is held on every cluster.
    let b = a.cmd(&["SET", &k, "tok-b", "NX", "PX", "1000"]).await;
    assert_eq!(b, "$nil", "B must not get the lock A holds");
    (pttl, state)
}

/// `wait_replicas` 1: a planned failover inside a cluster hands the slots to a replica that
/// confirmed every vote, so the proxy re-stamps them with no quarantine and they vote at once.
/// Negative controls, quarantined per slot: `wait_replicas` 0 (the failover is amnesia), and
/// two replicas online where one confirms each vote (the other may have confirmed a vote the
/// promoted one lacks: the proxy cannot tell).
#[test]
fn a_planned_failover_to_a_replica_that_confirmed_every_vote_needs_no_quarantine() {
    run_alone(async {
        let (pttl, state) = planned_failover_in_a_cluster(1, 1).await;
        assert_eq!(pttl, ":-2", "a quarantine on the promoted node: {state}");
        assert!(
            state.starts_with("up (cluster: 3 primaries, 16384 of 16384"),
            "{state}"
        );
    });
    for (wait_replicas, replicas) in [(0, 1), (1, 2)] {
        run_alone(async {
            let (pttl, state) = planned_failover_in_a_cluster(wait_replicas, replicas).await;
            let left: i64 = pttl[1..].parse().expect(&pttl);
            assert!(
                left > 0,
                "negative control ({replicas} replicas, wait_replicas {wait_replicas}): the failover must be quarantined: {pttl}, {state}"
            );
        });
    }
}

/// The node ids and ports of a cluster's primaries, by what the first answering node says.
fn primaries(cluster: &RedisCluster) -> Vec<(String, u16)> {
    let Some(reply) = cluster.nodes.iter().find_map(|n| {
        blocking_cmd(
            n.port,
            &[b"CLUSTER".as_ref(), b"NODES"],
            Duration::from_secs(2),
        )
        .ok()
    }) else {
        return Vec::new();
    };
    let Reply::Bulk(text) = reply else {
        return Vec::new();
    };
    String::from_utf8_lossy(&text)
        .lines()
        .filter(|l| l.contains("master") && !l.contains("fail") && l.split(' ').count() > 8)
        .filter_map(|l| {
            let mut fields = l.split(' ');
            let id = fields.next()?.to_string();
            let port = fields
                .next()?
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            Some((id, port))
        })
        .collect()
}

/// Promotes a replica of `cluster`'s primary on port `old` with `CLUSTER FAILOVER <how>`
/// (`""`: a planned failover) and waits until it is a primary; the promoted port.
fn fail_over(cluster: &RedisCluster, old: u16, how: &str) -> u16 {
    let replica = cluster.replica_of(old).expect("a replica");
    let port = cluster.nodes[replica].port;
    let mut args: Vec<&[u8]> = vec![b"CLUSTER", b"FAILOVER", how.as_bytes()];
    args.retain(|a| !a.is_empty());
    let reply = blocking_cmd(port, &args, Duration::from_secs(5)).expect("a reply");
    assert_eq!(
        reply,
        Reply::Status(bytes::Bytes::from_static(b"OK")),
        "CLUSTER FAILOVER {how}"
    );
    let deadline = std::time::Instant::now() + FAILOVER_LIMIT;
    while !primaries(cluster).iter().any(|(_, p)| *p == port) {
        assert!(
            std::time::Instant::now() < deadline,
            "{port} never became a primary"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    port
}

/// Kills (SIGKILL) a primary of `cluster` that has a replica and waits until the cluster has
/// promoted one in its place (after its node timeout, an election).
fn kill_a_primary(cluster: &RedisCluster) {
    let (_, port) = (primaries(cluster).into_iter())
        .find(|(_, port)| cluster.replica_of(*port).is_some())
        .expect("a primary with a replica");
    let node = cluster
        .nodes
        .iter()
        .find(|n| n.port == port)
        .expect("its node");
    signal(node.pid().expect("running"), "KILL");
    let deadline = std::time::Instant::now() + FAILOVER_LIMIT;
    while primaries(cluster).len() < 3 || primaries(cluster).iter().any(|(_, p)| *p == port) {
        assert!(
            std::time::Instant::now() < deadline,
            "no replica of {port} was promoted"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Moves `slots` slots of cluster `c` from its first primary to its second with
/// `redis-cli --cluster reshard` (keys and all: `MIGRATE`, so `ASK` and `TRYAGAIN` in flight).
fn reshard(cluster: &RedisCluster, slots: usize) {
    let nodes = primaries(cluster);
    let status = std::process::Command::new("redis-cli")
        .args(["--cluster", "reshard", &format!("127.0.0.1:{}", nodes[0].1)])
        .args(["--cluster-from", &nodes[0].0, "--cluster-to", &nodes[1].0])
        .args(["--cluster-slots", &slots.to_string(), "--cluster-yes"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .expect("redis-cli");
    assert!(status.success(), "redis-cli --cluster reshard: {status}");
}

/// A workload of locks (plain, `LOCK.ACQUIRE` with tokens, extends) through three clusters of
/// three primaries with a replica each, while a fault driver forces a failover in cluster 0
/// (`CLUSTER FAILOVER FORCE`: the replica may lack the last writes), takes a primary over in
/// cluster 1 (`TAKEOVER`), moves 2000 slots of cluster 2 with `redis-cli --cluster reshard`,
/// pauses every node of cluster 1 (a whole cluster down: a minority of the masters) for 3 s,
/// and kills a primary of cluster 2 (its replica promoted by the cluster's own election).
/// The checker: no two holders at once, no token given twice or going backwards, no OK after
/// its lease.
#[test]
fn failovers_a_reshard_and_a_cluster_down_keep_mutual_exclusion() {
    run_alone(async {
        let clusters = Arc::new(tokio::task::block_in_place(|| three_clusters(3, 1)));
        let proxy = proxy_over(&clusters, |c| c.max_lock_ttl_ms = 1000).await;
        let mut workload = Workload::new(vec![proxy.port], "cluster", 11).with_keys(12);
        workload.duration = Duration::from_secs(25);
        workload.lock_acquire_chance = 0.3;
        workload.extend_chance = 0.1;
        workload.extend_via_lock_extend = true;
        let clusters_ = clusters.clone();
        let (report, faults, took) = workload
            .run_beside(move || {
                let mut done = Vec::new();
                std::thread::sleep(Duration::from_secs(1));
                fail_over(&clusters_[0], primaries(&clusters_[0])[0].1, "FORCE");
                done.push("failover force");
                std::thread::sleep(Duration::from_secs(1));
                fail_over(&clusters_[1], primaries(&clusters_[1])[0].1, "TAKEOVER");
                done.push("takeover");
                std::thread::sleep(Duration::from_secs(1));
                reshard(&clusters_[2], 2000);
                done.push("reshard");
                std::thread::sleep(Duration::from_secs(1));
                let pids: Vec<u32> = clusters_[1].nodes.iter().filter_map(|n| n.pid()).collect();
                pids.iter().for_each(|pid| signal(*pid, "STOP"));
                std::thread::sleep(Duration::from_secs(3));
                pids.iter().for_each(|pid| signal(*pid, "CONT"));
                done.push("cluster down");
                std::thread::sleep(Duration::from_secs(1));
                kill_a_primary(&clusters_[2]);
                done.push("primary killed, replica promoted");
                std::thread::sleep(Duration::from_secs(3));
                done
            })
            .await;
        println!(
            "[cluster] {:.1} s, faults {faults:?}: {report}",
            took.as_secs_f64()
        );
        assert_eq!(faults.len(), 5, "every fault took effect");
        report.assert_safe(50);
    });
}
