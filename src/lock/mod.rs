//! Lock operations over the masters: the Redlock acquire with its per-key single flight
//! ([`Acquirer`]), the rollback of refused attempts, and the scripts they run on the masters.
//! Used by the `SET` command ([`crate::commands::lock`]); knows nothing of connections or
//! the command table.

mod acquire;
mod flights;
mod rollback;

pub use acquire::{attempt_key, Attempt, ACQUIRE_SCRIPT};
pub use flights::Started;
pub use rollback::{COMPARE_AND_DELETE, UNDO_SCRIPT};

use crate::masters::Masters;
use crate::redlock::Policy;
use crate::script_cache::script_sha;
use acquire::AttemptIds;
use flights::Flights;
use std::sync::Arc;

/// The acquire service shared by every connection.
pub struct Acquirer {
    masters: Arc<Masters>,
    policy: Policy,
    ids: AttemptIds,
    /// SHA1 of [`ACQUIRE_SCRIPT`].
    acquire_sha: String,
    flights: Flights,
}

impl Acquirer {
    pub fn new(masters: Arc<Masters>, policy: Policy) -> Arc<Acquirer> {
        Arc::new(Acquirer {
            masters,
            policy,
            ids: AttemptIds::new(),
            acquire_sha: script_sha(ACQUIRE_SCRIPT.as_bytes()),
            flights: Flights::default(),
        })
    }

    /// Scripts the health monitors keep loaded on every master (acquires call them by SHA1).
    pub fn preload() -> Vec<&'static str> {
        vec![ACQUIRE_SCRIPT]
    }
}
