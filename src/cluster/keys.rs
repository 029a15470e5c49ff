//! The names of the proxy's own keys on a Redis Cluster master (docs/design/cluster-masters.md,
//! "Keys"): every key the proxy reads or writes for a lock key lives in that key's slot, so a
//! script's declared keys are always one slot. Single masters keep their names
//! ([`crate::on_master`]): renaming them would split the counters of two proxy versions.
//!
//! Invariant (tested): for every slot s and every key k of slot s, the names below hash to s.

use super::slots::{key_slot, slot_tag};
use crate::on_master::{ARMED_KEY, QUARANTINE_KEY, TOKEN_KEY_PREFIX};
use bytes::Bytes;

/// The markers a script checks for a key of `slot` on a master that is a cluster
/// (`on_cluster`: the slot's, [`markers`]) or a single server (its own, [`ARMED_KEY`] and
/// [`QUARANTINE_KEY`]).
pub fn markers_on(on_cluster: bool, slot: u16) -> [Bytes; 2] {
    match on_cluster {
        true => markers(slot),
        false => [ARMED_KEY, QUARANTINE_KEY].map(|k| Bytes::from_static(k.as_bytes())),
    }
}

/// Where a master that is a cluster (`on_cluster`: [`token_key`]) or a single server
/// ([`crate::on_master::token_key`]) keeps the fencing token counter of `key`.
pub fn token_key_on(on_cluster: bool, key: &[u8]) -> Bytes {
    match on_cluster {
        true => token_key(key),
        false => crate::on_master::token_key(key),
    }
}

/// The markers of slot `slot`: `redlock-proxy:armed:{T}` (the node id of the node that armed
/// it) and `redlock-proxy:quarantine:{T}`.
pub fn markers(slot: u16) -> [Bytes; 2] {
    marker_pieces(slot).map(|pieces| Bytes::from(pieces.concat()))
}

/// [`markers`] as the pieces each name is the concatenation of (an acquire writes them
/// without building them: [`crate::protocol::ScriptCall`]).
pub fn marker_pieces(slot: u16) -> [[&'static [u8]; 4]; 2] {
    let tag = slot_tag(slot).as_bytes();
    [ARMED_KEY, QUARANTINE_KEY].map(|name| [name.as_bytes(), b":{", tag, b"}"])
}

/// Where a cluster master keeps the fencing token counter of `key`:
/// `redlock-proxy:token:{T}:<key>`, `T` the tag of the key's slot (a `{key}` form would be
/// wrong for keys holding `}`; the tag is right for every key).
pub fn token_key(key: &[u8]) -> Bytes {
    Bytes::from(token_key_pieces(key_slot(key), key).concat())
}

/// What the token counter of a key of `slot` is named with before the key, on a master that
/// is a cluster (`on_cluster`: `redlock-proxy:token:{T}:`) or a single server
/// (`redlock-proxy:token:`): the prelude of client scripts names the counters of the keys a
/// script declares itself.
pub fn token_prefix_on(on_cluster: bool, slot: u16) -> Bytes {
    match on_cluster {
        true => Bytes::from(token_key_pieces(slot, b"").concat()),
        false => Bytes::from_static(TOKEN_KEY_PREFIX.as_bytes()),
    }
}

/// [`token_key`] of `key`, of slot `slot`, as its pieces.
pub fn token_key_pieces(slot: u16, key: &[u8]) -> [&[u8]; 5] {
    let tag = slot_tag(slot).as_bytes();
    [TOKEN_KEY_PREFIX.as_bytes(), b"{", tag, b"}:", key]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::slots::SLOTS;

    #[test]
    fn the_proxy_keys_of_a_slot_are_in_that_slot() {
        for slot in 0..SLOTS as u16 {
            for marker in markers(slot) {
                assert_eq!(key_slot(&marker), slot, "{marker:?}");
            }
        }
        let keys: &[&[u8]] = &[
            b"a",
            b"{a}x",
            b"a}b",
            b"{}",
            b"}{",
            b"x{y}z",
            b"",
            b"lock:{user:7}",
        ];
        for key in keys {
            let counter = token_key(key);
            assert_eq!(key_slot(&counter), key_slot(key), "{counter:?}");
            assert!(counter.starts_with(TOKEN_KEY_PREFIX.as_bytes()));
            assert!(counter.ends_with(key));
        }
        assert_eq!(&token_key(b"b")[..], b"redlock-proxy:token:{b}:b");
        assert_eq!(&markers(3300)[0][..], b"redlock-proxy:armed:{b}");
    }
}
