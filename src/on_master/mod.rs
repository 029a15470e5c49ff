//! What the proxy keeps and runs on every master: each Lua script, one `.lua` file beside this
//! module (formatted and commented there), and the names of the proxy's own keys.
//!
//! A master receives a script [`compact`]ed: comment lines dropped, each line trimmed, all
//! joined by one space. So the scripts sent whole on every call (the guard, `LOCK.TOKEN`) cost a
//! master no bytes for their comments, the prelude is one line (a client body keeps its line
//! numbers), and a comment can change without changing a script's SHA1. A code line therefore
//! holds no `--` comment of its own (a test checks it). What each script promises, and why, is
//! argued in docs/SAFETY.md; the table test below pins each one's SHA1 and `KEYS`/`ARGV` layout.
//!
//! Invariant: every key the proxy writes on a master is under [`RESERVED_PREFIX`], which client
//! commands and client scripts can never touch.

use bytes::{Bytes, BytesMut};
use std::sync::LazyLock;

/// Keys under this prefix hold the proxy's own state on the masters (the shared markers, the
/// token counters); a client that could delete or change them could end a quarantine early or
/// make every master look wiped.
pub const RESERVED_PREFIX: &str = "redlock-proxy:";
/// The marker every proxy keeps on every master it has armed (no expiry).
pub const ARMED_KEY: &str = "redlock-proxy:armed";
/// The shared quarantine marker (`PX` = the lease bound, only ever lengthened).
pub const QUARANTINE_KEY: &str = "redlock-proxy:quarantine";
/// The write witness (no expiry): counted up by every merged lock call that takes a key, in the
/// same script, so a master that kept every acquire it acknowledged holds at least the highest
/// value it answered (docs/SAFETY.md, "Acknowledged writes").
pub const WITNESS_KEY: &str = "redlock-proxy:witness";
/// How a founding claim in [`QUARANTINE_KEY`] starts (`founding:<instance>`), as [`CLAIM_SCRIPT`]
/// writes and compares it.
pub const CLAIM_PREFIX: &str = "founding:";

/// What every token counter's name starts with ([`token_key`]).
pub const TOKEN_KEY_PREFIX: &str = "redlock-proxy:token:";

/// Where the masters keep the fencing token counter of `key` (`<token>:<proxy instance>`).
pub fn token_key(key: &[u8]) -> Bytes {
    let mut name = BytesMut::with_capacity(TOKEN_KEY_PREFIX.len() + key.len());
    name.extend_from_slice(TOKEN_KEY_PREFIX.as_bytes());
    name.extend_from_slice(key);
    name.freeze()
}

/// `source` as a master receives it: comment lines dropped, lines trimmed and joined by one
/// space (see the module doc); a shebang line (`#!lua flags=…`, Redis 7's script flags) stays
/// the first line of its own.
pub fn compact(source: &str) -> String {
    let (shebang, body) = match source.strip_prefix("#!") {
        Some(rest) => match rest.split_once('\n') {
            Some((flags, body)) => (Some(flags), body),
            None => (Some(rest), ""),
        },
        None => (None, source),
    };
    let body = body
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with("--"))
        .collect::<Vec<_>>()
        .join(" ");
    match shebang {
        Some(flags) => format!("#!{}\n{body}", flags.trim()),
        None => body,
    }
}

/// Lower-case hex SHA1 of a script body, as Redis computes it for `EVALSHA`.
pub fn script_sha(body: &[u8]) -> String {
    sha1_smol::Sha1::from(body).digest().to_string()
}

/// A script of this directory, [`compact`]ed once.
pub struct Script(LazyLock<String>);

