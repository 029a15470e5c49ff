//! The release of a lock on every master ([`Acquirer::release`]): the compare-and-delete every
//! client library sends (recognised by [`crate::lease_script::is_compare_and_delete`]) and
//! `LOCK.RELEASE`, as calls of the proxy's own [`RELEASE_SCRIPT`], which the links merge like
//! the acquires.

use super::Acquirer;
use crate::masters::Ask;
use crate::protocol::{Reply, ScriptCall};
use crate::redlock::{no_quorum, MergeRule};
use crate::script_cache::script_sha;
use crate::transport::SharedScript;
use std::sync::Arc;

/// The compare-and-delete of every release the link merged into this call: for each `i`,
/// `1` if `KEYS[i]` held `ARGV[i]` and was deleted, else `0`, exactly what the classic
/// `if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) else return
/// 0 end` answers. A key of another type is that release's error (`WRONGTYPE`, as the classic
/// script's `redis.call` raises), and not the end of the others' (`pcall`).
pub const RELEASE_SCRIPT: &str = "local r = {} for i = 1, #KEYS do local v = redis.pcall('get', KEYS[i]) if type(v) == 'table' and v.err then r[i] = v elseif v == ARGV[i] then r[i] = redis.call('del', KEYS[i]) else r[i] = 0 end end return r";

/// How the links call [`RELEASE_SCRIPT`] (by SHA1: the health monitors load it).
pub(super) fn release_script() -> Arc<SharedScript> {
    Arc::new(SharedScript {
        sha: script_sha(RELEASE_SCRIPT.as_bytes()),
        body: RELEASE_SCRIPT,
        shared_keys: Vec::new(),
    })
}

impl Acquirer {
    /// Releases `key` if it holds `value`, on every master (those that cannot vote too), and
    /// answers by the release rule ([`MergeRule::Release`]).
    pub async fn release(&self, key: &[u8], value: &[u8]) -> Reply {
        let call = ScriptCall::new(&[key], &[value]);
        let rule = MergeRule::Release;
        let ask = |_| Some(Ask::Script(self.release_script.clone(), call.clone()));
        let votes = self.masters.quorum_votes(ask, rule).await;
        crate::redlock::merge(&votes, rule).unwrap_or_else(|| no_quorum(votes.len()))
    }
}
