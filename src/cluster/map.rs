//! A Redis Cluster's slot map as the proxy reads it ([`SlotMap`], from `CLUSTER SHARDS` or,
//! before Redis 7, `CLUSTER SLOTS`), and the redirections a node answers instead of running a
//! command ([`Redirect`]). Pure, no I/O: parsed from the replies.
//!
//! Invariants: a map names, for every slot it covers, one primary by address and node id; a
//! slot no shard covers (a cluster being set up, a lost shard) has no owner, and the proxy asks
//! nobody for it. A redirection is recognised only by Redis' own codes (`MOVED`, `ASK`,
//! `TRYAGAIN`, `CLUSTERDOWN`); every one of them comes before a command runs, so a resend
//! never runs a write twice.

use super::slots::SLOTS;
use crate::protocol::Reply;

/// A primary of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    pub host: String,
    pub port: u16,
    /// Its node id (`CLUSTER MYID`).
    pub id: String,
}

/// Which primary serves each slot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotMap {
    pub primaries: Vec<Node>,
    /// Per slot, the index in `primaries` of its owner (`None`: no shard covers it).
    owners: Vec<Option<u16>>,
}

/// Why a slot map could not be read from a reply.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unexpected cluster topology reply: {0}")]
pub struct MapError(&'static str);

impl SlotMap {
    /// The primary serving `slot`.
    pub fn owner(&self, slot: u16) -> Option<&Node> {
        let at = (*self.owners.get(usize::from(slot))?)?;
        self.primaries.get(usize::from(at))
    }

    /// Slots no primary serves.
    pub fn uncovered(&self) -> usize {
        self.owners.iter().filter(|o| o.is_none()).count()
    }

    fn empty() -> SlotMap {
        SlotMap {
            primaries: Vec::new(),
            owners: vec![None; SLOTS],
        }
    }

    /// `slots` (pairs of first and last slot) are served by `primary`.
    fn assign(&mut self, primary: Node, ranges: &[(i64, i64)]) -> Result<(), MapError> {
        let at = match self.primaries.iter().position(|n| *n == primary) {
            Some(at) => at,
            None => {
                self.primaries.push(primary);
                self.primaries.len() - 1
            }
        };
        let at = u16::try_from(at).map_err(|_| MapError("more primaries than slots"))?;
        for &(first, last) in ranges {
            let (Ok(first), Ok(last)) = (usize::try_from(first), usize::try_from(last)) else {
                return Err(MapError("a negative slot"));
            };
            if first > last || last >= SLOTS {
                return Err(MapError("a slot range out of bounds"));
            }
            for owner in &mut self.owners[first..=last] {
                *owner = Some(at);
            }
        }
        Ok(())
    }

    /// From `CLUSTER SLOTS`: `[[first, last, [host, port, id, …], replicas…], …]`. A node
    /// whose address is unknown to the cluster (empty or `?`: a node that never met another,
    /// as a cluster of one) is at `asked`, the host the reply came from (Redis' documented
    /// rule for clients).
    pub fn from_cluster_slots(reply: &Reply, asked: &str) -> Result<SlotMap, MapError> {
        let Reply::Array(ranges) = reply else {
            return Err(MapError("CLUSTER SLOTS is not an array"));
        };
        let mut map = SlotMap::empty();
        for range in ranges {
            let Reply::Array(items) = range else {
                return Err(MapError("a CLUSTER SLOTS range is not an array"));
            };
            let (Some(Reply::Integer(first)), Some(Reply::Integer(last)), Some(primary)) =
                (items.first(), items.get(1), items.get(2))
            else {
                return Err(MapError("a CLUSTER SLOTS range lacks its slots or primary"));
            };
            let Reply::Array(node) = primary else {
                return Err(MapError("a CLUSTER SLOTS primary is not an array"));
            };
            let (Some(host), Some(Reply::Integer(port)), Some(id)) = (
                node.first().and_then(text),
                node.get(1),
                node.get(2).and_then(text),
            ) else {
                return Err(MapError("a CLUSTER SLOTS primary lacks host, port or id"));
            };
            let port = u16::try_from(*port).map_err(|_| MapError("a port out of range"))?;
            let host = known_or(host, asked);
            map.assign(Node { host, port, id }, &[(*first, *last)])?;
        }
        Ok(map)
    }

    /// From `CLUSTER SHARDS` (Redis 7): per shard `slots` (a flat list of first/last pairs)
    /// and `nodes` (field/value lists: `id`, `port` or `tls-port`, `ip`, `endpoint`, `role`,
    /// `health`, …). The shard's primary is its node with `role` `master`; its address is its
    /// `endpoint` (what clients are to use), else its `ip`. A shard without slots (a primary
    /// being added) serves nothing.
    pub fn from_cluster_shards(reply: &Reply, tls: bool, asked: &str) -> Result<SlotMap, MapError> {
        let Reply::Array(shards) = reply else {
            return Err(MapError("CLUSTER SHARDS is not an array"));
        };
        let mut map = SlotMap::empty();
        for shard in shards {
            let shard = fields(shard).ok_or(MapError("a shard is not a field list"))?;
            let slots = match field(&shard, "slots") {
                Some(Reply::Array(slots)) => slots,
                _ => return Err(MapError("a shard lacks its slots")),
            };
            let mut ranges = Vec::with_capacity(slots.len() / 2);
            for pair in slots.chunks(2) {
                let [Reply::Integer(first), Reply::Integer(last)] = pair else {
                    return Err(MapError("a shard's slots are not pairs of integers"));
                };
                ranges.push((*first, *last));
            }
            if ranges.is_empty() {
                continue;
            }
            let Some(Reply::Array(nodes)) = field(&shard, "nodes") else {
                return Err(MapError("a shard lacks its nodes"));
            };
            let primary = nodes
                .iter()
                .filter_map(fields)
                .find(|node| field(node, "role").and_then(text).as_deref() == Some("master"))
                .ok_or(MapError("a shard with slots has no primary"))?;
            let host = ["endpoint", "ip"]
                .iter()
                .filter_map(|name| field(&primary, name).and_then(text))
                .find(|host| !host.is_empty() && host != "?")
                .unwrap_or_else(|| asked.to_string());
            let port = match field(&primary, if tls { "tls-port" } else { "port" }) {
                Some(Reply::Integer(port)) => {
                    u16::try_from(*port).map_err(|_| MapError("a port out of range"))?
                }
                _ => return Err(MapError("a shard's primary has no port")),
            };
            let id = field(&primary, "id")
                .and_then(text)
                .ok_or(MapError("a shard's primary has no id"))?;
            map.assign(Node { host, port, id }, &ranges)?;
        }
        Ok(map)
    }
}

/// `host`, unless the cluster does not know it (empty or `?`): then `asked`.
fn known_or(host: String, asked: &str) -> String {
    match host.as_str() {
        "" | "?" => asked.to_string(),
        _ => host,
    }
}

/// A field/value list (RESP2: a flat array; RESP3: a map) as pairs.
fn fields(reply: &Reply) -> Option<Vec<(Reply, Reply)>> {
    match reply {
        Reply::Map(pairs) => Some(pairs.clone()),
        Reply::Array(items) if items.len() % 2 == 0 => Some(
            items
                .chunks(2)
                .map(|kv| (kv[0].clone(), kv[1].clone()))
                .collect(),
        ),
        _ => None,
    }
}

/// The value of field `name`.
fn field<'a>(fields: &'a [(Reply, Reply)], name: &str) -> Option<&'a Reply> {
    fields
        .iter()
        .find(|(k, _)| text(k).as_deref() == Some(name))
        .map(|(_, v)| v)
}