impl Script {
    /// The text a master runs.
    pub fn text(&'static self) -> &'static str {
        self.0.as_str()
    }
}

macro_rules! on_master {
    ($($(#[$doc:meta])* $name:ident = $file:literal;)*) => {
        $($(#[$doc])* pub static $name: Script = Script(LazyLock::new(|| compact(include_str!($file))));)*
        /// Every script above with its file, for the table test.
        #[cfg(test)]
        static ALL: &[(&str, &Script)] = &[$(($file, &$name)),*];
    };
}

on_master! {
    /// The acquires and releases a link merged into one call (docs/SAFETY.md, "Merged calls
    /// decide nothing together", "Fencing tokens").
    LOCK_SCRIPT = "lock.lua";
    /// The clean-up of one refused acquire attempt (docs/SAFETY.md, "Clean-ups undo only
    /// their own attempt").
    UNDO_SCRIPT = "undo.lua";
    /// The clean-up of one refused hash-lock acquire (docs/SAFETY.md, "Hash locks
    /// (Redisson)").
    UNDO_HASH_SCRIPT = "undo_hash.lua";
    /// The compare-and-delete release of every client library.
    COMPARE_AND_DELETE = "compare_and_delete.lua";
    /// `LOCK.EXTEND` on one master (docs/PROTOCOL.md §10).
    EXTEND_SCRIPT = "extend.lua";
    /// The undo of an extend the client was not given.
    UNEXTEND_SCRIPT = "unextend.lua";
    /// A master's markers, for the health monitor.
    STATUS_SCRIPT = "status.lua";
    /// Quarantine and re-arm in one step (docs/SAFETY.md, quarantine).
    QUARANTINE_SCRIPT = "quarantine.lua";
    /// A founding claim on an unarmed master (docs/SAFETY.md, founding).
    CLAIM_SCRIPT = "claim.lua";
    /// Lifts this proxy's founding claim.
    LIFT_SCRIPT = "lift_claim.lua";
    /// [`LOCK_SCRIPT`] on a Redis Cluster node: one merged call for operations of any slots of
    /// the node, each acquire checking its own slot's markers against the node's id
    /// (docs/SAFETY.md, "Cluster masters").
    CLUSTER_LOCK_SCRIPT = "cluster_lock.lua";
    /// Re-stamps the armed marker of a server whose data was judged its own (docs/SAFETY.md,
    /// "Failovers").
    RESTAMP_SCRIPT = "restamp.lua";
    /// `LOCK.TOKEN` on one master.
    TOKEN_SCRIPT = "token.lua";
    /// The guard after every command that may write (docs/PROTOCOL.md §5).
    GUARD_SCRIPT = "guard.lua";
    /// `SET … IFEQ` as a lock operation on one master: a hand-over or an extend.
    COMPARE_AND_SET_SCRIPT = "compare_and_set.lua";
    /// The undo of a [`COMPARE_AND_SET_SCRIPT`] the client was not given.
    RESTORE_SCRIPT = "restore.lua";
    /// `SET` and `DELEX` with a condition that is a plain write.
    CONDITIONAL_SCRIPT = "conditional.lua";
}

/// How a script names the redis-server it runs on, as a single master: its `run_id`.
const OWN_RUN_ID: &str = "string.match(redis.call('info', 'server'), 'run_id:(%w+)')";
/// The same on a Redis Cluster node: its node id, which names the node that armed a slot
/// (docs/design/cluster-masters.md, "Keys"; a promoted replica is another node).
const OWN_NODE_ID: &str = "redis.call('cluster', 'myid')";

/// The form of a script a Redis Cluster master runs, for one slot (docs/design/cluster-masters.md,
/// "Scripts"): the armed marker holds the node id of the node that armed the slot, and every
/// check of it compares it with the node the script runs on, so a slot whose data came from
/// another node (a promotion, a migration) or is gone votes for nobody.
pub struct ClusterScript {
    base: &'static Script,
    /// The text of the base script to replace, and its replacement: each occurs exactly once.
    replace: &'static [(&'static str, &'static str)],
    text: LazyLock<String>,
}

impl ClusterScript {
    /// The text a cluster node runs.
    pub fn text(&'static self) -> &'static str {
        self.text.as_str()
    }

    fn build(&'static self) -> String {
        let mut text = self.base.text().to_string();
        for (from, to) in self.replace {
            assert_eq!(
                text.matches(from).count(),
                1,
                "{from:?} once in the base script"
            );
            text = text.replacen(from, to, 1);
        }
        text
    }
}

macro_rules! on_cluster {
    ($($(#[$doc:meta])* $name:ident = $base:ident, [$(($from:expr, $to:expr $(,)?)),* $(,)?];)*) => {
        $($(#[$doc])* pub static $name: ClusterScript = ClusterScript {
            base: &$base,
            replace: &[$(($from, $to)),*],
            text: LazyLock::new(|| $name.build()),
        };)*
        /// Every cluster form above, for the table test.
        #[cfg(test)]
        static ALL_CLUSTER: &[(&str, &ClusterScript)] = &[$((stringify!($name), &$name)),*];
    };
}

on_cluster! {
    /// [`EXTEND_SCRIPT`] for a slot.
    CLUSTER_EXTEND_SCRIPT = EXTEND_SCRIPT, [(
        "redis.call('exists', KEYS[3]) == 0",
        "redis.call('get', KEYS[3]) ~= redis.call('cluster', 'myid')",
    )];
    /// [`COMPARE_AND_SET_SCRIPT`] for a slot.
    CLUSTER_COMPARE_AND_SET_SCRIPT = COMPARE_AND_SET_SCRIPT, [(
        "redis.call('exists', KEYS[3]) == 0",
        "redis.call('get', KEYS[3]) ~= redis.call('cluster', 'myid')",
    )];
    /// [`GUARD_SCRIPT`] for a slot. A node notifies a key's changes (keyspace events) only to
    /// its own subscribers, and the proxy subscribes on one node per cluster: after a write
    /// that leaves a key a list (a push, a move's destination, a script's push), the guard
    /// publishes the key's keyspace event itself, which Redis Cluster carries to every node, so
    /// a blocked pop waiting on that channel is woken (docs/PROTOCOL.md §14).
    CLUSTER_GUARD_SCRIPT = GUARD_SCRIPT, [(
        "redis.call('exists', KEYS[1]) == 0",
        "redis.call('get', KEYS[1]) ~= redis.call('cluster', 'myid')",
    ), (
        "local ttl = redis.call('pttl', KEYS[i])",
        "local ttl = redis.call('pttl', KEYS[i]) if redis.call('type', KEYS[i]).ok == 'list' then redis.call('publish', '__keyspace@0__:' .. KEYS[i], 'lpush') end",
    )];
    /// [`QUARANTINE_SCRIPT`] for a slot: stamps the node id.
    CLUSTER_QUARANTINE_SCRIPT = QUARANTINE_SCRIPT, [(OWN_RUN_ID, OWN_NODE_ID)];
    /// [`CLAIM_SCRIPT`] for a slot: stamps the node id.
    CLUSTER_CLAIM_SCRIPT = CLAIM_SCRIPT, [(OWN_RUN_ID, OWN_NODE_ID)];
    /// [`RESTAMP_SCRIPT`] for a slot: compares and stamps the node id.
    CLUSTER_RESTAMP_SCRIPT = RESTAMP_SCRIPT, [(OWN_RUN_ID, OWN_NODE_ID)];
}

/// The prelude of client scripts, with its placeholders (filled by [`crate::script_keys`]).
pub const PRELUDE_SOURCE: &str = include_str!("prelude.lua");

#[cfg(test)]
mod tests {
    use super::*;

    /// The highest `KEYS[n]` and `ARGV[n]` a script names with a literal index.
    fn highest_index(text: &str, table: &str) -> usize {
        let open = format!("{table}[");
        text.match_indices(&open)
            .filter_map(|(at, _)| {
                let rest = &text[at + open.len()..];
                rest[..rest.find(']')?].parse::<usize>().ok()
            })
            .max()
            .unwrap_or(0)
    }

    /// Each cluster form differs from its base script where it names the node (the guard's
    /// also where it notifies a list's change), and is pinned like the base scripts.
    #[test]
    fn every_cluster_form_is_pinned() {
        let pinned: &[(&str, &str)] = &[
            (
                "CLUSTER_EXTEND_SCRIPT",
                "a5b58e3b307e9eca5835b9ba2a512fc033935bd7",
            ),
            (
                "CLUSTER_COMPARE_AND_SET_SCRIPT",
                "6981be9cdeaf270fd38505064e58e88fce368cfe",
            ),
            (
                "CLUSTER_GUARD_SCRIPT",
                "e7faf4ba05a2b0b47fffdf1dff9f471a0539eb15",
            ),
            (
                "CLUSTER_QUARANTINE_SCRIPT",
                "5fc60386fecbc467c158c38caf4b8a0f3dce1c54",
            ),
            (
                "CLUSTER_CLAIM_SCRIPT",
                "5ee9d1228479f10d33caaa4b3303c9ee4730bd03",
            ),
            (
                "CLUSTER_RESTAMP_SCRIPT",
                "cb4a17f646904352f690c9c5d7e6cbd776c9c81a",
            ),
        ];
        let shas: Vec<(&str, String)> = ALL_CLUSTER
            .iter()
            .map(|(name, script)| (*name, script_sha(script.text().as_bytes())))
            .collect();
        for ((name, sha), (pinned_name, pinned_sha)) in shas.iter().zip(pinned) {
            assert_eq!(
                (*name, sha.as_str()),
                (*pinned_name, *pinned_sha),
                "{shas:?}"
            );
        }
        assert_eq!(shas.len(), pinned.len());
        for (_, script) in ALL_CLUSTER {
            assert_ne!(script.text(), script.base.text());
            assert!(!script.text().contains("run_id"), "{}", script.text());
            assert!(script.text().contains(OWN_NODE_ID), "{}", script.text());
        }
    }

    /// `lock.lua` names the proxy's own keys itself (a master converts each name passed):
    /// they must be this module's.
    #[test]
    fn the_lock_script_names_the_proxys_keys_as_declared_here() {
        for name in [ARMED_KEY, QUARANTINE_KEY, WITNESS_KEY, TOKEN_KEY_PREFIX] {
            let literal = format!("'{name}'");
            assert_eq!(LOCK_SCRIPT.text().matches(&literal).count(), 1, "{name}");
        }
    }

    /// Each script's SHA1 (a change to what a master runs must be made here on purpose: a
    /// proxy of another version calls the old one by its SHA1) and its layout: the highest
    /// literal `KEYS` and `ARGV` index, and whether it walks them in a loop (variadic).
    #[test]
    fn every_script_is_pinned_with_its_layout() {
        let pinned: &[(&str, &str, usize, usize, bool)] = &[
            (
                "lock.lua",
                "4b4e5c954fd9b91967534096ae45c6a2c63a70d4",
                0,
                4,
                true,
            ),
            (
                "undo.lua",
                "8ff4038c27eb84cf877f8c475487acda6db96563",
                2,
                2,
                false,
            ),
            (
                "undo_hash.lua",
                "0c50dc2d38fbc8a7387fad098b154754ce18b4a4",
                2,
                2,
                false,
            ),
            (
                "compare_and_delete.lua",
                "e9f69f2beb755be68b5e456ee2ce9aadfbc4ebf4",
                1,
                1,
                false,
            ),
            (
                "extend.lua",
                "5b61dcd6a5b8aef3e18a57e4f267c408ea385270",
                4,
                3,
                false,
            ),
            (
                "unextend.lua",
                "5517ed16e1951c76a5cef3f99f5fd6aae3f23f1c",
                1,
                2,
                false,
            ),
            (
                "status.lua",
                "f8596f268234f90676363f16dd40d7e85841fc70",
                3,
                0,
                false,
            ),
            (
                "quarantine.lua",
                "b42a1a7f04da9df3e88435cb2111cc1ae1eafc56",
                2,
                1,
                false,
            ),
            (
                "claim.lua",
                "ec79cdd950ef85953f13799c93e261938144d27c",
                2,
                2,
                false,
            ),
            (
                "lift_claim.lua",
                "d095c0795782341e80b9859b911abb1d3d2f9810",
                2,
                1,
                false,
            ),
            (
                "cluster_lock.lua",
                "3fcf90f465596c893c920cfe97ff82d6b07beeeb",
                0,
                1,
                true,
            ),
            (
                "restamp.lua",
                "50e106b5613a295c1b8c036c8b0126b69c6c7e7e",
                1,
                2,
                false,
            ),
            (
                "token.lua",
                "73a033f09508e1c5d5a885df5c58363af8ffc8b5",
                2,
                1,
                false,
            ),
            (
                "guard.lua",
                "1607e5d77a065669a4e0b9f2e62248c031b58614",
                2,
                1,
                true,
            ),
            (
                "compare_and_set.lua",
                "41b09e594a00eff8dd44c227300f6fb0c9b44fb2",
                4,
                4,
                false,
            ),
            (
                "restore.lua",
                "606b7b87a432ed3c2631d2240aa13b84bf846cf6",
                1,
                3,
                false,
            ),
            (
                "conditional.lua",
                "494fbb059cb34dca2789957885ffed5b400116d3",
                1,
                7,
                false,
            ),
        ];
        assert_eq!(pinned.len(), ALL.len(), "a script without a pin");
        for ((file, script), (pinned_file, sha, keys, argv, variadic)) in ALL.iter().zip(pinned) {
            let text = script.text();
            assert_eq!(file, pinned_file);
            assert_eq!(script_sha(text.as_bytes()), *sha, "{file}");
            assert_eq!(highest_index(text, "KEYS"), *keys, "{file}: KEYS");
            assert_eq!(highest_index(text, "ARGV"), *argv, "{file}: ARGV");
            assert_eq!(
                text.contains("#KEYS") || text.contains("#ARGV"),
                *variadic,
                "{file}"
            );
        }
    }

    #[test]
    fn code_lines_hold_no_comment() {
        for (file, source) in ALL
            .iter()
            .map(|(file, script)| (*file, script.text()))
            .chain([("prelude.lua", PRELUDE_SOURCE)])
        {
            assert!(
                !compact(source).contains("--"),
                "{file}: a comment after code"
            );
        }
    }

    #[test]
    fn key_names_are_the_reserved_prefix_s() {
        for key in [ARMED_KEY, QUARANTINE_KEY, WITNESS_KEY] {
            assert!(key.starts_with(RESERVED_PREFIX), "{key}");
        }
        assert_eq!(&token_key(b"k")[..], b"redlock-proxy:token:k");
        assert_eq!(
            compact("-- a comment\n  local a = 1\n\n  return a  \n"),
            "local a = 1 return a"
        );
    }
}
