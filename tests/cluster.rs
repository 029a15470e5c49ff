//! Masters that are Redis Clusters (issue 26): what the proxy computes and reads about a
//! cluster, checked against a real one (3 primaries with a replica each, on loopback): hash
//! slots and the per-slot tags of the proxy's own keys against `CLUSTER KEYSLOT`, the slot map
//! from `CLUSTER SHARDS` and from `CLUSTER SLOTS` against each other and against where a key
//! lands, and the redirection a node answers for a slot it does not serve.

use bytes::BytesMut;
use redlock_proxy::cluster::map::{Redirect, SlotMap};
use redlock_proxy::cluster::slots::{key_slot, slot_tag, SLOTS};
use redlock_proxy::fuzzing::{decode_reply, encode_command, Reply as ProxyReply};
use redlock_testkit::cluster::RedisCluster;
use redlock_testkit::resp::{blocking_cmd, Reply};
use std::io::{Read, Write};
use std::net::TcpStream;
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
    let shards = SlotMap::from_cluster_shards(&proxy_reply(port, &["CLUSTER", "SHARDS"]), false)
        .expect("CLUSTER SHARDS");
    let slots = SlotMap::from_cluster_slots(&proxy_reply(port, &["CLUSTER", "SLOTS"]))
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
