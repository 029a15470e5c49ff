//! The release of a lock on every master ([`Acquirer::release`]): the compare-and-delete every
//! client library sends (recognised by [`crate::lease_script::is_compare_and_delete`]) and
//! `LOCK.RELEASE`, as release operations of the proxy's own [`super::LOCK_SCRIPT`], which the
//! links merge with the acquires.

use super::Acquirer;
use crate::masters::Ask;
use crate::protocol::{Reply, ScriptCall};
use crate::redlock::MergeRule;

impl Acquirer {
    /// Releases `key` if it holds `value`, on every master (those that cannot vote too), and
    /// answers by the release rule ([`MergeRule::Release`]).
    pub async fn release(&self, key: &[u8], value: &[u8]) -> Reply {
        let call = ScriptCall::new(&[key], &[b"r", value]);
        let rule = MergeRule::Release;
        let ask = |_| Some(Ask::Script(self.script.clone(), call.clone()));
        self.masters.quorum_reply_each(ask, rule).await
    }
}
