//! The proxy's script cache: every script body seen (`EVAL`, `SCRIPT LOAD`) under its real
//! SHA1, with what the proxy understood of it ([`crate::lease_script`]), so `EVALSHA` can send
//! the masters the body (a master that never saw a script, or lost its cache, runs it like
//! the others) and so a script is analysed once, not on every call.
//!
//! Bounded: at most [`MAX_SCRIPTS`] scripts; an evicted script's `EVALSHA` gets `NOSCRIPT`,
//! and every client library then sends the body again (`EVAL`).

use crate::lease_script::{
    is_compare_and_delete, known_lock_script, may_write, reaches_globals, recognise, KnownLock,
    LeaseShape,
};
use crate::on_master::script_sha;
use crate::redlock::MergeRule;
use crate::script_keys::checked_body;
use bytes::Bytes;
use dashmap::DashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Most scripts remembered. Clients that interpolate values into script bodies would
/// otherwise grow the cache without end.
pub const MAX_SCRIPTS: usize = 10_000;

/// A script the proxy has seen, and what it knows of its meaning.
#[derive(Debug, Clone)]
pub struct Script {
    pub body: Bytes,
    /// Where it takes a lease TTL from, if it sets one from an argument.
    pub lease: Option<LeaseShape>,
    /// How its replies merge: only a recognised compare-and-delete has a known meaning.
    pub merge: MergeRule,
    /// It may write: followed by a guard on every master ([`crate::commands::scripts`]), and
    /// its checked body reports the leases it set (by effect, [`checked_body`]).
    pub may_write: bool,
    /// It could reach the real `redis` around the key checks ([`crate::script_keys`]): refused.
    pub reaches_globals: bool,
    /// A client library's whole acquire or release script, run as the proxy's own.
    pub lock: Option<KnownLock>,
    /// What the masters run: the body behind the key checks ([`checked_body`]), and its SHA1.
    pub checked: Bytes,
    pub checked_sha: Bytes,
    /// Whether the checked body was sent whole to the masters once: later calls go by SHA1
    /// (a master that lost it answers `NOSCRIPT` and gets the body then).
    pub sent_whole: Arc<AtomicBool>,
}

impl Script {
    /// Analyses `body`.
    fn new(body: Bytes) -> Script {
        let may_write = may_write(&body);
        let checked = checked_body(&body, may_write);
        Script {
            lease: recognise(&body),
            merge: if is_compare_and_delete(&body) {
                MergeRule::Release
            } else {
                MergeRule::Strict
            },
            may_write,
            reaches_globals: std::str::from_utf8(&body).map_or(true, reaches_globals),
            lock: known_lock_script(&body),
            checked_sha: Bytes::from(script_sha(&checked)),
            checked,
            sent_whole: Arc::default(),
            body,
        }
    }
}

/// SHA1 (lower-case hex) → script.
#[derive(Debug, Default)]
pub struct ScriptCache {
    scripts: DashMap<String, Script>,
}

impl ScriptCache {
    /// The cached script for `body`, analysed once and remembered under its SHA1.
    pub fn remember(&self, body: Bytes) -> Script {
        let sha = script_sha(&body);
        if let Some(known) = self.scripts.get(&sha) {
            return known.clone();
        }
        if self.scripts.len() >= MAX_SCRIPTS {
            let victim = self.scripts.iter().next().map(|e| e.key().clone());
            if let Some(victim) = victim {
                self.scripts.remove(&victim);
            }
        }
        let script = Script::new(body);
        self.scripts.insert(sha, script.clone());
        script
    }

    /// The cached script with this SHA1 (any case), if known.
    pub fn by_sha(&self, sha: &[u8]) -> Option<Script> {
        let sha = String::from_utf8_lossy(sha).to_ascii_lowercase();
        self.scripts.get(&sha).map(|s| s.clone())
    }

    /// Forgets every script (`SCRIPT FLUSH`).
    pub fn clear(&self) {
        self.scripts.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_by_sha_in_any_case_and_stays_bounded() {
        let cache = ScriptCache::default();
        let body = Bytes::from_static(b"return 1");
        cache.remember(body.clone());
        let sha = script_sha(&body);
        assert_eq!(sha, "e0e1f9fabfc9d4800c877a703b823ac0578ff8db");
        assert!(cache.by_sha(sha.to_ascii_uppercase().as_bytes()).is_some());
        for i in 0..MAX_SCRIPTS + 5 {
            cache.remember(Bytes::from(format!("return {i}")));
        }
        assert_eq!(cache.scripts.len(), MAX_SCRIPTS);
        cache.clear();
        assert!(cache.by_sha(sha.as_bytes()).is_none());
    }
}