/// A bulk or simple string as text.
fn text(reply: &Reply) -> Option<String> {
    match reply {
        Reply::Bulk(b) | Reply::Simple(b) | Reply::Verbatim(b) => {
            Some(String::from_utf8_lossy(b).into_owned())
        }
        _ => None,
    }
}

/// What a node answered instead of running a command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// The slot lives on another primary for good: reload the map, send it there.
    Moved { slot: u16, host: String, port: u16 },
    /// The slot is migrating and this key is on the importing node: send it there once, after
    /// `ASKING`.
    Ask { slot: u16, host: String, port: u16 },
    /// A multi-key command during a slot's migration, its keys split between the nodes: retry
    /// shortly.
    TryAgain,
    /// The cluster cannot serve the slot now: no vote.
    ClusterDown,
}

impl Redirect {
    /// The redirection `reply` is, if it is one.
    pub fn parse(reply: &Reply) -> Option<Redirect> {
        let Reply::Error(text) = reply else {
            return None;
        };
        let text = std::str::from_utf8(text).ok()?;
        let mut words = text.split(' ');
        let code = words.next()?;
        let target = |words: &mut std::str::Split<'_, char>| {
            let slot = words.next()?.parse::<u16>().ok()?;
            let (host, port) = words.next()?.rsplit_once(':')?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_string();
            Some((slot, host, port.parse::<u16>().ok()?))
        };
        match code {
            "MOVED" => {
                target(&mut words).map(|(slot, host, port)| Redirect::Moved { slot, host, port })
            }
            "ASK" => {
                target(&mut words).map(|(slot, host, port)| Redirect::Ask { slot, host, port })
            }
            "TRYAGAIN" => Some(Redirect::TryAgain),
            "CLUSTERDOWN" => Some(Redirect::ClusterDown),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Reply {
        Reply::bulk(s.to_string())
    }

    fn node(host: &str, port: i64, id: &str) -> Reply {
        Reply::Array(vec![
            bulk(host),
            Reply::Integer(port),
            bulk(id),
            Reply::Array(vec![]),
        ])
    }

    /// The shapes the design notes recorded from redis-server 7.0.15.
    #[test]
    fn cluster_slots_give_each_slot_its_primary() {
        let reply = Reply::Array(vec![
            Reply::Array(vec![
                Reply::Integer(0),
                Reply::Integer(5460),
                node("127.0.0.1", 48066, "9cb9"),
                node("127.0.0.1", 48069, "c2f5"),
            ]),
            Reply::Array(vec![
                Reply::Integer(5461),
                Reply::Integer(16383),
                node("127.0.0.1", 48067, "aaaa"),
            ]),
        ]);
        let map = SlotMap::from_cluster_slots(&reply, "h").unwrap();
        assert_eq!(map.owner(0).unwrap().port, 48066);
        assert_eq!(map.owner(5460).unwrap().id, "9cb9");
        assert_eq!(map.owner(5461).unwrap().port, 48067);
        assert_eq!(map.uncovered(), 0);
        assert_eq!(map.primaries.len(), 2);
        assert!(SlotMap::from_cluster_slots(&Reply::Integer(1), "h").is_err());
        let out_of_range = Reply::Array(vec![Reply::Array(vec![
            Reply::Integer(0),
            Reply::Integer(16384),
            node("h", 1, "x"),
        ])]);
        assert!(SlotMap::from_cluster_slots(&out_of_range, "h").is_err());
    }

    #[test]
    fn cluster_shards_give_each_slot_its_primary() {
        let node = |id: &str, port: i64, role: &str| {
            Reply::Array(vec![
                bulk("id"),
                bulk(id),
                bulk("port"),
                Reply::Integer(port),
                bulk("ip"),
                bulk("127.0.0.1"),
                bulk("endpoint"),
                bulk("127.0.0.1"),
                bulk("role"),
                bulk(role),
                bulk("replication-offset"),
                Reply::Integer(126),
                bulk("health"),
                bulk("online"),
            ])
        };
        let shard = |slots: &[i64], nodes: Vec<Reply>| {
            Reply::Array(vec![
                bulk("slots"),
                Reply::Array(slots.iter().map(|s| Reply::Integer(*s)).collect()),
                bulk("nodes"),
                Reply::Array(nodes),
            ])
        };
        let reply = Reply::Array(vec![
            shard(
                &[10923, 16383],
                vec![
                    node("2693", 48068, "master"),
                    node("bf85", 48071, "replica"),
                ],
            ),
            // After a move of slot 3300 to this shard.
            shard(
                &[3300, 3300, 5461, 10922],
                vec![node("bbbb", 48067, "master")],
            ),
            shard(&[0, 3299, 3301, 5460], vec![node("9cb9", 48066, "master")]),
            // A primary added without slots yet.
            shard(&[], vec![node("new0", 48090, "master")]),
        ]);
        let map = SlotMap::from_cluster_shards(&reply, false, "h").unwrap();
        assert_eq!(map.owner(16383).unwrap().id, "2693");
        assert_eq!(map.owner(3300).unwrap().port, 48067);
        assert_eq!(map.owner(3299).unwrap().port, 48066);
        assert_eq!(map.uncovered(), 0);
        assert_eq!(map.primaries.len(), 3);
        let no_primary = Reply::Array(vec![shard(&[0, 1], vec![node("r", 1, "replica")])]);
        assert!(SlotMap::from_cluster_shards(&no_primary, false, "h").is_err());
        // A cluster of one node never learnt its own address (`ip` and `endpoint` empty, as
        // redis-server 7 answers): it is where the answer came from.
        let alone = Reply::Array(vec![Reply::Array(vec![
            bulk("slots"),
            Reply::Array(vec![Reply::Integer(0), Reply::Integer(16383)]),
            bulk("nodes"),
            Reply::Array(vec![Reply::Array(vec![
                bulk("id"),
                bulk("8a15"),
                bulk("port"),
                Reply::Integer(7555),
                bulk("ip"),
                bulk(""),
                bulk("endpoint"),
                bulk(""),
                bulk("role"),
                bulk("master"),
            ])]),
        ])]);
        let map = SlotMap::from_cluster_shards(&alone, false, "10.1.2.3").unwrap();
        assert_eq!(map.owner(42).unwrap().host, "10.1.2.3");
    }

    #[test]
    fn redirections_are_read_from_redis_own_codes() {
        let err = |s: &str| Reply::error(s.to_string());
        assert_eq!(
            Redirect::parse(&err("MOVED 15495 127.0.0.1:48068")),
            Some(Redirect::Moved {
                slot: 15495,
                host: "127.0.0.1".into(),
                port: 48068
            })
        );
        assert_eq!(
            Redirect::parse(&err("ASK 3300 [::1]:48067")),
            Some(Redirect::Ask {
                slot: 3300,
                host: "::1".into(),
                port: 48067
            })
        );
        assert_eq!(
            Redirect::parse(&err(
                "TRYAGAIN Multiple keys request during rehashing of slot"
            )),
            Some(Redirect::TryAgain)
        );
        assert_eq!(
            Redirect::parse(&err("CLUSTERDOWN The cluster is down")),
            Some(Redirect::ClusterDown)
        );
        for other in [
            "ERR MOVED",
            "MOVED x 1:2",
            "MOVEDX 1 h:2",
            "NOSCRIPT No matching script",
        ] {
            assert_eq!(Redirect::parse(&err(other)), None, "{other}");
        }
        assert_eq!(
            Redirect::parse(&Reply::bulk("MOVED 1 h:2".to_string())),
            None
        );
    }
}
